//! An opened RDMA device: its context, protection domain, port 1 and GID, and memory
//! registrations on it.

use super::events::DeviceEvents;
use super::verbs::{self, Context, Gid, Mr, PortAttr, Verbs};
use crate::env;
use crate::error::{fail, ErrorCode, Result};
use std::ffi::{c_void, CStr};
use std::sync::Arc;

/// Access of a registration: local write (READs land in it) and, when peers may reach it
/// (`remote_accessible`: a segment, a remotely accessible buffer), remote read and write. A
/// local-only range (a caller's buffer, a bounce) refuses any peer's work request, whatever
/// rkey it names.
fn access(remote_accessible: bool) -> std::ffi::c_int {
    match remote_accessible {
        true => verbs::ACCESS_LOCAL_WRITE | verbs::ACCESS_REMOTE_WRITE | verbs::ACCESS_REMOTE_READ,
        false => verbs::ACCESS_LOCAL_WRITE,
    }
}

/// The port used (Mooncake uses port 1 of each device).
pub(crate) const PORT: u8 = 1;

/// An open device with one protection domain. Thread-safe; shared by `Arc`. Closed (PD
/// deallocated, context closed) when the last `Arc` — including those held by every
/// [`Registration`] and queue pair — is dropped.
pub struct RdmaDevice {
    pub(crate) verbs: &'static Verbs,
    pub(crate) context: *mut Context,
    pub(crate) pd: *mut c_void,
    name: String,
    pub(crate) gid: Gid,
    pub(crate) gid_index: u8,
    pub(crate) lid: u16,
    pub(crate) active_mtu: u32,
    /// Started by the first queue pair (see [`RdmaDevice::events`]).
    events: once_cell::sync::OnceCell<DeviceEvents>,
}

// SAFETY: the context and PD are handles libibverbs lets any thread use; they are only freed
// in `Drop`, when no other reference exists.
unsafe impl Send for RdmaDevice {}
// SAFETY: as above; nothing is mutated through `&self`.
unsafe impl Sync for RdmaDevice {}

impl std::fmt::Debug for RdmaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RdmaDevice({}, gid index {})", self.name, self.gid_index)
    }
}

/// What a setup error says about the device list.
pub(super) fn setup_error<T>(problem: impl std::fmt::Display) -> Result<T> {
    fail(
        ErrorCode::TransferFail,
        format_args!("protocol 'rdma': {problem}"),
    )
}

impl RdmaDevice {
    /// Opens the device named `device_name` (one name, e.g. `rxe0`; empty: the first device
    /// the library lists), with its port 1 active. A `device_name` list of several devices
    /// is opened by [`RdmaDevices::open`](super::RdmaDevices::open).
    ///
    /// Errors: `TRANSFER_FAIL` with a message naming the problem: libibverbs cannot be
    /// loaded, no RDMA device, the named device does not exist, it cannot be opened, its port
    /// is not active, or no protection domain.
    pub fn open(device_name: &str) -> Result<Arc<RdmaDevice>> {
        let verbs = match verbs::verbs() {
            Ok(verbs) => verbs,
            Err(problem) => return setup_error(problem),
        };
        let wanted = Some(device_name.trim()).filter(|name| !name.is_empty());
        let mut count = 0;
        // SAFETY: the list is freed below and only read in between.
        let list = unsafe { (verbs.get_device_list)(&mut count) };
        if list.is_null() || count <= 0 {
            if !list.is_null() {
                // SAFETY: returned by get_device_list.
                unsafe { (verbs.free_device_list)(list) };
            }
            return setup_error("no RDMA device (ibv_get_device_list found none)");
        }
        let mut names = Vec::new();
        let mut chosen = None;
        for index in 0..count as usize {
            // SAFETY: `count` entries are valid.
            let device = unsafe { *list.add(index) };
            // SAFETY: a device of the list; the name is a C string owned by it.
            let name = unsafe { CStr::from_ptr((verbs.get_device_name)(device)) }
                .to_string_lossy()
                .into_owned();
            if chosen.is_none() && wanted.is_none_or(|w| w == name) {
                chosen = Some((device, name.clone()));
            }
            names.push(name);
        }
        let opened = chosen.map(|(device, name)| {
            // SAFETY: a device of the list, opened before the list is freed.
            (unsafe { (verbs.open_device)(device) }, name)
        });
        // SAFETY: returned by get_device_list; opened contexts stay valid after this.
        unsafe { (verbs.free_device_list)(list) };
        let Some((context, name)) = opened else {
            return setup_error(format_args!(
                "device {:?} not found (devices: {})",
                wanted.unwrap_or(""),
                names.join(", ")
            ));
        };
        if context.is_null() {
            return setup_error(format_args!(
                "cannot open device {name}: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: an open context; closed on every error path.
        unsafe { Self::on_context(verbs, context, name) }
    }

    /// Queries the port and GID and allocates the PD of an opened `context`; closes it on
    /// error.
    ///
    /// # Safety
    /// `context` is open and owned by the caller, who hands it over.
    unsafe fn on_context(
        verbs: &'static Verbs,
        context: *mut Context,
        name: String,
    ) -> Result<Arc<RdmaDevice>> {
        let close = |problem: String| {
            // SAFETY: owned and not used after this.
            unsafe { (verbs.close_device)(context) };
            setup_error(problem)
        };
        let mut port = PortAttr::default();
        // SAFETY: an open context; `port` is a zeroed ibv_port_attr, as the header does.
        if unsafe { (verbs.query_port)(context, PORT, &mut port) } != 0 {
            return close(format!("ibv_query_port({name}, {PORT}) failed"));
        }
        if port.state != verbs::PORT_ACTIVE {
            return close(format!(
                "port {PORT} of {name} is not active (state {})",
                port.state
            ));
        }
        let gid_index = match Self::gid_index(verbs, context, &port) {
            Ok(index) => index,
            Err(problem) => return close(format!("{name}: {problem}")),
        };
        let mut gid = Gid::default();
        // SAFETY: an open context; `gid` is a 16-byte union ibv_gid.
        if unsafe { (verbs.query_gid)(context, PORT, c_int_from(gid_index), &mut gid) } != 0 {
            return close(format!("ibv_query_gid({name}, {gid_index}) failed"));
        }
        // SAFETY: an open context.
        let pd = unsafe { (verbs.alloc_pd)(context) };
        if pd.is_null() {
            return close(format!("ibv_alloc_pd({name}) failed"));
        }
        Ok(Arc::new(RdmaDevice {
            verbs,
            context,
            pd,
            name,
            gid,
            gid_index,
            lid: port.lid,
            active_mtu: port.active_mtu,
            events: once_cell::sync::OnceCell::new(),
        }))
    }

    /// `MC_GID_INDEX`, or the first IPv4-mapped GID on an Ethernet port, or 0.
    fn gid_index(
        verbs: &Verbs,
        context: *mut Context,
        port: &PortAttr,
    ) -> std::result::Result<u8, String> {
        // MC_GID_INDEX (Mooncake's name): the GID table entry used for RoCE addressing. Unset:
        // the first IPv4-mapped entry (RoCE v2 over an IPv4 address), else entry 0.
        if let Some(text) = env::GID_INDEX.get() {
            return text
                .trim()
                .parse::<u8>()
                .map_err(|_| format!("{}={text:?} is not a GID index", env::GID_INDEX.name));
        }
        if port.link_layer != verbs::LINK_LAYER_ETHERNET {
            return Ok(0);
        }
        let entries = port.gid_tbl_len.clamp(0, 256);
        for index in 0..entries {
            let mut gid = Gid::default();
            // SAFETY: an open context; `gid` is a union ibv_gid.
            if unsafe { (verbs.query_gid)(context, PORT, index, &mut gid) } != 0 {
                continue;
            }
            let mapped = gid.raw[..10].iter().all(|b| *b == 0) && gid.raw[10..12] == [0xff; 2];
            if mapped {
                return u8::try_from(index).map_err(|_| "GID index over 255".to_string());
            }
        }
        Ok(0)
    }

    /// The device's completion channel and event thread, started on first use.
    ///
    /// Errors: `TRANSFER_FAIL` when they cannot be created (the next call tries again).
    pub(crate) fn events(&self) -> Result<&DeviceEvents> {
        self.events.get_or_try_init(|| {
            // SAFETY: the context is open until `Drop`, which stops the events first.
            unsafe { DeviceEvents::start(self.verbs, self.context) }
        })
    }

    /// The device name (e.g. `rxe0`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Registers `[addr, addr+len)` for local write, and for remote read and write when
    /// `remote_accessible` ([`access`]).
    ///
    /// Errors: `TRANSFER_FAIL` when the device refuses (e.g. unmapped memory, a lock limit).
    pub(crate) fn register(
        self: &Arc<Self>,
        addr: usize,
        len: usize,
        remote_accessible: bool,
    ) -> Result<Registration> {
        let access = access(remote_accessible);
        // SAFETY: the PD is live; the library only pins and maps the range.
        let mr = unsafe { (self.verbs.reg_mr)(self.pd, addr as *mut c_void, len, access) };
        self.registered(mr, format_args!("ibv_reg_mr of {len} bytes at {addr:#x}"))
    }

    /// Registers `len` bytes of the dma-buf `fd` from `offset`, addressed as `iova` in work
    /// requests (GPUDirect: device memory exported by its driver; `iova` is its device
    /// address, so slices name it as for host memory), with [`access`] as for `register`.
    /// The dma-buf may be closed afterwards (the MR holds it).
    ///
    /// Errors: `TRANSFER_FAIL` naming the cause: libibverbs has no `ibv_reg_dmabuf_mr`
    /// (rdma-core before 34), or the device or kernel refuses (soft-RoCE answers
    /// "Operation not supported").
    pub(crate) fn register_dmabuf(
        self: &Arc<Self>,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
        remote_accessible: bool,
    ) -> Result<Registration> {
        use std::os::fd::AsRawFd;
        let Some(reg_dmabuf_mr) = self.verbs.reg_dmabuf_mr else {
            return fail(
                ErrorCode::TransferFail,
                "libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or later is needed)",
            );
        };
        // SAFETY: the PD is live and `fd` an open descriptor for the call; the kernel checks
        // that it is a dma-buf covering `offset + len`.
        let mr = unsafe {
            reg_dmabuf_mr(
                self.pd,
                offset,
                len,
                iova,
                fd.as_raw_fd(),
                access(remote_accessible),
            )
        };
        self.registered(
            mr,
            format_args!("ibv_reg_dmabuf_mr of {len} bytes at {iova:#x}"),
        )
    }

    /// `mr` as a registration, or `TRANSFER_FAIL` saying that `what` failed (with errno)
    /// when it is null.
    fn registered(
        self: &Arc<Self>,
        mr: *mut Mr,
        what: std::fmt::Arguments<'_>,
    ) -> Result<Registration> {
        if mr.is_null() {
            return fail(
                ErrorCode::TransferFail,
                format_args!(
                    "{what} on {} failed: {}",
                    self.name,
                    std::io::Error::last_os_error()
                ),
            );
        }
        Ok(Registration {
            device: Arc::clone(self),
            mr,
        })
    }
}

fn c_int_from(index: u8) -> std::ffi::c_int {
    std::ffi::c_int::from(index)
}

impl Drop for RdmaDevice {
    fn drop(&mut self) {
        // The event thread reads the context: stopped before it is closed.
        drop(self.events.take());
        // SAFETY: every registration and QP holds an Arc, so none is left; owned handles.
        unsafe {
            (self.verbs.dealloc_pd)(self.pd);
            (self.verbs.close_device)(self.context);
        }
    }
}

/// A registered memory region; deregistered on drop, after which the NIC refuses its rkey
/// (remote access error) and its lkey. Thread-safe.
pub(crate) struct Registration {
    device: Arc<RdmaDevice>,
    mr: *mut Mr,
}

// SAFETY: the MR is an immutable handle after registration; freed only in `Drop`.
unsafe impl Send for Registration {}
// SAFETY: as above.
unsafe impl Sync for Registration {}

impl Registration {
    /// The key local work requests name.
    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: live until drop.
        unsafe { (*self.mr).lkey }
    }

    /// The key peers name in RDMA READ/WRITE.
    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: live until drop.
        unsafe { (*self.mr).rkey }
    }

    /// `(addr, length)` as the library recorded them (the layout check reads them back).
    #[cfg(test)]
    pub(crate) fn range(&self) -> (usize, usize) {
        // SAFETY: live until drop.
        unsafe { ((*self.mr).addr as usize, (*self.mr).length) }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: registered by `register`, deregistered once.
        let rc = unsafe { (self.device.verbs.dereg_mr)(self.mr) };
        if rc != 0 {
            tracing::warn!("ibv_dereg_mr on {} returned {rc}", self.device.name);
        }
    }
}
