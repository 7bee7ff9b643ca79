//! Probing shared-library symbols without panicking: every driver entry point a backend
//! calls is looked up once at load time, and a missing one disables only its feature.

/// Whether every symbol in `names` resolves in `lib`.
pub(crate) fn all_present(lib: &libloading::Library, names: &[&str]) -> Result<(), String> {
    for name in names {
        // SAFETY: only the address is looked up; nothing is called.
        let found = unsafe { lib.get::<unsafe extern "C" fn()>(name.as_bytes()) };
        if found.is_err() {
            return Err(format!("symbol {name} is missing"));
        }
    }
    Ok(())
}
