//! The history each worker appends to its own file and the checker reads back: one line per
//! event, written with one `write(2)` so a SIGKILLed worker leaves only whole lines (a torn
//! last line is skipped on reading). Times are CLOCK_MONOTONIC nanoseconds, one clock for
//! every process on the machine.

use std::fs::File;
use std::io::Write;

/// Now on CLOCK_MONOTONIC, in nanoseconds.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One event of a worker's history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A write of `version` to `key` by operation `op` begins at `at`.
    WriteBegin {
        at: u64,
        op: String,
        key: String,
        version: u64,
    },
    /// That write returned `rc` (0: committed) at `at`.
    WriteEnd {
        at: u64,
        key: String,
        version: u64,
        rc: i32,
    },
    /// A read of `key` by `op` over `[begin, end]`: `rc` 0 with the `version` the bytes named
    /// (every byte checked), or the error code.
    Read {
        begin: u64,
        end: u64,
        op: String,
        key: String,
        version: u64,
        rc: i32,
    },
    /// A read whose bytes were wrong (torn, garbage, another key's): always a violation.
    Corrupt {
        begin: u64,
        end: u64,
        op: String,
        key: String,
        detail: String,
    },
    /// A removal of `key` (`*`: remove_all) over `[begin, end]` returning `rc`.
    Remove {
        begin: u64,
        end: u64,
        op: String,
        key: String,
        rc: i32,
    },
    /// The worker's data-path totals so far (this incarnation): bytes it moved through
    /// mapped same-host segments, (a dummy) bytes its real client moved for it, and reads
    /// its location cache answered without the master.
    /// Written every few seconds, so a killed worker leaves most of its traffic counted.
    Traffic {
        at: u64,
        same_host_bytes: u64,
        dummy_bytes: u64,
        cache_hits: u64,
    },
}

impl Event {
    fn line(&self) -> String {
        match self {
            Event::WriteBegin {
                at,
                op,
                key,
                version,
            } => format!("B {at} {op} {key} {version}\n"),
            Event::WriteEnd {
                at,
                key,
                version,
                rc,
            } => format!("E {at} {key} {version} {rc}\n"),
            Event::Read {
                begin,
                end,
                op,
                key,
                version,
                rc,
            } => {
                format!("R {begin} {end} {op} {key} {version} {rc}\n")
            }
            Event::Corrupt {
                begin,
                end,
                op,
                key,
                detail,
            } => {
                format!("X {begin} {end} {op} {key} {}\n", detail.replace('\n', " "))
            }
            Event::Remove {
                begin,
                end,
                op,
                key,
                rc,
            } => format!("D {begin} {end} {op} {key} {rc}\n"),
            Event::Traffic {
                at,
                same_host_bytes,
                dummy_bytes,
                cache_hits,
            } => format!("T {at} {same_host_bytes} {dummy_bytes} {cache_hits}\n"),
        }
    }

    /// Parses one line; `None` for a torn or unknown line.
    pub fn parse(line: &str) -> Option<Event> {
        let tag = line.split(' ').next()?;
        let event = match tag {
            "B" => {
                let w: Vec<&str> = line.trim_end().split(' ').collect();
                let [_, at, op, key, version] = w[..] else {
                    return None;
                };
                Event::WriteBegin {
                    at: at.parse().ok()?,
                    op: op.to_string(),
                    key: key.to_string(),
                    version: version.parse().ok()?,
                }
            }
            "E" => {
                let w: Vec<&str> = line.trim_end().split(' ').collect();
                let [_, at, key, version, rc] = w[..] else {
                    return None;
                };
                Event::WriteEnd {
                    at: at.parse().ok()?,
                    key: key.to_string(),
                    version: version.parse().ok()?,
                    rc: rc.parse().ok()?,
                }
            }
            "R" => {
                let w: Vec<&str> = line.trim_end().split(' ').collect();
                let [_, begin, end, op, key, version, rc] = w[..] else {
                    return None;
                };
                Event::Read {
                    begin: begin.parse().ok()?,
                    end: end.parse().ok()?,
                    op: op.to_string(),
                    key: key.to_string(),
                    version: version.parse().ok()?,
                    rc: rc.parse().ok()?,
                }
            }
            "X" => {
                let w: Vec<&str> = line.trim_end().splitn(6, ' ').collect();
                let [_, begin, end, op, key, detail] = w[..] else {
                    return None;
                };
                Event::Corrupt {
                    begin: begin.parse().ok()?,
                    end: end.parse().ok()?,
                    op: op.to_string(),
                    key: key.to_string(),
                    detail: detail.to_string(),
                }
            }
            "D" => {
                let w: Vec<&str> = line.trim_end().split(' ').collect();
                let [_, begin, end, op, key, rc] = w[..] else {
                    return None;
                };
                Event::Remove {
                    begin: begin.parse().ok()?,
                    end: end.parse().ok()?,
                    op: op.to_string(),
                    key: key.to_string(),
                    rc: rc.parse().ok()?,
                }
            }
            "T" => {
                let w: Vec<&str> = line.trim_end().split(' ').collect();
                let [_, at, same_host_bytes, dummy_bytes, cache_hits] = w[..] else {
                    return None;
                };
                Event::Traffic {
                    at: at.parse().ok()?,
                    same_host_bytes: same_host_bytes.parse().ok()?,
                    dummy_bytes: dummy_bytes.parse().ok()?,
                    cache_hits: cache_hits.parse().ok()?,
                }
            }
            _ => return None,
        };
        Some(event)
    }
}

/// Appends events to one worker's file. Owned by that worker's thread.
pub struct Journal {
    file: File,
}

impl Journal {
    /// Opens (creating, appending) `path`.
    pub fn open(path: &str) -> std::io::Result<Journal> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Journal { file })
    }

    /// Appends `event` with a single write. A failed write ends the worker: a history with
    /// holes could hide a violation.
    pub fn record(&mut self, event: &Event) -> std::io::Result<()> {
        self.file.write_all(event.line().as_bytes())
    }
}

/// Every whole event in the file at `path`.
pub fn read_all(path: &std::path::Path) -> std::io::Result<Vec<Event>> {
    let text = std::fs::read_to_string(path)?;
    Ok(text.lines().filter_map(Event::parse).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_through_lines() {
        let events = [
            Event::WriteBegin {
                at: 1,
                op: "put".into(),
                key: "k/1".into(),
                version: 9,
            },
            Event::WriteEnd {
                at: 2,
                key: "k/1".into(),
                version: 9,
                rc: -704,
            },
            Event::Read {
                begin: 3,
                end: 4,
                op: "get".into(),
                key: "k/1".into(),
                version: 9,
                rc: 0,
            },
            Event::Corrupt {
                begin: 3,
                end: 4,
                op: "get".into(),
                key: "k/1".into(),
                detail: "byte 3 is x".into(),
            },
            Event::Remove {
                begin: 5,
                end: 6,
                op: "remove_all".into(),
                key: "*".into(),
                rc: 0,
            },
            Event::Traffic {
                at: 7,
                same_host_bytes: 1 << 40,
                dummy_bytes: 12,
                cache_hits: 3,
            },
        ];
        for event in events {
            assert_eq!(Event::parse(event.line().trim_end()), Some(event.clone()));
        }
        assert_eq!(Event::parse("R 1 2 get"), None);
    }
}
