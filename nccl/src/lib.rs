//! # weave-nccl: `libnccl.so.2` from weave
//!
//! A shared library with NCCL 2.29's C ABI whose every collective runs on weave, so programs
//! built against NCCL (PyTorch, nccl-tests) run on weave unchanged: `LD_PRELOAD` it, or put
//! its directory first on `LD_LIBRARY_PATH`. `cargo xtask nccl` builds it to
//! `target/nccl/libnccl.so.2` (SONAME `libnccl.so.2`); `nccl/include/nccl.h` declares what it
//! exports.
//!
//! - Version: `ncclGetVersion` reports 22902 (NCCL 2.29.2), see [`abi::NCCL_VERSION`].
//! - Types and values: [`abi`] (`ncclConfig_t` as 2.28 lays it out, 80 bytes); what weave
//!   reads of a config ([`config`]: `blocking`, `commName`, `maxCTAs`, the rest named as
//!   ignored at `NCCL_DEBUG=INFO`).
//! - Unique id: weave's bootstrap address and secret in the 128 bytes ([`unique_id`]).
//! - Init, finalize, destroy, abort, queries: [`api_comm`]; split: [`api_split`]; revoke, shrink and grow:
//!   [`api_elastic`]; a split, shrink or grow inside a group, made at its end: [`derived`].
//! - Collectives, send/recv, groups: [`api_coll`], [`group`], [`coll`] (every data type,
//!   FP8 included).
//! - GPU memory: `ncclCommMemStats`, `ncclCommSuspend`, `ncclCommResume` ([`api_memory`]);
//!   windows: `ncclCommWindowRegister`, `ncclCommWindowDeregister` ([`api_window`]); local
//!   registrations: `ncclCommRegister`, `ncclCommDeregister` ([`api_register`]).
//! - Pre-multiplied sums: [`premul`]. `ncclGroupSimulateEnd`'s estimate, refused calls and
//!   their codes: [`api_misc`].
//! - Errors: [`error`] (weave error → `ncclResult_t`). Every exported function checks its
//!   pointers and catches panics.
//! - Diagnostics: [`debug`] (`NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS` and `WEAVE_DEBUG` install one
//!   `tracing` subscriber on stderr).
//!
//! Environment: `NCCL_DEBUG`, `NCCL_COMM_ID` (root address of `ncclGetUniqueId`), weave's
//! `WEAVE_*` (`WEAVE_TIMEOUT` bounds every wait; unset, libnccl waits up to 30 minutes for a
//! live peer, [`config::UNSET_TIMEOUT`], where NCCL waits for ever), and `WEAVE_NCCL_ALLOW_CPU=1` (tests only:
//! host-only communicators without a GPU).

#![allow(non_snake_case, reason = "exported C symbols carry NCCL's names")]

pub mod abi;
pub mod api_coll;
pub mod api_comm;
pub mod api_elastic;
pub mod api_memory;
pub mod api_misc;
pub mod api_register;
pub mod api_split;
pub mod api_window;
pub mod background_init;
pub mod coll;
pub mod config;
pub mod cuda;
pub mod debug;
pub mod derived;
pub mod error;
pub mod group;
pub mod handle;
pub mod premul;
pub mod unique_id;
