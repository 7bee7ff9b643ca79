//! `mc_bench`: measures the hardware limits and the store's scenarios in the same run and
//! prints each scenario as a ratio to its limit (the on-stream scenarios, `stream.rs`, are
//! compared with each other: call cost vs bytes, session vs pinning calls, pipeline vs ideal).
//!
//! Usage: `mc_bench [--json] [--quick] [--device | --stream | --load | --tcp | --same-host | --rdma
//! | --journal | --failover | --ssd | --auth | --location-cache | --master-scale]
//! [--only NAME | --profile NAME]`, or `mc_bench --standalone [--json] [--quick]` (a dummy's
//! get through its real client against memcpy, `standalone.rs`) (`--tcp`: only the memcpy
//! limit and the TCP scenarios between two processes; `--same-host`: only the same-host
//! scenarios, `same_host.rs`; `--rdma`: only the RDMA transport
//! against perftest, inside the soft-RoCE VM, `rdma.rs`; `--only NAME`: of the judged lines,
//! only those whose name contains NAME; `--profile NAME`: the same without their limits, for a
//! profiler; `--journal`: the master journal's cost (ops/s with and without it, interleaved)
//! and a restart of 1 M objects (100 k with `--quick`), `journal.rs`; `--failover`: an HA
//! group on a real etcd, clients' wait when the leader is SIGKILLed, `failover.rs`; `--ssd`: the
//! SSD tier's disk gets and demotions against `fio` on the same directory and its DRAM-hit
//! cost, `ssd.rs`; `--auth`: gets and new connections with a cluster key against without,
//! `auth.rs`; `--location-cache`: hot and cold gets with the location cache against their
//! limits, and upserts of cached keys, `location_cache.rs`; `--master-scale`: the master's
//! memory per object, op/s and gets during `remove_all` at 1 M to 30 M objects (1 M with
//! `--quick`), `master_scale.rs`; `--load`: only the
//! master load test, `load.rs`, about 30 s; `--device`: only the memcpy
//! limit, the embedded host scenarios and the device scenarios, which need a GPU and are
//! skipped cleanly without one; `--stream`: only the memcpy limit and the on-stream
//! scenarios). With `--json` every line is one JSON object
//! `{name, value, unit, limit_name, limit_value, ratio}`. `ratio = value / limit_value`; for
//! latencies (unit `us`) lower is better, for throughputs higher is better. A scenario judged
//! against an interleaved limit (`interleave`: the TCP and P2P ones) reports medians of its
//! rounds as `value`/`limit_value` and adds `rounds, value_min, value_max, limit_min,
//! limit_max, ratio_best`.

mod auth;
mod children;
mod device;
mod failover;
mod interleave;
mod journal;
mod limits;
mod load;
mod location_cache;
mod master_scale;
mod p2p;
mod rdma;
mod redis;
mod report;
mod same_host;
mod scenarios;
mod ssd;
mod standalone;
mod stream;
mod stream_put;

use report::Report;

/// A scenario run alone: `(report, quick)`.
type Alone = fn(&mut Report, bool) -> Result<(), String>;

fn main() {
    mooncake_rs::init_logging();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--serve-segment") {
        std::process::exit(scenarios::serve_segment(&args[1..]));
    }
    if args.first().map(String::as_str) == Some("--serve-real-client") {
        std::process::exit(standalone::serve_real_client(&args[1..]));
    }
    let json = args.iter().any(|a| a == "--json");
    if args.first().map(String::as_str) == Some("--standalone") {
        let mut report = Report::new(json, interleave::Selection::default());
        let quick = args.iter().any(|a| a == "--quick");
        let rounds = scenarios::Rounds {
            duration: std::time::Duration::from_millis(if quick { 300 } else { 1500 }),
            rounds: 5,
        };
        if let Err(message) = standalone::run(&mut report, rounds) {
            eprintln!("mc_bench: {message}");
            std::process::exit(1);
        }
        return;
    }
    if args.first().map(String::as_str) == Some("--serve-p2p-owner") {
        std::process::exit(p2p::serve_owner(&args[1..]));
    }
    if args.first().map(String::as_str) == Some("--auth-leg") {
        std::process::exit(auth::serve_leg(&args[1..]));
    }
    // Scenarios run alone, each with `--quick` for a shorter run.
    let alone: [(&str, Alone); 6] = [
        ("--auth", auth::run),
        ("--failover", failover::run),
        ("--journal", journal::run),
        ("--ssd", ssd::run),
        ("--location-cache", location_cache::run),
        ("--master-scale", master_scale::run),
    ];
    if let Some((_, run)) = alone
        .iter()
        .find(|(flag, _)| args.iter().any(|a| a == flag))
    {
        let mut report = Report::new(json, interleave::Selection::default());
        let quick = args.iter().any(|a| a == "--quick");
        if let Err(message) = run(&mut report, quick) {
            eprintln!("mc_bench: {message}");
            std::process::exit(1);
        }
        return;
    }
    if args.iter().any(|a| a == "--rdma") {
        let mut report = Report::new(json, interleave::Selection::default());
        if let Err(message) = rdma::run(&mut report) {
            eprintln!("mc_bench: {message}");
            std::process::exit(1);
        }
        return;
    }
    let mut quick = false;
    let mut only = scenarios::Only::All;
    let mut selection = interleave::Selection::default();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            flag @ ("--only" | "--profile") => {
                let Some(part) = args.next() else {
                    eprintln!("mc_bench: {flag} needs a part of a scenario name");
                    std::process::exit(2);
                };
                selection.name_contains = Some(part.clone());
                selection.without_limits = flag == "--profile";
            }
            "--json" => {}
            "--quick" => quick = true,
            "--device" => only = scenarios::Only::Device,
            "--stream" => only = scenarios::Only::Stream,
            "--load" => only = scenarios::Only::Load,
            "--tcp" => only = scenarios::Only::Tcp,
            "--same-host" => only = scenarios::Only::SameHost,
            other => {
                eprintln!(
                    "mc_bench: unknown argument '{other}' (use --json, --quick, --device, --stream, --load, --tcp, --same-host, --only NAME, --profile NAME)"
                );
                std::process::exit(2);
            }
        }
    }
    let mut report = Report::new(json, selection);
    if let Err(message) = scenarios::run_all(&mut report, quick, only) {
        eprintln!("mc_bench: {message}");
        std::process::exit(1);
    }
}
