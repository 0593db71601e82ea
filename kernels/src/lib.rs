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
//! - [`compile()`] (module [`mod@compile`]): NVRTC at run time (no CUDA toolkit needed, only
//!   `libnvrtc` of the driver's CUDA major version or older, see [`nvrtc`]), with an on-disk
//!   cache;
//! - [`embedded`]: the direct program compiled at build time (`build.rs`) for `sm_80`, `sm_90`
//!   and `sm_100`, when NVRTC was there, so a first collective needs no NVRTC;
//! - [`module::KernelModule`]: compiled code loaded into a `cudarc` context;
//! - [`launch::KernelArg`]: comm-core handles as kernel arguments.
//!
//! ```ignore
//! use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
//! use kernels::{Compiler, KernelArg, KernelModule};
//!
//! let ctx = CudaContext::new(0)?;
//! let module = KernelModule::compile_and_load(&ctx, &Compiler::from_env(), r#"
//!     extern "C" __global__ void ping(weave::DeviceSemaphoreHandle s, weave::DeviceStatusHandle st) {
//!       if (threadIdx.x == 0) { weave::signal(s); weave::wait(s, st); }
//!     }"#)?;
//! let ping = module.function("ping")?;
//! let (sem, status) = (KernelArg(semaphore_handle), KernelArg(status_handle));
//! let stream = ctx.default_stream();
//! let mut launch = stream.launch_builder(&ping);
//! launch.arg(&sem).arg(&status);
//! unsafe { launch.launch(LaunchConfig::for_num_elems(1)) }?;
//! ```
//!
//! Every kernel compiles on CPU-only machines too (PTX for `sm_90`), so CI catches broken
//! device code; the GPU tests (`tests/gpu_primitives.rs`) run the test kernels where a GPU is.

pub mod arch;
pub mod channel;
pub mod compile;
pub mod convert;
pub mod direct;
mod disk_cache;
pub mod embedded;
pub mod launch;
pub mod layout;
pub mod module;
pub mod nvrtc;
pub mod program_text;
pub mod source;
pub mod workspace;

pub use arch::device_arch;
pub use compile::{CacheOutcome, CompiledKernel, Compiler, compile};
pub use launch::{DeviceHandle, KernelArg};
pub use module::KernelModule;
