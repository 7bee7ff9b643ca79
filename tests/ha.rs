//! A group of `mooncake_master`s elected on a real etcd (Debian's `etcd-server`), with real
//! peer processes and clients that follow the leader through `etcd://`: failovers under the
//! faults a group must survive, with every committed object still readable and no get
//! returning bytes other than its key's.

mod common;

use common::{
    etcd_master_addr, local_client, pattern, wait_until, EtcdMember, Master, PeerClient, TcpProxy,
};
use mooncake_rs::client::Client;
use mooncake_rs::master::{MasterApi, RemoteMaster, RpcMasterClient};
use mooncake_rs::rpc::Timeouts;
use mooncake_rs::types::{ReplicateConfig, Uuid};
use mooncake_rs::ErrorCode;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The lease the tests' masters hold (shorter than the 5 s default, so failovers are quick).
const LEASE_MS: u64 = 2000;

/// A journal directory, deleted on drop.
struct Dir(PathBuf);

impl Dir {
    fn new() -> Dir {
        let unique = format!("mc-ha-{}-{:x}", std::process::id(), fastrand::u64(..));
        Dir(std::env::temp_dir().join(unique))
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One master of the group.
struct Member {
    master: Master,
    _dir: Dir,
}

fn member(etcd_endpoints: &str) -> Member {
    member_with_lease(etcd_endpoints, LEASE_MS)
}

fn member_with_lease(etcd_endpoints: &str, lease_ms: u64) -> Member {
    let dir = Dir::new();
    let master = Master::start(&[
        "--enable_ha",
        &format!("--etcd_endpoints={etcd_endpoints}"),
        &format!("--journal_dir={}", dir.0.display()),
        &format!("--ha_lease_ttl_ms={lease_ms}"),
        "--reattach_grace_ms=20000",
    ]);
    Member { master, _dir: dir }
}

fn endpoints(etcd: &[EtcdMember]) -> String {
    let list: Vec<String> = etcd.iter().map(EtcdMember::endpoint).collect();
    list.join(",")
}

/// An HA group on a real etcd: its members, which master leads first, peers holding the
/// replicas and a client following the leader.
struct Group {
    etcd: Vec<EtcdMember>,
    masters: Vec<Member>,
    first: usize,
    _peers: Vec<PeerClient>,
    client: Arc<Client>,
}

fn group(etcd_members: usize, masters: usize, peers: usize) -> Group {
    let etcd = EtcdMember::cluster(etcd_members);
    let list = endpoints(&etcd);
    let masters: Vec<Member> = (0..masters).map(|_| member(&list)).collect();
    let first = leader_of(&masters.iter().collect::<Vec<_>>(), Duration::from_secs(10));
    let addr = etcd_master_addr(&etcd);
    let peers = (0..peers)
        .map(|_| PeerClient::start(&addr, "64 MB"))
        .collect();
    let client = Arc::new(local_client(&addr, 0, 0));
    Group {
        etcd,
        masters,
        first,
        _peers: peers,
        client,
    }
}

fn leads(member: &Member) -> bool {
    member.master.gauge("ha_leader") == 1
}

/// Waits until exactly one of `members` leads; returns its index.
fn leader_of(members: &[&Member], limit: Duration) -> usize {
    let mut leader = None;
    let found = wait_until(limit, || {
        let leading: Vec<usize> = (0..members.len()).filter(|&i| leads(members[i])).collect();
        leader = leading.first().copied();
        leading.len() == 1
    });
    assert!(found, "no single leader");
    leader.unwrap_or(0)
}

fn read_exact(client: &Client, key: &str, len: usize, seed: u8) -> Result<(), String> {
    let mut buf = vec![0u8; len];
    match client.get_into(key, &mut buf) {
        Ok(n) if n as usize == len && buf == pattern(len, seed) => Ok(()),
        Ok(_) => Err(format!("{key}: WRONG BYTES")),
        Err(code) => Err(format!("{key}: {code:?}")),
    }
}

/// Puts `count` keys `prefix-i` (4 KiB, seed i) and lets their commits reach the standby.
fn put_keys(client: &Client, prefix: &str, count: u8) {
    for i in 0..count {
        let key = format!("{prefix}-{i}");
        client
            .put_from(&key, &pattern(4096, i), &ReplicateConfig::default())
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
}

/// Every key readable exactly again within `limit`; never wrong bytes meanwhile.
fn all_readable(client: &Client, prefix: &str, count: u8, limit: Duration) {
    let started = Instant::now();
    for i in 0..count {
        let key = format!("{prefix}-{i}");
        loop {
            match read_exact(client, &key, 4096, i) {
                Ok(()) => break,
                Err(e) if e.contains("WRONG") => panic!("{e}"),
                Err(e) if started.elapsed() > limit => panic!("{e} after {limit:?}"),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
}

/// A direct RPC client of one master (not through etcd).
fn direct(master: &Master) -> RemoteMaster<RpcMasterClient> {
    let timeouts = Timeouts {
        connect: Duration::from_secs(1),
        request: Duration::from_secs(2),
    };
    RemoteMaster(RpcMasterClient::new(&master.addr(), timeouts))
}

/// One put the load was acknowledged: its key, seed and when.
struct Acked {
    key: String,
    seed: u8,
    at: Instant,
}

/// A writer putting 4 KiB keys `<prefix>-i` through the group (paced to at most ~400 puts/s so
/// the peers' segments never evict), reading back an earlier acknowledged key after each put:
/// a fault happens while it runs. A read that returns other bytes than its key's panics the
/// writer (and so the test); a failed call is counted, not fatal.
struct Load {
    stop: Arc<AtomicBool>,
    writer: std::thread::JoinHandle<Vec<Acked>>,
}

/// What [`Load::finish`] found.
struct LoadReport {
    acked: usize,
    after_fault: usize,
    lost: usize,
}

impl Load {
    fn start(client: &Arc<Client>, prefix: &'static str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (client, stop) = (Arc::clone(client), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut acked: Vec<Acked> = Vec::new();
                for i in 0..100_000u32 {
                    if stop.load(Ordering::Acquire) {
                        break;
                    }
                    let (key, seed) = (format!("{prefix}-{i}"), (i % 251) as u8);
                    let put =
                        client.put_from(&key, &pattern(4096, seed), &ReplicateConfig::default());
                    match put {
                        Ok(()) => acked.push(Acked {
                            key,
                            seed,
                            at: Instant::now(),
                        }),
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                    if let Some(earlier) = acked.get(fastrand::usize(..acked.len().max(1))) {
                        if let Err(e) = read_exact(&client, &earlier.key, 4096, earlier.seed) {
                            assert!(!e.contains("WRONG"), "{e}");
                        }
                    }
                    std::thread::sleep(Duration::from_micros(2500));
                }
                acked
            })
        };
        Load { stop, writer }
    }

    /// Stops the writer and reads every put it was acknowledged: never other bytes than the
    /// key's; none acknowledged `settled` or longer before `fault` lost (those reached the
    /// standby's copy of the journal before the fault).
    fn finish(self, client: &Client, fault: Instant, settled: Duration) -> LoadReport {
        self.stop.store(true, Ordering::Release);
        let acked = self.writer.join().expect("the load's writer failed");
        let (mut lost, mut settled_lost, mut after_fault) = (0, 0, 0);
        for put in &acked {
            match read_exact(client, &put.key, 4096, put.seed) {
                Ok(()) => {}
                Err(e) if e.contains("WRONG") => panic!("{e}"),
                Err(_) => {
                    lost += 1;
                    settled_lost += usize::from(put.at + settled < fault);
                }
            }
            after_fault += usize::from(put.at > fault);
        }
        eprintln!(
            "load: {} acknowledged, {after_fault} after the fault, {lost} lost",
            acked.len()
        );
        assert_eq!(settled_lost, 0, "acknowledged long before the fault, lost");
        LoadReport {
            acked: acked.len(),
            after_fault,
            lost,
        }
    }
}

#[test]
fn a_killed_leader_is_replaced_and_every_committed_object_stays_readable() {
    let mut group = group(1, 2, 2);
    let client = Arc::clone(&group.client);
    put_keys(&client, "before", 100);
    let load = Load::start(&client, "load");
    std::thread::sleep(Duration::from_millis(500));
    let mut leader = group.masters.remove(group.first);
    let standby = group.masters.remove(0);
    let killed = Instant::now();
    leader.master.kill();
    assert!(
        wait_until(Duration::from_secs(10), || leads(&standby)),
        "no takeover"
    );
    let took_over = killed.elapsed();
    all_readable(&client, "before", 100, Duration::from_secs(15));
    eprintln!(
        "takeover after {took_over:?}, all readable after {:?}",
        killed.elapsed()
    );
    std::thread::sleep(Duration::from_millis(500));
    let report = load.finish(&client, killed, Duration::from_millis(500));
    assert!(report.after_fault > 0, "puts went on after the takeover");
    put_keys(&client, "after", 20);
    all_readable(&client, "after", 20, Duration::from_secs(5));
}

#[test]
fn a_stopped_leader_that_wakes_up_after_a_takeover_grants_nothing() {
    let group = group(1, 2, 1);
    let client = &group.client;
    put_keys(client, "k", 50);
    let load = Load::start(client, "load");
    std::thread::sleep(Duration::from_millis(500));
    let leader = &group.masters[group.first];
    let standby = &group.masters[1 - group.first];
    let stopped = Instant::now();
    leader.master.signal(libc::SIGSTOP);
    assert!(
        wait_until(Duration::from_secs(10), || leads(standby)),
        "no takeover"
    );
    leader.master.signal(libc::SIGCONT);
    // At once, before its own HA loop looks at etcd: its fence has fallen.
    let woken = direct(&leader.master);
    let refused = woken.batch_put_start(
        Uuid::random(),
        vec!["late".into()],
        vec![64],
        ReplicateConfig::default(),
    );
    assert_eq!(refused.err(), Some(ErrorCode::UnavailableInCurrentStatus));
    assert!(!leads(leader));
    all_readable(client, "k", 50, Duration::from_secs(15));
    assert_eq!(client.is_exist("late"), Ok(false));
    std::thread::sleep(Duration::from_millis(500));
    let report = load.finish(client, stopped, Duration::from_millis(500));
    assert!(report.after_fault > 0, "puts went on after the takeover");
}

#[test]
fn the_group_survives_losing_one_of_three_etcd_members() {
    let mut group = group(3, 2, 1);
    let client = Arc::clone(&group.client);
    put_keys(&client, "k", 50);
    let load = Load::start(&client, "load");
    std::thread::sleep(Duration::from_millis(500));
    let lost_member = Instant::now();
    group.etcd[0].kill();
    std::thread::sleep(Duration::from_millis(3 * LEASE_MS));
    let masters: Vec<&Member> = group.masters.iter().collect();
    let still = leader_of(&masters, Duration::from_secs(10));
    assert_eq!(
        still, group.first,
        "the leader kept its lease through the member loss"
    );
    all_readable(&client, "k", 50, Duration::from_secs(10));
    // No failover: nothing the writer was acknowledged may be lost, however recent.
    let report = load.finish(&client, lost_member, Duration::ZERO);
    assert_eq!(report.lost, 0);
    assert!(report.after_fault > 0 && report.acked > report.after_fault);
    put_keys(&client, "more", 10);
    all_readable(&client, "more", 10, Duration::from_secs(5));
}

#[test]
fn a_leader_cut_off_from_etcd_stops_serving_within_its_lease_and_serves_again_after() {
    let group = group(1, 1, 1);
    let (etcd, a, client) = (&group.etcd, &group.masters[0], &group.client);
    put_keys(client, "k", 30);
    etcd[0].signal(libc::SIGSTOP);
    let cut = Instant::now();
    assert!(
        wait_until(Duration::from_millis(LEASE_MS + 1000), || !leads(a)),
        "still serving {:?} after etcd stopped",
        cut.elapsed()
    );
    let stopped_after = cut.elapsed();
    assert!(
        stopped_after < Duration::from_millis(LEASE_MS),
        "{stopped_after:?}"
    );
    etcd[0].signal(libc::SIGCONT);
    leader_of(&[a], Duration::from_secs(15));
    all_readable(client, "k", 30, Duration::from_secs(15));
}

#[test]
fn a_leader_partitioned_from_etcd_stands_down_before_its_standby_takes_over() {
    let etcd = EtcdMember::cluster(1);
    // The first master reaches etcd only through a proxy the test can cut.
    let proxy = TcpProxy::start(etcd[0].client_port);
    let a = member(&format!("127.0.0.1:{}", proxy.port));
    leader_of(&[&a], Duration::from_secs(10));
    let b = member(&endpoints(&etcd));
    let addr = etcd_master_addr(&etcd);
    let _peer = PeerClient::start(&addr, "64 MB");
    let client = Arc::new(local_client(&addr, 0, 0));
    put_keys(&client, "k", 50);
    let load = Load::start(&client, "load");
    // B is in sync before the partition.
    std::thread::sleep(Duration::from_millis(500));
    proxy.cut();
    let cut = Instant::now();
    let (mut a_stopped, mut b_started) = (None, None);
    let both = wait_until(Duration::from_millis(4 * LEASE_MS), || {
        if a_stopped.is_none() && !leads(&a) {
            a_stopped = Some(cut.elapsed());
        }
        if b_started.is_none() && leads(&b) {
            b_started = Some(cut.elapsed());
        }
        a_stopped.is_some() && b_started.is_some()
    });
    assert!(both, "stopped {a_stopped:?}, took over {b_started:?}");
    let (stopped, started) = (a_stopped.unwrap(), b_started.unwrap());
    eprintln!("partitioned leader stopped after {stopped:?}, standby led after {started:?}");
    assert!(
        stopped < started,
        "two leaders: A stopped {stopped:?}, B led {started:?}"
    );
    all_readable(&client, "k", 50, Duration::from_secs(15));
    // Healed, the old leader follows the new one; it never leads again meanwhile.
    proxy.heal();
    std::thread::sleep(Duration::from_millis(LEASE_MS));
    assert!(!leads(&a) && leads(&b));
    let report = load.finish(&client, cut, Duration::from_millis(500));
    assert!(report.after_fault > 0, "puts went on after the takeover");
    put_keys(&client, "more", 10);
    all_readable(&client, "more", 10, Duration::from_secs(5));
}

#[test]
fn a_p2p_group_fails_over_and_its_owners_reclaim_their_keys() {
    use common::{p2p_accessor, P2pOwnerProcess};
    use mooncake_rs::p2p::{RequestOptions, TransferDirection};
    let etcd = EtcdMember::cluster(1);
    let grace = format!(
        "--p2p_route_grace_ms={}",
        mooncake_rs::p2p::MASTER_ROUTE_GRACE.as_millis()
    );
    let p2p_master = || {
        // A client TTL longer than a failover: the old leader cannot have expired the owner
        // before it died, so the owner vouches for its keys to the new one.
        Master::start(&[
            "--deployment_mode=P2P",
            "--client_ttl=10",
            "--enable_ha",
            &format!("--etcd_endpoints={}", endpoints(&etcd)),
            &format!("--ha_lease_ttl_ms={LEASE_MS}"),
            &grace,
        ])
    };
    let (a, b) = (
        Member {
            master: p2p_master(),
            _dir: Dir::new(),
        },
        Member {
            master: p2p_master(),
            _dir: Dir::new(),
        },
    );
    let first = leader_of(&[&a, &b], Duration::from_secs(10));
    let addr = etcd_master_addr(&etcd);
    let owner = P2pOwnerProcess::start(&addr, &[], &[]);
    let accessor = p2p_accessor(&addr, TransferDirection::Reverse);
    let to_owner = RequestOptions {
        direction: Some(TransferDirection::Reverse),
        preferred_owner: Some(owner.name.clone()),
    };
    let value = pattern(4096, 9);
    accessor.put("k", &value, &to_owner).unwrap();
    let (mut leader, standby) = if first == 0 { (a, b) } else { (b, a) };
    leader.master.kill();
    assert!(
        wait_until(Duration::from_secs(10), || leads(&standby)),
        "no takeover"
    );
    let forward = RequestOptions::direction(TransferDirection::Forward);
    let back = wait_until(Duration::from_secs(15), || {
        accessor.get("k", &forward).is_ok_and(|v| v == value)
    });
    assert!(back, "the owner's key is not routed by the new leader");
}

#[test]
fn removals_wait_out_a_stopped_standby_and_succeed() {
    // A lease longer than the default: the leader stops waiting for a silent standby after 7 s.
    let etcd = EtcdMember::cluster(1);
    let list = endpoints(&etcd);
    let a = member_with_lease(&list, 7000);
    leader_of(&[&a], Duration::from_secs(10));
    let b = member_with_lease(&list, 7000);
    let addr = etcd_master_addr(&etcd);
    let _peer = PeerClient::start(&addr, "64 MB");
    let client = local_client(&addr, 0, 0);
    put_keys(&client, "k", 60);
    std::thread::sleep(Duration::from_millis(500));
    b.master.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    // Each removal waits until the stopped standby is no longer waited for, then succeeds.
    let mut failed = Vec::new();
    for i in 0..60u8 {
        if let Err(code) = client.remove(&format!("k-{i}"), true) {
            failed.push((i, code, stopped.elapsed()));
        }
        if stopped.elapsed() > Duration::from_secs(10) {
            break;
        }
    }
    b.master.signal(libc::SIGCONT);
    assert!(failed.is_empty(), "removals failed: {failed:?}");
    assert_eq!(client.is_exist("k-0"), Ok(false));
}

/// The HA layer's etcd client given a list whose first member is gone (its port refuses):
/// every operation, each from a fresh client that starts at the dead member, goes on through
/// the live one, `create` included (a refused connection proves its request never left).
/// `etcd-client`'s balanced channel alone kept sending some calls to the dead member (`tcp
/// connect error`), which cost a leader its lease in
/// `the_group_survives_losing_one_of_three_etcd_members`.
#[test]
fn every_etcd_call_goes_on_through_a_live_member_when_one_is_gone() {
    use mooncake_rs::ha::etcd::{endpoints, Etcd};
    let etcd = EtcdMember::cluster(1);
    // Nothing listens on port 1 here: connections to it are refused.
    let list = endpoints(&format!("127.0.0.1:1,{}", etcd[0].endpoint()));
    let fresh = || Etcd::new(&list, Duration::from_millis(500)).expect("client");
    let lease = fresh().grant(Duration::from_secs(5)).expect("grant");
    let revision = fresh()
        .create("mc-test/leader", "me", lease)
        .expect("create")
        .expect("the key was free");
    assert_eq!(fresh().create("mc-test/leader", "me", lease), Ok(None));
    assert_eq!(fresh().put("mc-test/k", b"v"), Ok(()));
    let read = fresh().get("mc-test/k").expect("get").expect("present");
    assert_eq!(read.value, "v");
    assert_eq!(
        fresh().put_if("mc-test/leader", revision, "mc-test/list", "l"),
        Ok(true)
    );
    assert_eq!(
        fresh().put_if("mc-test/leader", revision + 1, "mc-test/list", "l"),
        Ok(false)
    );
    assert!(fresh().keep_alive(lease).expect("keep alive") > 0);
    // One client goes on renewing on the stream it opened.
    let kept = fresh();
    for round in 0..20 {
        assert!(kept.keep_alive(lease).expect("keep alive") > 0, "{round}");
    }
    assert_eq!(fresh().delete("mc-test/k"), Ok(()));
    assert_eq!(fresh().get("mc-test/k"), Ok(None));
    assert_eq!(fresh().revoke(lease), Ok(()));
    assert_eq!(fresh().get("mc-test/leader"), Ok(None));
    // A lease that is gone is an answer (0), not a failed member.
    assert_eq!(fresh().keep_alive(lease), Ok(0));
}
