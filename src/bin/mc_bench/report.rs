//! Printing results: a table for people, JSON lines for scripts.

use crate::interleave::{Judged, Selection, Verdict};
use serde::Serialize;

/// One measured scenario and the limit it is compared with.
#[derive(Serialize)]
pub struct Line {
    pub name: String,
    /// The value; for a judged line (see `interleave`) the median of its rounds.
    pub value: f64,
    pub unit: &'static str,
    pub limit_name: String,
    /// The limit; for a judged line the median of its rounds.
    pub limit_value: f64,
    /// `value / limit_value`.
    pub ratio: f64,
    /// Judged lines only: the rounds' spread and the ratio of the best rounds.
    #[serde(skip_serializing_if = "Option::is_none", flatten)]
    pub spread: Option<SpreadFields>,
}

/// The extra fields of a judged line.
#[derive(Serialize)]
pub struct SpreadFields {
    pub rounds: usize,
    pub value_min: f64,
    pub value_max: f64,
    pub limit_min: f64,
    pub limit_max: f64,
    /// Best scenario round / best limit round (best: largest, smallest for `us`).
    pub ratio_best: f64,
}

/// Collects and prints lines as they are measured.
pub struct Report {
    json: bool,
    selection: Selection,
}

fn ratio(value: f64, limit: f64) -> f64 {
    if limit > 0.0 {
        value / limit
    } else {
        0.0
    }
}

impl Report {
    /// A report printing JSON lines or a table; `selection` picks the judged lines.
    pub fn new(json: bool, selection: Selection) -> Report {
        if !json {
            println!(
                "{:<34} {:>12} {:<5} {:<28} {:>12} {:>7}  {:>7}  spread min/median/max: scenario | limit",
                "scenario", "value", "unit", "limit", "limit value", "ratio", "best"
            );
        }
        Report { json, selection }
    }

    /// Which judged lines to measure.
    pub fn selection(&self) -> Selection {
        self.selection.clone()
    }

    /// Prints a limit measurement (its own line, ratio 1).
    pub fn limit(&mut self, name: &str, value: f64, unit: &'static str) {
        self.line(name, value, unit, name, value);
    }

    /// Prints a scenario against a limit.
    pub fn line(
        &mut self,
        name: &str,
        value: f64,
        unit: &'static str,
        limit_name: &str,
        limit_value: f64,
    ) {
        self.print(Line {
            name: name.into(),
            value,
            unit,
            limit_name: limit_name.into(),
            limit_value,
            ratio: ratio(value, limit_value),
            spread: None,
        });
    }

    /// Prints a scenario judged against its interleaved limit (see `interleave::judge`):
    /// medians, ratio of medians, ratio of the best rounds and both spreads.
    pub fn judged(&mut self, what: &Judged<'_>, verdict: &Verdict) {
        let lower_is_better = what.unit == "us";
        let (s, l) = (&verdict.scenario, &verdict.limit);
        self.print(Line {
            name: what.name.into(),
            value: s.median,
            unit: what.unit,
            limit_name: what.limit_name.into(),
            limit_value: l.median,
            ratio: ratio(s.median, l.median),
            spread: Some(SpreadFields {
                rounds: what.rounds,
                value_min: s.min,
                value_max: s.max,
                limit_min: l.min,
                limit_max: l.max,
                ratio_best: ratio(s.best(lower_is_better), l.best(lower_is_better)),
            }),
        });
    }

    fn print(&mut self, line: Line) {
        if self.json {
            println!("{}", serde_json::to_string(&line).unwrap_or_default());
            return;
        }
        let mut text = format!(
            "{:<34} {:>12.3} {:<5} {:<28} {:>12.3} {:>7.3}",
            line.name, line.value, line.unit, line.limit_name, line.limit_value, line.ratio
        );
        if let Some(s) = &line.spread {
            text += &format!(
                "  {:>7.3}  {:.3}/{:.3}/{:.3} | {:.3}/{:.3}/{:.3} (x{})",
                s.ratio_best,
                s.value_min,
                line.value,
                s.value_max,
                s.limit_min,
                line.limit_value,
                s.limit_max,
                s.rounds
            );
        }
        println!("{text}");
    }
}
