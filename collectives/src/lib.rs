//! # weave collectives
//!
//! The user-facing crate of weave: a [`Communicator`] with all-reduce, all-gather,
//! reduce-scatter, broadcast, reduce, all-to-all(v) and grouped send/recv, each picking its
//! algorithm from an [`AlgorithmTable`] by message size and world size.
//!
//! ```no_run
//! use collectives::{Communicator, ReduceOp};
//!
//! # fn main() -> comm_core::Result<()> {
//! let comm = Communicator::from_env()?; // launched by `cargo xtask launch -n 4 -- …`
//! let mine = vec![comm.rank() as f32; 1024];
//! let mut sum = vec![0.0f32; 1024];
//! comm.all_reduce(&mine, &mut sum, ReduceOp::Sum)?;
//! # Ok(()) }
//! ```
//!
//! Transports come from Cargo features: `shm` (POSIX shared memory, default), `tcp` (default),
//! `ib`, and `cudaipc` (GPU memory over NVLink / PCIe peer access, default). The GPU engine —
//! the device calls — comes with `cuda` (turned on by `cudaipc`) and runs over whichever
//! transports reach the peers; the CUDA driver is loaded at run time, so CPU-only machines
//! build and run it — the GPU path is then off. The primitives layer is re-exported as
//! [`core`].

mod api;
mod call;
mod channel;
mod copy;
#[cfg(feature = "cuda")]
mod device_staging;
pub mod dtype;
mod exec;
pub mod fp8;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
#[cfg(feature = "cuda")]
pub mod gpu;
mod health;
mod hierarchy;
mod host;
mod matching;
pub mod op;
mod p2p_progress;
mod per_rank;
pub mod reduce;
mod schedule;
pub mod select;
mod widen;
pub use select::table;

pub use api::abort::AbortHandle;
pub use api::buffer::SharedBuffer;
pub use api::builder::{Builder, default_transports};
#[cfg(feature = "cuda")]
pub use api::device_group::DeviceGroup;
pub use api::device_memory::DeviceMemory;
pub use api::group::Group;
pub use api::grow::{GrowId, Growing};
#[cfg(feature = "cuda")]
pub use api::registered::DeviceRegistration;
#[cfg(feature = "cuda")]
pub use api::window::{Window, WindowOffsets};
pub use api::{buffer, communicator, grow, split};
pub use call::DeviceTransfer;
pub use comm_core as core;
pub use communicator::Communicator;
pub use dtype::{DataType, Element, ForEachElement};
pub use fp8::{F8E4M3, F8E5M2};
pub use half::{bf16, f16};
pub use op::ReduceOp;
pub use table::{Algorithm, AlgorithmTable, Collective, Family, MemorySpace};

#[cfg(feature = "cudaipc")]
pub use transport_cudaipc;
#[cfg(feature = "ib")]
pub use transport_ib;
#[cfg(feature = "shm")]
pub use transport_shm;
#[cfg(feature = "tcp")]
pub use transport_tcp;
