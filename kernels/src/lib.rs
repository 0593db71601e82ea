//! # kernels
//!
//! weave's CUDA device code and how it gets onto a GPU:
//!
//! - `cuda/weave/*.cuh` ([`source::HEADERS`]): header-only device primitives in namespace
//!   `weave` — C++ mirrors of comm-core's device handles, named memory-ordering atomics, bounded
//!   spins that report [`comm_core::device::DeviceError`] codes, semaphores, cooperative copies,
//!   LL8/LL16 packets, the trigger FIFO push, memory/port channel helpers, f16/bf16 arithmetic;
//! - [`source::program`]: a kernel's source with the headers and the generated layout checks
//!   ([`layout`]);
//! - [`compile`]: NVRTC at run time (no CUDA toolkit needed, only `libnvrtc`), with an on-disk
//!   cache;
//! - [`module::KernelModule`]: compiled code loaded into a `cudarc` context;
//! - [`launch::KernelArg`]: comm-core handles as kernel arguments.
//!
//! Every kernel compiles on CPU-only machines too (PTX for `sm_90`), so CI catches broken
//! device code; the GPU tests (`tests/gpu_primitives.rs`) run the test kernels where a GPU is.

pub mod arch;
pub mod compile;
pub mod launch;
pub mod layout;
pub mod module;
pub mod source;

pub use arch::device_arch;
pub use compile::{CacheOutcome, CompiledKernel, Compiler, compile};
pub use launch::{DeviceHandle, KernelArg};
pub use module::KernelModule;
