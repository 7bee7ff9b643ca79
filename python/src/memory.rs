//! Checks of the bare addresses Python callers pass (`buffer_ptr` ints): NULL, unmapped,
//! read-only or overflowing ranges give `INVALID_PARAMS` instead of a crash (an address inside
//! mapped memory that is not the caller's buffer cannot be told apart). Memory registered with the client
//! (`register_buffer`, the local buffer, the segment) and device memory are trusted; any
//! other range must be mapped in this process with the needed access (read for sources,
//! read-write for destinations), as `/proc/self/maps` shows it at the call. Callers still
//! keep the memory valid for the call's duration (upstream's contract, spec §0.6).

use mooncake_rs::client::{Buf, Client};
use mooncake_rs::error::{fail, ErrorCode, Result};

/// How a range will be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// The store reads it (put sources).
    Read,
    /// The store writes it (get destinations).
    Write,
}

/// `INVALID_PARAMS` unless every range of `lists` is usable with `access` (see the module
/// doc). Reads `/proc/self/maps` at most once, and only for unregistered host ranges.
pub fn check(client: &Client, lists: &[Vec<Buf>], access: Access) -> Result<()> {
    let mut maps: Option<Vec<Mapping>> = None;
    for buf in lists.iter().flatten() {
        if buf.len == 0 || trusted(client, *buf) {
            continue;
        }
        if buf.addr == 0 {
            return fail(ErrorCode::InvalidParams, "buffer address is 0 (NULL)");
        }
        let maps = match &mut maps {
            Some(m) => m,
            None => maps.insert(read_maps()?),
        };
        if !covered(maps, *buf, access) {
            return fail(
                ErrorCode::InvalidParams,
                format!(
                    "buffer [{:#x}, +{}) is not {} memory of this process (nor registered or device memory)",
                    buf.addr,
                    buf.len,
                    match access {
                        Access::Read => "readable",
                        Access::Write => "writable",
                    }
                ),
            );
        }
    }
    Ok(())
}

/// Registered with the client, or device memory.
fn trusted(client: &Client, buf: Buf) -> bool {
    let in_region = client
        .registered_region(buf.addr)
        .is_some_and(|(base, len)| {
            (buf.addr as u64 - base as u64)
                .checked_add(buf.len)
                .is_some_and(|end| end <= len)
        });
    in_region || mooncake_rs::device::runtime().is_device(buf.addr)
}

/// One line of `/proc/self/maps`.
struct Mapping {
    start: u64,
    end: u64,
    read: bool,
    write: bool,
}

fn read_maps() -> Result<Vec<Mapping>> {
    let text = match std::fs::read_to_string("/proc/self/maps") {
        Ok(t) => t,
        Err(e) => return fail(ErrorCode::InternalError, format!("/proc/self/maps: {e}")),
    };
    Ok(text.lines().filter_map(parse_line).collect())
}

fn parse_line(line: &str) -> Option<Mapping> {
    let mut fields = line.split_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?.as_bytes();
    Some(Mapping {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        read: perms.first() == Some(&b'r'),
        write: perms.get(1) == Some(&b'w'),
    })
}

/// Whether consecutive mappings with the access cover `[addr, addr + len)` (the file is
/// sorted by address).
fn covered(maps: &[Mapping], buf: Buf, access: Access) -> bool {
    let Some(end) = (buf.addr as u64).checked_add(buf.len) else {
        return false;
    };
    let mut at = buf.addr as u64;
    for m in maps {
        if m.end <= at {
            continue;
        }
        if m.start > at || !m.read || (access == Access::Write && !m.write) {
            return false;
        }
        at = m.end;
        if at >= end {
            return true;
        }
    }
    false
}
