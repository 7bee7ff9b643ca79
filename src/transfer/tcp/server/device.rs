//! Requests on device memory: a transfer endpoint (`mooncake.engine`) may register a GPU
//! buffer for its peers, as SGLang and vLLM register their KV caches. A host access to device
//! memory faults, so the data server neither receives into nor sends from it: each request
//! moves through a host bounce of its own, chunk by chunk, and the device side of every chunk
//! is one driver copy ([`memcpy_safe`]). A driver copy may wait behind the device's queued
//! work, so it runs on the runtime's blocking pool, never on a thread serving connections.

use super::{acknowledge_write, add, before, may_apply, Opcode, ServeContext, SessionHeader};
use super::{Registry, STATUS_LEN};
use super::{Status, Stop};
use crate::device::memcpy_safe;
use std::io;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The most bytes of one request held in host memory at a time.
const BOUNCE_BYTES: usize = 1 << 20;

/// Serves one admitted request whose range is device memory.
///
/// A WRITE's payload is received into the bounce (by the request's deadline) and copied to
/// the device; the OK status follows the last chunk under v2. A READ is counted as served,
/// then each chunk is copied from the device and sent within the I/O timeout, the OK status
/// under v2 in the same send as the first chunk (so a failed first copy sends nothing). A
/// failed driver copy ends the connection abortively ([`Stop::Failed`]), so the initiator
/// sees its transfer fail; a request naming an epoch that changed is [`Stop::Remounted`].
pub(super) async fn serve(
    conn: &mut BufReader<TcpStream>,
    header: SessionHeader,
    deadline: Instant,
    context: &ServeContext,
) -> std::result::Result<(), Stop> {
    let size = header.size as usize;
    let metrics = &context.metrics;
    // The bounce starts with an OK status frame (sent in front of a v2 READ's first chunk),
    // then room for one chunk.
    let mut bounce = Status::Ok.encode().to_vec();
    bounce.resize(STATUS_LEN + size.min(BOUNCE_BYTES), 0);
    if header.opcode == Opcode::Read {
        add(
            &metrics.served_reads,
            &metrics.served_read_bytes,
            header.size,
        );
    }
    let mut done = 0;
    while done < size {
        let len = (size - done).min(BOUNCE_BYTES);
        let at = header.addr + done as u64;
        let chunk = STATUS_LEN..STATUS_LEN + len;
        match header.opcode {
            Opcode::Write => {
                before(deadline, conn.read_exact(&mut bounce[chunk])).await?;
                may_apply(conn.get_ref(), deadline)?;
                bounce = copy(context, header.epoch, at, len, bounce, Direction::ToDevice).await?;
            }
            Opcode::Read => {
                bounce = copy(
                    context,
                    header.epoch,
                    at,
                    len,
                    bounce,
                    Direction::FromDevice,
                )
                .await?;
                let first_with_status = done == 0 && header.v2;
                let from = if first_with_status { 0 } else { STATUS_LEN };
                let sent = conn.get_mut().write_all(&bounce[from..STATUS_LEN + len]);
                before(Instant::now() + context.io_timeout, sent).await?;
            }
        }
        done += len;
    }
    if header.opcode == Opcode::Write {
        acknowledge_write(conn, &header, context).await?;
    }
    Ok(())
}

/// Which way a chunk moves between the bounce and the device.
#[derive(Clone, Copy)]
enum Direction {
    ToDevice,
    FromDevice,
}

/// One driver copy of `len` bytes between the bounce (after its status room) and device
/// address `at`, on the blocking pool; gives the bounce back. A request naming an epoch is
/// copied under the registry's epoch fence (a remount waits for the copy); one naming none
/// (a transfer endpoint's) needs no fence.
async fn copy(
    context: &ServeContext,
    epoch: Option<u64>,
    at: u64,
    len: usize,
    mut bounce: Vec<u8>,
    direction: Direction,
) -> std::result::Result<Vec<u8>, Stop> {
    let registry: Arc<Registry> = Arc::clone(&context.registry);
    let copied = tokio::task::spawn_blocking(move || {
        let host = &mut bounce[STATUS_LEN..STATUS_LEN + len];
        let device = at as usize;
        // SAFETY: [at, at+len) lies inside a registered range `admit` accepted, which the
        // registering caller keeps valid while registered; `host` is ours and `len` long.
        let mut access = || unsafe {
            match direction {
                Direction::ToDevice => memcpy_safe(device as *mut u8, host.as_ptr(), len),
                Direction::FromDevice => memcpy_safe(host.as_mut_ptr(), device as *const u8, len),
            }
        };
        let copied = match epoch {
            Some(_) => registry.fenced(at, len as u64, epoch, access),
            None => Ok(access()),
        };
        (bounce, copied)
    })
    .await;
    let (bounce, copied) = copied
        .map_err(|e| Stop::Failed(io::Error::other(format!("device copy task failed: {e}"))))?;
    match copied.map_err(|_| Stop::Remounted)? {
        Ok(_) => Ok(bounce),
        Err(why) => Err(Stop::Failed(io::Error::other(format!(
            "device copy of {len} bytes at {at:#x} failed: {why}"
        )))),
    }
}
