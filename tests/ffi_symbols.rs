//! The shared library exports only `mc_*` and `mooncake_store_*` and has SONAME
//! `libmooncake_rs.so.0`. Uses binutils (`nm`, `readelf`) on the cdylib cargo built next to
//! this test binary.

use std::path::PathBuf;
use std::process::Command;

/// `target/<profile>/libmooncake_rs.so` (the test binary lives in `target/<profile>/deps`).
/// `cargo test` builds the library as an rlib only, so the cdylib is built here first with
/// the same cargo, target directory and profile (a no-op when it is up to date).
fn cdylib() -> PathBuf {
    static BUILD: std::sync::Once = std::sync::Once::new();
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let target_dir = profile_dir.parent().unwrap();
    let release = profile_dir.file_name().and_then(|n| n.to_str()) == Some("release");
    BUILD.call_once(|| {
        let mut cargo = Command::new(env!("CARGO"));
        cargo
            .args(["build", "--lib", "--quiet", "--target-dir"])
            .arg(target_dir)
            .arg("--manifest-path")
            .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"));
        if release {
            cargo.arg("--release");
        }
        assert!(
            cargo.status().unwrap().success(),
            "building the cdylib failed"
        );
    });
    let lib = profile_dir.join("libmooncake_rs.so");
    assert!(lib.exists(), "{} not built", lib.display());
    lib
}

fn tool(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .arg(cdylib())
        .output()
        .unwrap_or_else(|e| panic!("{cmd} not runnable: {e}"));
    assert!(out.status.success(), "{cmd} failed");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn only_mc_and_mooncake_store_symbols_are_exported() {
    let listing = tool("nm", &["-D", "--defined-only"]);
    let mut names = Vec::new();
    for line in listing.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (kind, name) = match fields.as_slice() {
            [_, kind, name] => (*kind, *name),
            _ => continue,
        };
        assert!(
            name.starts_with("mc_") || name.starts_with("mooncake_store_"),
            "unexpected exported symbol {name} ({kind})"
        );
        assert_eq!(kind, "T", "{name} is not a function");
        names.push(name.to_string());
    }
    let mc = names.iter().filter(|n| n.starts_with("mc_")).count();
    let compat = names
        .iter()
        .filter(|n| n.starts_with("mooncake_store_"))
        .count();
    assert_eq!((mc, compat), (86, 19), "{names:?}");
}

#[test]
fn library_has_the_soname() {
    let dynamic = tool("readelf", &["-d"]);
    assert!(
        dynamic.contains("Library soname: [libmooncake_rs.so.0]"),
        "{dynamic}"
    );
}

/// The library loads on a machine without rdma-core or a device runtime: libibverbs (and
/// every other RDMA or device runtime library) is opened at run time by `protocol = "rdma"`
/// or the first device pointer, never a load-time dependency.
#[test]
fn library_needs_no_rdma_or_device_runtime_at_load_time() {
    let dynamic = tool("readelf", &["-d"]);
    let needed: Vec<&str> = dynamic
        .lines()
        .filter(|line| line.contains("(NEEDED)"))
        .filter_map(|line| line.split('[').nth(1)?.split(']').next())
        .collect();
    assert!(needed.iter().any(|l| l.starts_with("libc.so")), "{dynamic}");
    let runtime = [
        "libibverbs",
        "librdmacm",
        "libmlx",
        "librxe",
        "libcuda",
        "libcudart",
        "libnvidia",
        "libascendcl",
        "libacl",
        "libruntime",
    ];
    for library in &needed {
        assert!(
            !runtime.iter().any(|r| library.starts_with(r)),
            "{library} is a load-time dependency: {needed:?}"
        );
    }
}
