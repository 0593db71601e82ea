//! How many sequential communication steps a plan takes: the latency term of its cost.
//!
//! A step is one round of the one-port model: in it every rank sends at most one message and
//! receives at most one (a rank that reads or writes `n - 1` peers' memory one after another
//! takes `n - 1` steps, even without messages). The count is for a small call, one message per
//! peer and step; large calls add messages to each step, not steps.

use super::table::{Algorithm, Collective};

/// `ceil(log2 n)` (0 for `n <= 1`).
pub fn ceil_log2(n: usize) -> usize {
    n.max(1).next_power_of_two().ilog2() as usize
}

/// Sequential steps of `algorithm` running `collective` on `n` ranks, or `None` where the
/// count depends on more than `n` (the hierarchical plans run whatever their sub-communicators'
/// tables pick).
pub fn steps(collective: Collective, algorithm: Algorithm, n: usize) -> Option<usize> {
    use Algorithm::*;
    if n <= 1 {
        return Some(0);
    }
    let hops = n - 1;
    // Ranks outside the largest power of two fold in before and get the result after.
    let core_steps = n.ilog2() as usize;
    let fold = if n.is_power_of_two() { 0 } else { 2 };
    let both_halves = matches!(collective, Collective::AllReduce);
    Some(match algorithm {
        _ if collective == Collective::SendRecv => 1,
        OneShot | Direct | ChannelDirect | ChannelEager => hops,
        TwoShot | TwoShotLl128 | TwoPhase => 2 * hops,
        Ring | ChannelRing => {
            if both_halves {
                2 * hops
            } else {
                hops
            }
        }
        ChannelDoubling => core_steps + fold,
        ChannelHalving => {
            if both_halves {
                2 * core_steps + fold
            } else {
                core_steps + fold
            }
        }
        ChannelBruck | ChannelTree => ceil_log2(n),
        Hierarchical => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::super::device::{GpuCaps, TEST_CAPS};
    use super::super::table::{AlgorithmTable, MemorySpace};
    use super::super::{CallShape, Executor, plan};
    use super::*;
    use comm_core::topology::Topology;
    use comm_core::transport::Transport;

    /// The world sizes the step counts are checked at: every power of two from 2 to 65,536 and
    /// the odd sizes around some of them.
    fn worlds() -> Vec<usize> {
        let mut v: Vec<usize> = (1..=16).map(|k| 1usize << k).collect();
        v.extend([3, 5, 6, 7, 9, 11, 13, 15, 17, 31, 33, 63, 65, 100, 127, 129, 255, 257, 1000, 1023, 1025, 4097]);
        v.extend([12_345, 65_535]);
        v.sort_unstable();
        v
    }

    /// Bytes of a small call of `collective` as the table measures it: one 8-byte element per
    /// rank, and the largest buffer for the block collectives.
    fn small_bytes(collective: Collective, n: usize) -> usize {
        match collective {
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll | Collective::AllToAllv => 8 * n,
            _ => 8,
        }
    }

    /// Most steps per `ceil(log2 n)` a small call's plan may take.
    const C: usize = 3;

    /// Checks the steps of `algorithm`, planned for a small `c` on `n` ranks, and adds a line to
    /// `report`. Every collective but all-to-all-v must stay within the logarithmic bound;
    /// all-to-all-v, whose per-peer counts are known only to the ranks that send (a Bruck form
    /// would first exchange them), stays direct.
    fn check(report: &mut String, n: usize, label: &str, c: Collective, algorithm: Algorithm) {
        let bound = C * ceil_log2(n);
        let s = steps(c, algorithm, n).unwrap();
        report.push_str(&format!(
            "{n:>5}  {bound:>5}  {label:<7}  {:<14}  {:<16}  {s:>5}\n",
            c.name(),
            algorithm.name()
        ));
        if c == Collective::AllToAllv {
            assert_eq!(s, n - 1, "{c} at {n} ranks");
        } else {
            assert!(s <= bound, "{c} on {n} ranks ({label}) runs {algorithm} in {s} steps, more than {bound}");
        }
    }

    const HEADER: &str = "world  bound  memory   collective      algorithm         steps\n";

    #[test]
    fn small_call_plans_take_a_logarithmic_number_of_steps() {
        let table = AlgorithmTable::default();
        let transports = [
            ("mapped", Transport::named("steps-test-mapping").unwrap(), true),
            ("network", Transport::named("steps-test-network").unwrap(), false),
        ];
        let mut report = String::from(HEADER);
        for n in worlds() {
            for &(label, transport, direct) in &transports {
                let topology = Topology::single_node(0, n, transport, direct);
                for c in Collective::ALL {
                    let p = plan(&table, CallShape::host(c, small_bytes(c, n)), &topology, None).unwrap();
                    assert_ne!(p.executor, Executor::Hierarchical);
                    check(&mut report, n, label, c, p.algorithm);
                }
            }
        }
        println!("{report}");
    }

    #[test]
    fn small_device_call_plans_take_a_logarithmic_number_of_steps() {
        // GPUs on one host: the direct kernels up to their eight GPUs, the channel kernels
        // beyond (and, with WEAVE_ALGO=channel, at every size of world).
        let mut channel_only = AlgorithmTable::default();
        channel_only.apply_overrides("channel").unwrap();
        let tables = [("gpu", AlgorithmTable::default()), ("gpu-ch", channel_only)];
        let transport = Transport::named("steps-test-mapping").unwrap();
        let mut report = String::from(HEADER);
        for n in worlds() {
            let topology = Topology::single_node(0, n, transport, true);
            let caps = GpuCaps { direct: n <= 8, ..TEST_CAPS };
            for (label, table) in &tables {
                for c in Collective::ALL {
                    let bytes = small_bytes(c, n);
                    let call = CallShape { collective: c, memory: MemorySpace::Device, bytes, payload: 8 };
                    let p = plan(table, call, &topology, Some(&caps)).unwrap();
                    if n > 8 || *label == "gpu-ch" {
                        assert_eq!(p.executor, Executor::GpuChannel, "{c} on {n} GPUs");
                    }
                    check(&mut report, n, label, c, p.algorithm);
                }
            }
        }
        println!("{report}");
    }

    #[test]
    fn the_logarithmic_algorithms_count_their_steps() {
        assert_eq!(steps(Collective::AllReduce, Algorithm::ChannelDoubling, 8), Some(3));
        assert_eq!(steps(Collective::AllReduce, Algorithm::ChannelDoubling, 9), Some(5));
        assert_eq!(steps(Collective::AllReduce, Algorithm::ChannelHalving, 16), Some(8));
        assert_eq!(steps(Collective::ReduceScatter, Algorithm::ChannelHalving, 17), Some(6));
        assert_eq!(steps(Collective::AllGather, Algorithm::ChannelBruck, 1000), Some(10));
        assert_eq!(steps(Collective::Broadcast, Algorithm::ChannelTree, 1025), Some(11));
        assert_eq!(steps(Collective::AllReduce, Algorithm::ChannelRing, 1000), Some(1998));
        assert_eq!(steps(Collective::Broadcast, Algorithm::Hierarchical, 16), None);
    }
}
