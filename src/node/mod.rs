//! One process handle's plumbing, shared by the centralized client ([`crate::client`]) and the
//! P2P client ([`crate::p2p`]): the setup arguments and their validation (`config`), the
//! engine bootstrap and what a handle publishes to a metadata service (`engine`), the
//! registered local buffer (`local_buffer`), the own mounted segment (`own_segment`), the
//! link to the master with the single liveness loop and its hook (`master_link`), and what
//! the loop's answers prove about pins the handle holds (`standing`), and the SSD tier with
//! its read service and the readers of other clients' tiers (`disk_tier`), whose owner runs
//! its disk work on a queue drained by a pool of threads (`work_queue`).
//!
//! May use: `stream`, `standalone`, `master`, `metadata`, `storage`, `transfer`, `device`,
//! `rpc` and the ground floor; never `client`, `p2p` or `ffi`.

mod config;
mod disk_tier;
mod engine;
mod local_buffer;
mod master_link;
mod own_segment;
mod standing;
mod work_queue;

pub(crate) use config::MetadataMode;
pub use config::{ssd_offload_dir, SetupConfig};
pub(crate) use disk_tier::{DemotionSource, DiskReaders, DiskTierSettings, OwnDiskTier};
pub(crate) use engine::{publish_endpoint, start_dummy_engine, start_engine};
pub use local_buffer::LocalAlloc;
pub(crate) use local_buffer::LocalBuffer;
pub(crate) use master_link::{LivenessHook, MasterLink, PING_INTERVAL};
pub(crate) use own_segment::{OwnSegment, SEGMENT_FILE};
pub(crate) use standing::margin as ttl_margin;
