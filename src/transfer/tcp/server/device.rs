//! Requests on device memory: a transfer endpoint (`mooncake.engine`) may register a GPU
//! buffer for its peers, as SGLang and vLLM register their KV caches. A host access to device
//! memory faults, so the data server neither receives into nor sends from it: each request
//! moves through a host bounce of its own, chunk by chunk, and the device side of every chunk
//! is one driver copy ([`memcpy_safe`]) made under the registry's epoch fence.

use super::{add, before, may_apply, Opcode, ServeContext, SessionHeader, Status, Stop};
use crate::device::memcpy_safe;
use std::io;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The most bytes of one request held in host memory at a time.
const BOUNCE_BYTES: usize = 1 << 20;

/// Serves one admitted request whose range is device memory: a WRITE's payload is received
/// into the bounce and copied to the device (the OK status after the last chunk under v2), a
/// READ's bytes are copied from the device into the bounce and sent (after the OK status
/// under v2). Counted as served like host requests. A failed driver copy ends the connection
/// abortively ([`Stop::Failed`]), so the initiator sees its transfer fail; a remount
/// mid-request is [`Stop::Remounted`].
pub(super) async fn serve(
    conn: &mut BufReader<TcpStream>,
    header: SessionHeader,
    deadline: Instant,
    context: &ServeContext,
) -> std::result::Result<(), Stop> {
    let size = header.size as usize;
    let mut bounce = vec![0u8; size.min(BOUNCE_BYTES)];
    if header.opcode == Opcode::Read && header.v2 {
        conn.get_mut().write_all(&Status::Ok.encode()).await?;
    }
    let mut done = 0;
    while done < size {
        let chunk = &mut bounce[..(size - done).min(BOUNCE_BYTES)];
        let at = header.addr + done as u64;
        match header.opcode {
            Opcode::Write => {
                before(deadline, conn.read_exact(chunk)).await?;
                may_apply(conn.get_ref(), deadline)?;
                copy(context, header.epoch, at, chunk, Direction::ToDevice)?;
            }
            Opcode::Read => {
                copy(context, header.epoch, at, chunk, Direction::FromDevice)?;
                let sent = conn.get_mut().write_all(chunk);
                before(Instant::now() + context.io_timeout, sent).await?;
            }
        }
        done += chunk.len();
    }
    let metrics = &context.metrics;
    match header.opcode {
        Opcode::Write => {
            add(
                &metrics.served_writes,
                &metrics.served_write_bytes,
                header.size,
            );
            if header.v2 {
                conn.get_mut().write_all(&Status::Ok.encode()).await?;
            }
        }
        Opcode::Read => add(
            &metrics.served_reads,
            &metrics.served_read_bytes,
            header.size,
        ),
    }
    Ok(())
}

/// Which way a chunk moves between the bounce and the device.
enum Direction {
    ToDevice,
    FromDevice,
}

/// One driver copy between `chunk` and device address `at` (inside the range the request was
/// admitted for), under the epoch fence of the request.
fn copy(
    context: &ServeContext,
    epoch: Option<u64>,
    at: u64,
    chunk: &mut [u8],
    direction: Direction,
) -> std::result::Result<(), Stop> {
    let (len, device) = (chunk.len(), at as usize);
    let copied = context.registry.fenced(at, len as u64, epoch, || {
        // SAFETY: [at, at+len) lies inside a registered range `admit` accepted, which the
        // registering caller keeps valid while registered; `chunk` is ours and `len` long.
        unsafe {
            match direction {
                Direction::ToDevice => memcpy_safe(device as *mut u8, chunk.as_ptr(), len),
                Direction::FromDevice => memcpy_safe(chunk.as_mut_ptr(), device as *const u8, len),
            }
        }
    });
    match copied.map_err(|_| Stop::Remounted)? {
        Ok(_) => Ok(()),
        Err(why) => Err(Stop::Failed(io::Error::other(format!(
            "device copy of {len} bytes at {at:#x} failed: {why}"
        )))),
    }
}
