//! The table's unit tests: rows, selection, overrides.

use super::*;

/// The families a job of one node allows.
const DIRECT_AND_CHANNEL: &[Family] = &[Family::Direct, Family::Channel];

#[test]
fn every_host_collective_has_an_algorithm_for_every_size_and_world() {
    let t = AlgorithmTable::default();
    for c in Collective::ALL {
        for ranks in [1, 2, 3, 8, 63, 64, 1000] {
            for bytes in [0, 1, 4096, 1 << 20, 1 << 30, usize::MAX - 1] {
                let a = t.select(c, MemorySpace::Host, ranks, bytes).unwrap();
                assert!(a.runs_on_host(c), "{c} {ranks} {bytes} -> {a}");
            }
        }
    }
}

#[test]
fn what_runs_where_follows_from_the_rows() {
    use Algorithm::*;
    use Collective::*;
    let host = |c: Collective| Algorithm::ALL.into_iter().filter(|a| a.runs_on_host(c)).collect::<Vec<_>>();
    let device = |c: Collective| Algorithm::ALL.into_iter().filter(|a| a.runs_on_device(c)).collect::<Vec<_>>();
    assert_eq!(
        host(AllReduce),
        [OneShot, TwoPhase, Ring, ChannelRing, ChannelDirect, ChannelDoubling, ChannelHalving, Hierarchical]
    );
    assert_eq!(host(AllGather), [Ring, Direct, ChannelRing, ChannelDirect, ChannelBruck, Hierarchical]);
    assert_eq!(host(ReduceScatter), [Ring, Direct, ChannelRing, ChannelDirect, ChannelHalving, Hierarchical]);
    assert_eq!(host(AllToAll), [Direct, ChannelDirect, ChannelBruck]);
    assert_eq!(host(Broadcast), [Direct, ChannelRing, ChannelDirect, ChannelEager, ChannelTree, Hierarchical]);
    assert_eq!(host(Reduce), [OneShot, TwoPhase, ChannelRing, ChannelDirect, ChannelEager, ChannelTree, Hierarchical]);
    assert_eq!(host(AllToAllv), [Direct, ChannelDirect]);
    assert_eq!(host(SendRecv), [Direct, ChannelDirect]);
    assert_eq!(
        device(AllReduce),
        [
            OneShot,
            TwoShot,
            TwoShotLl128,
            TwoPhase,
            ChannelRing,
            ChannelDirect,
            ChannelDoubling,
            ChannelHalving,
            Hierarchical
        ]
    );
    assert_eq!(device(AllGather), [OneShot, Direct, ChannelRing, ChannelDirect, ChannelBruck, Hierarchical]);
    assert_eq!(device(ReduceScatter), [OneShot, Direct, ChannelRing, ChannelDirect, ChannelHalving, Hierarchical]);
    assert_eq!(device(AllToAll), [OneShot, Direct, ChannelDirect, ChannelBruck]);
    assert_eq!(device(Broadcast), [OneShot, TwoPhase, Ring, ChannelRing, ChannelDirect, ChannelTree, Hierarchical]);
    assert_eq!(device(Reduce), [OneShot, Direct, ChannelRing, ChannelDirect, ChannelTree, Hierarchical]);
    assert_eq!(device(AllToAllv), [Direct, ChannelDirect]);
    assert_eq!(device(SendRecv), [Direct, ChannelDirect]);
}

#[test]
fn small_and_large_all_reduce_pick_different_algorithms() {
    let t = AlgorithmTable::default();
    assert_eq!(t.select(Collective::AllReduce, MemorySpace::Host, 2, 1024).unwrap(), Algorithm::OneShot);
    assert_eq!(t.select(Collective::AllReduce, MemorySpace::Host, 2, 64 << 20).unwrap(), Algorithm::TwoPhase);
    assert_eq!(t.select(Collective::AllReduce, MemorySpace::Host, 128, 512 << 10).unwrap(), Algorithm::ChannelHalving);
    assert_eq!(t.select(Collective::AllReduce, MemorySpace::Host, 128, 64 << 20).unwrap(), Algorithm::Ring);
}

#[test]
fn every_device_collective_has_an_algorithm_at_every_world_size() {
    let t = AlgorithmTable::default();
    for c in Collective::ALL {
        for ranks in 1..=8 {
            for bytes in [0, 8, 256 << 10, 1 << 30] {
                let a = t.select(c, MemorySpace::Device, ranks, bytes).unwrap();
                assert!(a.runs_on_device(c), "{c} {ranks} {bytes} -> {a}");
            }
        }
    }
    // Past the direct kernels' eight GPUs only the channel rows remain.
    for c in Collective::ALL {
        for bytes in [0, 8, 1 << 30] {
            let a = t.select(c, MemorySpace::Device, 16, bytes).unwrap();
            assert_eq!(a.family(), Family::Channel, "{c} {bytes} -> {a}");
        }
    }
}

#[test]
fn hopper_rows_are_per_world_size_and_cover_every_size() {
    let t = AlgorithmTable::default();
    let sel = |c, n, b| t.select_among(c, MemorySpace::Device, n, b, Some(90), DIRECT_AND_CHANNEL).unwrap();
    assert_eq!(sel(Collective::AllReduce, 2, 256 << 10), Algorithm::OneShot);
    assert_eq!(sel(Collective::AllReduce, 2, 1 << 20), Algorithm::TwoShotLl128);
    assert_eq!(sel(Collective::AllReduce, 4, 256 << 10), Algorithm::OneShot);
    assert_eq!(sel(Collective::AllReduce, 4, 512 << 10), Algorithm::TwoShotLl128);
    assert_eq!(sel(Collective::AllReduce, 4, 4 << 20), Algorithm::TwoPhase);
    assert_eq!(sel(Collective::AllReduce, 4, 1 << 30), Algorithm::TwoPhase);
    assert_eq!(sel(Collective::Broadcast, 4, 8), Algorithm::OneShot);
    assert_eq!(sel(Collective::Broadcast, 4, 256 << 10), Algorithm::OneShot);
    assert_eq!(sel(Collective::Broadcast, 4, 512 << 10), Algorithm::Ring);
    assert_eq!(sel(Collective::Broadcast, 4, 1 << 30), Algorithm::Ring);
    assert_eq!(sel(Collective::Broadcast, 2, 1 << 30), Algorithm::TwoPhase);
    for c in Collective::ALL {
        for ranks in 1..=8 {
            for bytes in [0, 8, 64 << 10, 256 << 10, 1 << 20, 1 << 30] {
                let a = sel(c, ranks, bytes);
                assert!(a.runs_on_device(c), "{c} {ranks} {bytes} -> {a}");
            }
        }
    }
    // Another architecture gets the generic rows.
    assert_eq!(
        t.select_among(Collective::AllReduce, MemorySpace::Device, 2, 128 << 10, Some(80), DIRECT_AND_CHANNEL).unwrap(),
        Algorithm::TwoShot
    );
}

#[test]
fn an_override_applies_only_where_the_algorithm_runs() {
    let mut t = AlgorithmTable::default();
    t.apply_overrides("all_reduce=two_shot").unwrap();
    assert_eq!(t.select(Collective::AllReduce, MemorySpace::Device, 4, 1 << 30).unwrap(), Algorithm::TwoShot);
    assert_eq!(t.select(Collective::AllReduce, MemorySpace::Host, 4, 1 << 30).unwrap(), Algorithm::TwoPhase);
}

#[test]
fn overrides_parse_and_apply() {
    let mut t = AlgorithmTable::default();
    t.apply_overrides("ring").unwrap();
    assert_eq!(t.select(Collective::AllReduce, MemorySpace::Host, 2, 8).unwrap(), Algorithm::Ring);
    assert_eq!(t.select(Collective::Broadcast, MemorySpace::Host, 2, 8).unwrap(), Algorithm::ChannelEager);
    assert_eq!(t.select(Collective::Broadcast, MemorySpace::Host, 2, 1 << 20).unwrap(), Algorithm::Direct);
    t.apply_overrides("all-reduce=one_shot").unwrap();
    assert_eq!(t.select(Collective::AllReduce, MemorySpace::Host, 2, 1 << 30).unwrap(), Algorithm::OneShot);
    assert!(t.apply_overrides("all_to_allv=ring").is_err());
    t.apply_overrides("broadcast=ring").unwrap();
    assert_eq!(t.select(Collective::Broadcast, MemorySpace::Device, 4, 8).unwrap(), Algorithm::Ring);
    assert_eq!(t.select(Collective::Broadcast, MemorySpace::Host, 4, 8).unwrap(), Algorithm::ChannelEager);
    assert!(t.apply_overrides("all_reduce=fast").is_err());
    assert!(t.apply_overrides("gather=direct").is_err());
}

#[test]
fn a_crowded_host_keeps_small_all_reduces_of_up_to_128_ranks_on_one_arrival() {
    let mut t = AlgorithmTable::default();
    let small = |t: &AlgorithmTable, ranks| t.select(Collective::AllReduce, MemorySpace::Host, ranks, 8).unwrap();
    assert_eq!(small(&t, 32), Algorithm::ChannelDoubling);
    t.for_crowded_host();
    let rows = t.rows().len();
    t.for_crowded_host();
    assert_eq!(t.rows().len(), rows, "the crowded rows went in twice");
    assert_eq!(small(&t, 8), Algorithm::OneShot);
    assert_eq!(small(&t, 32), Algorithm::OneShot);
    assert_eq!(small(&t, 128), Algorithm::OneShot);
    assert_eq!(small(&t, 129), Algorithm::ChannelDoubling);
    assert_eq!(t.select(Collective::AllReduce, MemorySpace::Host, 32, 1 << 20).unwrap(), Algorithm::TwoPhase);
    // An override still wins.
    t.apply_overrides("all_reduce=channel_doubling").unwrap();
    assert_eq!(small(&t, 32), Algorithm::ChannelDoubling);
}

#[test]
fn one_rank_per_node_sends_all_reduces_of_four_and_eight_ranks_through_doubling_then_halving() {
    let mut t = AlgorithmTable::default();
    let channel = |t: &AlgorithmTable, ranks, bytes| {
        t.select_among(Collective::AllReduce, MemorySpace::Host, ranks, bytes, None, &[Family::Channel]).unwrap()
    };
    assert_eq!(channel(&t, 4, 8), Algorithm::ChannelDirect);
    t.for_one_rank_per_node();
    t.for_one_rank_per_node();
    assert_eq!(t.rows().iter().filter(|r| ONE_RANK_PER_NODE_ROWS.contains(r)).count(), ONE_RANK_PER_NODE_ROWS.len());
    for ranks in [4, 8] {
        assert_eq!(channel(&t, ranks, 8), Algorithm::ChannelDoubling, "{ranks} ranks");
        assert_eq!(channel(&t, ranks, 16 << 10), Algorithm::ChannelDoubling, "{ranks} ranks, 16 KiB");
        assert_eq!(channel(&t, ranks, 32 << 10), Algorithm::ChannelHalving, "{ranks} ranks, 32 KiB");
        assert_eq!(channel(&t, ranks, 1 << 20), Algorithm::ChannelRing, "{ranks} ranks, 1 MiB");
    }
    for ranks in [2, 3, 5] {
        assert_eq!(channel(&t, ranks, 8), Algorithm::ChannelDirect, "{ranks} ranks");
    }
    t.apply_overrides("all_reduce=channel_direct").unwrap();
    assert_eq!(channel(&t, 4, 8), Algorithm::ChannelDirect);
}
