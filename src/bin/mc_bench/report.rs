//! Printing results: a table for people, JSON lines for scripts.

use serde::Serialize;

/// One measured scenario and the limit it is compared with.
#[derive(Serialize)]
pub struct Line {
    pub name: String,
    pub value: f64,
    pub unit: &'static str,
    pub limit_name: String,
    pub limit_value: f64,
    pub ratio: f64,
}

/// Collects and prints lines as they are measured.
pub struct Report {
    json: bool,
}

impl Report {
    pub fn new(json: bool) -> Report {
        if !json {
            println!(
                "{:<34} {:>12} {:<5} {:<28} {:>12} {:>7}",
                "scenario", "value", "unit", "limit", "limit value", "ratio"
            );
        }
        Report { json }
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
        let ratio = if limit_value > 0.0 {
            value / limit_value
        } else {
            0.0
        };
        let line = Line {
            name: name.into(),
            value,
            unit,
            limit_name: limit_name.into(),
            limit_value,
            ratio,
        };
        if self.json {
            println!("{}", serde_json::to_string(&line).unwrap_or_default());
        } else {
            println!(
                "{:<34} {:>12.3} {:<5} {:<28} {:>12.3} {:>7.3}",
                line.name, line.value, line.unit, line.limit_name, line.limit_value, line.ratio
            );
        }
    }
}
