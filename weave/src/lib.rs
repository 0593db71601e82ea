//! # weave
//!
//! Collective and point-to-point communication between GPUs and CPU processes, over pluggable
//! transports — the one crate a user adds. It re-exports the user API of
//! [`collectives`](https://docs.rs/collectives) (a [`Communicator`] with all-reduce, all-gather,
//! reduce-scatter, broadcast, reduce, all-to-all(v), grouped send/recv, on host and device
//! buffers), weave's [`Error`] and [`Result`], the primitives layer as [`core`] and the
//! transport crates that the features turn on.
//!
//! ```no_run
//! use weave::{Communicator, ReduceOp};
//!
//! fn main() -> weave::Result<()> {
//!     let comm = Communicator::from_env()?; // cargo xtask launch -n 4 -- ./my_program
//!     let mine = vec![comm.rank() as f32; 1024];
//!     let mut sum = vec![0.0f32; 1024];
//!     comm.all_reduce(&mine, &mut sum, ReduceOp::Sum)?;
//!     Ok(())
//! }
//! ```
//!
//! [`Communicator::from_env`] reads what a launcher sets (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
//! `MASTER_PORT`: `cargo xtask launch`, torchrun, Open MPI's `mpirun` or Slurm's `srun`). The
//! example `all_reduce` of this crate starts its own ranks when no launcher did:
//! `cargo run -p weave --example all_reduce`.
//!
//! Ranks may also be threads of one process, joined by the in-process loopback bootstrap and
//! transport of [`core::loopback`] (what the primitives' tests use):
//!
//! ```
//! use std::time::Duration;
//! use weave::core::loopback::{LoopbackBootstrap, LoopbackTransport};
//! use weave::{Communicator, ReduceOp};
//!
//! let ranks = LoopbackBootstrap::group(3, Duration::from_secs(10));
//! let sums: Vec<Vec<i32>> = std::thread::scope(|s| {
//!     let threads: Vec<_> = ranks
//!         .into_iter()
//!         .enumerate()
//!         .map(|(rank, bootstrap)| {
//!             s.spawn(move || -> weave::Result<Vec<i32>> {
//!                 let comm = Communicator::builder(bootstrap).with_transport(LoopbackTransport).build()?;
//!                 let mut sum = vec![0; 4];
//!                 comm.all_reduce(&[rank as i32 + 1; 4], &mut sum, ReduceOp::Sum)?;
//!                 Ok(sum)
//!             })
//!         })
//!         .collect();
//!     threads.into_iter().map(|t| t.join().unwrap().unwrap()).collect()
//! });
//! assert!(sums.iter().all(|s| s == &[6; 4]));
//! ```
//!
//! ## Features
//!
//! | feature | transport | default |
//! |---|---|---|
//! | `shm` | POSIX shared memory between processes of one host ([`transport_shm`]) | yes |
//! | `tcp` | sockets between hosts ([`transport_tcp`]) | yes |
//! | `cuda` | the GPU engine: the device calls ([`gpu`]) over whatever transports reach the peers; the CUDA driver is loaded at run time | yes (through `cudaipc`) |
//! | `cudaipc` | GPU memory between the processes of one host over CUDA IPC / NVLink ([`transport_cudaipc`]); turns on `cuda` | yes |
//! | `ib` | InfiniBand / RoCE verbs between hosts (the `transport-ib` crate; links libibverbs) | no |
//!
//! Features decide which transports exist, the `WEAVE_TRANSPORTS` variable which are used.
//! A transport of your own implements [`core::transport::TransportFactory`] and is handed to
//! [`Builder::with_transport`].
//!
//! ## When a rank fails or falls behind
//!
//! Every wait is bounded (`WEAVE_TIMEOUT`). A call that times out or loses a peer asks every
//! member how far it got and returns the answer inside its error ([`Error::verdict`], a
//! [`Verdict`]): which ranks are behind, in which call, the same text on every rank. The
//! survivors then go on: [`Communicator::revoke`], [`Communicator::agree_on_failed`],
//! [`Communicator::shrink`], and later [`Communicator::grow`] (the example `elastic`).

pub use collectives::core::verdict::Verdict;
pub use collectives::core::{Error, Result};
pub use collectives::*;
