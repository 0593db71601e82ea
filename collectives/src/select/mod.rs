//! Algorithm selection: one function, [`plan`], maps a call and the communicator's topology to
//! the plan that runs it, from the data in [`table`].
//!
//! A new algorithm touches its table row, its executor and (on GPUs) its kernel file; the
//! choice itself is made here and nowhere else.

pub mod algorithm;
pub mod cost;
pub mod device;
pub(crate) mod forms;
pub mod steps;
pub mod table;

use comm_core::Result;
use comm_core::topology::Topology;

use device::{GpuCaps, KernelPlan};
use table::{Algorithm, AlgorithmTable, Collective, Family, MemorySpace};

/// Whether every rank of a communicator of several is on a node of its own (the table then
/// puts [`ONE_RANK_PER_NODE_ROWS`](table::ONE_RANK_PER_NODE_ROWS) first).
pub(crate) fn one_rank_per_node(topology: &Topology) -> bool {
    topology.world_size() > 1 && topology.node_count() == topology.world_size()
}

/// What is asked: the collective, where its buffers live and how big it is ("bytes" as the
/// table defines it: the largest buffer of the call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallShape {
    /// The collective.
    pub collective: Collective,
    /// Where the buffers live.
    pub memory: MemorySpace,
    /// Bytes of the call's largest buffer.
    pub bytes: usize,
    /// Bytes of one rank's part (count × element size): what a packet kernel moves per peer.
    pub payload: usize,
}

impl CallShape {
    /// A call on host memory of `bytes` bytes.
    pub fn host(collective: Collective, bytes: usize) -> Self {
        CallShape { collective, memory: MemorySpace::Host, bytes, payload: bytes }
    }
}

/// Which executor runs a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Executor {
    /// The calling thread, loading and storing peers' mapped host memory.
    HostDirect,
    /// The calling thread, driving links over connections (any transport).
    HostChannel,
    /// One kernel on the user's stream, loading and storing peers' mapped GPU memory.
    GpuDirect,
    /// One kernel on the user's stream pushing triggers; the proxy drives the links over
    /// connections (any number of GPUs).
    GpuChannel,
    /// The calling thread, running the call as steps over sub-communicators of its node and
    /// of its rail across nodes (see `crate::hierarchy`).
    Hierarchical,
}

/// How one call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Who runs it.
    pub executor: Executor,
    /// The kernel and its grid, for plans that launch one.
    pub kernel: Option<KernelPlan>,
}

/// The plan for `call` on this communicator: the families the topology allows (the direct
/// family needs every peer mapped here), then the table's first row among them — or the
/// override `WEAVE_ALGO` set — for the world size and the bytes; on device buffers (`gpu`
/// holds the GPUs' agreed capabilities) the algorithm the GPUs can run for this size, and its
/// kernel and grid.
pub fn plan(table: &AlgorithmTable, call: CallShape, topology: &Topology, gpu: Option<&GpuCaps>) -> Result<Plan> {
    plan_among(table, call, topology, gpu, true)
}

/// [`plan`] without the hierarchical family: for calls whose steps would not compose (an
/// integer average on device buffers, which each step would truncate).
pub fn plan_flat(table: &AlgorithmTable, call: CallShape, topology: &Topology, gpu: Option<&GpuCaps>) -> Result<Plan> {
    plan_among(table, call, topology, gpu, false)
}

/// [`plan`], with the hierarchical family only where `hierarchical` allows it.
fn plan_among(
    table: &AlgorithmTable,
    call: CallShape,
    topology: &Topology,
    gpu: Option<&GpuCaps>,
    hierarchical: bool,
) -> Result<Plan> {
    let direct_runs = match (call.memory, gpu) {
        (MemorySpace::Device, Some(caps)) => caps.direct,
        _ => topology.all_direct(),
    };
    // Steps over node and rail sub-communicators need several nodes of several ranks each.
    let hierarchical_runs = hierarchical
        && (call.memory == MemorySpace::Host || gpu.is_some())
        && topology.node_grid().is_some_and(|g| g.nodes > 1 && g.ranks_per_node > 1);
    let families: &[Family] = match (hierarchical_runs, direct_runs) {
        (true, true) => &[Family::Hierarchical, Family::Direct, Family::Channel],
        (true, false) => &[Family::Hierarchical, Family::Channel],
        (false, true) => &[Family::Direct, Family::Channel],
        (false, false) => &[Family::Channel],
    };
    let world = topology.world_size();
    let arch = gpu.and_then(|g| g.arch);
    let algorithm = table.select_among(call.collective, call.memory, world, call.bytes, arch, families)?;
    match (call.memory, algorithm.family(), gpu) {
        (MemorySpace::Host, Family::Direct, _) => Ok(Plan { algorithm, executor: Executor::HostDirect, kernel: None }),
        (MemorySpace::Host, Family::Channel, _) => {
            Ok(Plan { algorithm, executor: Executor::HostChannel, kernel: None })
        }
        (_, Family::Hierarchical, _) => Ok(Plan { algorithm, executor: Executor::Hierarchical, kernel: None }),
        (MemorySpace::Device, Family::Channel, Some(caps)) => {
            let kernel = device::kernel(call.collective, algorithm, world, call.bytes, caps)?;
            Ok(Plan { algorithm, executor: Executor::GpuChannel, kernel: Some(kernel) })
        }
        (MemorySpace::Device, Family::Direct, Some(caps)) => {
            let algorithm = device::fit(algorithm, call.collective, world, call.payload, caps);
            let kernel = device::kernel(call.collective, algorithm, world, call.bytes, caps)?;
            Ok(Plan { algorithm, executor: Executor::GpuDirect, kernel: Some(kernel) })
        }
        (MemorySpace::Device, _, None) => Err(comm_core::Error::Unsupported(format!(
            "{} on device buffers needs the GPU path, which this communicator does not have",
            call.collective
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use comm_core::transport::Transport;

    /// A transport that maps peer memory, and one that does not; the names are arbitrary.
    fn mapping() -> Transport {
        Transport::named("select-test-mapping").unwrap()
    }

    fn network() -> Transport {
        Transport::named("select-test-network").unwrap()
    }

    fn shape(collective: Collective, bytes: usize) -> CallShape {
        CallShape::host(collective, bytes)
    }

    #[test]
    fn direct_access_everywhere_keeps_the_direct_rows() {
        let t = AlgorithmTable::default();
        let topo = Topology::single_node(0, 4, mapping(), true);
        let p = plan(&t, shape(Collective::AllReduce, 1024), &topo, None).unwrap();
        assert_eq!(p, Plan { algorithm: Algorithm::OneShot, executor: Executor::HostDirect, kernel: None });
    }

    #[test]
    fn peers_without_direct_access_get_the_channel_family_for_every_collective() {
        let t = AlgorithmTable::default();
        let topo = Topology::single_node(0, 4, network(), false);
        for c in Collective::ALL {
            for bytes in [0, 8, 64 << 10, 1 << 20, 1 << 30] {
                let p = plan(&t, shape(c, bytes), &topo, None).unwrap();
                assert_eq!(p.executor, Executor::HostChannel, "{c} {bytes}");
                assert!(p.algorithm.runs_on_host(c), "{c} {bytes} -> {}", p.algorithm);
            }
        }
        assert_eq!(plan(&t, shape(Collective::AllReduce, 8), &topo, None).unwrap().algorithm, Algorithm::ChannelDirect);
        assert_eq!(
            plan(&t, shape(Collective::AllReduce, 1 << 30), &topo, None).unwrap().algorithm,
            Algorithm::ChannelRing
        );
    }

    #[test]
    fn a_forced_direct_algorithm_without_direct_access_is_refused() {
        let mut t = AlgorithmTable::default();
        t.apply_overrides("all_reduce=one_shot").unwrap();
        let topo = Topology::single_node(0, 2, network(), false);
        let e = plan(&t, shape(Collective::AllReduce, 8), &topo, None).unwrap_err();
        assert!(e.to_string().contains("one_shot"), "{e}");
    }

    #[test]
    fn weave_algo_channel_picks_the_channel_rows_where_they_run() {
        let mut t = AlgorithmTable::default();
        t.apply_overrides("channel").unwrap();
        let topo = Topology::single_node(1, 3, mapping(), true);
        for c in Collective::ALL {
            let p = plan(&t, shape(c, 4096), &topo, None).unwrap();
            assert_eq!(p.executor, Executor::HostChannel, "{c}");
        }
        // Device buffers too: the channel kernels.
        let caps = device::TEST_CAPS;
        for c in Collective::ALL {
            let d = CallShape { collective: c, memory: MemorySpace::Device, bytes: 8, payload: 8 };
            let p = plan(&t, d, &topo, Some(&caps)).unwrap();
            assert_eq!(p.executor, Executor::GpuChannel, "{c}");
            assert!(p.kernel.is_some_and(|k| k.family.starts_with("weave_channel")), "{c}");
        }
        // Without the family override the direct kernels run where they can.
        let d = CallShape { collective: Collective::AllReduce, memory: MemorySpace::Device, bytes: 8, payload: 8 };
        let p = plan(&AlgorithmTable::default(), d, &topo, Some(&caps)).unwrap();
        assert_eq!((p.algorithm, p.executor), (Algorithm::OneShot, Executor::GpuDirect));
        assert_eq!(p.kernel.map(|k| k.family), Some("weave_all_reduce_ll"));
        // ... and where they cannot (more than 8 GPUs), the channel kernels do.
        let no_direct = GpuCaps { direct: false, ..caps };
        let topo16 = Topology::single_node(1, 16, mapping(), true);
        for c in Collective::ALL {
            for bytes in [8, 1 << 20, 1 << 30] {
                let d = CallShape { collective: c, memory: MemorySpace::Device, bytes, payload: bytes };
                let p = plan(&AlgorithmTable::default(), d, &topo16, Some(&no_direct)).unwrap();
                assert_eq!(p.executor, Executor::GpuChannel, "{c} {bytes}");
            }
        }
    }

    /// Rank 1 of two nodes of two ranks: it maps its node's peer 0 and reaches 2 and 3 over the
    /// network.
    fn grid_2x2_rank_1() -> Topology {
        let hosts: Vec<String> = ["a", "a", "b", "b"].map(String::from).to_vec();
        let reach = (0..4)
            .map(|p| comm_core::topology::PeerReach {
                transports: match p {
                    1 => Vec::new(),
                    0 => vec![(mapping(), true)],
                    _ => vec![(network(), false)],
                },
            })
            .collect();
        Topology::new(1, &hosts, reach)
    }

    #[test]
    fn host_calls_across_a_node_grid_take_steps_where_the_rows_say() {
        let t = AlgorithmTable::default();
        let topo = grid_2x2_rank_1();
        for (c, bytes, steps) in [
            (Collective::AllReduce, 8, true),
            (Collective::AllReduce, 1 << 20, true),
            (Collective::AllGather, 8, true),
            (Collective::AllGather, 1 << 20, true),
            (Collective::ReduceScatter, (64 << 10) - 1, false),
            (Collective::ReduceScatter, 64 << 10, true),
            (Collective::Broadcast, 8, true),
            (Collective::Reduce, 8, true),
            (Collective::AllToAll, 8, false),
        ] {
            let p = plan(&t, shape(c, bytes), &topo, None).unwrap();
            assert_eq!(p.executor == Executor::Hierarchical, steps, "{c} {bytes}: {p:?}");
        }
    }

    #[test]
    fn device_calls_across_a_node_grid_take_steps_where_the_rows_say() {
        let t = AlgorithmTable::default();
        let topo = grid_2x2_rank_1();
        let caps = GpuCaps { direct: false, ..device::TEST_CAPS };
        let device = |c, bytes| CallShape { collective: c, memory: MemorySpace::Device, bytes, payload: bytes };
        for (c, bytes, steps) in [
            (Collective::AllReduce, 1 << 20, true),
            (Collective::AllReduce, 8, false),
            (Collective::Broadcast, 8, true),
            (Collective::AllGather, 1 << 20, true),
            (Collective::AllGather, (64 << 10) - 1, false),
            (Collective::ReduceScatter, 64 << 10, true),
            (Collective::ReduceScatter, 8, false),
            (Collective::Reduce, 1 << 20, true),
            (Collective::Reduce, 8, true),
            (Collective::AllToAll, 1 << 20, false),
        ] {
            let p = plan(&t, device(c, bytes), &topo, Some(&caps)).unwrap();
            assert_eq!(p.executor == Executor::Hierarchical, steps, "{c} {bytes}: {p:?}");
            let flat = plan_flat(&t, device(c, bytes), &topo, Some(&caps)).unwrap();
            assert_eq!(flat.executor, Executor::GpuChannel, "{c} {bytes}");
        }
        // Without GPU capabilities a device call has no plan at all, hierarchical or not.
        assert!(plan(&t, device(Collective::AllReduce, 1 << 20), &topo, None).is_err());
    }
}
