//! Upstream `mooncake_master` flags of features this master does not have (snapshots, KV
//! events, tenants' quotas, NVMe-oF, CXL, copy/move tasks, ...), so that upstream's launch
//! scripts either run unchanged or stop with a message naming what is missing, never with a
//! bare "unexpected argument" nor by silently dropping a feature they asked for.
//!
//! A *switch* turns a missing feature on: it is accepted at its off value (upstream's default)
//! and refused (exit 2) otherwise. A *knob* only tunes a missing feature (or upstream's own
//! implementation of one we build differently): any value is accepted, has no effect, and is
//! named in a warning at start. The flags are taken out of the argument list before clap
//! parses the rest; `--help` does not list them (README.md, "Configuration", does). No name
//! here is also one of the program's own flags or aliases (a unit test checks).

use std::ffi::OsString;

/// What a flag of the table does here.
#[derive(Clone, Copy, Debug)]
pub(super) enum Effect {
    /// Accepted only with one of these values (compared case-insensitively); anything else
    /// is refused with `why`.
    Switch {
        off: &'static [&'static str],
        why: &'static str,
    },
    /// Any value is accepted and has no effect (`why` says why, in the start warning).
    Knob { why: &'static str },
}

/// One upstream flag this master does not implement.
#[derive(Clone, Copy, Debug)]
pub(super) struct UpstreamFlag {
    pub(super) name: &'static str,
    /// Whether it is a gflags boolean: it may stand alone (`--flag`, `--noflag`).
    pub(super) boolean: bool,
    pub(super) effect: Effect,
}

/// A flag given on the command line that was accepted without effect.
#[derive(Debug)]
pub(super) struct Ignored {
    pub(super) name: &'static str,
    pub(super) value: String,
    pub(super) why: &'static str,
}

const FALSE: &[&str] = &["false", "0", "no", "n", "f"];
const EMPTY: &[&str] = &[""];

const fn switch(
    name: &'static str,
    off: &'static [&'static str],
    why: &'static str,
) -> UpstreamFlag {
    UpstreamFlag {
        name,
        boolean: false,
        effect: Effect::Switch { off, why },
    }
}

const fn bool_switch(name: &'static str, why: &'static str) -> UpstreamFlag {
    UpstreamFlag {
        name,
        boolean: true,
        effect: Effect::Switch { off: FALSE, why },
    }
}

const fn knob(name: &'static str, why: &'static str) -> UpstreamFlag {
    UpstreamFlag {
        name,
        boolean: false,
        effect: Effect::Knob { why },
    }
}

const fn bool_knob(name: &'static str, why: &'static str) -> UpstreamFlag {
    UpstreamFlag {
        name,
        boolean: true,
        effect: Effect::Knob { why },
    }
}

const SNAPSHOTS: &str = "metadata snapshots are not built (the journal, --journal_dir, keeps the table across restarts)";
const OPLOG: &str =
    "upstream's OpLog replication is not built (HA here: --enable_ha with --journal_dir)";
const KV_EVENTS: &str = "the KV-event publisher is not built";
const TENANTS: &str = "multi-tenant namespaces and quotas are not built (a pool has one tenant)";
const NOF: &str = "NVMe-oF segments are not built";
const CXL: &str = "CXL memory is not built";
const DFS: &str = "the shared-file (NFS/3FS) storage backend is not built (the SSD tier is the clients' own disks)";
const TASKS: &str = "copy/move tasks are not built";
const DYNAMIC_REPLICATION: &str = "dynamic replication is not built";
const OFFLOAD_PIPELINE: &str =
    "upstream's offload queues are not built (the SSD tier here pipelines demotions itself)";

/// Upstream's master flags (Mooncake 3b5a594, `mooncake-store/src/master.cpp`) that this
/// master does not implement.
pub(super) const MASTER_FLAGS: &[UpstreamFlag] = &[
    switch(
        "config_path",
        EMPTY,
        "a master config file is not read here: pass its settings as flags",
    ),
    bool_switch("enable_snapshot", SNAPSHOTS),
    bool_switch("enable_snapshot_restore", SNAPSHOTS),
    knob("snapshot_interval_seconds", SNAPSHOTS),
    knob("snapshot_child_timeout_seconds", SNAPSHOTS),
    knob("snapshot_retention_count", SNAPSHOTS),
    knob("snapshot_backup_dir", SNAPSHOTS),
    knob("snapshot_object_store_type", SNAPSHOTS),
    knob("snapshot_payload_store_type", SNAPSHOTS),
    knob("snapshot_payload_backend_type", SNAPSHOTS),
    knob("snapshot_catalog_store_type", SNAPSHOTS),
    knob("snapshot_catalog_backend_type", SNAPSHOTS),
    knob("snapshot_catalog_store_connstring", SNAPSHOTS),
    knob("snapshot_catalog_backend_connstring", SNAPSHOTS),
    bool_switch("enable_oplog", OPLOG),
    knob("oplog_poll_interval_ms", OPLOG),
    knob("oplog_batch_max_entries", OPLOG),
    knob("batch_oplog_retry_timeout_sec", OPLOG),
    bool_switch("enable_kv_events", KV_EVENTS),
    knob("kv_events_bind_endpoint", KV_EVENTS),
    knob("kv_events_backend_id", KV_EVENTS),
    bool_knob("kv_events_emit_legacy_compat", KV_EVENTS),
    bool_knob("kv_events_emit_object_key", KV_EVENTS),
    knob("kv_events_queue_capacity", KV_EVENTS),
    knob("kv_events_model_name", KV_EVENTS),
    knob("kv_events_tenant_id", KV_EVENTS),
    knob("kv_events_additional_salt", KV_EVENTS),
    knob("kv_events_lora_name", KV_EVENTS),
    knob("kv_events_block_size", KV_EVENTS),
    knob("kv_events_dp_rank", KV_EVENTS),
    bool_switch("enable_multi_tenants", TENANTS),
    knob("tenant_quota_connector_type", TENANTS),
    knob("tenant_quota_connector_uri", TENANTS),
    knob("nof_eviction_ratio", NOF),
    knob("nof_eviction_high_watermark_ratio", NOF),
    knob("nof_heartbeat_interval_sec", NOF),
    knob("nof_heartbeat_probe_timeout_ms", NOF),
    knob("nof_heartbeat_failures_threshold", NOF),
    bool_switch("enable_cxl", CXL),
    knob("cxl_path", CXL),
    knob("cxl_size", CXL),
    bool_switch(
        "offload_force_evict",
        "evicting objects over the offload cap without writing them to disk is not built",
    ),
    knob("offloading_queue_limit", OFFLOAD_PIPELINE),
    knob("offload_cap_ratio", OFFLOAD_PIPELINE),
    knob("promotion_queue_limit", OFFLOAD_PIPELINE),
    knob("promotion_max_per_heartbeat", OFFLOAD_PIPELINE),
    UpstreamFlag {
        name: "enable_disk_eviction",
        boolean: true,
        effect: Effect::Switch {
            off: &["true", "1", "yes", "y", "t"],
            why: "the SSD tier always evicts when a disk is full; it cannot be turned off",
        },
    },
    switch(
        "quota_bytes",
        &["0"],
        "a storage-backend quota is not built (each client's SSD tier has its own, MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES)",
    ),
    switch("root_fs_dir", EMPTY, DFS),
    knob("global_file_segment_size", DFS),
    knob("max_total_finished_tasks", TASKS),
    knob("max_total_pending_tasks", TASKS),
    knob("max_total_processing_tasks", TASKS),
    knob("pending_task_timeout_sec", TASKS),
    knob("processing_task_timeout_sec", TASKS),
    knob("max_retry_attempts", TASKS),
    switch("dynamic_replication_mode", &["off"], DYNAMIC_REPLICATION),
    knob("dynamic_replication_heat_window_seconds", DYNAMIC_REPLICATION),
    knob("dynamic_replication_admission_qps_threshold", DYNAMIC_REPLICATION),
    knob("dynamic_replication_max_memory_replicas", DYNAMIC_REPLICATION),
    bool_switch(
        "enable_metadata_cleanup_on_timeout",
        "removing a dead client's HTTP metadata is not built",
    ),
    knob("pod_name", "Kubernetes label routing is not built"),
    knob("pod_namespace", "Kubernetes label routing is not built"),
    bool_knob(
        "use_mmap_arena_allocator",
        "the master maps no buffers (a client's segment is one mapping)",
    ),
    knob(
        "mmap_arena_pool_size",
        "the master maps no buffers (a client's segment is one mapping)",
    ),
];

/// Takes the flags of `table` out of `args` (`args[0]` is the program name): `--name=value`,
/// `-name=value`, `--name value`, and for booleans `--name` / `--noname`. Returns the
/// remaining arguments (in order) and the knobs that were given, or `Err` with the message
/// for a switch turned on (the caller exits with 2). Nothing after a `--` is looked at.
pub(super) fn take<I, T>(
    args: I,
    table: &[UpstreamFlag],
) -> Result<(Vec<OsString>, Vec<Ignored>), String>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let mut rest = Vec::new();
    let mut ignored = Vec::new();
    let mut args = args.into_iter().map(Into::into);
    rest.extend(args.next());
    while let Some(arg) = args.next() {
        let Some((flag, value)) = arg.to_str().and_then(|a| find(a, table)) else {
            let end = arg == "--";
            rest.push(arg);
            if end {
                rest.extend(args.by_ref());
            }
            continue;
        };
        let value = match value {
            Some(value) => value,
            None => match args.next().filter(|next| next != "--") {
                Some(next) => next.to_string_lossy().into_owned(),
                None => return Err(format!("--{} needs a value", flag.name)),
            },
        };
        match flag.effect {
            Effect::Switch { off, why } => {
                if !off.iter().any(|o| o.eq_ignore_ascii_case(value.trim())) {
                    return Err(format!(
                        "--{}={value} (an upstream Mooncake flag) is not supported: {why}",
                        flag.name
                    ));
                }
            }
            Effect::Knob { why } => ignored.push(Ignored {
                name: flag.name,
                value,
                why,
            }),
        }
    }
    Ok((rest, ignored))
}

/// The flag of `table` that `arg` names and its value when the argument carries one
/// (`=value`, or a boolean's bare or `no` form); `None` when `arg` is not one of them.
fn find(arg: &str, table: &[UpstreamFlag]) -> Option<(UpstreamFlag, Option<String>)> {
    let body = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-'))?;
    let (name, value) = match body.split_once('=') {
        Some((name, value)) => (name, Some(value.to_owned())),
        None => (body, None),
    };
    if let Some(flag) = table.iter().find(|f| f.name == name) {
        let value = match (value, flag.boolean) {
            (None, true) => Some("true".to_owned()),
            (value, _) => value,
        };
        return Some((*flag, value));
    }
    let negated = name.strip_prefix("no")?;
    let flag = table.iter().find(|f| f.boolean && f.name == negated)?;
    value.is_none().then(|| (*flag, Some("false".to_owned())))
}

/// Logs a warning for each knob that was given: it has no effect here.
pub(super) fn warn_ignored(program: &str, ignored: &[Ignored]) {
    for knob in ignored {
        tracing::warn!(
            "{program}: --{}={} (an upstream Mooncake flag) has no effect here: {}",
            knob.name,
            knob.value,
            knob.why
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(args: &[&str]) -> Result<(Vec<String>, Vec<&'static str>), String> {
        let argv = std::iter::once("mooncake_master").chain(args.iter().copied());
        take(argv, MASTER_FLAGS).map(|(rest, ignored)| {
            (
                rest.into_iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect(),
                ignored.into_iter().map(|i| i.name).collect(),
            )
        })
    }

    #[test]
    fn switches_at_their_off_value_and_knobs_are_taken_out() {
        let (rest, ignored) = taken(&[
            "--rpc_port=50051",
            "--enable_snapshot=false",
            "--noenable_kv_events",
            "--enable_cxl=False",
            "--dynamic_replication_mode=OFF",
            "--snapshot_interval_seconds",
            "60",
            "-pod_name=p0",
            "--enable_disk_eviction",
            "--quota_bytes=0",
            "--config_path=",
            "--v=1",
        ])
        .unwrap();
        assert_eq!(rest, ["mooncake_master", "--rpc_port=50051", "--v=1"]);
        assert_eq!(ignored, ["snapshot_interval_seconds", "pod_name"]);
    }

    #[test]
    fn a_switch_turned_on_is_refused_naming_the_feature() {
        for (arg, says) in [
            ("--enable_snapshot", "snapshots are not built"),
            ("--enable_kv_events=1", "KV-event publisher"),
            ("--config_path=/etc/master.yaml", "config file"),
            ("--root_fs_dir=/mnt/3fs", "NFS/3FS"),
            ("--dynamic_replication_mode=enforce", "dynamic replication"),
            ("--enable_disk_eviction=false", "cannot be turned off"),
            ("--quota_bytes=1024", "quota"),
        ] {
            let message = taken(&[arg]).unwrap_err();
            assert!(
                message.contains("upstream Mooncake flag") && message.contains(says),
                "{arg}: {message}"
            );
        }
        assert!(taken(&["--cxl_size"])
            .unwrap_err()
            .contains("needs a value"));
        let before_the_end = taken(&["--cxl_size", "--", "--v=1"]).unwrap_err();
        assert!(before_the_end.contains("needs a value"), "{before_the_end}");
    }

    /// A name in the table would shadow the master's own flag of that name
    /// (`--ha_backend_connstring` is an alias of `--etcd_endpoints`, for instance): none may be
    /// one.
    #[test]
    fn no_upstream_only_flag_is_one_of_the_masters_own() {
        use clap::CommandFactory;
        let command = super::super::master::Flags::command();
        let own: Vec<&str> = command
            .get_arguments()
            .flat_map(|arg| {
                let aliases = arg.get_all_aliases().unwrap_or_default();
                arg.get_long().into_iter().chain(aliases)
            })
            .collect();
        assert!(own.contains(&"ha_backend_connstring") && own.contains(&"max_threads"));
        for flag in MASTER_FLAGS {
            assert!(
                !own.contains(&flag.name),
                "--{} is the master's own",
                flag.name
            );
        }
    }

    #[test]
    fn other_arguments_pass_through_untouched() {
        let (rest, ignored) = taken(&[
            "--enable_snapshots=true",
            "--noenable_snapshot=true",
            "--",
            "--enable_snapshot",
        ])
        .unwrap();
        assert_eq!(
            rest,
            [
                "mooncake_master",
                "--enable_snapshots=true",
                "--noenable_snapshot=true",
                "--",
                "--enable_snapshot"
            ]
        );
        assert!(ignored.is_empty());
    }
}
