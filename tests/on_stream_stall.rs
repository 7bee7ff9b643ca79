//! The stream engine never hangs (issue 12, finding 4), with the real binaries: a stopped
//! master does not keep gates closed (unpins are asynchronous and the deadline scan has its
//! own timer), a stopped peer does not pin the fetch workers (a fetch past its ticket's
//! deadline is handed off and a fresh worker takes its place), and teardown returns within
//! its bound with both stopped. All tests of this binary share one set of process-wide
//! timeouts (set once, before any client starts).

mod common;

use common::streams::{buf, on, Blocker};
use common::{local_client, pattern, wait_until, Master, PeerClient};
use mooncake_rs::client::Client;
use mooncake_rs::stream::{HostStream, StreamRef, Ticket};
use mooncake_rs::ErrorCode;
use std::sync::Once;
use std::time::{Duration, Instant};

/// Objects are under the transfer engine's 1 MiB slice, so each fetch is one socket
/// exchange on the fetch worker's own thread.
const SIZE: usize = 512 << 10;
/// `MC_STREAM_TIMEOUT_MS` of this binary.
const DEADLINE: Duration = Duration::from_millis(500);
/// How late after its deadline a gate may open on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(1500);
/// `MC_STREAM_TEARDOWN_MS` of this binary.
const TEARDOWN: Duration = Duration::from_millis(1000);
const LIMIT: Option<Duration> = Some(Duration::from_secs(20));

/// Short ticket deadlines, a transfer timeout far beyond any test (a stopped peer's
/// transfer stays stuck), a master request timeout well above the deadline.
fn timeouts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::env::set_var("MC_STREAM_TIMEOUT_MS", DEADLINE.as_millis().to_string());
        std::env::set_var("MC_STREAM_TEARDOWN_MS", TEARDOWN.as_millis().to_string());
        std::env::set_var("MC_TRANSFER_TIMEOUT_MS", "30000");
        std::env::set_var("MC_RPC_TIMEOUT_MS", "5000");
    });
}

/// A master, a healthy peer and a peer to be stopped, and `keys` written to each of them
/// (`h<i>` on the healthy one, `s<i>` on the other) through `reader`.
struct Cluster {
    master: Master,
    _healthy: PeerClient,
    stuck: PeerClient,
    reader: Client,
}

impl Cluster {
    fn start(keys: usize, reader_segment: u64) -> Cluster {
        timeouts();
        let master = Master::start(&[]);
        let healthy = PeerClient::start(&master.addr(), "16 MB");
        let stuck = PeerClient::start(&master.addr(), "16 MB");
        let reader = local_client(&master.addr(), reader_segment, 0);
        for i in 0..keys {
            let h = pattern(SIZE, i as u8);
            reader
                .put_from(&format!("h{i}"), &h, &on(&healthy.name))
                .unwrap();
            let s = pattern(SIZE, 100 + i as u8);
            reader
                .put_from(&format!("s{i}"), &s, &on(&stuck.name))
                .unwrap();
        }
        Cluster {
            master,
            _healthy: healthy,
            stuck,
            reader,
        }
    }

    /// Gets `key` into `out` on `stream`.
    fn get(&self, key: &str, out: &mut [u8], stream: &HostStream) -> Ticket {
        // SAFETY: every `out` of these tests outlives its stream's synchronize.
        unsafe {
            self.reader.batch_get_into_on_stream_raw(
                &[key],
                vec![buf(out)],
                false,
                StreamRef::Host(stream),
            )
        }
        .expect("on-stream get issued")
    }

    fn active_pins(&self) -> Option<u64> {
        let text = self.master.http_get("/metrics");
        text.lines()
            .find(|l| l.starts_with("mooncake_master_active_pins{"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.trim().parse().ok())
    }
}

/// Waits for `ticket`'s final status; asserts it came by `issued + DEADLINE + SLACK`.
fn final_by_deadline(ticket: &Ticket, issued: Instant, what: &str) -> i32 {
    let status = ticket.wait(LIMIT);
    let took = issued.elapsed();
    assert!(
        took <= DEADLINE + SLACK,
        "{what}: final after {took:?}, deadline {DEADLINE:?} + slack {SLACK:?}"
    );
    status
}

#[test]
fn a_stopped_master_does_not_keep_gates_closed_and_unpins_arrive_after_it_resumes() {
    let c = Cluster::start(1, 8 << 20);
    c.stuck.signal(libc::SIGSTOP);
    let (fast, slow) = (HostStream::new().unwrap(), HostStream::new().unwrap());
    let mut good = vec![0u8; SIZE];
    let mut late = vec![0u8; SIZE];
    let issued = Instant::now();
    let stuck_ticket = c.get("s0", &mut late, &slow);
    // The fast stream passes the healthy ticket only once the master is stopped.
    let blocker = Blocker::block(&fast);
    let healthy_ticket = c.get("h0", &mut good, &fast);
    assert_eq!(c.active_pins(), Some(2));
    c.master.signal(libc::SIGSTOP);
    blocker.release();
    // The healthy ticket's release (and its unpin) happens while the master is stopped.
    assert_eq!(final_by_deadline(&healthy_ticket, issued, "healthy"), 0);
    assert_eq!(good, pattern(SIZE, 0));
    assert_eq!(
        final_by_deadline(&stuck_ticket, issued, "stuck"),
        ErrorCode::TransferTimeout.code()
    );
    assert!(
        fast.synchronize(LIMIT) && slow.synchronize(LIMIT),
        "the streams went on"
    );
    assert!(late.iter().all(|&b| b == 0), "no copy after a failed gate");
    let m = c.reader.metrics().stream;
    assert_eq!((m.tickets_outstanding, m.pins_held), (0, 0));
    c.master.signal(libc::SIGCONT);
    assert!(
        wait_until(Duration::from_secs(20), || c.active_pins() == Some(0)),
        "the deferred unpins reached the master once it resumed"
    );
    c.stuck.signal(libc::SIGCONT);
}

#[test]
fn fetches_stuck_on_a_stopped_peer_time_out_and_do_not_pin_the_workers() {
    let c = Cluster::start(3, 8 << 20);
    c.stuck.signal(libc::SIGSTOP);
    // One stuck fetch per default worker (MC_STREAM_WORKERS = 2).
    let streams: Vec<HostStream> = (0..4).map(|_| HostStream::new().unwrap()).collect();
    let mut late = vec![vec![0u8; SIZE]; 2];
    let issued = Instant::now();
    let stuck: Vec<Ticket> = late
        .iter_mut()
        .enumerate()
        .map(|(i, out)| c.get(&format!("s{i}"), out, &streams[i]))
        .collect();
    for t in &stuck {
        assert_eq!(
            final_by_deadline(t, issued, "stuck"),
            ErrorCode::TransferTimeout.code()
        );
    }
    // Two more tickets to the healthy peer, issued right after: they must complete.
    let mut good = vec![vec![0u8; SIZE]; 2];
    let issued = Instant::now();
    let healthy: Vec<Ticket> = good
        .iter_mut()
        .enumerate()
        .map(|(i, out)| c.get(&format!("h{}", i + 1), out, &streams[2 + i]))
        .collect();
    for (i, t) in healthy.iter().enumerate() {
        assert_eq!(
            final_by_deadline(t, issued, "healthy"),
            0,
            "healthy ticket {i}"
        );
        assert_eq!(good[i], pattern(SIZE, i as u8 + 1));
    }
    assert!(streams.iter().all(|s| s.synchronize(LIMIT)));
    let m = c.reader.metrics().stream;
    assert_eq!((m.timed_out, m.tickets_ok), (2, 2));
    assert!(
        m.staging_bytes_in_use >= 2 * SIZE as u64,
        "the stuck transfers still own their staging"
    );
    c.stuck.signal(libc::SIGCONT);
}

#[test]
fn teardown_returns_within_its_bound_with_the_master_and_a_peer_stopped() {
    // No segment: the reader's teardown makes no master call of its own (no heartbeat, no
    // unmount), so its duration is the stream engine's.
    let c = Cluster::start(2, 0);
    c.stuck.signal(libc::SIGSTOP);
    let streams: Vec<HostStream> = (0..3).map(|_| HostStream::new().unwrap()).collect();
    let mut outs = vec![vec![0u8; SIZE]; 3];
    let [first, second, third] = &mut outs[..] else {
        unreachable!()
    };
    let issued = Instant::now();
    let timed_out = c.get("s0", first, &streams[0]);
    assert_eq!(
        final_by_deadline(&timed_out, issued, "stuck"),
        ErrorCode::TransferTimeout.code()
    );
    // Then a fetch that is still stuck at teardown and a ticket whose unpin cannot reach the
    // master.
    let in_flight = c.get("s1", second, &streams[1]);
    let healthy = c.get("h0", third, &streams[2]);
    c.master.signal(libc::SIGSTOP);
    assert_eq!(healthy.wait(LIMIT), 0);
    let started = Instant::now();
    c.reader.teardown();
    let took = started.elapsed();
    assert!(
        took <= TEARDOWN + Duration::from_secs(2),
        "teardown took {took:?}; bound MC_STREAM_TEARDOWN_MS ({TEARDOWN:?}) + 2 s"
    );
    assert_eq!(in_flight.wait(LIMIT), ErrorCode::Cancelled.code());
    assert!(streams.iter().all(|s| s.synchronize(LIMIT)));
    c.master.signal(libc::SIGCONT);
    c.stuck.signal(libc::SIGCONT);
}
