//! The on-stream operations of a worker: gets and puts issued on the worker's host stream
//! (`batch_get_into_on_stream_raw`, `batch_put_from_on_stream_raw`), journaled like their
//! synchronous twins once the ticket is final and the stream synchronized.
//!
//! A ticket whose final status is 0 with a failed key, or a ticket or stream still busy after
//! [`STREAM_WAIT`], is journaled as a `Corrupt` event (a violation); the buffers of a call
//! that never finished are leaked, never freed under the stream.

use crate::journal::{now_ns, Event};
use crate::value;
use crate::worker::Worker;
use mooncake_rs::client::Buf;
use mooncake_rs::stream::{StreamRef, Ticket, TICKET_PENDING};
use mooncake_rs::ErrorCode;
use std::time::Duration;

/// How long a worker waits for a ticket to become final and then for its stream to drain.
pub const STREAM_WAIT: Duration = Duration::from_secs(30);

/// A final ticket's per-key outcomes, or why there are none.
enum Outcome {
    /// The call was refused: nothing enqueued.
    Refused(ErrorCode),
    /// The ticket's status and per-key results.
    Final(i32, Vec<Result<u64, ErrorCode>>),
    /// Ticket pending or stream busy past [`STREAM_WAIT`].
    Hung(String),
}

/// Waits (bounded) for `ticket` and then for the worker's stream.
fn settle(worker: &Worker, issued: Result<Ticket, ErrorCode>) -> Outcome {
    let ticket = match issued {
        Ok(ticket) => ticket,
        Err(code) => return Outcome::Refused(code),
    };
    let status = ticket.wait(Some(STREAM_WAIT));
    if status == TICKET_PENDING {
        return Outcome::Hung(format!("ticket pending after {STREAM_WAIT:?}"));
    }
    if !worker.stream.synchronize(Some(STREAM_WAIT)) {
        return Outcome::Hung(format!(
            "stream busy {STREAM_WAIT:?} after its ticket ({status})"
        ));
    }
    Outcome::Final(status, ticket.results())
}

/// The contradiction of a final status 0 with a failed key, if there is one.
fn contradiction(status: i32, result: &Result<u64, ErrorCode>) -> Option<String> {
    match result {
        Err(code) if status == 0 => Some(format!("ticket status 0 but the key failed ({code:?})")),
        _ => None,
    }
}

impl Worker {
    fn corrupt(&mut self, op: &str, begin: u64, key: &str, detail: String) -> std::io::Result<()> {
        self.journal.record(&Event::Corrupt {
            begin,
            end: now_ns(),
            op: op.into(),
            key: key.into(),
            detail,
        })
    }

    /// 1–4 keys read on the stream into fresh (unregistered, zeroed) buffers.
    pub(crate) fn stream_get(&mut self) -> std::io::Result<()> {
        let count = self.rng.usize(1..=4);
        let keys = self.distinct_keys(count);
        let size = self.args.max_value.max(value::HEADER_LEN);
        let mut outs: Vec<Vec<u8>> = keys.iter().map(|_| vec![0u8; size]).collect();
        let dsts = outs
            .iter_mut()
            .map(|o| vec![Buf::new(o.as_mut_ptr() as usize, o.len() as u64)])
            .collect();
        let begin = now_ns();
        // SAFETY: `outs` is neither touched nor freed until the ticket is final and the stream
        // has drained (`settle`); when it never does they are leaked below.
        let issued = unsafe {
            self.client.batch_get_into_on_stream_raw(
                &keys,
                dsts,
                false,
                StreamRef::Host(&self.stream),
            )
        };
        match settle(self, issued) {
            Outcome::Refused(code) => {
                for key in &keys {
                    self.record_whole("stream_get", begin, key, Err(code))?;
                }
            }
            Outcome::Hung(detail) => {
                std::mem::forget(outs);
                for key in &keys {
                    self.corrupt("stream_get", begin, key, detail.clone())?;
                }
            }
            Outcome::Final(status, results) => {
                for ((key, result), out) in keys.iter().zip(results).zip(&outs) {
                    match contradiction(status, &result) {
                        Some(detail) => self.corrupt("stream_get", begin, key, detail)?,
                        None => {
                            let bytes = result.map(|n| &out[..(n as usize).min(out.len())]);
                            self.record_whole("stream_get", begin, key, bytes)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// 1–4 keys put on the stream, each from up to three source buffers (insert if absent).
    pub(crate) fn stream_put(&mut self) -> std::io::Result<()> {
        const OP: &str = "stream_put";
        let count = self.rng.usize(1..=4);
        let keys = self.distinct_keys(count);
        let mut versions = Vec::with_capacity(keys.len());
        let mut values = Vec::with_capacity(keys.len());
        let mut srcs = Vec::with_capacity(keys.len());
        for key in &keys {
            let version = self.version();
            let len = self.length().min(self.args.max_value);
            let bytes = value::build(key, version, len);
            let a = self.rng.usize(0..=len);
            let b = self.rng.usize(a..=len);
            let base = bytes.as_ptr() as usize;
            srcs.push(
                [(0, a), (a, b), (b, len)]
                    .iter()
                    .map(|&(from, to)| Buf::new(base + from, (to - from) as u64))
                    .collect::<Vec<Buf>>(),
            );
            versions.push(version);
            values.push(bytes);
            self.begin(OP, key, version)?;
        }
        let begin = now_ns();
        // SAFETY: `values` (the sources) stay alive and unchanged until the ticket is final
        // and the stream has drained (`settle`); when it never does they are leaked below.
        let issued = unsafe {
            self.client.batch_put_from_on_stream_raw(
                &keys,
                srcs,
                &self.config,
                StreamRef::Host(&self.stream),
            )
        };
        match settle(self, issued) {
            Outcome::Refused(code) => {
                for (key, version) in keys.iter().zip(&versions) {
                    self.end(key, *version, code.code())?;
                }
            }
            Outcome::Hung(detail) => {
                std::mem::forget(values);
                for (key, version) in keys.iter().zip(&versions) {
                    self.corrupt(OP, begin, key, detail.clone())?;
                    self.end(key, *version, TICKET_PENDING)?;
                }
            }
            Outcome::Final(status, results) => {
                for ((key, version), result) in keys.iter().zip(&versions).zip(results) {
                    if let Some(detail) = contradiction(status, &result) {
                        self.corrupt(OP, begin, key, detail)?;
                    }
                    let code = result.err().map_or(0, |code| code.code());
                    self.end(key, *version, code)?;
                }
            }
        }
        Ok(())
    }
}
