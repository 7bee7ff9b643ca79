//! The RDMA transport (ibverbs, RC queue pairs, one-sided READ/WRITE).
//!
//! Modules, one job each: `verbs` (the C layouts and the run-time loaded entry points),
//! `device` (opening a device, its PD, and memory registrations), `devices` (the devices of
//! a `device_name` list), `events` (a device's completion channel and asynchronous events,
//! one thread), `qp` (one queue pair:
//! connecting it and running work requests with bounded outstanding work), `handshake`
//! (QP endpoints and region tables over the TCP data port), `bounce` (registered bounce
//! buffers), `gpudirect` (registering device memory with the NIC), `retire` (re-registration under new rkeys, old MRs kept through a quarantine) and `transport` ([`RdmaTransport`]: registrations, connections per peer, slices).
//!
//! libibverbs is opened with `dlopen` on first use, so nothing here makes the library a
//! load-time dependency of `libmooncake_rs.so`.

mod bounce;
mod device;
mod devices;
mod events;
mod gpudirect;
mod handshake;
mod qp;
mod retire;
mod transport;
mod verbs;

#[cfg(test)]
mod tests;

pub use device::RdmaDevice;
pub use devices::RdmaDevices;
pub(crate) use handshake::{fuzz as fuzz_handshake, REQUEST_LEN};
pub use transport::RdmaDeviceBytes;
pub(crate) use transport::RdmaTransport;
