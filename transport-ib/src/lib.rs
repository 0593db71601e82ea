//! # transport-ib
//!
//! weave over InfiniBand and RoCE verbs. This step holds the verbs layer ([`verbs`]): a port
//! chosen by `WEAVE_IB_HCA` (or the first active one), protection domain, registrations of
//! existing memory, completion queues and RC queue pairs with RDMA write and atomic
//! fetch-and-add. The transport backend and connection on top of it (endpoints through the
//! bootstrap, `write` as RDMA writes, `update_and_sync` as a fetch-and-add ordered after the
//! data) come next.
//!
//! No machine here has an HCA: the tests that need a device are `#[ignore]`d and run inside a
//! QEMU guest with SoftRoCE (`transport-ib/vm/softroce-guest.sh DIR` runs `DIR/test.sh` there).
//! A machine without RDMA gets [`Error::Unsupported`](comm_core::Error::Unsupported), never a
//! panic.

pub mod verbs;

pub use verbs::PortChoice;

/// The name this transport registers, and answers to in `WEAVE_TRANSPORTS`.
pub const NAME: &str = "ib";
