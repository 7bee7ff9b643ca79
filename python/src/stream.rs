//! Seed 000 in Python: loads and puts on a caller's stream (`*_on_stream`), their `Ticket`,
//! and our host streams and events (`HostStream`, `HostEvent`) so a CPU-only pipeline can be
//! written in Python. Semantics are the C API's (`mc_store_*_on_stream`, `mc_ticket_*`,
//! `mc_host_stream_*`, `mc_host_event_*`; see docs/c-api.md).
//!
//! `stream` arguments: an `int` handle (0 is the blocking call; another value is a CUDA
//! stream, or an Ascend stream with `stream_kind="ascend"`), a `HostStream`, or any object
//! with an integer `cuda_stream` (e.g. `torch.cuda.Stream`) or `npu_stream` attribute.

use crate::config::{client_config, PyReplicateConfig};
use crate::convert::{self, INVALID, U64};
use crate::memory::{self, Access};
use crate::ops_ranges::session_shapes;
use crate::ops_zero_copy::{multi, single};
use crate::store::Store;
use mooncake_rs::client::{Buf, Client};
use mooncake_rs::error::{fail, ErrorCode, Result};
use mooncake_rs::stream::{HostEvent, HostStream, StreamRef, Ticket};
use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use std::time::Duration;

/// Seconds (`None`: no limit) as a wait limit; negative means no limit.
fn limit(timeout: Option<f64>) -> Option<Duration> {
    timeout.and_then(|s| {
        Duration::try_from_secs_f64(s.max(0.0))
            .ok()
            .filter(|_| s >= 0.0)
    })
}

/// A host stream: Python callables and on-stream transfers run in enqueue order on one
/// dedicated thread. Closing or collecting it runs everything already enqueued first (work
/// still queued when the interpreter exits without collecting it does not run). Thread-safe.
#[pyclass(frozen, module = "mooncake.store", name = "HostStream")]
pub struct PyHostStream {
    stream: Mutex<Option<HostStream>>,
}

/// A host stream handle that is never dropped with the GIL held: dropping the last handle
/// drains the stream and joins its thread, and queued Python callables need the GIL to
/// finish. Any handle may turn out to be the last (another thread may close the Python
/// object meanwhile), so every handle taken from a `HostStream` object is one of these.
struct StreamHandle(std::mem::ManuallyDrop<HostStream>);

impl StreamHandle {
    fn new(stream: HostStream) -> StreamHandle {
        StreamHandle(std::mem::ManuallyDrop::new(stream))
    }
}

impl std::ops::Deref for StreamHandle {
    type Target = HostStream;

    fn deref(&self) -> &HostStream {
        &self.0
    }
}

impl Drop for StreamHandle {
    fn drop(&mut self) {
        // SAFETY: taken exactly once, here; the field is never used again.
        let stream = unsafe { std::mem::ManuallyDrop::take(&mut self.0) };
        Python::attach(|py| py.detach(move || drop(stream)));
    }
}

impl PyHostStream {
    fn get(&self) -> PyResult<StreamHandle> {
        let stream = self.stream.lock().clone();
        stream
            .map(StreamHandle::new)
            .ok_or_else(|| PyRuntimeError::new_err("host stream is closed"))
    }
}

impl Drop for PyHostStream {
    fn drop(&mut self) {
        drop(self.stream.get_mut().take().map(StreamHandle::new));
    }
}

#[pymethods]
impl PyHostStream {
    /// Starts a stream and its thread (`RuntimeError` if the thread cannot start).
    #[new]
    fn new() -> PyResult<Self> {
        let stream = HostStream::new().map_err(PyRuntimeError::new_err)?;
        Ok(PyHostStream {
            stream: Mutex::new(Some(stream)),
        })
    }

    /// Enqueues `fn()`: it runs on the stream's thread (with the GIL) after everything
    /// enqueued before; an exception it raises is printed and the stream goes on.
    fn launch(&self, func: Py<PyAny>) -> PyResult<()> {
        if !Python::attach(|py| func.bind(py).is_callable()) {
            return Err(PyTypeError::new_err("launch() needs a callable"));
        }
        self.get()?.launch(move || {
            Python::attach(|py| {
                if let Err(e) = func.call0(py) {
                    e.print(py);
                }
            })
        });
        Ok(())
    }

    /// Makes work enqueued later wait until `event`'s last record has completed.
    fn wait_event(&self, event: PyRef<'_, PyHostEvent>) -> PyResult<()> {
        self.get()?.wait_event(&event.event);
        Ok(())
    }

    /// Waits (GIL released) until everything enqueued so far has run; `False` on timeout
    /// (`timeout` in seconds, `None` = no limit).
    #[pyo3(signature = (timeout = None))]
    fn synchronize(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let stream = self.get()?;
        Ok(py.detach(|| stream.synchronize(limit(timeout))))
    }

    /// Runs what is enqueued, then stops the thread (GIL released). Idempotent; later
    /// calls on this stream raise `RuntimeError`.
    fn close(&self) {
        let stream = self.stream.lock().take();
        drop(stream.map(StreamHandle::new));
    }
}

/// A host event: a point in a host stream that threads or other host streams wait for.
/// Thread-safe.
#[pyclass(frozen, module = "mooncake.store", name = "HostEvent")]
pub struct PyHostEvent {
    event: HostEvent,
}

#[pymethods]
impl PyHostEvent {
    #[new]
    fn new() -> Self {
        PyHostEvent {
            event: HostEvent::new(),
        }
    }

    /// Records the event at the current end of `stream`.
    fn record(&self, stream: PyRef<'_, PyHostStream>) -> PyResult<()> {
        self.event.record(&*stream.get()?);
        Ok(())
    }

    /// Whether the stream has passed the last record (`True` when never recorded).
    fn query(&self) -> bool {
        self.event.query()
    }

    /// Waits (GIL released) for the last record; `False` on timeout (seconds; `None` = no
    /// limit).
    #[pyo3(signature = (timeout = None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> bool {
        py.detach(|| self.event.wait(limit(timeout)))
    }
}

/// The outcome of one on-stream call. `status()` is `Ticket.PENDING` (1) until the stream has
/// passed the call, then 0 or the first error. Releasing it early is safe: the library keeps
/// what it needs until the stream reaches the call's release point. After `release()` (or
/// the end of a `with` block) every query returns -600. Thread-safe.
#[pyclass(frozen, module = "mooncake.store", name = "Ticket")]
pub struct PyTicket {
    ticket: Mutex<Option<Ticket>>,
}

impl PyTicket {
    fn get(&self) -> Option<Ticket> {
        self.ticket.lock().clone()
    }
}

#[pymethods]
impl PyTicket {
    /// The status while the call is not final.
    #[classattr]
    const PENDING: i32 = mooncake_rs::stream::TICKET_PENDING;

    /// 1 pending, 0 every key succeeded, else the first error's code.
    fn status(&self) -> i64 {
        self.get().map_or(INVALID, |t| i64::from(t.status()))
    }

    /// Waits (GIL released) until final or `timeout` seconds (`None` = no limit) pass;
    /// returns the status (1 on timeout).
    #[pyo3(signature = (timeout = None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> i64 {
        match self.get() {
            Some(t) => i64::from(py.detach(|| t.wait(limit(timeout)))),
            None => INVALID,
        }
    }

    /// Per key, in call order: the bytes moved or a negative code (pending keys read 1).
    fn results(&self) -> Vec<i64> {
        self.get()
            .map_or_else(Vec::new, |t| convert::counts(t.results()))
    }

    /// Number of keys of the call (0 after release).
    fn key_count(&self) -> usize {
        self.get().map_or(0, |t| t.results().len())
    }

    /// Drops this handle's hold on the call (safe at any time).
    fn release(&self) {
        self.ticket.lock().take();
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.release();
        false
    }
}

/// A `stream` argument, resolved; `Host` keeps the host stream alive for the call.
enum Stream {
    Blocking,
    Host(StreamHandle),
    Cuda(usize),
    Ascend(usize),
}

impl Stream {
    fn as_ref(&self) -> StreamRef<'_> {
        match self {
            Stream::Blocking => StreamRef::Blocking,
            Stream::Host(s) => StreamRef::Host(s),
            Stream::Cuda(s) => StreamRef::Cuda(*s),
            Stream::Ascend(s) => StreamRef::Ascend(*s),
        }
    }
}

/// Resolves a `stream` argument (see the module doc). `TypeError` for other objects;
/// `Ok(Err(-600))` for an unknown `stream_kind`.
fn resolve(stream: &Bound<'_, PyAny>, kind: Option<&str>) -> PyResult<Result<Stream>> {
    if let Ok(host) = stream.cast::<PyHostStream>() {
        return Ok(Ok(Stream::Host(host.get().get()?)));
    }
    let (handle, default_kind) = if let Ok(h) = stream.extract::<U64>() {
        (h.usize(), "cuda")
    } else if let Ok(h) = stream
        .getattr("cuda_stream")
        .and_then(|v| v.extract::<U64>())
    {
        (h.usize(), "cuda")
    } else if let Ok(h) = stream
        .getattr("npu_stream")
        .and_then(|v| v.extract::<U64>())
    {
        (h.usize(), "ascend")
    } else {
        return Err(PyTypeError::new_err(
            "stream must be an int handle, a HostStream, or an object with an integer cuda_stream / npu_stream attribute",
        ));
    };
    Ok(match (kind.unwrap_or(default_kind), handle) {
        ("cuda" | "ascend", 0) => Ok(Stream::Blocking),
        ("cuda", h) => Ok(Stream::Cuda(h)),
        ("ascend", h) => Ok(Stream::Ascend(h)),
        (other, _) => fail(
            ErrorCode::InvalidParams,
            format!("stream_kind '{other}' is not 'cuda' or 'ascend'"),
        ),
    })
}

/// A ticket, or the call's error code.
fn outcome(py: Python<'_>, result: Result<Ticket>) -> PyResult<Py<PyAny>> {
    Ok(match result {
        Ok(ticket) => Py::new(
            py,
            PyTicket {
                ticket: Mutex::new(Some(ticket)),
            },
        )?
        .into_any(),
        Err(e) => convert::code(e).into_pyobject(py)?.into_any().unbind(),
    })
}

impl Store {
    /// Common part of the on-stream calls: resolves the stream, checks the buffers, runs
    /// `issue` with the GIL released, and wraps the ticket or the code.
    fn on_stream(
        &self,
        py: Python<'_>,
        stream: &Bound<'_, PyAny>,
        kind: Option<&str>,
        bufs: Option<Vec<Vec<Buf>>>,
        access: Access,
        issue: impl FnOnce(&Client, Vec<Vec<Buf>>, StreamRef<'_>) -> Result<Ticket> + Send,
    ) -> PyResult<Py<PyAny>> {
        let stream = resolve(stream, kind)?;
        let result = match (self.client(), bufs, stream) {
            (None, _, _) => fail(ErrorCode::InvalidParams, "store is not set up"),
            (_, None, _) => fail(
                ErrorCode::InvalidParams,
                "buffer lists do not match the keys",
            ),
            (_, _, Err(e)) => Err(e),
            (Some(client), Some(bufs), Ok(stream)) => py.detach(|| {
                memory::check(&client, &bufs, access)?;
                issue(&client, bufs, stream.as_ref())
            }),
        };
        outcome(py, result)
    }

    /// The stream-ordered puts: key `i`'s object is `bufs[i]` laid end to end.
    fn put_on_stream(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        bufs: Option<Vec<Vec<Buf>>>,
        stream: &Bound<'_, PyAny>,
        config: Option<&PyReplicateConfig>,
        kind: Option<&str>,
    ) -> PyResult<Py<PyAny>> {
        let config = client_config(config, keys.len());
        // SAFETY: the sources were checked; the caller keeps them unchanged until the stream
        // passed the call.
        self.on_stream(py, stream, kind, bufs, Access::Read, |c, bufs, s| unsafe {
            c.batch_put_from_on_stream_raw(&keys, bufs, &config?, s)
        })
    }
}

#[pymethods]
impl Store {
    /// `batch_get_into` on `stream`: returns a `Ticket` once the copies are enqueued (the
    /// objects stay pinned until the stream passed them), or a negative code (-600 bad
    /// arguments, -1012 no runtime for the stream kind, -9001 try again, -9002 capturing).
    #[pyo3(signature = (keys, buffer_ptrs, sizes, stream, stream_kind = None))]
    fn batch_get_into_on_stream(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<U64>,
        sizes: Vec<U64>,
        stream: &Bound<'_, PyAny>,
        stream_kind: Option<String>,
    ) -> PyResult<Py<PyAny>> {
        let bufs = single(&buffer_ptrs, &sizes, keys.len());
        // SAFETY: the destinations were checked; the caller keeps them valid until the stream passed the call.
        self.on_stream(
            py,
            stream,
            stream_kind.as_deref(),
            bufs,
            Access::Write,
            |c, bufs, s| unsafe { c.batch_get_into_on_stream_raw(&keys, bufs, false, s) },
        )
    }

    /// `batch_get_into_multi_buffers` on `stream` (seed 000's call); as
    /// `batch_get_into_on_stream`.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, stream, stream_kind = None))]
    fn batch_get_into_multi_buffers_on_stream(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<U64>>,
        all_sizes: Vec<Vec<U64>>,
        stream: &Bound<'_, PyAny>,
        stream_kind: Option<String>,
    ) -> PyResult<Py<PyAny>> {
        let bufs = multi(&all_buffer_ptrs, &all_sizes, keys.len());
        // SAFETY: as `batch_get_into_on_stream`.
        self.on_stream(
            py,
            stream,
            stream_kind.as_deref(),
            bufs,
            Access::Write,
            |c, bufs, s| unsafe { c.batch_get_into_on_stream_raw(&keys, bufs, true, s) },
        )
    }

    /// `batch_get_into_multi_buffer_ranges` on `stream`, inside get sessions: no master call.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, all_src_offsets, stream, stream_kind = None))]
    #[allow(clippy::too_many_arguments)]
    fn get_into_ranges_on_stream(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<U64>>,
        all_sizes: Vec<Vec<U64>>,
        all_src_offsets: Vec<Vec<U64>>,
        stream: &Bound<'_, PyAny>,
        stream_kind: Option<String>,
    ) -> PyResult<Py<PyAny>> {
        let n = keys.len();
        let (shapes, src) = session_shapes(&all_buffer_ptrs, &all_sizes, &all_src_offsets, n);
        let bufs = shapes
            .filter(|(_, ok)| ok.iter().all(|&ok| ok))
            .map(|(bufs, _)| bufs);
        // SAFETY: as `batch_get_into_on_stream`.
        self.on_stream(
            py,
            stream,
            stream_kind.as_deref(),
            bufs,
            Access::Write,
            |c, bufs, s| unsafe {
                c.batch_get_into_multi_buffer_ranges_on_stream_raw(&keys, bufs, &src, s)
            },
        )
    }

    /// `batch_put_from` on `stream`: the sources are read when the stream reaches the call,
    /// the objects commit after; per-key outcomes in the ticket.
    #[pyo3(signature = (keys, buffer_ptrs, sizes, stream, config = None, stream_kind = None))]
    #[allow(clippy::too_many_arguments)]
    fn batch_put_from_on_stream(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: Vec<U64>,
        sizes: Vec<U64>,
        stream: &Bound<'_, PyAny>,
        config: Option<PyReplicateConfig>,
        stream_kind: Option<String>,
    ) -> PyResult<Py<PyAny>> {
        let bufs = single(&buffer_ptrs, &sizes, keys.len());
        self.put_on_stream(
            py,
            keys,
            bufs,
            stream,
            config.as_ref(),
            stream_kind.as_deref(),
        )
    }

    /// `batch_put_from_multi_buffers` on `stream`; as `batch_put_from_on_stream`.
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, stream, config = None, stream_kind = None))]
    #[allow(clippy::too_many_arguments)]
    fn batch_put_from_multi_buffers_on_stream(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: Vec<Vec<U64>>,
        all_sizes: Vec<Vec<U64>>,
        stream: &Bound<'_, PyAny>,
        config: Option<PyReplicateConfig>,
        stream_kind: Option<String>,
    ) -> PyResult<Py<PyAny>> {
        let bufs = multi(&all_buffer_ptrs, &all_sizes, keys.len());
        self.put_on_stream(
            py,
            keys,
            bufs,
            stream,
            config.as_ref(),
            stream_kind.as_deref(),
        )
    }
}
