//! The user's API: how a communicator is built ([`builder`]), its collectives on host memory
//! ([`communicator`]), point-to-point groups ([`group`]), shared buffers ([`buffer`]), splits
//! and shrinks ([`split`], `elastic.rs`), growth ([`grow`]), aborts (`abort.rs`), and on GPUs
//! the raw device-address calls (`device_raw.rs`), the GPU memory a communicator holds
//! (`device_memory.rs`), windows of user memory used in place (`window.rs`) and buffers each
//! rank registers alone (`registered.rs`), the typed calls over cudarc buffers
//! (`device_typed.rs`, checked by `device_checks.rs`) and device groups (`device_group.rs`).
//!
//! Every call checks its arguments, records itself in the ledger (`ledgered.rs`) and hands the
//! engine a [`CollectiveCall`](crate::call::CollectiveCall) (or a device call) through
//! `crate::exec`, which runs the plan on its executor; nothing below this module imports it.

pub(crate) mod abort;
pub(crate) mod arguments;
pub mod buffer;
pub(crate) mod builder;
pub mod communicator;
#[cfg(feature = "cuda")]
pub(crate) mod device_checks;
#[cfg(feature = "cuda")]
pub(crate) mod device_group;
pub(crate) mod device_memory;
#[cfg(feature = "cuda")]
pub(crate) mod device_raw;
#[cfg(feature = "cuda")]
pub(crate) mod device_typed;
pub(crate) mod elastic;
pub(crate) mod group;
pub mod grow;
pub(crate) mod ledgered;
#[cfg(feature = "cuda")]
pub(crate) mod registered;
pub mod split;
#[cfg(feature = "cuda")]
pub(crate) mod window;
