//! The process environment, read in one place: every `MC_*` / `MOONCAKE_*` variable the library
//! reads is named here, with its default and range, and `docs/configuration.md` lists them all in
//! one table. Also the size parser Mooncake's flags and variables share.
//!
//! Thread-safety: free functions and constants; reading the environment is safe from any thread
//! (nothing in the library writes it).

use crate::error::{fail, ErrorCode, Result};

/// One numeric environment tunable: its name, default and accepted range. A value that
/// does not parse falls back to the default; one outside the range is clamped into it.
pub(crate) struct Knob {
    pub(crate) name: &'static str,
    pub(crate) default: u64,
    pub(crate) min: u64,
    pub(crate) max: u64,
}

impl Knob {
    /// The value `text` gives this knob (see [`Knob`]); a bad value is logged.
    pub(crate) fn read(&self, text: Option<&str>) -> u64 {
        let Some(text) = text else {
            return self.default;
        };
        match text.trim().parse::<u64>() {
            Ok(value) if (self.min..=self.max).contains(&value) => value,
            Ok(value) => {
                let clamped = value.clamp(self.min, self.max);
                tracing::warn!("{}={value} is out of range; using {clamped}", self.name);
                clamped
            }
            Err(_) => {
                tracing::warn!(
                    "{}={text:?} is not a number; using the default {}",
                    self.name,
                    self.default
                );
                self.default
            }
        }
    }
}

/// Parses Mooncake's human-readable sizes: a plain byte count or a number with a
/// `K/KB/KiB/M/MB/MiB/G/GB/GiB/T/TB/TiB` suffix (binary multiples, case-insensitive).
pub fn parse_size(text: &str) -> Result<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return fail(
                ErrorCode::InvalidParams,
                format!("unknown size unit '{other}'"),
            )
        }
    };
    let out_of_range = || {
        fail(
            ErrorCode::InvalidParams,
            format!("size '{text}' out of range"),
        )
    };
    // A whole number is scaled exactly; only a fraction goes through a double (a u64 above
    // 2^53 does not survive one).
    if let Ok(whole) = number.parse::<u64>() {
        return whole.checked_mul(multiplier).map_or_else(out_of_range, Ok);
    }
    let value: f64 = match number.parse() {
        Ok(v) => v,
        Err(_) => return fail(ErrorCode::InvalidParams, format!("bad size '{text}'")),
    };
    let bytes = value * multiplier as f64;
    // u64::MAX as f64 is 2^64, itself out of range.
    if !(0.0..u64::MAX as f64).contains(&bytes) {
        return out_of_range();
    }
    Ok(bytes as u64)
}

/// Reads an environment variable as a number, falling back to `default` when unset or
/// unparsable.
pub(crate) fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// Reads a boolean environment variable (`1/true/yes/on`, `0/false/no/off`).
pub(crate) fn env_bool(name: &str) -> Option<bool> {
    let value = std::env::var(name).ok()?;
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_mooncake() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("4 GB").unwrap(), 4 << 30);
        assert_eq!(parse_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert_eq!(parse_size("12 parsecs"), Err(ErrorCode::InvalidParams));
        assert_eq!(parse_size(""), Err(ErrorCode::InvalidParams));
    }
}
