//! Communicator life without a GPU (`WEAVE_NCCL_ALLOW_CPU=1`): two ranks as threads of this
//! process init (blocking and non-blocking), query, split with `NCCL_SPLIT_NOCOLOR`, refuse
//! device collectives cleanly, take count-0 calls, and abort from another thread.

use std::ffi::c_int;
use std::ptr::null_mut;

use nccl::abi::{NcclCommPtr, NcclConfig, NcclDataType, NcclRedOp, NcclResult, NcclUniqueId};
use nccl::api_coll::*;
use nccl::api_comm::*;

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
        // Split: rank 1 opts out.
        let mut sub: NcclCommPtr = fake.cast();
        let color = if rank == 0 { 7 } else { -1 };
        assert_eq!(ncclCommSplit(comm, color, 0, &mut sub, null_mut()), NcclResult::SUCCESS);
        if rank == 0 {
            assert!(!sub.is_null());
            assert_eq!(ncclCommCount(sub, &mut n), NcclResult::SUCCESS);
            assert_eq!(n, 1);
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

#[test]
fn two_cpu_ranks_init_split_and_abort() {
    // SAFETY: set before any thread of this test binary reads the environment.
    unsafe { std::env::set_var("WEAVE_NCCL_ALLOW_CPU", "1") };
    let mut id = NcclUniqueId { internal: [0; 128] };
    // SAFETY: `id` is a live local.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, NcclResult::SUCCESS);
    let ranks: Vec<_> = (0..2).map(|r| std::thread::spawn(move || rank_main(id, r))).collect();
    for r in ranks {
        r.join().unwrap();
    }
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
        let mut cfg = config(1);
        cfg.magic = 0;
        assert_eq!(ncclCommInitRankConfig(&mut comm, 1, id, 0, &mut cfg), NcclResult::INVALID_ARGUMENT);
        assert!(comm.is_null());
        let mut v = 0;
        assert_eq!(ncclGetVersion(&mut v), NcclResult::SUCCESS);
        assert_eq!(v, 22803);
        assert_eq!(ncclGetVersion(null_mut()), NcclResult::INVALID_ARGUMENT);
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
