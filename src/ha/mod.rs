//! High availability on etcd: a group of masters with one leader ([`member`], [`role`]) and
//! clients that follow it ([`view`]), over a small blocking etcd client ([`etcd`]). See
//! `docs/ha.md` for the design (election, fencing, journal copying, the in-sync list).
//!
//! Floor: above `master` (a member runs a `MasterService`, copies journals through its RPC
//! client) and `rpc`; `node` uses [`view`] for `etcd://` master addresses.

pub mod etcd;
pub mod member;
pub mod role;
pub mod view;

pub use member::{HaConfig, Member};
pub use role::{Role, RoleCall};
pub use view::{is_etcd_addr, Leader, LeaderView};
