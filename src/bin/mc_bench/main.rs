//! `mc_bench`: measures the hardware limits and the store's scenarios in the same run and
//! prints each scenario as a ratio to its limit.
//!
//! Usage: `mc_bench [--json] [--quick] [--device]` (`--device`: only the memcpy limit, the
//! embedded host scenarios and the device scenarios, which need a GPU and are skipped
//! cleanly without one). With `--json` every line is one JSON object
//! `{name, value, unit, limit_name, limit_value, ratio}`. `ratio = value / limit_value`; for
//! latencies (unit `us`) lower is better, for throughputs higher is better.

mod device;
mod limits;
mod p2p;
mod redis;
mod report;
mod scenarios;

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
    let mut device_only = false;
    for arg in &args {
        match arg.as_str() {
            "--json" => json = true,
            "--quick" => quick = true,
            "--device" => device_only = true,
            other => {
                eprintln!("mc_bench: unknown argument '{other}' (use --json, --quick, --device)");
                std::process::exit(2);
            }
        }
    }
    let mut report = Report::new(json);
    if let Err(message) = scenarios::run_all(&mut report, quick, device_only) {
        eprintln!("mc_bench: {message}");
        std::process::exit(1);
    }
}
