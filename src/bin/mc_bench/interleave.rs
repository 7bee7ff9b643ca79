//! Judging a scenario against its limit honestly: both are measured the same number of
//! times with the same size and duration, alternately (limit, scenario, limit, scenario …),
//! so a machine that speeds up or slows down during the run moves both; the report prints
//! the spread of each and the ratio of the medians and of the best rounds.
//!
//! Reuse: `judge(report, &Judged { .. }, limit, scenario)` with two closures that each
//! measure one round (for about the same duration) and return its value.

use crate::report::Report;

/// Smallest, median and largest of a set of rounds.
#[derive(Clone, Copy, Debug)]
pub struct Spread {
    pub min: f64,
    pub median: f64,
    pub max: f64,
}

impl Spread {
    /// The spread of `values` (all zero for none).
    pub fn of(values: &[f64]) -> Spread {
        let mut sorted = values.to_vec();
        sorted.sort_by(|a, b| a.total_cmp(b));
        let at = |i: usize| sorted.get(i).copied().unwrap_or(0.0);
        Spread {
            min: at(0),
            median: at(sorted.len() / 2),
            max: at(sorted.len().saturating_sub(1)),
        }
    }

    /// The best round: the largest, or the smallest when `lower_is_better`.
    pub fn best(&self, lower_is_better: bool) -> f64 {
        if lower_is_better {
            self.min
        } else {
            self.max
        }
    }
}

/// What a judged line is called and how it is printed.
pub struct Judged<'a> {
    /// Scenario name.
    pub name: &'a str,
    /// Unit of both values; `us` means lower is better.
    pub unit: &'static str,
    /// Limit name.
    pub limit_name: &'a str,
    /// Rounds of each (≥ 1).
    pub rounds: usize,
}

/// The measured spreads of a judged scenario and its limit.
pub struct Verdict {
    pub scenario: Spread,
    pub limit: Spread,
}

/// Which judged lines a run measures (`--only`, `--profile`).
#[derive(Clone, Debug, Default)]
pub struct Selection {
    /// Only lines whose name contains this (`None`: all).
    pub name_contains: Option<String>,
    /// Skip the limits (`--profile`: the scenario alone, for a profiler); ratios print as 0.
    pub without_limits: bool,
}

/// Runs `limit` and `scenario` alternately, `what.rounds` times each (limit first), prints
/// the line (medians, spreads, ratio of medians and of the best rounds) and returns the
/// spreads; `None` when the report's [`Selection`] leaves the line out. Each closure
/// measures one round and returns its value in `what.unit`; the first error stops the run.
pub fn judge(
    report: &mut Report,
    what: &Judged<'_>,
    mut limit: impl FnMut() -> Result<f64, String>,
    mut scenario: impl FnMut() -> Result<f64, String>,
) -> Result<Option<Verdict>, String> {
    let selection = report.selection();
    if selection
        .name_contains
        .as_ref()
        .is_some_and(|part| !what.name.contains(part.as_str()))
    {
        return Ok(None);
    }
    let rounds = what.rounds.max(1);
    let (mut limits, mut scenarios) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for _ in 0..rounds {
        if !selection.without_limits {
            limits.push(limit()?);
        }
        scenarios.push(scenario()?);
    }
    let verdict = Verdict {
        scenario: Spread::of(&scenarios),
        limit: Spread::of(&limits),
    };
    report.judged(what, &verdict);
    Ok(Some(verdict))
}
