use super::fdpass::MAX_FDS_PER_MESSAGE;
use super::*;
use crate::error::{last_error_message, ErrorCode};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

fn write_through(mapping: &PeerMapping, offset: usize, bytes: &[u8]) {
    assert!(offset + bytes.len() <= mapping.len());
    // SAFETY: inside the mapping; the test is the only user.
    unsafe {
        std::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            (mapping.addr() + offset) as *mut u8,
            bytes.len(),
        )
    };
}

fn read_through(mapping: &PeerMapping, offset: usize, len: usize) -> Vec<u8> {
    // SAFETY: inside the mapping; the test is the only user.
    unsafe { std::slice::from_raw_parts((mapping.addr() + offset) as *const u8, len).to_vec() }
}

#[test]
fn a_passed_memfd_maps_the_same_pages_on_both_sides() {
    let file = SealedMemfd::create("shm-test", 1 << 20).unwrap();
    let owner = PeerMapping::map(file.fd(), 0, file.len()).unwrap();
    write_through(&owner, 4096, b"written by the owner");
    let (a, b) = UnixStream::pair().unwrap();
    send_with_fds(&a, b"segment", &[file.fd()]).unwrap();
    let mut buf = [0u8; 64];
    let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
    assert_eq!((&buf[..n], fds.len()), (&b"segment"[..], 1));
    let peer = PeerMapping::map(fds[0].as_fd(), 0, 1 << 20).unwrap();
    drop(fds);
    assert_eq!(read_through(&peer, 4096, 20), b"written by the owner");
    write_through(&peer, 8192, b"and by the peer");
    assert_eq!(read_through(&owner, 8192, 15), b"and by the peer");
    // A window at a page offset sees the same bytes.
    let window = PeerMapping::map(file.fd(), 4096, 4096).unwrap();
    assert_eq!(read_through(&window, 0, 20), b"written by the owner");
}

#[test]
fn files_that_could_shrink_or_are_too_short_are_refused() {
    // SAFETY: a fresh memfd without seals.
    let raw = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(raw >= 0);
    // SAFETY: fresh descriptor.
    let unsealed = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: our descriptor.
    assert_eq!(unsafe { libc::ftruncate(unsealed.as_raw_fd(), 8192) }, 0);
    let err = PeerMapping::map(unsealed.as_fd(), 0, 4096).unwrap_err();
    assert_eq!(err, ErrorCode::InvalidParams);
    assert!(
        last_error_message().contains("not sealed"),
        "{}",
        last_error_message()
    );

    let file = SealedMemfd::create("short", 8192).unwrap();
    let err = PeerMapping::map(file.fd(), 4096, 8192).unwrap_err();
    assert_eq!(err, ErrorCode::InvalidParams);
    assert!(
        last_error_message().contains("8192 bytes"),
        "{}",
        last_error_message()
    );
    assert!(
        PeerMapping::map(file.fd(), 100, 4096).is_err(),
        "unaligned offset"
    );
    assert!(PeerMapping::map(file.fd(), 0, 0).is_err());
    assert!(PeerMapping::map(file.fd(), u64::MAX - 4095, 4096).is_err());
    // The seals hold: the owner itself cannot shrink it.
    // SAFETY: our descriptor.
    assert_ne!(unsafe { libc::ftruncate(file.fd().as_raw_fd(), 0) }, 0);
    assert_eq!(
        SealedMemfd::create("empty", 0).unwrap_err(),
        ErrorCode::InvalidParams
    );
}

#[test]
fn descriptor_limits_and_orderly_close() {
    let (a, b) = UnixStream::pair().unwrap();
    let file = SealedMemfd::create("many", 4096).unwrap();
    let too_many = vec![file.fd(); MAX_FDS_PER_MESSAGE + 1];
    let err = send_with_fds(&a, b"x", &too_many).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert_eq!(
        send_with_fds(&a, b"", &[file.fd()]).unwrap_err().kind(),
        std::io::ErrorKind::InvalidInput
    );
    let most = vec![file.fd(); MAX_FDS_PER_MESSAGE];
    send_with_fds(&a, b"y", &most).unwrap();
    let mut buf = [0u8; 4];
    let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
    assert_eq!((n, fds.len()), (1, MAX_FDS_PER_MESSAGE));
    drop(a);
    let (n, fds) = recv_with_fds(&b, &mut buf).unwrap();
    assert_eq!((n, fds.len()), (0, 0));
    // Sending to a closed peer is an error, not a SIGPIPE.
    let (c, d) = UnixStream::pair().unwrap();
    drop(d);
    assert!(send_with_fds(&c, b"z", &[]).is_err());
}

#[test]
fn a_sealed_hugetlb_file_is_refused() {
    // SAFETY: a fresh memfd; the flags are constants.
    let raw = unsafe {
        libc::memfd_create(
            c"huge".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING | libc::MFD_HUGETLB,
        )
    };
    if raw < 0 {
        eprintln!(
            "skipped: no hugetlb memfd here ({})",
            std::io::Error::last_os_error()
        );
        return;
    }
    // SAFETY: fresh descriptor.
    let file = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: our descriptor; a size of one huge page, then the seals.
    unsafe {
        assert_eq!(libc::ftruncate(file.as_raw_fd(), 2 << 20), 0);
        assert_eq!(
            libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK),
            0
        );
    }
    assert_eq!(
        PeerMapping::map(file.as_fd(), 0, 2 << 20).unwrap_err(),
        ErrorCode::InvalidParams
    );
    assert!(last_error_message().contains("not ordinary shared memory"));
}

#[test]
fn a_process_of_another_user_is_refused() {
    let (a, b) = UnixStream::pair().unwrap();
    check_peer_user(&a).unwrap();
    check_peer_user(&b).unwrap();
    let name = format!("mc-rs-test-{}-peer-user", std::process::id());
    let addr =
        <std::os::unix::net::SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(
            name.as_bytes(),
        )
        .unwrap();
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    let server = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        check_peer_user(&stream).unwrap_err()
    });
    let Some(seen) = crate::test_util::other_user_connects(&name, b"hello") else {
        return;
    };
    assert_eq!(seen, "CLOSED");
    let err = server.join().unwrap();
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
    assert!(err.to_string().contains("uid 65534"), "{err}");
}

/// A hole punched in a shared file (which `F_SEAL_SHRINK` does not prevent) that the kernel
/// cannot refill — strict overcommit at its limit — raised SIGBUS in the process copying
/// through its mapping, which killed it. The guard turns it into lost pages: both copies
/// finish (on scratch pages), the mapping says so, and other mappings are untouched.
/// Runs in the RDMA VM (`scripts/rdma-tests.sh`): it switches the kernel's overcommit.
#[test]
#[ignore = "needs a kernel of its own (strict overcommit): run by scripts/rdma-tests.sh"]
fn a_hole_punched_in_a_peers_file_fails_the_copy_not_the_process() {
    const MIB: usize = 1 << 20;
    let file = SealedMemfd::create("punched", 8 * MIB).unwrap();
    let owner = PeerMapping::map(file.fd(), 0, file.len()).unwrap();
    let peer = PeerMapping::map(file.fd(), 0, file.len()).unwrap();
    let other_file = SealedMemfd::create("intact", MIB).unwrap();
    let other = PeerMapping::map(other_file.fd(), 0, MIB).unwrap();
    write_through(&owner, 0, &vec![0x5a; 8 * MIB]);
    write_through(&other, 0, &vec![0x77; MIB]);
    let mut read = vec![0u8; 2 * MIB];
    let written = vec![0xc3u8; MIB];
    crate::test_util::punch_hole(file.fd(), 2 * MIB, 4 * MIB);
    {
        let _strict = crate::test_util::StrictOvercommit::enter();
        // SAFETY: both ranges lie inside the peer's mapping and our buffers.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (peer.addr() + 2 * MIB) as *const u8,
                read.as_mut_ptr(),
                read.len(),
            );
            std::ptr::copy_nonoverlapping(
                written.as_ptr(),
                (peer.addr() + 5 * MIB) as *mut u8,
                written.len(),
            );
        }
    }
    assert!(peer.lost_pages(), "the copies through the hole are marked");
    assert!(!owner.lost_pages() && !other.lost_pages());
    // Outside the recovered windows the peer still sees the file.
    assert_eq!(read_through(&peer, 0, 16), vec![0x5a; 16]);
    assert_eq!(read_through(&other, 0, MIB), vec![0x77; MIB]);
    // A fault outside every registered range is not swallowed: it still ends the process
    // (a child touches a page of a file it truncated).
    // SAFETY: fork in a test; the child makes only plain syscalls, faults, or exits.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // SAFETY: syscalls on the child's own fresh file and mapping.
        unsafe {
            let fd = libc::memfd_create(c"truncated".as_ptr(), 0);
            libc::ftruncate(fd, 4096);
            let page = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            );
            libc::ftruncate(fd, 0);
            std::ptr::read_volatile(page as *const u8);
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    assert!(
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGBUS,
        "a fault outside the guarded ranges still ends the process (status {status:#x})"
    );
}

/// A SIGBUS sent by a process (not a fault) goes to the action before the guard's, as it
/// would have without the guard: in a Rust program that is std's handler, which lets the
/// process go on but resets the action to the default. The guard's handler is then put back;
/// before, every later punched-hole fault of the process was unguarded (and fatal).
#[test]
fn a_sent_sigbus_goes_to_the_previous_handler_and_the_guard_stays_installed() {
    let file = SealedMemfd::create("sent", 4096).unwrap();
    let _mapping = PeerMapping::map(file.fd(), 0, 4096).unwrap();
    // SAFETY: reading the current action into a zeroed struct we own.
    let guard_action = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        assert_eq!(
            libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut action),
            0
        );
        action.sa_sigaction
    };
    // SAFETY: fork in a test; the child makes only plain syscalls and exits.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // SAFETY: raising a signal and reading the action in the child; no allocation.
        unsafe {
            libc::raise(libc::SIGBUS);
            let mut action: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut action);
            libc::_exit(if action.sa_sigaction == guard_action {
                0
            } else {
                3
            });
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    assert!(
        libc::WIFEXITED(status),
        "the sent SIGBUS ended the process (status {status:#x}); std's handler lets it go on"
    );
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "after the sent SIGBUS the guard's handler is no longer installed"
    );
}
