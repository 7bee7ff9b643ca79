//! `mc_bench`: measures the hardware limits and the store's scenarios in the same run and
//! prints each scenario as a ratio to its limit (the on-stream scenarios, `stream.rs`, are
//! compared with each other: call cost vs bytes, session vs pinning calls, pipeline vs ideal).
//!
//! Usage: `mc_bench [--json] [--quick] [--device | --stream | --load | --same-host]`
//! (`--same-host`: only the same-host scenarios, `same_host.rs`; `--load`: only the
//! master load test, `load.rs`, about 30 s; `--device`: only the memcpy
//! limit, the embedded host scenarios and the device scenarios, which need a GPU and are
//! skipped cleanly without one; `--stream`: only the memcpy limit and the on-stream
//! scenarios). With `--json` every line is one JSON object
//! `{name, value, unit, limit_name, limit_value, ratio}`. `ratio = value / limit_value`; for
//! latencies (unit `us`) lower is better, for throughputs higher is better.

mod device;
mod limits;
mod load;
mod p2p;
mod redis;
mod report;
mod same_host;
mod scenarios;
mod stream;
mod stream_put;

use report::Report;

fn main() {
    mooncake_rs::init_logging();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--serve-segment") {
        std::process::exit(scenarios::serve_segment(&args[1..]));
    }
    if args.first().map(String::as_str) == Some("--serve-p2p-owner") {
        std::process::exit(p2p::serve_owner(&args[1..]));
    }
    let mut json = false;
    let mut quick = false;
    let mut only = scenarios::Only::All;
    for arg in &args {
        match arg.as_str() {
            "--json" => json = true,
            "--quick" => quick = true,
            "--device" => only = scenarios::Only::Device,
            "--stream" => only = scenarios::Only::Stream,
            "--load" => only = scenarios::Only::Load,
            "--same-host" => only = scenarios::Only::SameHost,
            other => {
                eprintln!(
                    "mc_bench: unknown argument '{other}' (use --json, --quick, --device, --stream, --load, --same-host)"
                );
                std::process::exit(2);
            }
        }
    }
    let mut report = Report::new(json);
    if let Err(message) = scenarios::run_all(&mut report, quick, only) {
        eprintln!("mc_bench: {message}");
        std::process::exit(1);
    }
}
