//! libibverbs, loaded at run time: the `#[repr(C)]` layouts this crate reads or fills, the
//! constants it uses, and the table of entry points resolved with `dlopen`/`dlsym`.
//!
//! Nothing links against libibverbs: the library is opened on the first [`verbs`] call, so a
//! process without it still loads `libmooncake_rs.so` and only `protocol = "rdma"` fails.
//! The calls that `verbs.h` defines `static inline` (`ibv_post_send`, `ibv_poll_cq`,
//! `ibv_req_notify_cq`) go through the context's `ops` table exactly as the header does
//! (`qp->context->ops.post_send(...)`).
//!
//! Layouts: checked against `/usr/include/infiniband/verbs.h` of rdma-core 44 (x86-64 and
//! aarch64 LP64) by the size and offset assertions below (the numbers come from `offsetof` /
//! `sizeof` in a C program compiled against that header), and against the running library
//! by the VM unit tests in `super::tests` (fields the library fills are read back). Structs
//! the library allocates and we only read (`ibv_context`, `ibv_qp`, `ibv_cq`) are modelled
//! up to the last field we use.
//!
//! Thread-safety: the table is immutable after loading; libibverbs calls are thread-safe
//! per the rdma-core documentation (a QP is posted to by one thread at a time here).

use once_cell::sync::OnceCell;
use std::ffi::{c_char, c_int, c_uint, c_void};

/// Library names tried in order.
pub(crate) const LIBRARY_NAMES: &[&str] = &["libibverbs.so.1", "libibverbs.so"];

/// `union ibv_gid` (16 bytes, 8-aligned because of its `__be64` view).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Gid {
    pub(crate) raw: [u8; 16],
}

/// `struct ibv_context_ops`: 32 function pointers; only four are called.
#[repr(C)]
pub(crate) struct ContextOps {
    _before_poll: [usize; 11],
    pub(crate) poll_cq: Option<unsafe extern "C" fn(*mut Cq, c_int, *mut WorkCompletion) -> c_int>,
    pub(crate) req_notify_cq: Option<unsafe extern "C" fn(*mut Cq, c_int) -> c_int>,
    _between: [usize; 12],
    pub(crate) post_send:
        Option<unsafe extern "C" fn(*mut Qp, *mut SendWr, *mut *mut SendWr) -> c_int>,
    pub(crate) post_recv:
        Option<unsafe extern "C" fn(*mut Qp, *mut c_void, *mut *mut c_void) -> c_int>,
    _after: [usize; 5],
}

/// `struct ibv_context` up to its `async_fd` (read only; allocated by the library).
#[repr(C)]
pub(crate) struct Context {
    pub(crate) device: *mut c_void,
    pub(crate) ops: ContextOps,
    pub(crate) cmd_fd: c_int,
    pub(crate) async_fd: c_int,
}

/// `struct ibv_comp_channel` (read only; allocated by `ibv_create_comp_channel`).
#[repr(C)]
pub(crate) struct CompChannel {
    pub(crate) context: *mut Context,
    pub(crate) fd: c_int,
    pub(crate) refcnt: c_int,
}

/// `struct ibv_async_event`: the `element` union (a CQ or QP pointer for the events used
/// here) and the event type.
#[repr(C)]
pub(crate) struct AsyncEvent {
    pub(crate) element: *mut c_void,
    pub(crate) event_type: c_uint,
}

/// `struct ibv_cq` up to `cqe` (read only).
#[repr(C)]
pub(crate) struct Cq {
    pub(crate) context: *mut Context,
    pub(crate) channel: *mut c_void,
    pub(crate) cq_context: *mut c_void,
    pub(crate) handle: u32,
    pub(crate) cqe: c_int,
}

/// `struct ibv_qp` up to `qp_type` (read only).
#[repr(C)]
pub(crate) struct Qp {
    pub(crate) context: *mut Context,
    pub(crate) qp_context: *mut c_void,
    pub(crate) pd: *mut c_void,
    pub(crate) send_cq: *mut Cq,
    pub(crate) recv_cq: *mut Cq,
    pub(crate) srq: *mut c_void,
    pub(crate) handle: u32,
    pub(crate) qp_num: u32,
    pub(crate) state: c_uint,
    pub(crate) qp_type: c_uint,
}

/// `struct ibv_mr` (read only; allocated by `ibv_reg_mr`).
#[repr(C)]
pub(crate) struct Mr {
    pub(crate) context: *mut Context,
    pub(crate) pd: *mut c_void,
    pub(crate) addr: *mut c_void,
    pub(crate) length: usize,
    pub(crate) handle: u32,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sge {
    pub(crate) addr: u64,
    pub(crate) length: u32,
    pub(crate) lkey: u32,
}

/// `struct ibv_send_wr` with its `wr` union seen as `wr.rdma` (the atomic view is the
/// largest member, hence the padding) and the trailing unions as padding.
#[repr(C)]
pub(crate) struct SendWr {
    pub(crate) wr_id: u64,
    pub(crate) next: *mut SendWr,
    pub(crate) sg_list: *mut Sge,
    pub(crate) num_sge: c_int,
    pub(crate) opcode: c_uint,
    pub(crate) send_flags: c_uint,
    pub(crate) imm_data: u32,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    _atomic_rest: [u32; 5],
    _qp_type: [u64; 1],
    _bind_mw_tso: [u64; 6],
}

impl SendWr {
    /// One signalled RDMA work request of `opcode` over one scatter/gather entry.
    pub(crate) fn rdma(
        wr_id: u64,
        opcode: c_uint,
        sge: *mut Sge,
        remote_addr: u64,
        rkey: u32,
    ) -> SendWr {
        SendWr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: sge,
            num_sge: 1,
            opcode,
            send_flags: SEND_SIGNALED,
            imm_data: 0,
            remote_addr,
            rkey,
            _atomic_rest: [0; 5],
            _qp_type: [0],
            _bind_mw_tso: [0; 6],
        }
    }
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct WorkCompletion {
    pub(crate) wr_id: u64,
    pub(crate) status: c_uint,
    pub(crate) opcode: c_uint,
    pub(crate) vendor_err: u32,
    pub(crate) byte_len: u32,
    pub(crate) imm_data: u32,
    pub(crate) qp_num: u32,
    pub(crate) src_qp: u32,
    pub(crate) wc_flags: c_uint,
    pub(crate) pkey_index: u16,
    pub(crate) slid: u16,
    pub(crate) sl: u8,
    pub(crate) dlid_path_bits: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct QpCap {
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) max_send_sge: u32,
    pub(crate) max_recv_sge: u32,
    pub(crate) max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub(crate) struct QpInitAttr {
    pub(crate) qp_context: *mut c_void,
    pub(crate) send_cq: *mut Cq,
    pub(crate) recv_cq: *mut Cq,
    pub(crate) srq: *mut c_void,
    pub(crate) cap: QpCap,
    pub(crate) qp_type: c_uint,
    pub(crate) sq_sig_all: c_int,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct GlobalRoute {
    pub(crate) dgid: Gid,
    pub(crate) flow_label: u32,
    pub(crate) sgid_index: u8,
    pub(crate) hop_limit: u8,
    pub(crate) traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct AhAttr {
    pub(crate) grh: GlobalRoute,
    pub(crate) dlid: u16,
    pub(crate) sl: u8,
    pub(crate) src_path_bits: u8,
    pub(crate) static_rate: u8,
    pub(crate) is_global: u8,
    pub(crate) port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct QpAttr {
    pub(crate) qp_state: c_uint,
    pub(crate) cur_qp_state: c_uint,
    pub(crate) path_mtu: c_uint,
    pub(crate) path_mig_state: c_uint,
    pub(crate) qkey: u32,
    pub(crate) rq_psn: u32,
    pub(crate) sq_psn: u32,
    pub(crate) dest_qp_num: u32,
    pub(crate) qp_access_flags: c_uint,
    pub(crate) cap: QpCap,
    pub(crate) ah_attr: AhAttr,
    pub(crate) alt_ah_attr: AhAttr,
    pub(crate) pkey_index: u16,
    pub(crate) alt_pkey_index: u16,
    pub(crate) en_sqd_async_notify: u8,
    pub(crate) sq_draining: u8,
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_dest_rd_atomic: u8,
    pub(crate) min_rnr_timer: u8,
    pub(crate) port_num: u8,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) alt_port_num: u8,
    pub(crate) alt_timeout: u8,
    pub(crate) rate_limit: u32,
}

/// `struct ibv_port_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PortAttr {
    pub(crate) state: c_uint,
    pub(crate) max_mtu: c_uint,
    pub(crate) active_mtu: c_uint,
    pub(crate) gid_tbl_len: c_int,
    pub(crate) port_cap_flags: u32,
    pub(crate) max_msg_sz: u32,
    pub(crate) bad_pkey_cntr: u32,
    pub(crate) qkey_viol_cntr: u32,
    pub(crate) pkey_tbl_len: u16,
    pub(crate) lid: u16,
    pub(crate) sm_lid: u16,
    pub(crate) lmc: u8,
    pub(crate) max_vl_num: u8,
    pub(crate) sm_sl: u8,
    pub(crate) subnet_timeout: u8,
    pub(crate) init_type_reply: u8,
    pub(crate) active_width: u8,
    pub(crate) active_speed: u8,
    pub(crate) phys_state: u8,
    pub(crate) link_layer: u8,
    pub(crate) flags: u8,
    pub(crate) port_cap_flags2: u16,
}

// Sizes and offsets from verbs.h (see the module comment).
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(offset_of!(Context, ops) == 8);
    assert!(offset_of!(Context, cmd_fd) == 264 && offset_of!(Context, async_fd) == 268);
    assert!(size_of::<CompChannel>() == 16 && offset_of!(CompChannel, fd) == 8);
    assert!(size_of::<AsyncEvent>() == 16 && offset_of!(AsyncEvent, event_type) == 8);
    assert!(offset_of!(Context, ops) + offset_of!(ContextOps, poll_cq) == 96);
    assert!(offset_of!(Context, ops) + offset_of!(ContextOps, req_notify_cq) == 104);
    assert!(offset_of!(Context, ops) + offset_of!(ContextOps, post_send) == 208);
    assert!(offset_of!(Context, ops) + offset_of!(ContextOps, post_recv) == 216);
    assert!(size_of::<ContextOps>() == 256);
    assert!(size_of::<Mr>() == 48 && offset_of!(Mr, addr) == 16 && offset_of!(Mr, length) == 24);
    assert!(offset_of!(Mr, lkey) == 36 && offset_of!(Mr, rkey) == 40);
    assert!(offset_of!(Qp, qp_num) == 52 && offset_of!(Qp, state) == 56);
    assert!(offset_of!(Cq, cqe) == 28);
    assert!(size_of::<Sge>() == 16);
    assert!(size_of::<SendWr>() == 128 && offset_of!(SendWr, opcode) == 28);
    assert!(offset_of!(SendWr, send_flags) == 32 && offset_of!(SendWr, remote_addr) == 40);
    assert!(offset_of!(SendWr, rkey) == 48 && offset_of!(SendWr, _qp_type) == 72);
    assert!(offset_of!(SendWr, _bind_mw_tso) == 80);
    assert!(size_of::<WorkCompletion>() == 48 && offset_of!(WorkCompletion, status) == 8);
    assert!(offset_of!(WorkCompletion, vendor_err) == 16);
    assert!(offset_of!(WorkCompletion, byte_len) == 20);
    assert!(offset_of!(WorkCompletion, qp_num) == 28);
    assert!(size_of::<QpCap>() == 20);
    assert!(size_of::<QpInitAttr>() == 64 && offset_of!(QpInitAttr, cap) == 32);
    assert!(offset_of!(QpInitAttr, qp_type) == 52 && offset_of!(QpInitAttr, sq_sig_all) == 56);
    assert!(size_of::<GlobalRoute>() == 24 && offset_of!(GlobalRoute, flow_label) == 16);
    assert!(offset_of!(GlobalRoute, sgid_index) == 20);
    assert!(size_of::<AhAttr>() == 32 && offset_of!(AhAttr, dlid) == 24);
    assert!(offset_of!(AhAttr, is_global) == 29 && offset_of!(AhAttr, port_num) == 30);
    assert!(size_of::<QpAttr>() == 144 && offset_of!(QpAttr, qp_access_flags) == 32);
    assert!(offset_of!(QpAttr, cap) == 36 && offset_of!(QpAttr, ah_attr) == 56);
    assert!(offset_of!(QpAttr, alt_ah_attr) == 88 && offset_of!(QpAttr, pkey_index) == 120);
    assert!(offset_of!(QpAttr, max_rd_atomic) == 126 && offset_of!(QpAttr, port_num) == 129);
    assert!(offset_of!(QpAttr, timeout) == 130 && offset_of!(QpAttr, retry_cnt) == 131);
    assert!(offset_of!(QpAttr, rnr_retry) == 132 && offset_of!(QpAttr, rate_limit) == 136);
    assert!(size_of::<PortAttr>() == 52 && offset_of!(PortAttr, active_mtu) == 8);
    assert!(offset_of!(PortAttr, lid) == 34 && offset_of!(PortAttr, link_layer) == 46);
    assert!(size_of::<Gid>() == 16);
};

/// `enum ibv_qp_state`.
#[cfg(test)]
pub(crate) const QPS_RESET: c_uint = 0;
pub(crate) const QPS_INIT: c_uint = 1;
pub(crate) const QPS_RTR: c_uint = 2;
pub(crate) const QPS_RTS: c_uint = 3;
pub(crate) const QPS_ERR: c_uint = 6;
/// `IBV_QPT_RC`.
pub(crate) const QPT_RC: c_uint = 2;
/// `enum ibv_wr_opcode`.
pub(crate) const WR_RDMA_WRITE: c_uint = 0;
pub(crate) const WR_RDMA_READ: c_uint = 4;
/// `IBV_SEND_SIGNALED`.
pub(crate) const SEND_SIGNALED: c_uint = 2;
/// `enum ibv_wc_status`.
pub(crate) const WC_SUCCESS: c_uint = 0;
pub(crate) const WC_REM_ACCESS_ERR: c_uint = 10;
/// `enum ibv_event_type`: the asynchronous events that break a CQ or a QP.
pub(crate) const EVENT_CQ_ERR: c_uint = 0;
pub(crate) const EVENT_QP_FATAL: c_uint = 1;
pub(crate) const EVENT_QP_REQ_ERR: c_uint = 2;
pub(crate) const EVENT_QP_ACCESS_ERR: c_uint = 3;
/// `enum ibv_access_flags`.
pub(crate) const ACCESS_LOCAL_WRITE: c_int = 1;
pub(crate) const ACCESS_REMOTE_WRITE: c_int = 2;
pub(crate) const ACCESS_REMOTE_READ: c_int = 4;
/// `enum ibv_qp_attr_mask`.
pub(crate) const QP_STATE: c_int = 1;
pub(crate) const QP_ACCESS_FLAGS: c_int = 8;
pub(crate) const QP_PKEY_INDEX: c_int = 16;
pub(crate) const QP_PORT: c_int = 32;
pub(crate) const QP_AV: c_int = 128;
pub(crate) const QP_PATH_MTU: c_int = 256;
pub(crate) const QP_TIMEOUT: c_int = 512;
pub(crate) const QP_RETRY_CNT: c_int = 1024;
pub(crate) const QP_RNR_RETRY: c_int = 2048;
pub(crate) const QP_RQ_PSN: c_int = 4096;
pub(crate) const QP_MAX_QP_RD_ATOMIC: c_int = 8192;
pub(crate) const QP_MIN_RNR_TIMER: c_int = 32768;
pub(crate) const QP_SQ_PSN: c_int = 65536;
pub(crate) const QP_MAX_DEST_RD_ATOMIC: c_int = 131072;
pub(crate) const QP_DEST_QPN: c_int = 1048576;
/// `IBV_PORT_ACTIVE`.
pub(crate) const PORT_ACTIVE: c_uint = 4;
/// `IBV_LINK_LAYER_ETHERNET`.
pub(crate) const LINK_LAYER_ETHERNET: u8 = 2;

/// The exported entry points used (default symbol versions, `IBVERBS_1.1`).
pub(crate) struct Verbs {
    /// Keeps the library mapped for the life of the process.
    _library: libloading::Library,
    pub(crate) get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void,
    pub(crate) free_device_list: unsafe extern "C" fn(*mut *mut c_void),
    pub(crate) get_device_name: unsafe extern "C" fn(*mut c_void) -> *const c_char,
    pub(crate) open_device: unsafe extern "C" fn(*mut c_void) -> *mut Context,
    pub(crate) close_device: unsafe extern "C" fn(*mut Context) -> c_int,
    pub(crate) query_port: unsafe extern "C" fn(*mut Context, u8, *mut PortAttr) -> c_int,
    pub(crate) query_gid: unsafe extern "C" fn(*mut Context, u8, c_int, *mut Gid) -> c_int,
    pub(crate) alloc_pd: unsafe extern "C" fn(*mut Context) -> *mut c_void,
    pub(crate) dealloc_pd: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub(crate) reg_mr: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut Mr,
    /// `ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access)` (rdma-core 34 and later;
    /// `None` in older libraries): registers memory exported as a dma-buf (GPUDirect).
    pub(crate) reg_dmabuf_mr:
        Option<unsafe extern "C" fn(*mut c_void, u64, usize, u64, c_int, c_int) -> *mut Mr>,
    pub(crate) dereg_mr: unsafe extern "C" fn(*mut Mr) -> c_int,
    pub(crate) create_cq:
        unsafe extern "C" fn(*mut Context, c_int, *mut c_void, *mut c_void, c_int) -> *mut Cq,
    pub(crate) destroy_cq: unsafe extern "C" fn(*mut Cq) -> c_int,
    pub(crate) create_qp: unsafe extern "C" fn(*mut c_void, *mut QpInitAttr) -> *mut Qp,
    pub(crate) modify_qp: unsafe extern "C" fn(*mut Qp, *mut QpAttr, c_int) -> c_int,
    /// Only the layout check queries QPs.
    #[cfg(test)]
    pub(crate) query_qp:
        unsafe extern "C" fn(*mut Qp, *mut QpAttr, c_int, *mut QpInitAttr) -> c_int,
    pub(crate) destroy_qp: unsafe extern "C" fn(*mut Qp) -> c_int,
    pub(crate) create_comp_channel: unsafe extern "C" fn(*mut Context) -> *mut CompChannel,
    pub(crate) destroy_comp_channel: unsafe extern "C" fn(*mut CompChannel) -> c_int,
    pub(crate) get_cq_event:
        unsafe extern "C" fn(*mut CompChannel, *mut *mut Cq, *mut *mut c_void) -> c_int,
    pub(crate) ack_cq_events: unsafe extern "C" fn(*mut Cq, c_uint),
    pub(crate) get_async_event: unsafe extern "C" fn(*mut Context, *mut AsyncEvent) -> c_int,
    pub(crate) ack_async_event: unsafe extern "C" fn(*mut AsyncEvent),
}

/// Resolves `name` in `library` as a function pointer of type `F`.
///
/// # Safety
/// `F` must be the C signature of the symbol.
unsafe fn symbol<F: Copy>(library: &libloading::Library, name: &str) -> Result<F, String> {
    // SAFETY: forwarded from the caller.
    unsafe { library.get::<F>(name.as_bytes()) }
        .map(|found| *found)
        .map_err(|e| format!("symbol {name} is missing: {e}"))
}

impl Verbs {
    /// Opens the first of `names` that loads and resolves every entry point.
    ///
    /// Errors: a message naming the libraries tried and why each failed.
    pub(crate) fn load(names: &[&str]) -> Result<Verbs, String> {
        let mut problems = Vec::new();
        for name in names {
            // SAFETY: libibverbs' initialisers only read its configuration files.
            match unsafe { libloading::Library::new(*name) } {
                Ok(library) => match Verbs::resolve(library) {
                    Ok(verbs) => return Ok(verbs),
                    Err(e) => problems.push(format!("{name}: {e}")),
                },
                Err(e) => problems.push(format!("{name}: {e}")),
            }
        }
        Err(format!(
            "libibverbs cannot be loaded (install rdma-core / libibverbs1): {}",
            problems.join("; ")
        ))
    }

    fn resolve(library: libloading::Library) -> Result<Verbs, String> {
        // SAFETY: every type below is the symbol's prototype in verbs.h.
        unsafe {
            Ok(Verbs {
                get_device_list: symbol(&library, "ibv_get_device_list")?,
                free_device_list: symbol(&library, "ibv_free_device_list")?,
                get_device_name: symbol(&library, "ibv_get_device_name")?,
                open_device: symbol(&library, "ibv_open_device")?,
                close_device: symbol(&library, "ibv_close_device")?,
                query_port: symbol(&library, "ibv_query_port")?,
                query_gid: symbol(&library, "ibv_query_gid")?,
                alloc_pd: symbol(&library, "ibv_alloc_pd")?,
                dealloc_pd: symbol(&library, "ibv_dealloc_pd")?,
                reg_mr: symbol(&library, "ibv_reg_mr")?,
                reg_dmabuf_mr: symbol(&library, "ibv_reg_dmabuf_mr").ok(),
                dereg_mr: symbol(&library, "ibv_dereg_mr")?,
                create_cq: symbol(&library, "ibv_create_cq")?,
                destroy_cq: symbol(&library, "ibv_destroy_cq")?,
                create_qp: symbol(&library, "ibv_create_qp")?,
                modify_qp: symbol(&library, "ibv_modify_qp")?,
                #[cfg(test)]
                query_qp: symbol(&library, "ibv_query_qp")?,
                destroy_qp: symbol(&library, "ibv_destroy_qp")?,
                create_comp_channel: symbol(&library, "ibv_create_comp_channel")?,
                destroy_comp_channel: symbol(&library, "ibv_destroy_comp_channel")?,
                get_cq_event: symbol(&library, "ibv_get_cq_event")?,
                ack_cq_events: symbol(&library, "ibv_ack_cq_events")?,
                get_async_event: symbol(&library, "ibv_get_async_event")?,
                ack_async_event: symbol(&library, "ibv_ack_async_event")?,
                _library: library,
            })
        }
    }
}

static VERBS: OnceCell<Result<Verbs, String>> = OnceCell::new();

/// The process-wide table, loaded on first use from [`LIBRARY_NAMES`]; the error says why
/// it could not be (and stays the answer for the life of the process).
pub(crate) fn verbs() -> Result<&'static Verbs, String> {
    VERBS
        .get_or_init(|| Verbs::load(LIBRARY_NAMES))
        .as_ref()
        .map_err(Clone::clone)
}
