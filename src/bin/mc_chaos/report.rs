//! The run's report: faults × operations with counts, as a Markdown table that can be
//! pasted into docs/reliability.md, then the accounting and any violations.

use crate::checker::{FaultWindow, Verdict};
use crate::faults::{Accounting, KEYED_KINDS, KINDS};
use crate::worker::OPS;
use crate::Settings;
use std::time::Duration;

/// Prints the report to stdout.
pub fn print(
    settings: &Settings,
    verdict: &Verdict,
    windows: &[FaultWindow],
    (problems, notes): (&[String], &[String]),
    accounting: &Accounting,
    elapsed: Duration,
) {
    println!();
    println!(
        "mc_chaos --seed {} --duration {} --workers {} --dummies {} --owners {} --keys {} --max-value {} --segment '{}' ({} s wall)",
        settings.seed,
        settings.duration.as_secs(),
        settings.workers,
        settings.dummies,
        settings.owners,
        settings.keys,
        settings.max_value,
        settings.segment,
        elapsed.as_secs()
    );
    println!();
    // The kinds this run can draw at all (a run without a key has no intruder).
    let kinds: Vec<&str> = (KINDS.iter().copied())
        .filter(|kind| settings.cluster_key || !KEYED_KINDS.contains(kind))
        .collect();
    let mut header = String::from("| operation | calls | ok | failed |");
    let mut rule = String::from("|---|---:|---:|---:|");
    for kind in &kinds {
        header.push_str(&format!(" during {kind} |"));
        rule.push_str("---:|");
    }
    header.push_str(" worst ms | limit ms | violations |");
    rule.push_str("---:|---:|---:|");
    println!("{header}");
    println!("{rule}");
    let mut totals = [0u64; 4];
    let mut during_totals = vec![0u64; kinds.len()];
    for (op, _) in OPS {
        let counts = verdict.ops.get(*op).cloned().unwrap_or_default();
        let mut row = format!(
            "| {op} | {} | {} | {} |",
            counts.calls, counts.ok, counts.failed
        );
        for (i, kind) in kinds.iter().enumerate() {
            let n = counts.during.get(kind).copied().unwrap_or(0);
            during_totals[i] += n;
            row.push_str(&format!(" {n} |"));
        }
        row.push_str(&format!(
            " {} | {} | {} |",
            counts.worst_ns / 1_000_000,
            counts.limit_ns / 1_000_000,
            counts.violations
        ));
        totals[0] += counts.calls;
        totals[1] += counts.ok;
        totals[2] += counts.failed;
        totals[3] += counts.violations;
        println!("{row}");
    }
    let mut row = format!(
        "| **all** | {} | {} | {} |",
        totals[0], totals[1], totals[2]
    );
    for n in &during_totals {
        row.push_str(&format!(" {n} |"));
    }
    row.push_str(&format!(
        " {} | | {} |",
        verdict.longest_call_ns / 1_000_000,
        verdict.violations.len()
    ));
    println!("{row}");
    let mut row = String::from("| **faults injected** | | | |");
    for kind in &kinds {
        row.push_str(&format!(
            " {} |",
            windows.iter().filter(|w| w.kind == *kind).count()
        ));
    }
    row.push_str(" | | |");
    println!("{row}");
    println!();
    println!(
        "end of run: {} live objects ({} bytes in memory, {} on disk in {} records); master objects {:?}, bytes_used {:?}, active pins {:?}, deferred frees {:?}; longest call {} ms",
        accounting.live_objects,
        accounting.live_bytes,
        accounting.disk_objects,
        accounting.disk_records,
        accounting.master_objects,
        accounting.master_bytes_used,
        accounting.active_pins,
        accounting.deferred_frees,
        verdict.longest_call_ns / 1_000_000
    );
    let [demoted, failed, skipped, lost, trimmed, copied, released] = accounting.disk_counters;
    println!(
        "SSD tiers (the last master's counters): demotions committed {demoted:?}, failed {failed:?}, skipped {skipped:?}, replicas lost {lost:?}, evicted from disk {trimmed:?}, written through {copied:?}, memory released {released:?}"
    );
    let p2p = &accounting.p2p;
    println!(
        "P2P: {} routed keys, {} held by owners; P2P master p2p_keys {:?}, claimed keys {:?}",
        p2p.routed, p2p.held, p2p.master_keys, p2p.claimed_keys
    );
    for (label, fds, rss) in &accounting.usage {
        println!("  {label}: {fds} fds, {} MiB resident", rss >> 20);
    }
    for note in notes {
        println!("{note}");
    }
    for problem in problems {
        println!("PROBLEM: {problem}");
    }
    if !verdict.violations.is_empty() {
        println!(
            "{} violations (seed {}); the first ones:",
            verdict.violations.len(),
            settings.seed
        );
        print!("{}", verdict.details);
    }
}
