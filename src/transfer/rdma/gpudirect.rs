//! GPUDirect: registering device memory with a NIC directly, so RDMA reads and writes move
//! its bytes without a staging copy through host memory.
//!
//! Two ways, tried in order (as NVIDIA documents them):
//! 1. **dma-buf**: the device runtime exports the allocation as a dma-buf
//!    ([`crate::device::Runtime::export_dmabuf`], CUDA's `cuMemGetHandleForAddressRange`) and
//!    the NIC registers it (`ibv_reg_dmabuf_mr`; kernel 5.12+, rdma-core 34+, a driver that
//!    supports it).
//! 2. **peer memory**: a plain `ibv_reg_mr` of the device address, which a peer-memory
//!    kernel module (`nvidia-peermem`) resolves.
//!
//! When both fail the range has no registration and its transfers are staged through the
//! registered bounce buffers as before (counted in `rdma_bounce_*` and `device_staging_*`);
//! transfers through a registration are counted in `rdma_gpudirect_bytes`.

use super::device::{RdmaDevice, Registration};
use crate::error::{fail, last_error_message, ErrorCode, Result};
use std::os::fd::AsFd;
use std::sync::Arc;

/// Registers the device memory `[addr, addr+len)` on `device` (see the module doc), only
/// where the device runtime can flush the NIC's writes into that memory (so a READ's bytes
/// are visible to later device work when it completes); peers may reach it only when
/// `remote_accessible`.
///
/// Errors: `TRANSFER_FAIL` with a message naming why: no flush, or why each way failed.
pub(crate) fn register(
    device: &Arc<RdmaDevice>,
    addr: usize,
    len: usize,
    remote_accessible: bool,
) -> Result<Registration> {
    let runtime = crate::device::runtime();
    let ordinal = runtime.classify(addr).device().unwrap_or(0);
    if let Err(why) = runtime.can_flush_nic_writes(ordinal) {
        return fail(
            ErrorCode::TransferFail,
            format!(
                "device memory at {addr:#x} is not registered on {} (GPUDirect): {why}",
                device.name()
            ),
        );
    }
    let dmabuf = runtime.export_dmabuf(addr, len).and_then(|buf| {
        device
            .register_dmabuf(
                buf.fd.as_fd(),
                buf.offset,
                len,
                addr as u64,
                remote_accessible,
            )
            .map_err(|_| without_code(&last_error_message()).to_string())
    });
    let dmabuf_problem = match dmabuf {
        Ok(registration) => {
            tracing::debug!(
                addr,
                len,
                device = device.name(),
                "device memory registered by dma-buf"
            );
            return Ok(registration);
        }
        Err(problem) => problem,
    };
    match device.register(addr, len, remote_accessible) {
        Ok(registration) => {
            tracing::debug!(
                addr,
                len,
                device = device.name(),
                "device memory registered by peer memory"
            );
            Ok(registration)
        }
        Err(_) => fail(
            ErrorCode::TransferFail,
            format!(
                "device memory at {addr:#x} (+{len}) cannot be registered on {} (GPUDirect): \
                 dma-buf: {dmabuf_problem}; peer memory: {}",
                device.name(),
                without_code(&last_error_message())
            ),
        ),
    }
}

/// `message` without the `CODE: ` prefix a failure's message starts with, for nesting it in
/// another message.
fn without_code(message: &str) -> &str {
    message.split_once(": ").map_or(message, |(_, rest)| rest)
}
