//! Whether a segment endpoint (`host:port`) names this host: only such peers are asked for a
//! same-host mapping, so a process that binds the socket name of a *remote* peer's endpoint
//! is never asked.

use std::collections::HashSet;
use std::net::IpAddr;

/// Whether `endpoint`'s host is a loopback address, an address of one of this host's
/// interfaces, `localhost`, or this host's name. No name is resolved (no DNS on this path);
/// an endpoint without a port is not local.
pub(super) fn is_local(endpoint: &str) -> bool {
    let Some((host, _port)) = endpoint.rsplit_once(':') else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback() || interface_addresses().contains(&ip),
        Err(_) => {
            host.eq_ignore_ascii_case("localhost")
                || crate::process::host_name().is_some_and(|name| name.eq_ignore_ascii_case(host))
        }
    }
}

/// The addresses of this host's interfaces now (empty when they cannot be listed).
fn interface_addresses() -> HashSet<IpAddr> {
    let mut found = HashSet::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` or fails (checked); freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return found;
    }
    let mut at = list;
    while !at.is_null() {
        // SAFETY: a node of the list getifaddrs returned, alive until freeifaddrs.
        let addr = unsafe { (*at).ifa_addr };
        if !addr.is_null() {
            // SAFETY: `addr` points at a sockaddr of the family it names.
            match i32::from(unsafe { (*addr).sa_family }) {
                libc::AF_INET => {
                    // SAFETY: an AF_INET address is a sockaddr_in.
                    let v4 = unsafe { &*(addr as *const libc::sockaddr_in) };
                    found.insert(IpAddr::from(u32::from_be(v4.sin_addr.s_addr).to_be_bytes()));
                }
                libc::AF_INET6 => {
                    // SAFETY: an AF_INET6 address is a sockaddr_in6.
                    let v6 = unsafe { &*(addr as *const libc::sockaddr_in6) };
                    found.insert(IpAddr::from(v6.sin6_addr.s6_addr));
                }
                _ => {}
            }
        }
        // SAFETY: as above.
        at = unsafe { (*at).ifa_next };
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(list) };
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_own_names_are_local_and_other_addresses_are_not() {
        assert!(is_local("127.0.0.1:1"));
        assert!(is_local("127.9.8.7:65535"));
        assert!(is_local("[::1]:5"));
        assert!(is_local("localhost:5"));
        if let Some(name) = crate::process::host_name() {
            assert!(is_local(&format!("{name}:5")));
        }
        for ip in interface_addresses() {
            let endpoint = match ip {
                IpAddr::V4(v4) => format!("{v4}:7"),
                IpAddr::V6(v6) => format!("[{v6}]:7"),
            };
            assert!(is_local(&endpoint), "{endpoint}");
        }
        assert!(!is_local("192.0.2.1:5"), "TEST-NET-1");
        assert!(!is_local("no-such-host.invalid:5"));
        assert!(!is_local("127.0.0.1"), "no port");
    }
}
