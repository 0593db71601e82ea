//! Communicator life without a GPU (`WEAVE_NCCL_ALLOW_CPU=1`): two ranks as threads of this
//! process init (blocking and non-blocking), query, split with `NCCL_SPLIT_NOCOLOR`, refuse
//! device collectives cleanly, take count-0 calls, report no GPU memory (suspend and resume do
//! nothing), refuse windows (at once, or at `ncclGroupEnd` inside a group), and abort from
//! another thread, or while an init still waits for a peer that never comes; with `splitShare`, splits that keep every rank in order share their parent's
//! communicator and outlive it, and others build their own.

use std::ffi::c_int;
use std::ptr::null_mut;

use nccl::abi::{CudaStreamPtr, NcclCommPtr, NcclConfig, NcclDataType, NcclRedOp, NcclResult, NcclUniqueId};
use nccl::api_coll::*;
use nccl::api_comm::*;
use nccl::api_elastic::*;
use nccl::api_memory::*;
use nccl::api_register::*;
use nccl::api_split::*;
use nccl::api_window::*;

/// How long a call that must not wait for a peer (an abort, a destroy, a call on an init that
/// was called off) may take: far below the 30-minute timeout it would otherwise wait for, and
/// far above what it takes while this binary's other tests load both cores with rank threads.
const BOUNDED: std::time::Duration = std::time::Duration::from_secs(10);

fn config(blocking: c_int) -> NcclConfig {
    NcclConfig {
        size: std::mem::size_of::<NcclConfig>(),
        magic: nccl::abi::API_MAGIC,
        version: 22803,
        blocking,
        cgaClusterSize: c_int::MIN,
        minCTAs: c_int::MIN,
        maxCTAs: c_int::MIN,
        netName: std::ptr::null(),
        splitShare: c_int::MIN,
        trafficClass: c_int::MIN,
        commName: c"cpu-test".as_ptr(),
        collnetEnable: c_int::MIN,
        CTAPolicy: c_int::MIN,
        shrinkShare: c_int::MIN,
        nvlsCTAs: c_int::MIN,
        nChannelsPerNetPeer: c_int::MIN,
        nvlinkCentricSched: c_int::MIN,
    }
}

fn rank_main(id: NcclUniqueId, rank: c_int) {
    // SAFETY: every pointer passed is a live local; buffers are never touched (no GPU).
    unsafe {
        let mut comm: NcclCommPtr = null_mut();
        let mut cfg = config(if rank == 0 { 0 } else { 1 });
        let r = ncclCommInitRankConfig(&mut comm, 2, id, rank, &mut cfg);
        if rank == 0 {
            assert!(r == NcclResult::IN_PROGRESS || r == NcclResult::SUCCESS, "{r:?}");
            let mut state = NcclResult::IN_PROGRESS;
            for _ in 0..2000 {
                assert_eq!(ncclCommGetAsyncError(comm, &mut state), NcclResult::SUCCESS);
                if state != NcclResult::IN_PROGRESS {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            assert_eq!(state, NcclResult::SUCCESS);
        } else {
            assert_eq!(r, NcclResult::SUCCESS);
        }
        let (mut n, mut me, mut dev) = (0, -5, 0);
        assert_eq!(ncclCommCount(comm, &mut n), NcclResult::SUCCESS);
        assert_eq!(ncclCommUserRank(comm, &mut me), NcclResult::SUCCESS);
        assert_eq!(ncclCommCuDevice(comm, &mut dev), NcclResult::SUCCESS);
        assert_eq!((n, me, dev), (2, rank, -1));
        // Argument checks, then a count-0 call (success), then a real one (no GPU path).
        let f = NcclDataType::FLOAT32;
        assert_eq!(
            ncclAllReduce(null_mut(), null_mut(), 4, f, NcclRedOp::SUM, comm, null_mut()),
            NcclResult::INVALID_ARGUMENT
        );
        assert_eq!(ncclAllReduce(null_mut(), null_mut(), 0, f, NcclRedOp::SUM, comm, null_mut()), NcclResult::SUCCESS);
        let fake = 0x1000 as *mut std::ffi::c_void;
        assert_eq!(ncclAllReduce(fake, fake, 4, f, NcclRedOp(77), comm, null_mut()), NcclResult::INVALID_ARGUMENT);
        assert_eq!(
            ncclAllReduce(fake, fake, 4, NcclDataType(12), NcclRedOp::SUM, comm, null_mut()),
            NcclResult::INVALID_ARGUMENT
        );
        assert_eq!(ncclBroadcast(fake, fake, 4, f, 2, comm, null_mut()), NcclResult::INVALID_ARGUMENT);
        assert_eq!(ncclSend(fake, 4, f, -1, comm, null_mut()), NcclResult::INVALID_ARGUMENT);
        assert_eq!(ncclAllReduce(fake, fake, 4, f, NcclRedOp::AVG, comm, null_mut()), NcclResult::INVALID_USAGE);
        // GPU memory (none without a GPU path): the figures, suspend and resume, bad arguments.
        let mut bytes = 7u64;
        for stat in [STAT_GPU_MEM_SUSPEND, STAT_GPU_MEM_SUSPENDED, STAT_GPU_MEM_PERSIST, STAT_GPU_MEM_TOTAL] {
            assert_eq!(ncclCommMemStats(comm, stat, &mut bytes), NcclResult::SUCCESS);
            assert_eq!(bytes, 0, "stat {stat}");
        }
        assert_eq!(ncclCommMemStats(comm, 4, &mut bytes), NcclResult::INVALID_ARGUMENT);
        assert_eq!(ncclCommMemStats(comm, STAT_GPU_MEM_TOTAL, null_mut()), NcclResult::INVALID_ARGUMENT);
        assert_eq!(ncclCommSuspend(comm, 0x2), NcclResult::INVALID_ARGUMENT);
        assert_eq!(ncclCommSuspend(comm, SUSPEND_MEM), NcclResult::SUCCESS);
        assert_eq!(ncclCommResume(comm), NcclResult::SUCCESS);
        assert_eq!(ncclCommMemStats(fake.cast(), STAT_GPU_MEM_TOTAL, &mut bytes), NcclResult::INVALID_ARGUMENT);
        // Windows need a GPU path: refused at once outside a group; inside one, queued and
        // refused by ncclGroupEnd, `win` left alone; an unknown window is no window.
        let mut win: *mut std::ffi::c_void = null_mut();
        assert_eq!(ncclCommWindowRegister(comm, fake, 64, &mut win, WIN_COLL_SYMMETRIC), NcclResult::INVALID_USAGE);
        assert_eq!(ncclGroupStart(), NcclResult::SUCCESS);
        assert_eq!(ncclCommWindowRegister(comm, fake, 64, &mut win, WIN_COLL_SYMMETRIC), NcclResult::SUCCESS);
        assert!(win.is_null(), "filled before ncclGroupEnd");
        assert_eq!(ncclGroupEnd(), NcclResult::INVALID_USAGE);
        assert!(win.is_null());
        assert_eq!(ncclCommWindowRegister(comm, fake, 64, null_mut(), 0), NcclResult::INVALID_ARGUMENT);
        assert_eq!(ncclCommWindowDeregister(comm, fake), NcclResult::INVALID_ARGUMENT);
        // Local registrations belong to their communicator.
        let mut reg: *mut std::ffi::c_void = null_mut();
        assert_eq!(ncclCommRegister(comm, fake, 64, &mut reg), NcclResult::SUCCESS);
        assert!(!reg.is_null());
        assert_eq!(ncclCommRegister(comm, fake, 64, null_mut()), NcclResult::INVALID_ARGUMENT);
        assert_eq!(ncclCommDeregister(fake.cast(), reg), NcclResult::INVALID_ARGUMENT);
        assert_eq!(ncclCommDeregister(comm, fake), NcclResult::INVALID_ARGUMENT);
        assert_eq!(ncclCommDeregister(comm, reg), NcclResult::SUCCESS);
        assert_eq!(ncclCommDeregister(comm, reg), NcclResult::INVALID_ARGUMENT);
        // Split: rank 1 opts out.
        let mut sub: NcclCommPtr = fake.cast();
        let color = if rank == 0 { 7 } else { -1 };
        assert_eq!(ncclCommSplit(comm, color, 0, &mut sub, null_mut()), NcclResult::SUCCESS);
        if rank == 0 {
            assert!(!sub.is_null());
            assert_eq!(ncclCommCount(sub, &mut n), NcclResult::SUCCESS);
            assert_eq!(n, 1);
            // A group over two communicators on different streams runs each on a thread of its
            // own, where the per-thread default stream is another stream: refused before
            // anything runs. On one stream they run one after the other on this thread, so the
            // per-thread stream is fine (here the missing GPU path fails them).
            let (per_thread, other) = (0x2 as CudaStreamPtr, 0x1234 as CudaStreamPtr);
            let last_error = || std::ffi::CStr::from_ptr(ncclGetLastError(null_mut())).to_string_lossy().into_owned();
            assert_eq!(ncclGroupStart(), NcclResult::SUCCESS);
            assert_eq!(ncclAllReduce(fake, fake, 4, f, NcclRedOp::SUM, comm, per_thread), NcclResult::SUCCESS);
            assert_eq!(ncclAllReduce(fake, fake, 4, f, NcclRedOp::SUM, sub, other), NcclResult::SUCCESS);
            assert_eq!(ncclGroupEnd(), NcclResult::INVALID_USAGE);
            assert!(last_error().contains("cudaStreamPerThread"), "{}", last_error());
            assert_eq!(ncclGroupStart(), NcclResult::SUCCESS);
            assert_eq!(ncclAllReduce(fake, fake, 4, f, NcclRedOp::SUM, comm, per_thread), NcclResult::SUCCESS);
            assert_eq!(ncclAllReduce(fake, fake, 4, f, NcclRedOp::SUM, sub, per_thread), NcclResult::SUCCESS);
            assert_eq!(ncclGroupEnd(), NcclResult::INVALID_USAGE);
            assert!(last_error().contains("no GPU path"), "{}", last_error());
            assert_eq!(ncclCommDestroy(sub), NcclResult::SUCCESS);
            assert_eq!(ncclCommDestroy(sub), NcclResult::INVALID_ARGUMENT);
        } else {
            assert!(sub.is_null());
        }
        // Abort from another thread while nothing runs; the handle is gone afterwards.
        let c = comm as usize;
        let h = std::thread::spawn(move || ncclCommAbort(c as NcclCommPtr));
        assert_eq!(h.join().unwrap(), NcclResult::SUCCESS);
        assert_eq!(ncclCommCount(comm, &mut n), NcclResult::INVALID_ARGUMENT);
    }
}

/// A new job's id, in the CPU test mode (communicators without a GPU).
fn cpu_job_id() -> NcclUniqueId {
    // SAFETY: set before any thread of this test binary reads the environment (every test sets
    // the same value).
    unsafe { std::env::set_var("WEAVE_NCCL_ALLOW_CPU", "1") };
    let mut id = NcclUniqueId { internal: [0; 128] };
    // SAFETY: `id` is a live local.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, NcclResult::SUCCESS);
    id
}

/// Runs `rank` as two ranks (threads) of one job without a GPU.
fn two_cpu_ranks(rank: impl Fn(NcclUniqueId, c_int) + Sync) {
    let id = cpu_job_id();
    std::thread::scope(|s| {
        let rank = &rank;
        let ranks: Vec<_> = (0..2).map(|r| s.spawn(move || rank(id, r))).collect();
        for r in ranks {
            r.join().unwrap();
        }
    });
}

#[test]
fn two_cpu_ranks_init_split_and_abort() {
    two_cpu_ranks(rank_main);
}

/// The communicators of `N` CPU ranks, made by this one thread in one group.
fn init_in_one_group<const N: usize>() -> [NcclCommPtr; N] {
    let id = cpu_job_id();
    let mut comms: [NcclCommPtr; N] = [null_mut(); N];
    // SAFETY: every pointer passed is a live local.
    unsafe {
        assert_eq!(ncclGroupStart(), NcclResult::SUCCESS);
        for (r, comm) in comms.iter_mut().enumerate() {
            assert_eq!(ncclCommInitRank(comm, N as c_int, id, r as c_int), NcclResult::SUCCESS);
        }
        assert_eq!(ncclGroupEnd(), NcclResult::SUCCESS);
    }
    comms
}

#[test]
fn one_thread_splits_the_communicators_of_two_ranks_in_one_group() {
    let fake: NcclCommPtr = 0x1000 as NcclCommPtr;
    let comms: [NcclCommPtr; 2] = init_in_one_group();
    // SAFETY: every pointer passed is a live local; no buffer is touched.
    unsafe {
        // Two splits of each rank's communicator in one group, from this one thread: both ranks
        // with keys that reverse them, then rank 0 alone (rank 1 passes NCCL_SPLIT_NOCOLOR).
        let (mut pair, mut alone) = ([null_mut(); 2], [fake; 2]);
        assert_eq!(ncclGroupStart(), NcclResult::SUCCESS);
        for r in 0..2 {
            assert_eq!(ncclCommSplit(comms[r], 3, -(r as c_int), &mut pair[r], null_mut()), NcclResult::SUCCESS);
            let color = if r == 0 { 4 } else { -1 };
            assert_eq!(ncclCommSplit(comms[r], color, 0, &mut alone[r], null_mut()), NcclResult::SUCCESS);
        }
        // Handed out at once, usable after the group's end.
        assert!(!pair[0].is_null() && !pair[1].is_null() && !alone[0].is_null() && alone[1].is_null());
        let (mut n, mut me, mut state) = (0, -1, NcclResult::SUCCESS);
        assert_eq!(ncclCommCount(pair[0], &mut n), NcclResult::INVALID_USAGE);
        assert_eq!(ncclCommGetAsyncError(pair[0], &mut state), NcclResult::SUCCESS);
        assert_eq!(state, NcclResult::IN_PROGRESS);
        let started = std::time::Instant::now();
        assert_eq!(ncclGroupEnd(), NcclResult::SUCCESS);
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "the splits took {:?}", started.elapsed());
        for (r, &split) in pair.iter().enumerate() {
            assert_eq!(ncclCommCount(split, &mut n), NcclResult::SUCCESS);
            assert_eq!(ncclCommUserRank(split, &mut me), NcclResult::SUCCESS);
            assert_eq!((n, me), (2, 1 - r as c_int), "rank {r}'s split reverses the ranks");
            assert_eq!(ncclCommGetAsyncError(split, &mut state), NcclResult::SUCCESS);
            assert_eq!(state, NcclResult::SUCCESS);
        }
        assert_eq!(ncclCommCount(alone[0], &mut n), NcclResult::SUCCESS);
        assert_eq!(n, 1);
        // Two ranks of one communicator given one stream: refused, not left to wait on each other.
        let (f, stream) = (NcclDataType::FLOAT32, 0x1234 as CudaStreamPtr);
        let fake_buf = 0x1000 as *mut std::ffi::c_void;
        assert_eq!(ncclGroupStart(), NcclResult::SUCCESS);
        for &c in &comms {
            assert_eq!(ncclAllReduce(fake_buf, fake_buf, 4, f, NcclRedOp::SUM, c, stream), NcclResult::SUCCESS);
        }
        assert_eq!(ncclGroupEnd(), NcclResult::INVALID_USAGE);
        let said = std::ffi::CStr::from_ptr(ncclGetLastError(null_mut())).to_string_lossy().into_owned();
        assert!(said.contains("two ranks of one communicator"), "{said}");
        // A group that fails before its end runs nothing: its split's handle fails with it.
        let mut lost: NcclCommPtr = null_mut();
        assert_eq!(ncclGroupStart(), NcclResult::SUCCESS);
        assert_eq!(ncclCommSplit(comms[0], 5, 0, &mut lost, null_mut()), NcclResult::SUCCESS);
        assert_eq!(
            ncclAllReduce(null_mut(), null_mut(), 4, f, NcclRedOp::SUM, comms[0], null_mut()),
            NcclResult::INVALID_ARGUMENT
        );
        assert_eq!(ncclGroupEnd(), NcclResult::INVALID_ARGUMENT);
        assert_eq!(ncclCommGetAsyncError(lost, &mut state), NcclResult::SUCCESS);
        assert_eq!(state, NcclResult::INVALID_ARGUMENT, "the split's handle fails with its group");
        for c in [pair[0], pair[1], alone[0], lost, comms[0], comms[1]] {
            assert_eq!(ncclCommDestroy(c), NcclResult::SUCCESS);
        }
    }
}

#[test]
fn one_thread_shrinks_and_grows_the_communicators_of_three_ranks_in_groups() {
    let comms: [NcclCommPtr; 3] = init_in_one_group();
    // SAFETY: every pointer passed is a live local; no buffer is touched.
    unsafe {
        // Ranks 0 and 1 shrink rank 2 away, in one group from this one thread.
        let mut excluded: [c_int; 1] = [2];
        let mut shrunk: [NcclCommPtr; 2] = [null_mut(); 2];
        assert_eq!(ncclGroupStart(), NcclResult::SUCCESS);
        for (r, out) in shrunk.iter_mut().enumerate() {
            assert_eq!(ncclCommShrink(comms[r], excluded.as_mut_ptr(), 1, out, null_mut(), 0), NcclResult::SUCCESS);
        }
        assert!(shrunk.iter().all(|h| !h.is_null()));
        let mut n = 0;
        assert_eq!(ncclCommCount(shrunk[0], &mut n), NcclResult::INVALID_USAGE, "not made before the group's end");
        assert_eq!(ncclGroupEnd(), NcclResult::SUCCESS);
        for (r, &h) in shrunk.iter().enumerate() {
            let mut me = -1;
            assert_eq!(ncclCommCount(h, &mut n), NcclResult::SUCCESS);
            assert_eq!(ncclCommUserRank(h, &mut me), NcclResult::SUCCESS);
            assert_eq!((n, me), (2, r as c_int));
        }
        // And grow back to three in one group: the two members and a joiner.
        let mut gid = NcclUniqueId { internal: [0; 128] };
        assert_eq!(ncclCommGetUniqueId(shrunk[0], &mut gid), NcclResult::SUCCESS);
        let mut grown: [NcclCommPtr; 3] = [null_mut(); 3];
        // A simulated group runs no grow: its handles fail, and rank 0 keeps the id the joiner
        // holds for the grow asked again.
        assert_eq!(ncclGroupStart(), NcclResult::SUCCESS);
        for (r, &h) in shrunk.iter().enumerate() {
            assert_eq!(ncclCommGrow(h, 3, std::ptr::null(), -1, &mut grown[r], null_mut()), NcclResult::SUCCESS);
        }
        assert_eq!(nccl::api_misc::ncclGroupSimulateEnd(null_mut()), NcclResult::SUCCESS);
        for h in &mut grown[..2] {
            let mut state = NcclResult::SUCCESS;
            assert_eq!(ncclCommGetAsyncError(*h, &mut state), NcclResult::SUCCESS);
            assert_eq!(state, NcclResult::INVALID_USAGE, "a simulated grow made nothing");
            assert_eq!(ncclCommDestroy(*h), NcclResult::SUCCESS);
            *h = null_mut();
        }
        assert_eq!(ncclGroupStart(), NcclResult::SUCCESS);
        for (r, &h) in shrunk.iter().enumerate() {
            assert_eq!(ncclCommGrow(h, 3, std::ptr::null(), -1, &mut grown[r], null_mut()), NcclResult::SUCCESS);
        }
        assert_eq!(ncclCommGrow(null_mut(), 3, &gid, 2, &mut grown[2], null_mut()), NcclResult::SUCCESS);
        let started = std::time::Instant::now();
        assert_eq!(ncclGroupEnd(), NcclResult::SUCCESS);
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "the grow took {:?}", started.elapsed());
        for (r, &h) in grown.iter().enumerate() {
            let mut me = -1;
            assert_eq!(ncclCommCount(h, &mut n), NcclResult::SUCCESS);
            assert_eq!(ncclCommUserRank(h, &mut me), NcclResult::SUCCESS);
            assert_eq!((n, me), (3, r as c_int));
        }
        for h in grown.into_iter().chain(shrunk).chain(comms) {
            assert_eq!(ncclCommDestroy(h), NcclResult::SUCCESS);
        }
    }
}

/// One rank of the `splitShare` test: which splits share their parent's communicator, and a
/// family outliving its first handle.
fn split_share_rank(id: NcclUniqueId, rank: c_int) {
    use nccl::handle::share_a_communicator as shared;
    let f = NcclDataType::FLOAT32;
    // SAFETY: every pointer passed is a live local; buffers are never touched (no GPU).
    unsafe {
        let mut comm: NcclCommPtr = null_mut();
        let mut cfg = config(1);
        cfg.splitShare = 1;
        assert_eq!(ncclCommInitRankConfig(&mut comm, 2, id, rank, &mut cfg), NcclResult::SUCCESS);
        let split = |parent: NcclCommPtr, color: c_int, key: c_int, config: *mut NcclConfig| {
            let mut child: NcclCommPtr = null_mut();
            assert_eq!(ncclCommSplit(parent, color, key, &mut child, config), NcclResult::SUCCESS);
            child
        };
        // Every rank, keys in rank order (equal keys too): the parent's communicator.
        let same = split(comm, 5, rank, null_mut());
        assert!(shared(comm, same).unwrap());
        let tied = split(same, 0, 0, null_mut());
        assert!(shared(comm, tied).unwrap(), "a split of a sharing split, config NULL, shares too");
        // Keys that reorder the ranks, or a rank left out: a communicator of its own.
        let reordered = split(comm, 5, -rank, null_mut());
        assert!(!shared(comm, reordered).unwrap());
        let (mut me, mut n) = (-1, 0);
        assert_eq!(ncclCommUserRank(reordered, &mut me), NcclResult::SUCCESS);
        assert_eq!(me, 1 - rank);
        let alone = split(comm, if rank == 0 { 5 } else { -1 }, 0, null_mut());
        if rank == 0 {
            assert!(!shared(comm, alone).unwrap());
            assert_eq!(ncclCommCount(alone, &mut n), NcclResult::SUCCESS);
            assert_eq!(n, 1);
            assert_eq!(ncclCommDestroy(alone), NcclResult::SUCCESS);
        } else {
            assert!(alone.is_null());
        }
        // A split whose own config says splitShare = 0 shares its parent, but its splits do not.
        let mut off = config(1);
        off.splitShare = 0;
        let quiet = split(comm, 5, rank, &mut off);
        assert!(shared(comm, quiet).unwrap());
        let own = split(quiet, 5, rank, null_mut());
        assert!(!shared(quiet, own).unwrap());
        // A parent without splitShare: never shared.
        let plain = split(own, 5, rank, null_mut());
        assert!(!shared(own, plain).unwrap());
        // The family outlives its first handle: the others still count, take a count-0 call, split.
        assert_eq!(ncclCommDestroy(comm), NcclResult::SUCCESS);
        assert_eq!(ncclCommCount(same, &mut n), NcclResult::SUCCESS);
        assert_eq!(n, 2);
        assert_eq!(ncclAllReduce(null_mut(), null_mut(), 0, f, NcclRedOp::SUM, same, null_mut()), NcclResult::SUCCESS);
        let late = split(same, 5, rank, null_mut());
        assert!(shared(same, late).unwrap() && shared(tied, late).unwrap());
        // An abort of one handle aborts the family's communicator (as in NCCL, its other handles
        // are then only to be destroyed), and takes that handle away.
        assert_eq!(ncclCommAbort(late), NcclResult::SUCCESS);
        assert_eq!(ncclCommCount(late, &mut n), NcclResult::INVALID_ARGUMENT);
        for c in [same, tied, quiet, reordered, own, plain] {
            assert_eq!(ncclCommDestroy(c), NcclResult::SUCCESS);
        }
    }
}

#[test]
fn two_cpu_ranks_split_sharing_their_parent() {
    two_cpu_ranks(split_share_rank);
}

#[test]
fn bad_init_arguments_fail_cleanly() {
    let mut id = NcclUniqueId { internal: [0; 128] };
    let mut comm: NcclCommPtr = null_mut();
    // SAFETY: live locals.
    unsafe {
        assert_eq!(ncclCommInitRank(null_mut(), 2, id, 0), NcclResult::INVALID_ARGUMENT);
        assert_eq!(ncclGetUniqueId(&mut id), NcclResult::SUCCESS);
        assert_eq!(ncclCommInitRank(&mut comm, 2, id, 2), NcclResult::INVALID_ARGUMENT);
        assert_eq!(ncclCommInitRank(&mut comm, 0, id, 0), NcclResult::INVALID_ARGUMENT);
        // Refused before anything is sized by it (was an allocation of gigabytes per rank count).
        assert_eq!(ncclCommInitRank(&mut comm, c_int::MAX, id, 0), NcclResult::INVALID_ARGUMENT);
        assert_eq!(ncclCommInitAll(&mut comm, c_int::MAX, std::ptr::null()), NcclResult::INVALID_ARGUMENT);
        let mut cfg = config(1);
        cfg.magic = 0;
        assert_eq!(ncclCommInitRankConfig(&mut comm, 1, id, 0, &mut cfg), NcclResult::INVALID_ARGUMENT);
        assert!(comm.is_null());
        let mut v = 0;
        assert_eq!(ncclGetVersion(&mut v), NcclResult::SUCCESS);
        assert_eq!(v, 22902);
        assert_eq!(ncclGetVersion(null_mut()), NcclResult::INVALID_ARGUMENT);
    }
}

/// Rank 0 of a two-rank communicator whose rank 1 never joins, made non-blocking (its init waits
/// for rank 1: WEAVE_TIMEOUT unset, 30 minutes), once it listens at the id's address; that
/// address.
fn an_init_whose_peer_never_comes() -> (NcclCommPtr, std::net::SocketAddr) {
    let id = cpu_job_id();
    let mut comm: NcclCommPtr = null_mut();
    let mut cfg = config(0);
    // SAFETY: live locals.
    unsafe {
        assert_eq!(ncclCommInitRankConfig(&mut comm, 2, id, 0, &mut cfg), NcclResult::IN_PROGRESS);
    }
    let root = nccl::unique_id::decode(&id).unwrap().addr;
    let listening = std::time::Instant::now();
    while std::net::TcpListener::bind(root).is_ok() {
        assert!(listening.elapsed() < std::time::Duration::from_secs(5), "the init does not listen at {root}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    (comm, root)
}

#[test]
fn an_abort_calls_off_an_init_whose_peers_never_come() {
    let (comm, root) = an_init_whose_peer_never_comes();
    // SAFETY: `comm` is a live handle; every other pointer a live local.
    unsafe {
        let mut state = NcclResult::SUCCESS;
        assert_eq!(ncclCommGetAsyncError(comm, &mut state), NcclResult::SUCCESS);
        assert_eq!(state, NcclResult::IN_PROGRESS);
        // A call on another thread waits for the init; meanwhile the communicator still reports
        // its init running, and the abort neither waits for the init nor for that call.
        let handle = comm as usize;
        let caller = std::thread::spawn(move || {
            let fake = 0x1000 as *mut std::ffi::c_void;
            let (f, sum) = (NcclDataType::FLOAT32, NcclRedOp::SUM);
            // The buffers are never touched: the call fails before any GPU work.
            ncclAllReduce(fake, fake, 4, f, sum, handle as NcclCommPtr, null_mut())
        });
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(!caller.is_finished(), "the call did not wait for the init");
        state = NcclResult::SUCCESS;
        assert_eq!(ncclCommGetAsyncError(comm, &mut state), NcclResult::SUCCESS);
        assert_eq!(state, NcclResult::IN_PROGRESS, "a call waiting for the init hid it");
        let started = std::time::Instant::now();
        assert_eq!(ncclCommAbort(comm), NcclResult::SUCCESS);
        assert!(started.elapsed() < BOUNDED, "the abort waited {:?}", started.elapsed());
        // The abort called the init off and it ended: nothing listens there any more.
        std::net::TcpListener::bind(root).expect("the aborted init's root address is free when the abort returns");
        let code = caller.join().unwrap();
        assert!(started.elapsed() < BOUNDED, "the call waited {:?}", started.elapsed());
        // The waiting call fails: with the called-off init's error where it settled the init
        // itself, else finding its communicator aborted.
        assert!(
            [NcclResult::SYSTEM_ERROR, NcclResult::INVALID_USAGE].contains(&code),
            "the waiting call gave {code:?}"
        );
        assert_eq!(ncclCommGetAsyncError(comm, &mut state), NcclResult::INVALID_ARGUMENT, "the handle is gone");
    }
}

#[test]
fn a_destroy_calls_off_an_init_whose_peers_never_come() {
    // The program gives up on rank 1 and destroys the communicator.
    let (comm, root) = an_init_whose_peer_never_comes();
    // SAFETY: `comm` is a live handle.
    unsafe {
        let started = std::time::Instant::now();
        assert_eq!(ncclCommDestroy(comm), NcclResult::SUCCESS);
        assert!(started.elapsed() < BOUNDED, "the destroy waited {:?}", started.elapsed());
        std::net::TcpListener::bind(root).expect("the destroyed init's root address is free when the destroy returns");
    }
}

#[test]
fn an_abort_ends_a_split_waiting_for_a_rank_that_never_splits() {
    // Rank 1 never splits: rank 0's split waits for it (30 minutes) until rank 0's communicator
    // is aborted from another thread (PyTorch's watchdog).
    let (to_rank_1, rank_1_may_go) = std::sync::mpsc::channel::<()>();
    let rank_1_may_go = std::sync::Mutex::new(Some(rank_1_may_go));
    let rank = move |id: NcclUniqueId, rank: c_int| {
        let mut comm: NcclCommPtr = null_mut();
        // SAFETY: live locals; `comm` is a live handle until aborted.
        unsafe {
            assert_eq!(ncclCommInitRank(&mut comm, 2, id, rank), NcclResult::SUCCESS);
            if rank == 1 {
                let go = rank_1_may_go.lock().unwrap().take().unwrap();
                go.recv_timeout(std::time::Duration::from_secs(60)).expect("rank 0's word");
                assert_eq!(ncclCommAbort(comm), NcclResult::SUCCESS);
                return;
            }
            let handle = comm as usize;
            let splitting = std::thread::spawn(move || {
                let mut child: NcclCommPtr = null_mut();
                let r = ncclCommSplit(handle as NcclCommPtr, 0, 0, &mut child, null_mut());
                (r, child.is_null())
            });
            std::thread::sleep(std::time::Duration::from_millis(300));
            assert!(!splitting.is_finished(), "the split did not wait for rank 1");
            let started = std::time::Instant::now();
            // On a thread as well: an abort that did not end the split would wait for it (the
            // 30-minute timeout), and the test must fail instead.
            let aborting = std::thread::spawn(move || ncclCommAbort(handle as NcclCommPtr));
            while !(splitting.is_finished() && aborting.is_finished()) {
                assert!(started.elapsed() < BOUNDED, "the abort did not end the split");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert_eq!(aborting.join().unwrap(), NcclResult::SUCCESS);
            let (r, no_child) = splitting.join().unwrap();
            assert_ne!(r, NcclResult::SUCCESS, "the split was aborted");
            assert!(no_child, "an aborted split hands out no handle");
            to_rank_1.send(()).unwrap();
        }
    };
    two_cpu_ranks(rank);
}

#[test]
fn a_thread_that_ends_inside_a_group_leaves_no_handle_waiting() {
    let id = cpu_job_id();
    let mut comm: NcclCommPtr = null_mut();
    // SAFETY: live locals; `comm` is live until destroyed.
    unsafe {
        assert_eq!(ncclCommInitRank(&mut comm, 1, id, 0), NcclResult::SUCCESS);
        let parent = comm as usize;
        let child = std::thread::spawn(move || {
            let mut child: NcclCommPtr = null_mut();
            assert_eq!(ncclGroupStart(), NcclResult::SUCCESS);
            assert_eq!(ncclCommSplit(parent as NcclCommPtr, 0, 0, &mut child, null_mut()), NcclResult::SUCCESS);
            // The thread ends without ncclGroupEnd.
            child as usize
        })
        .join()
        .unwrap() as NcclCommPtr;
        let mut state = NcclResult::SUCCESS;
        assert_eq!(ncclCommGetAsyncError(child, &mut state), NcclResult::SUCCESS);
        assert_eq!(state, NcclResult::INVALID_USAGE, "the split's handle still waits for its group");
        assert_eq!(ncclCommDestroy(child), NcclResult::SUCCESS);
        assert_eq!(ncclCommDestroy(comm), NcclResult::SUCCESS);
    }
}

#[test]
fn a_split_refused_inside_a_group_fails_the_group() {
    let id = cpu_job_id();
    let (mut comm, mut child): (NcclCommPtr, NcclCommPtr) = (null_mut(), null_mut());
    // SAFETY: live locals.
    unsafe {
        assert_eq!(ncclCommInitRank(&mut comm, 1, id, 0), NcclResult::SUCCESS);
        assert_eq!(ncclGroupStart(), NcclResult::SUCCESS);
        assert_eq!(ncclCommSplit(comm, -5, 0, &mut child, null_mut()), NcclResult::INVALID_ARGUMENT);
        assert!(child.is_null(), "a refused split hands out no handle");
        // As in NCCL, the group remembers the failure: its end fails too.
        assert_eq!(ncclGroupEnd(), NcclResult::INVALID_ARGUMENT);
        assert_eq!(ncclCommDestroy(comm), NcclResult::SUCCESS);
    }
}

#[test]
fn three_cpu_ranks_init_scalable_with_two_roots() {
    // SAFETY: set before any thread of this test reads the environment (same value as above).
    unsafe { std::env::set_var("WEAVE_NCCL_ALLOW_CPU", "1") };
    let mut ids = [NcclUniqueId { internal: [0; 128] }; 2];
    // SAFETY: live locals; the first rank of each group (0 and 2) would make its id.
    unsafe {
        assert_eq!(ncclGetUniqueId(&mut ids[0]), NcclResult::SUCCESS);
        assert_eq!(ncclGetUniqueId(&mut ids[1]), NcclResult::SUCCESS);
        let mut comm: NcclCommPtr = null_mut();
        let mut copy = ids;
        assert_eq!(
            ncclCommInitRankScalable(&mut comm, 3, 0, 0, copy.as_mut_ptr(), null_mut()),
            NcclResult::INVALID_ARGUMENT
        );
        assert_eq!(
            ncclCommInitRankScalable(&mut comm, 1, 0, 2, copy.as_mut_ptr(), null_mut()),
            NcclResult::INVALID_ARGUMENT
        );
        assert_eq!(ncclCommInitRankScalable(&mut comm, 3, 0, 1, null_mut(), null_mut()), NcclResult::INVALID_ARGUMENT);
        assert!(comm.is_null());
    }
    let ranks: Vec<_> = (0..3)
        .map(|rank| {
            std::thread::spawn(move || {
                let mut ids = ids;
                let mut comm: NcclCommPtr = null_mut();
                // SAFETY: live locals; `ids` holds the two ids.
                unsafe {
                    let r = ncclCommInitRankScalable(&mut comm, 3, rank, 2, ids.as_mut_ptr(), null_mut());
                    assert_eq!(r, NcclResult::SUCCESS, "rank {rank}");
                    let (mut n, mut me) = (0, -1);
                    assert_eq!(ncclCommCount(comm, &mut n), NcclResult::SUCCESS);
                    assert_eq!(ncclCommUserRank(comm, &mut me), NcclResult::SUCCESS);
                    assert_eq!((n, me), (3, rank));
                    assert_eq!(ncclCommDestroy(comm), NcclResult::SUCCESS);
                }
            })
        })
        .collect();
    for r in ranks {
        r.join().unwrap();
    }
}

/// Three CPU ranks: rank 2 aborts and leaves; ranks 0 and 1 revoke, shrink it away (it takes no
/// part), then grow back to three with a joiner that takes rank 2; every communicator reports
/// its size and rank, and the parents are destroyed without waiting for the excluded rank.
#[test]
fn three_cpu_ranks_revoke_shrink_and_grow_back() {
    let id = cpu_job_id();
    let (grow_tx, grow_rx) = std::sync::mpsc::channel::<NcclUniqueId>();
    let grow_rx = std::sync::Arc::new(std::sync::Mutex::new(grow_rx));
    let ranks: Vec<_> = (0..3)
        .map(|rank: c_int| {
            let grow_tx = grow_tx.clone();
            std::thread::spawn(move || {
                // SAFETY: every pointer passed is a live local; no buffer is touched (no GPU).
                unsafe {
                    let mut comm: NcclCommPtr = null_mut();
                    assert_eq!(ncclCommInitRank(&mut comm, 3, id, rank), NcclResult::SUCCESS);
                    if rank == 2 {
                        let mut excluded = [2];
                        let mut sub: NcclCommPtr = null_mut();
                        assert_eq!(
                            ncclCommShrink(comm, excluded.as_mut_ptr(), 1, &mut sub, null_mut(), 0),
                            NcclResult::INVALID_ARGUMENT,
                            "an excluded rank must not shrink"
                        );
                        assert_eq!(ncclCommAbort(comm), NcclResult::SUCCESS);
                        return;
                    }
                    assert_eq!(ncclCommRevoke(comm, 7), NcclResult::INVALID_ARGUMENT);
                    assert_eq!(ncclCommRevoke(comm, 0), NcclResult::SUCCESS);
                    let f = NcclDataType::FLOAT32;
                    let fake = 0x1000 as *mut std::ffi::c_void;
                    assert_eq!(
                        ncclAllReduce(fake, fake, 4, f, NcclRedOp::SUM, comm, null_mut()),
                        NcclResult::INVALID_USAGE,
                        "a revoked communicator's collectives fail"
                    );
                    let said = std::ffi::CStr::from_ptr(ncclGetLastError(comm)).to_string_lossy().into_owned();
                    assert!(said.contains("revoked"), "the failure must say the communicator was revoked: {said}");
                    let mut excluded = [2];
                    let mut sub: NcclCommPtr = null_mut();
                    assert_eq!(
                        ncclCommShrink(comm, excluded.as_mut_ptr(), c_int::MAX, &mut sub, null_mut(), 0),
                        NcclResult::INVALID_ARGUMENT,
                        "a count beyond the communicator's ranks is refused before the list is read"
                    );
                    let mut shrunk: NcclCommPtr = null_mut();
                    let r = ncclCommShrink(comm, excluded.as_mut_ptr(), 1, &mut shrunk, null_mut(), SHRINK_ABORT);
                    assert_eq!(r, NcclResult::SUCCESS);
                    let (mut n, mut me) = (0, -1);
                    assert_eq!(ncclCommCount(shrunk, &mut n), NcclResult::SUCCESS);
                    assert_eq!(ncclCommUserRank(shrunk, &mut me), NcclResult::SUCCESS);
                    assert_eq!((n, me), (2, rank));
                    let started = std::time::Instant::now();
                    assert_eq!(ncclCommDestroy(comm), NcclResult::SUCCESS);
                    assert!(started.elapsed() < BOUNDED, "the parent's destroy waited");
                    // Grow back: rank 0 makes the id, a joiner takes rank 2.
                    let mut gid = NcclUniqueId { internal: [0; 128] };
                    if rank == 0 {
                        assert_eq!(ncclCommGetUniqueId(shrunk, &mut gid), NcclResult::SUCCESS);
                        grow_tx.send(gid).unwrap();
                    } else {
                        assert_eq!(ncclCommGetUniqueId(shrunk, &mut gid), NcclResult::INVALID_USAGE);
                    }
                    let mut grown: NcclCommPtr = null_mut();
                    assert_eq!(
                        ncclCommGrow(shrunk, 3, std::ptr::null(), -1, &mut grown, null_mut()),
                        NcclResult::SUCCESS
                    );
                    assert_eq!(ncclCommCount(grown, &mut n), NcclResult::SUCCESS);
                    assert_eq!(ncclCommUserRank(grown, &mut me), NcclResult::SUCCESS);
                    assert_eq!((n, me), (3, rank));
                    assert_eq!(ncclCommDestroy(grown), NcclResult::SUCCESS);
                    assert_eq!(ncclCommDestroy(shrunk), NcclResult::SUCCESS);
                }
            })
        })
        .collect();
    let joiner = std::thread::spawn(move || {
        let gid = grow_rx.lock().unwrap().recv_timeout(std::time::Duration::from_secs(60)).expect("a grow id");
        // SAFETY: live locals.
        unsafe {
            let mut grown: NcclCommPtr = null_mut();
            assert_eq!(ncclCommGrow(null_mut(), 3, &gid, 2, &mut grown, null_mut()), NcclResult::SUCCESS);
            let (mut n, mut me) = (0, -1);
            assert_eq!(ncclCommCount(grown, &mut n), NcclResult::SUCCESS);
            assert_eq!(ncclCommUserRank(grown, &mut me), NcclResult::SUCCESS);
            assert_eq!((n, me), (3, 2));
            assert_eq!(ncclCommDestroy(grown), NcclResult::SUCCESS);
        }
    });
    for r in ranks {
        r.join().unwrap();
    }
    joiner.join().unwrap();
}
