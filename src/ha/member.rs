//! One master of an HA group ([`Member`]): a standby that copies the leader's journal, a
//! candidate when there is no leader, the leader while it holds the etcd lease.
//!
//! - **Election**: the key `mooncake-store/<cluster_id>/master_view` (upstream's name) holds
//!   the leader's RPC address under a lease ([`HaConfig::lease_ttl`], 5 s). It is created only
//!   if absent (a transaction); the revision that created it is the leader's `view_version`
//!   and fencing token. A candidate replays its journal *before* it competes, so the address
//!   is published only once the master behind it can serve.
//! - **Lease**: renewed every `lease_ttl / 5` (standbys are looked at every 50 ms between); the leader serves only within
//!   [`super::role::fenced`] of the last renewal it sent, so it stops before etcd could
//!   expire the lease and let another win (a partition from etcd, a stopped process).
//! - **Journal**: standbys copy the leader's journal ([`JournalCopy`]); the leader reuses
//!   freed space only once every registered standby holds the removal. The key
//!   `mooncake-store/<cluster_id>/in_sync` lists, per view, the members that may take over:
//!   the leader, and each standby once its copy holds every record appended before it
//!   registered (earlier removals' ranges may have been reused without it). Standbys poll
//!   the leader's listing as a long poll, so a removal waits for a copy round trip, not a
//!   polling period. A standby silent for
//!   `lease_ttl` is removed from the list (in etcd first) before the leader stops waiting for
//!   it; a master not in the list does not compete (it could lack a removal whose space was
//!   reused). An absent list (a new cluster) lets anyone compete.
//! - **P2P mode** keeps no journal: a new leader starts empty and owners reclaim their
//!   routes (`p2p_route_grace_ms`).
//!
//! Threads: [`Member::run`] is the member's loop (one thread); the RPC server dispatches
//! through the shared [`Role`].

use super::etcd::Etcd;
use super::role::{fenced, Role};
use crate::error::{ErrorCode, Result};
use crate::master::standby::{member_id, JournalCopy};
use crate::master::Follower;
use crate::master::{JournalOptions, MasterConfig, MasterService, RemoteMaster, RpcMasterClient};
use crate::rpc::Timeouts;
use crate::types::{ClientId, DeploymentMode};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Pause after a journal copy round that brought nothing new (a round that copied starts the
/// next at once: the leader's listing is a long poll, see `MasterApi::journal_files`).
const FOLLOW_IDLE_PAUSE: Duration = Duration::from_millis(5);
/// Longest a standby copies without looking at the view in etcd.
const FOLLOW_SPELL: Duration = Duration::from_millis(100);
/// How often a leader looks at its standbys (a new one is listed in sync within this).
const IN_SYNC_PERIOD: Duration = Duration::from_millis(50);
/// Pause after a failed round, or while waiting for a leader.
const RETRY_PERIOD: Duration = Duration::from_millis(200);

/// An HA master's settings.
#[derive(Clone, Debug)]
pub struct HaConfig {
    /// etcd members (`http://host:port`).
    pub endpoints: Vec<String>,
    /// `--cluster_id`: the namespace of the keys.
    pub cluster_id: String,
    /// The address clients and standbys reach this master's RPC server at.
    pub advertise: String,
    /// The leader's lease (`--ha_lease_ttl_ms`, 5 s).
    pub lease_ttl: Duration,
    /// The journal directory (CENTRALIZED mode): the leader's journal, a standby's copy.
    pub journal: Option<JournalOptions>,
    pub master: MasterConfig,
}

/// The key holding the leader's address.
pub fn view_key(cluster_id: &str) -> String {
    format!(
        "mooncake-store/{}/master_view",
        cluster_id.trim_end_matches('/')
    )
}

fn in_sync_key(cluster_id: &str) -> String {
    format!(
        "mooncake-store/{}/in_sync",
        cluster_id.trim_end_matches('/')
    )
}

/// The members that may take over from the leader of `view`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct InSync {
    view: u64,
    members: Vec<String>,
}

/// Whom a standby copies from.
struct Following {
    view: u64,
    leader: RemoteMaster<RpcMasterClient>,
    copy: JournalCopy,
}

/// See the module documentation.
pub struct Member {
    config: HaConfig,
    role: Arc<Role>,
    etcd: Etcd,
    member: ClientId,
    following: Option<Following>,
}

impl Member {
    /// A member serving through `role`. Errors: `INVALID_PARAMS` (a CENTRALIZED member
    /// without a journal, no etcd endpoint), the journal directory's.
    pub fn new(config: HaConfig, role: Arc<Role>) -> Result<Member> {
        let member = match (&config.journal, config.master.deployment_mode) {
            (Some(journal), _) => member_id(&journal.dir)?,
            (None, DeploymentMode::P2p) => ClientId::random(),
            (None, DeploymentMode::Centralized) => {
                return crate::error::fail(
                    ErrorCode::InvalidParams,
                    "an HA master in CENTRALIZED mode needs --journal_dir",
                )
            }
        };
        // Connected at the first round (and retried every round): a master may start before
        // etcd answers.
        let etcd = Etcd::new(&config.endpoints, etcd_timeout(config.lease_ttl))?;
        Ok(Member {
            config,
            role,
            etcd,
            member,
            following: None,
        })
    }

    /// Runs until `stop`; a leader then stands down and revokes its lease, so a standby
    /// takes over at once.
    pub fn run(&mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Acquire) {
            let pause = match self.round(stop) {
                Ok(pause) => pause,
                Err(code) => {
                    tracing::warn!(%code, detail = %crate::error::last_error_message(), "HA round failed");
                    RETRY_PERIOD
                }
            };
            std::thread::sleep(pause);
        }
    }

    /// One look at the view: follow the leader, or compete when there is none.
    fn round(&mut self, stop: &AtomicBool) -> Result<Duration> {
        let key = view_key(&self.config.cluster_id);
        match self.etcd.get(&key)? {
            Some(view) if view.value == self.config.advertise => {
                // Our own key from a previous life: its lease runs out.
                Ok(RETRY_PERIOD)
            }
            Some(view) => self.follow(&view.value, view.create_revision),
            None if self.eligible()? => {
                self.compete(stop)?;
                Ok(Duration::ZERO)
            }
            None => Ok(RETRY_PERIOD),
        }
    }

    /// One copy round from the leader at `addr` (view `view`).
    fn follow(&mut self, addr: &str, view: u64) -> Result<Duration> {
        let Some(journal) = &self.config.journal else {
            return Ok(RETRY_PERIOD);
        };
        if self.following.as_ref().is_none_or(|f| f.view != view) {
            let timeouts = Timeouts {
                connect: Duration::from_secs(1),
                request: Duration::from_secs(5),
            };
            tracing::info!(leader = addr, view, "following a new leader");
            self.following = Some(Following {
                view,
                leader: RemoteMaster(RpcMasterClient::new(addr, timeouts)),
                copy: JournalCopy::start(&journal.dir)?,
            });
        }
        let Some(following) = self.following.as_mut() else {
            return Ok(RETRY_PERIOD);
        };
        // Rounds follow each other while they copy, for at most FOLLOW_SPELL between two
        // looks at the view (a deposed leader refuses the calls meanwhile: it is fenced).
        let spell = Instant::now() + FOLLOW_SPELL;
        let copied = loop {
            let before = following.copy.acked();
            match following.copy.sync_once(&following.leader) {
                Ok(()) if following.copy.acked() == before => break Ok(FOLLOW_IDLE_PAUSE),
                Ok(()) if Instant::now() >= spell => break Ok(Duration::ZERO),
                Ok(()) => {}
                Err(code) => break Err(code),
            }
        };
        match copied {
            Ok(pause) => Ok(pause),
            Err(ErrorCode::InternalError) => {
                // The leader's files do not extend our copy: start over.
                self.following = None;
                Ok(RETRY_PERIOD)
            }
            Err(code) => Err(code),
        }
    }

    /// Whether this member may take over (see the module documentation). Always in P2P mode:
    /// no journal, nothing a new leader could serve wrongly (owners reclaim their routes).
    fn eligible(&self) -> Result<bool> {
        if self.config.journal.is_none() {
            return Ok(true);
        }
        let Some(list) = self.etcd.get(&in_sync_key(&self.config.cluster_id))? else {
            return Ok(true);
        };
        let in_sync: InSync = serde_json::from_str(&list.value).unwrap_or_default();
        let listed = in_sync.members.contains(&self.member.to_string());
        if !listed {
            tracing::warn!(member = %self.member, "not in the in-sync list: not competing");
        }
        Ok(listed)
    }

    /// Replays the journal, competes for the key, and leads while the lease holds.
    fn compete(&mut self, stop: &AtomicBool) -> Result<()> {
        self.following = None;
        let service = match &self.config.journal {
            Some(journal) => {
                let options = JournalOptions {
                    safe_wait: journal.safe_wait.max(safe_wait(self.config.lease_ttl)),
                    ..journal.clone()
                };
                MasterService::open(self.config.master.clone(), options)?
            }
            None => MasterService::new(self.config.master.clone()),
        };
        let ttl = self.config.lease_ttl;
        let granted_at = Instant::now();
        let lease = match self.etcd.grant(ttl) {
            Ok(lease) => lease,
            Err(code) => {
                service.shutdown();
                return Err(code);
            }
        };
        // Until it leads, any way out gives the lease back (a create whose answer was lost
        // may have taken the key under it: nobody would lead until it ran out).
        let give_up = |outcome: Result<()>| {
            let _ = self.etcd.revoke(lease);
            service.shutdown();
            outcome
        };
        let key = view_key(&self.config.cluster_id);
        let view = match self.etcd.create(&key, &self.config.advertise, lease) {
            Ok(Some(view)) => view,
            Ok(None) => return give_up(Ok(())),
            Err(code) => return give_up(Err(code)),
        };
        service.set_view_version(view);
        let mut in_sync = InSync {
            view,
            members: vec![self.member.to_string()],
        };
        match self.publish(view, &in_sync) {
            Ok(true) => {}
            Ok(false) => return give_up(Ok(())),
            Err(code) => return give_up(Err(code)),
        }
        tracing::info!(view, address = %self.config.advertise, "leading");
        self.role
            .lead(Arc::clone(&service), granted_at + fenced(ttl));
        self.lead(&service, lease, &mut in_sync, stop);
        self.role.stand_down();
        service.shutdown();
        let _ = self.etcd.revoke(lease);
        tracing::warn!(view, "stood down");
        Ok(())
    }

    /// Writes the in-sync list if this member still leads `view`.
    fn publish(&self, view: u64, in_sync: &InSync) -> Result<bool> {
        let text = serde_json::to_string(in_sync).unwrap_or_default();
        let key = view_key(&self.config.cluster_id);
        self.etcd
            .put_if(&key, view, &in_sync_key(&self.config.cluster_id), &text)
    }

    /// Renews the lease and keeps the in-sync list until the fence falls or `stop`.
    fn lead(&self, service: &MasterService, lease: i64, in_sync: &mut InSync, stop: &AtomicBool) {
        let ttl = self.config.lease_ttl;
        let period = ttl / 5;
        let mut next_renewal = Instant::now();
        while !stop.load(Ordering::Acquire) {
            if Instant::now() >= next_renewal {
                let sent = Instant::now();
                next_renewal = sent + period;
                match self.etcd.keep_alive(lease) {
                    Ok(granted) if granted > 0 => {
                        let granted = Duration::from_secs(granted as u64).min(ttl);
                        self.role.extend(sent + fenced(granted));
                    }
                    Ok(_) => {
                        tracing::error!("the leader's lease is gone");
                        return;
                    }
                    Err(_) => tracing::warn!(
                        detail = %crate::error::last_error_message(),
                        "lease renewal failed"
                    ),
                }
            }
            if Instant::now() >= self.role.fence() {
                tracing::error!("lease not renewed in time: standing down");
                return;
            }
            if let Err(code) = self.keep_in_sync(service, in_sync) {
                tracing::warn!(%code, "in-sync list not updated");
            }
            let pause = next_renewal.saturating_duration_since(Instant::now());
            std::thread::sleep(pause.min(IN_SYNC_PERIOD));
        }
    }

    /// Adds standbys that report to the in-sync list; removes those silent for the lease's
    /// length (in etcd first, then from the journal's followers).
    fn keep_in_sync(&self, service: &MasterService, in_sync: &mut InSync) -> Result<()> {
        let Some(followers) = service.journal_followers() else {
            return Ok(());
        };
        let (next, dropped) = next_in_sync(in_sync, &followers, self.config.lease_ttl);
        if next != *in_sync {
            if !self.publish(in_sync.view, &next)? {
                return crate::error::fail(ErrorCode::EtcdTransactionFail, "no longer leading");
            }
            *in_sync = next;
        }
        for id in dropped {
            tracing::warn!(standby = %id, "standby silent: no longer waited for");
            service.drop_journal_follower(id);
        }
        Ok(())
    }
}

/// The in-sync list after a look at the leader's `followers`, and the followers to stop
/// waiting for: a follower silent for `silent_after` leaves the list; one that reports joins
/// once its copy holds every record appended before it registered (removals whose ranges
/// were reused without waiting for it: a promoted copy lacking one would serve a key over
/// another key's bytes).
fn next_in_sync(
    in_sync: &InSync,
    followers: &HashMap<ClientId, Follower>,
    silent_after: Duration,
) -> (InSync, Vec<ClientId>) {
    let mut next = in_sync.clone();
    let mut dropped = Vec::new();
    for (id, follower) in followers {
        let name = id.to_string();
        let silent = follower.seen.elapsed() > silent_after;
        let complete = follower.acked >= follower.joined;
        let listed = next.members.contains(&name);
        if silent {
            next.members.retain(|member| *member != name);
            dropped.push(*id);
        } else if listed && !complete {
            // Its copy started over (a restart): unlisted until it holds what it lacks.
            next.members.retain(|member| *member != name);
        } else if !listed && complete {
            next.members.push(name);
        }
    }
    (next, dropped)
}

/// How long a leader's removals may wait for standbys: longer than a standby may stay silent
/// before it is no longer waited for (a lease, a look every [`IN_SYNC_PERIOD`] that may follow
/// a lease renewal, then an etcd write: each etcd call at most [`etcd_timeout`]), so a stopped
/// standby delays them and never fails them.
fn safe_wait(lease_ttl: Duration) -> Duration {
    lease_ttl + IN_SYNC_PERIOD + 2 * etcd_timeout(lease_ttl) + Duration::from_secs(1)
}

/// The timeout of each etcd operation: a fifth of the lease, between 0.5 and 2 s.
fn etcd_timeout(lease_ttl: Duration) -> Duration {
    (lease_ttl / 5).clamp(Duration::from_millis(500), Duration::from_secs(2))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Uuid;

    fn follower(acked: u64, joined: u64, silent_for: Duration) -> Follower {
        Follower {
            acked,
            joined,
            seen: Instant::now() - silent_for,
        }
    }

    #[test]
    fn a_standby_is_listed_only_once_its_copy_holds_what_was_appended_when_it_joined() {
        let leader = InSync {
            view: 7,
            members: vec!["leader".into()],
        };
        let standby = Uuid::random();
        let copying = HashMap::from([(standby, follower(3, 10, Duration::ZERO))]);
        let (next, dropped) = next_in_sync(&leader, &copying, Duration::from_secs(5));
        assert_eq!(next, leader, "listed before its copy caught up");
        assert!(dropped.is_empty());
        let caught_up = HashMap::from([(standby, follower(10, 10, Duration::ZERO))]);
        let (next, _) = next_in_sync(&leader, &caught_up, Duration::from_secs(5));
        assert_eq!(
            next.members,
            vec!["leader".to_string(), standby.to_string()]
        );
        // Its copy started over (the leader registered it again): unlisted, still waited for.
        let restarted = HashMap::from([(standby, follower(0, 12, Duration::ZERO))]);
        let (again, dropped) = next_in_sync(&next, &restarted, Duration::from_secs(5));
        assert_eq!(again, leader, "listed while its copy starts over");
        assert!(dropped.is_empty());
        // Silent: dropped from the list and no longer waited for.
        let silent = HashMap::from([(standby, follower(10, 10, Duration::from_secs(6)))]);
        let (after, dropped) = next_in_sync(&next, &silent, Duration::from_secs(5));
        assert_eq!(after, leader);
        assert_eq!(dropped, vec![standby]);
    }
}
