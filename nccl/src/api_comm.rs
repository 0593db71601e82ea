//! Exported: version, unique id, communicator life (init, finalize, destroy, abort; split: `api_split.rs`),
//! queries, and error reporting.
//!
//! Init takes the CUDA device current on the calling thread (as NCCL does: `cudaSetDevice`
//! first), connects the ranks through weave's TCP bootstrap at the address in the unique id,
//! and builds a weave communicator with the CUDA IPC, shared-memory and TCP transports (GPUs
//! of one host map each other; TCP carries device buffers between hosts). It fails (on every
//! rank alike) when weave's GPU path is off — some rank has no GPU. A split asked for inside a
//! group is made at the group's end (`derived.rs`).
//!
//! `WEAVE_NCCL_ALLOW_CPU=1` is a testing knob: ranks without a GPU then get a host-only
//! communicator (device -1) whose init, split, queries and teardown work and whose collectives
//! return `ncclInvalidUsage`.

use std::ffi::{c_char, c_int};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use collectives::Communicator;
use collectives::transport_cudaipc::CudaIpcTransport;
use collectives::transport_shm::ShmTransport;
use collectives::transport_tcp::{TcpConfig, TcpTransport};
use comm_core::bootstrap::{TcpBootstrap, UniqueId};

use crate::abi::{self, NcclCommPtr, NcclConfig, NcclResult, NcclUniqueId};
use crate::background_init::BackgroundInit;
use crate::config::{ConfigTuning, read_config_fields};
use crate::cuda;
use crate::error::{self, CallResult, Fail, guard};
use crate::group;
use crate::handle::{self, Live, NcclComm, State};
use crate::unique_id;

/// What one rank's init needs.
#[derive(Debug, Clone)]
pub(crate) struct InitArgs {
    /// One id per bootstrap root (one, except for `ncclCommInitRankScalable`).
    pub(crate) ids: Vec<UniqueId>,
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
    pub(crate) device: Option<u32>,
    pub(crate) blocking: bool,
    pub(crate) name: String,
    /// What the program's `ncclConfig_t` asks of the new communicator beyond blocking and name.
    pub(crate) tuning: ConfigTuning,
}

fn cpu_mode() -> bool {
    std::env::var("WEAVE_NCCL_ALLOW_CPU").is_ok_and(|v| v == "1")
}

/// The device for a new communicator: the caller's current one (`None` in the CPU test mode
/// when there is no GPU).
pub(crate) fn caller_device() -> Result<Option<u32>, Fail> {
    match cuda::current_device() {
        Ok(d) => Ok(Some(d)),
        Err(_) if cpu_mode() => Ok(None),
        Err(e) => Err(Fail::new(
            NcclResult::UNHANDLED_CUDA_ERROR,
            format!("find the caller's CUDA device (weave's libnccl needs a GPU): {e}"),
        )),
    }
}

/// Builds the weave communicator of one rank (collective over the ranks of `a.ids`); where
/// `cancel` is given (a background init), setting it ends the build's waits for peers.
pub(crate) fn build(a: &InitArgs, cancel: Option<Arc<AtomicBool>>) -> Result<Communicator, Fail> {
    // A background init runs outside `guard`, which puts the caller's context back.
    let _saved = cuda::SavedContext::save();
    let config = crate::config::communicator_config(|name| std::env::var(name).ok())?;
    let boot = match &cancel {
        Some(flag) => TcpBootstrap::with_roots_cancellable(&a.ids, a.rank, a.nranks, config.timeout, flag.clone())?,
        None => TcpBootstrap::with_roots(&a.ids, a.rank, a.nranks, config.timeout)?,
    };
    let mut gpu = collectives::gpu::GpuConfig::from_env()?;
    if let Some(most) = a.tuning.max_ctas {
        gpu.pipeline_blocks = Some(gpu.pipeline_blocks.map_or(most, |b| b.min(most)));
    }
    a.tuning.log_ignored(Some(a.rank));
    let mut b = Communicator::builder(boot).with_config(config).with_gpu_config(gpu);
    if let Some(flag) = cancel {
        b = b.with_cancel_flag(flag);
    }
    if let Some(d) = a.device {
        b = b.with_transport(CudaIpcTransport::on_device(d));
    }
    // TCP listens on the address of the route towards the job's root, where no MASTER_ADDR
    // names the rendezvous host (nccl-tests over MPI, for one).
    let mut tcp = TcpConfig::from_env()?;
    if tcp.master_addr.is_none() {
        tcp.master_addr = a.ids.first().map(|id| id.addr.ip().to_string());
    }
    let comm = b.with_transport(ShmTransport).with_transport(TcpTransport::with_config(tcp)).build()?;
    if a.device.is_some() && !comm.has_gpu() {
        return Err(Fail::usage(
            "weave's GPU path is off for this communicator on every rank: every rank needs a CUDA device (run \
             with NCCL_DEBUG=INFO or WEAVE_DEBUG=info to see why)",
        ));
    }
    tracing::info!(
        target: crate::debug::NCCL,
        rank = a.rank,
        "init {}: rank {} of {} on device {:?} ({})",
        a.name,
        a.rank,
        a.nranks,
        a.device,
        a.ids[0].job_key()
    );
    Ok(comm)
}

/// Makes the handle of one rank: built now (blocking, outside a group) or in the background.
pub(crate) fn init(out: *mut NcclCommPtr, a: InitArgs) -> CallResult {
    let split_share = a.tuning.split_share_of_new()?;
    let background = !a.blocking || group::in_group();
    let device = a.device.map_or(-1, |d| d as i32);
    let state = if background {
        let args = a.clone();
        State::Initializing(BackgroundInit::start(a.rank, move |cancel| build(&args, Some(cancel)))?)
    } else {
        State::ready(build(&a, None)?)
    };
    let p = handle::register(NcclComm::new(a.rank, a.nranks, device, a.blocking, state).with_split_share(split_share))?;
    // SAFETY: `out` was checked non-null by the caller and points at an ncclComm_t.
    unsafe { *out = p };
    if group::in_group() {
        group::add_init(handle::lookup(p)?);
        return Ok(());
    }
    if !a.blocking {
        return Err(Fail::new(NcclResult::IN_PROGRESS, "init runs in the background"));
    }
    Ok(())
}

fn check_out<T>(p: *mut T, what: &str) -> CallResult {
    if p.is_null() { Err(Fail::invalid(format!("{what} is NULL"))) } else { Ok(()) }
}

/// [`check_out`] for the communicator handle a call makes, which is then set to NULL: a call
/// that fails leaves the caller no handle.
///
/// # Safety
/// `p` is NULL or writable.
pub(crate) unsafe fn clear_out(p: *mut NcclCommPtr, what: &str) -> CallResult {
    check_out(p, what)?;
    // SAFETY: checked non-null; writable as the caller guarantees.
    unsafe { *p = std::ptr::null_mut() };
    Ok(())
}

/// The most ranks `ncclCommInitAll` makes at once (each is built on a thread of its own).
const MAX_INIT_ALL: usize = 1024;

/// How many times `ncclCommGetAsyncError` tries the handle's lock, a millisecond apart.
const ASYNC_STATE_TRIES: usize = 20;

/// How long `ncclCommAbort` or `ncclCommDestroy` of a communicator still initializing waits for
/// its init to end once called off (the rendezvous, its connection attempts to a silent root
/// included, and the endpoint exchange look at the call-off every few milliseconds).
const INIT_CALL_OFF_WAIT: Duration = Duration::from_secs(10);

/// Checks `nranks` and `rank` and decodes the id.
fn rank_args(nranks: c_int, id: &NcclUniqueId, rank: c_int) -> Result<(UniqueId, usize, usize), Fail> {
    let most = comm_core::bootstrap::MAX_WORLD_SIZE;
    let n = usize::try_from(nranks)
        .ok()
        .filter(|&n| (1..=most).contains(&n))
        .ok_or_else(|| Fail::invalid(format!("nranks is {nranks}; a communicator has 1 to {most} ranks")))?;
    let r = crate::coll::check_rank("rank", rank, n)?;
    Ok((unique_id::decode(id)?, r, n))
}

/// `ncclGetVersion`: writes the version code (22902: this library stands in for NCCL 2.29.2).
///
/// # Safety
/// `version` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> NcclResult {
    guard("ncclGetVersion", || {
        check_out(version, "version")?;
        // SAFETY: checked non-null; the caller passes a writable int.
        unsafe { *version = abi::version_code() };
        Ok(())
    })
}

/// `ncclGetUniqueId`: a fresh bootstrap address and secret (see [`crate::unique_id`]).
///
/// # Safety
/// `unique_id` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetUniqueId(unique_id: *mut NcclUniqueId) -> NcclResult {
    guard("ncclGetUniqueId", || {
        check_out(unique_id, "uniqueId")?;
        let id = unique_id::encode(&unique_id::fresh()?)?;
        // SAFETY: checked non-null; the caller passes a writable ncclUniqueId.
        unsafe { *unique_id = id };
        Ok(())
    })
}

/// `ncclCommInitRank`: blocking init of rank `rank` of `nranks` on the current device.
///
/// # Safety
/// `comm` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut NcclCommPtr,
    nranks: c_int,
    comm_id: NcclUniqueId,
    rank: c_int,
) -> NcclResult {
    // SAFETY: forwarded; a NULL config means the defaults.
    unsafe { ncclCommInitRankConfig(comm, nranks, comm_id, rank, std::ptr::null_mut()) }
}

/// `ncclCommInitRankConfig`: init with a config; `config->blocking == 0` returns
/// `ncclInProgress` at once and finishes in the background (poll `ncclCommGetAsyncError`).
///
/// # Safety
/// `comm` is NULL or writable; `config` is NULL or an initialized `ncclConfig_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut NcclCommPtr,
    nranks: c_int,
    comm_id: NcclUniqueId,
    rank: c_int,
    config: *mut NcclConfig,
) -> NcclResult {
    guard("ncclCommInitRankConfig", || {
        // SAFETY: the caller passes NULL or a writable handle.
        unsafe { clear_out(comm, "comm") }?;
        // SAFETY: the caller passes NULL or an initialized config.
        let (blocking, name, tuning) = unsafe { read_config_fields(config, true) }?;
        let (id, rank, nranks) = rank_args(nranks, &comm_id, rank)?;
        let device = caller_device()?;
        init(comm, InitArgs { ids: vec![id], rank, nranks, device, blocking, name, tuning })
    })
}

/// `ncclCommInitRankScalable`: as `ncclCommInitRankConfig` with `n_id` bootstrap roots. The
/// ranks split into `n_id` contiguous groups (the first `nranks % n_id` one rank longer, as in
/// NCCL) and the first rank of group `i` serves as root at `comm_ids[i]`'s address, so that
/// rank must be the one that made id `i` with `ncclGetUniqueId`; every rank passes the same ids
/// in the same order. More ids than ranks is `ncclInvalidArgument`.
///
/// # Safety
/// `comm` writable; `comm_ids` holds `n_id` ids; `config` as for `ncclCommInitRankConfig`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitRankScalable(
    comm: *mut NcclCommPtr,
    nranks: c_int,
    rank: c_int,
    n_id: c_int,
    comm_ids: *mut NcclUniqueId,
    config: *mut NcclConfig,
) -> NcclResult {
    guard("ncclCommInitRankScalable", || {
        // SAFETY: the caller passes NULL or a writable handle.
        unsafe { clear_out(comm, "comm") }?;
        let count = usize::try_from(n_id).ok().filter(|&k| k >= 1 && !comm_ids.is_null()).ok_or_else(|| {
            Fail::invalid(format!("commIds is {comm_ids:p} with nId {n_id}; at least one id is needed"))
        })?;
        // SAFETY: `comm_ids` is non-null and holds `n_id` ids (the caller's contract).
        let raw = unsafe { std::slice::from_raw_parts(comm_ids, count) };
        let (first, rank, nranks) = rank_args(nranks, &raw[0], rank)?;
        if count > nranks {
            return Err(Fail::invalid(format!("nId is {count}, more roots than the {nranks} ranks")));
        }
        let mut ids = vec![first];
        for id in &raw[1..] {
            ids.push(unique_id::decode(id)?);
        }
        // SAFETY: the caller passes NULL or an initialized config.
        let (blocking, name, tuning) = unsafe { read_config_fields(config, true) }?;
        let device = caller_device()?;
        init(comm, InitArgs { ids, rank, nranks, device, blocking, name, tuning })
    })
}

/// `ncclCommInitAll`: `ndev` communicators of this process, rank i on `devlist[i]` (or device
/// i), built on one thread each over a loopback bootstrap.
///
/// # Safety
/// `comms` holds `ndev` writable handles; `devlist` is NULL or holds `ndev` ints.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommInitAll(comms: *mut NcclCommPtr, ndev: c_int, devlist: *const c_int) -> NcclResult {
    guard("ncclCommInitAll", || {
        check_out(comms, "comms")?;
        let n = usize::try_from(ndev).ok().filter(|&n| (1..=MAX_INIT_ALL).contains(&n)).ok_or_else(|| {
            Fail::invalid(format!("ndev is {ndev}; ncclCommInitAll makes 1 to {MAX_INIT_ALL} ranks in one process"))
        })?;
        let mut devices = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: `devlist` holds `ndev` ints when non-null.
            let d = if devlist.is_null() { i as c_int } else { unsafe { *devlist.add(i) } };
            devices.push(u32::try_from(d).map_err(|_| Fail::invalid(format!("devlist[{i}] is {d}")))?);
        }
        let id = UniqueId::on_free_port(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))?;
        let built: Vec<Result<Communicator, Fail>> = std::thread::scope(|s| {
            let hs: Vec<_> = devices
                .iter()
                .enumerate()
                .map(|(rank, &d)| {
                    let a = InitArgs {
                        ids: vec![id.clone()],
                        rank,
                        nranks: n,
                        device: Some(d),
                        blocking: true,
                        name: "initall".into(),
                        tuning: ConfigTuning::default(),
                    };
                    s.spawn(move || build(&a, None))
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| Err(Fail::new(NcclResult::INTERNAL_ERROR, "init thread panicked")))
                })
                .collect()
        });
        let mut ok = Vec::with_capacity(n);
        for r in built {
            ok.push(r.map_err(|f| f.context("ncclCommInitAll (several GPUs of one process)"))?);
        }
        let split_share = ConfigTuning::default().split_share_of_new()?;
        for (rank, comm) in ok.into_iter().enumerate() {
            let handle = NcclComm::new(rank, n, devices[rank] as i32, true, State::ready(comm));
            let p = handle::register(handle.with_split_share(split_share))?;
            // SAFETY: `comms` holds `ndev` writable handles.
            unsafe { *comms.add(rank) = p };
        }
        Ok(())
    })
}

/// Tears down the communicator of `c` (after `abort` when aborting): calls a background init
/// off and waits for it (one that does not end within [`INIT_CALL_OFF_WAIT`] is left to end on
/// its own: nothing waits for a communicator that is going), then for the GPU work of the
/// context, then drops the weave communicator.
fn teardown(c: &Arc<NcclComm>, abort: bool) -> CallResult {
    if abort && let Some(h) = c.abort_handle() {
        h.abort();
    }
    let mut g = c.lock()?;
    let mut ended_in_time = true;
    if let State::Initializing(init) = &*g {
        // Waited for without the lock, as `settled` does: other threads' calls see the init
        // running meanwhile.
        let end = init.call_off();
        drop(g);
        ended_in_time = end.wait(INIT_CALL_OFF_WAIT);
        g = c.lock()?;
    }
    if !ended_in_time && matches!(&*g, State::Initializing(_)) {
        // The init did not see the call-off in time (a connection attempt to a silent host, a
        // CUDA call): it ends within WEAVE_TIMEOUT on its thread, which drops whatever it
        // built; the abort or destroy does not wait for it.
        *g = State::Gone;
        tracing::info!(
            target: crate::debug::NCCL,
            rank = c.rank(),
            "{} of a communicator still initializing: its init did not end within {INIT_CALL_OFF_WAIT:?} of \
             being called off and is left to end on its own",
            if abort { "abort" } else { "destroy" }
        );
        return Ok(());
    }
    // The init is over (or there was none).
    let mut g = if abort {
        c.settle(g)
    } else {
        drop(g);
        c.settled()?
    };
    if abort && let Some(h) = c.abort_handle() {
        h.abort();
    }
    let state = std::mem::replace(&mut *g, State::Gone);
    drop(g);
    let State::Ready(family) = state else { return Ok(()) };
    let others = family.members().saturating_sub(1);
    // The communicator when this was the family's last handle; the others keep it otherwise.
    let last = family.leave()?;
    let ctx = match &last {
        Some(live) => live.comm.gpu_context().map(|ctx| (ctx, live.batches())),
        None => {
            tracing::info!(
                target: crate::debug::NCCL,
                rank = c.rank(),
                "this handle leaves its splitShare family; the communicator stays with the other {others}"
            );
            // An abort does not wait for a sibling's running call to let go of the family: the
            // abort ends it, and nothing of the communicator is freed here.
            if abort { None } else { family.lock()?.as_ref().and_then(|l| Some((l.comm.gpu_context()?, l.batches()))) }
        }
    };
    // The work queued so far is done when this returns, before the communicator (if it goes).
    if let Some((ctx, batches)) = ctx {
        match cuda::synchronize_context(&ctx) {
            // The family goes on: this handle's calls are done, and the program may now destroy
            // their streams.
            Ok(()) if last.is_none() => family.forget_finished_stream(batches)?,
            Ok(()) => {}
            Err(e) if !abort => {
                return Err(Fail::from(e).context("wait for the communicator's GPU work before destroying it"));
            }
            Err(_) => {}
        }
    }
    drop(last);
    Ok(())
}

/// `ncclCommFinalize`: waits until the communicator's GPU work is done (blocking; returns
/// `ncclSuccess`, never `ncclInProgress`).
///
/// # Safety
/// `comm` is any value (checked against the live handles).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommFinalize(comm: NcclCommPtr) -> NcclResult {
    guard("ncclCommFinalize", || {
        let c = handle::lookup(comm)?;
        c.with_live(|live| match live.comm.gpu_context() {
            Some(ctx) => {
                cuda::synchronize_context(&ctx)?;
                // Every call is done: the next one waits for no stream.
                live.forget_stream();
                Ok(())
            }
            None => Ok(()),
        })
    })
}

/// `ncclCommDestroy`: frees the communicator after its GPU work is done, with the
/// registrations and windows it still holds. Unlike NCCL's, which first waits for a non-blocking
/// init to finish, it calls an init still running off (as `ncclCommAbort` does): the program is
/// done with the communicator, and a peer that never comes would keep NCCL's waiting for ever.
///
/// # Safety
/// `comm` is any value (checked against the live handles).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommDestroy(comm: NcclCommPtr) -> NcclResult {
    guard("ncclCommDestroy", || end(comm, false))
}

/// `ncclCommAbort`: stops the communicator's waits and kernels (usable from another thread
/// while a call runs; that call returns an error), then frees it.
///
/// # Safety
/// `comm` is any value (checked against the live handles).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommAbort(comm: NcclCommPtr) -> NcclResult {
    guard("ncclCommAbort", || end(comm, true))
}

/// Destroys or aborts `comm`: its teardown, then the registrations and windows it still holds
/// (the program need not deregister them first, as in NCCL).
fn end(comm: NcclCommPtr, abort: bool) -> CallResult {
    let c = handle::unregister(comm)?;
    let torn = teardown(&c, abort);
    crate::api_register::forget_communicator(comm as usize);
    crate::api_window::forget_communicator(comm as usize);
    torn
}

/// `ncclCommGetAsyncError`: `ncclInProgress` while a background init runs; the first error
/// that broke the communicator (a dead peer is `ncclRemoteError`, found by weave's peer watch
/// when a kernel stops waiting for it, within `WEAVE_TIMEOUT` at most); else `ncclSuccess`.
/// Waits 20 ms at the most: when another thread holds the handle that long, the last known
/// state is reported.
///
/// # Safety
/// `async_error` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommGetAsyncError(comm: NcclCommPtr, async_error: *mut NcclResult) -> NcclResult {
    guard("ncclCommGetAsyncError", || {
        check_out(async_error, "asyncError")?;
        let c = handle::lookup(comm)?;
        let code = async_state(&c);
        // SAFETY: checked non-null.
        unsafe { *async_error = code };
        Ok(())
    })
}

fn async_state(c: &NcclComm) -> NcclResult {
    if let Some(f) = c.async_error() {
        return f.code;
    }
    // The handle's lock is only ever held for moments: a few tries find it free. Should they
    // not, the last known state (no error) is the answer rather than a wait.
    let Some(g) = (0..ASYNC_STATE_TRIES).find_map(|try_| {
        if try_ > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        c.try_lock()
    }) else {
        return NcclResult::SUCCESS;
    };
    let g = c.settle(g);
    match &*g {
        State::Initializing(_) | State::AwaitingGroup => NcclResult::IN_PROGRESS,
        State::Failed(f) => f.code,
        State::Gone => NcclResult::INVALID_USAGE,
        State::Ready(family) => match family.try_lock() {
            // A call of another handle of the family holds it: the last known state.
            None => NcclResult::SUCCESS,
            Some(live) => match live.as_ref() {
                None => NcclResult::INVALID_USAGE,
                Some(live) => gpu_state(c, live),
            },
        },
    }
}

/// What `ncclCommGetAsyncError` reports of a ready communicator: its GPU's error word.
fn gpu_state(c: &NcclComm, live: &Live) -> NcclResult {
    match live.comm.has_gpu().then(|| live.comm.check_gpu()) {
        Some(Err(e)) => {
            let f = Fail::from(e);
            c.record_async(&f);
            error::set_last_error(&f.message);
            f.code
        }
        _ => NcclResult::SUCCESS,
    }
}

fn query(
    name: &'static str,
    comm: NcclCommPtr,
    out: *mut c_int,
    f: impl FnOnce(&NcclComm) -> Result<c_int, Fail>,
) -> NcclResult {
    guard(name, || {
        check_out(out, "output pointer")?;
        let c = handle::lookup(comm)?;
        let value = f(&c)?;
        // SAFETY: checked non-null.
        unsafe { *out = value };
        Ok(())
    })
}

/// `ncclCommCount`: ranks of the communicator (`ncclInvalidUsage` for a split's handle before
/// the end of the group it was asked for in).
///
/// # Safety
/// `count` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommCount(comm: NcclCommPtr, count: *mut c_int) -> NcclResult {
    query("ncclCommCount", comm, count, |c| c.check_made().map(|()| c.nranks() as c_int))
}

/// `ncclCommCuDevice`: the CUDA device of this rank (-1 in the CPU test mode).
///
/// # Safety
/// `device` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommCuDevice(comm: NcclCommPtr, device: *mut c_int) -> NcclResult {
    query("ncclCommCuDevice", comm, device, |c| Ok(c.device))
}

/// `ncclCommUserRank`: this rank (`ncclInvalidUsage` as for [`ncclCommCount`]).
///
/// # Safety
/// `rank` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclCommUserRank(comm: NcclCommPtr, rank: *mut c_int) -> NcclResult {
    query("ncclCommUserRank", comm, rank, |c| c.check_made().map(|()| c.rank() as c_int))
}

/// `ncclGetErrorString`: a static description of `result`.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetErrorString(result: NcclResult) -> *const c_char {
    error::error_cstr(result).as_ptr()
}

/// `ncclGetLastError`: the message of the last failure: of `comm` when it has one, else of the
/// calling thread's last failed call, else of the process; valid until this thread calls it
/// again. Empty when nothing failed.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetLastError(comm: NcclCommPtr) -> *const c_char {
    let own = std::panic::catch_unwind(|| {
        if comm.is_null() { None } else { handle::lookup(comm).ok().and_then(|c| c.async_error()).map(|f| f.message) }
    })
    .ok()
    .flatten();
    error::last_error_ptr(own)
}

/// `ncclResetDebugInit` (deprecated in NCCL): nothing to reset (`NCCL_DEBUG` is read once).
#[unsafe(no_mangle)]
pub extern "C" fn ncclResetDebugInit() {}
