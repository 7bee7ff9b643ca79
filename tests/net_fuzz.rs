//! Network fuzzing of open servers (no cluster key): see `common::net_fuzz`.

mod common;

#[test]
fn a_master_and_a_peer_survive_mutated_frames_with_bounded_memory() {
    common::net_fuzz::mutated_frames(None);
}

#[test]
fn a_peer_serves_requests_aimed_inside_its_segment_exactly_and_survives_them() {
    common::net_fuzz::aimed_requests(None);
}
