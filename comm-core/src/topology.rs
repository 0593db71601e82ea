//! Topology: how the ranks of a communicator group into nodes, and how each peer is reached.
//!
//! Every rank builds the same node grouping from the host identities all-gathered at setup
//! (see [`crate::host`]; `WEAVE_HOST_ID` overrides them). Nodes are numbered in the order of
//! their lowest rank, and ranks inside a node keep their communicator order. Per peer, the
//! topology lists the transports that reach it, best first, and whether that transport maps
//! the peer's memory here (direct access: memory channels, the direct algorithm family) or
//! only moves bytes through a connection (port channels, the channel algorithm family).

use crate::transport::Transport;

/// How this rank reaches one peer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeerReach {
    /// The transports that reach the peer, best first, each with whether memory imported
    /// through it is mapped into this process.
    pub transports: Vec<(Transport, bool)>,
}

impl PeerReach {
    /// The preferred transport, if any (none for this rank itself).
    pub fn preferred(&self) -> Option<Transport> {
        self.transports.first().map(|&(t, _)| t)
    }

    /// Whether some transport to this peer maps its memory here.
    pub fn direct_access(&self) -> bool {
        self.transports.iter().any(|&(_, direct)| direct)
    }
}

/// One rank's view of the communicator's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    rank: usize,
    /// Node index of every rank.
    node_of: Vec<usize>,
    /// Ranks of every node, ascending.
    nodes: Vec<Vec<usize>>,
    /// How every rank is reached from this one (empty for this rank).
    reach: Vec<PeerReach>,
    /// Every peer's memory is mapped here by some transport.
    all_direct: bool,
    /// The nodes as a grid, where they form one.
    grid: Option<NodeGrid>,
}

/// Nodes that all hold the same number of ranks, in blocks of consecutive ranks: node `k`
/// holds ranks `k·L … k·L + L − 1` (as launchers place them). Rank `r` is then local rank
/// `r % L` of node `r / L`, and the ranks with one local rank, one per node, form a *rail*.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeGrid {
    /// Number of nodes.
    pub nodes: usize,
    /// Ranks on every node (`L`).
    pub ranks_per_node: usize,
}

impl NodeGrid {
    /// The node of `rank`.
    pub fn node_of(&self, rank: usize) -> usize {
        rank / self.ranks_per_node
    }

    /// The local rank of `rank` on its node (and the rail it belongs to).
    pub fn local_of(&self, rank: usize) -> usize {
        rank % self.ranks_per_node
    }
}

impl Topology {
    /// The topology of `rank` among ranks whose host identities are `hosts` (indexed by rank),
    /// reaching each rank as `reach` says.
    pub fn new(rank: usize, hosts: &[String], reach: Vec<PeerReach>) -> Self {
        let mut names: Vec<&str> = Vec::new();
        let mut node_of = Vec::with_capacity(hosts.len());
        let mut nodes: Vec<Vec<usize>> = Vec::new();
        for (r, h) in hosts.iter().enumerate() {
            let node = match names.iter().position(|n| *n == h.as_str()) {
                Some(i) => i,
                None => {
                    names.push(h);
                    nodes.push(Vec::new());
                    names.len() - 1
                }
            };
            node_of.push(node);
            nodes[node].push(r);
        }
        let all_direct = reach.iter().enumerate().all(|(p, r)| p == rank || r.direct_access());
        let per_node = nodes.first().map_or(0, Vec::len);
        let grid = nodes
            .iter()
            .enumerate()
            .all(|(k, ranks)| ranks.len() == per_node && ranks.iter().enumerate().all(|(i, &r)| r == k * per_node + i))
            .then_some(NodeGrid { nodes: nodes.len(), ranks_per_node: per_node });
        Topology { rank, node_of, nodes, reach, all_direct, grid }
    }

    /// A topology where every rank is on one node and reached by `transport` (tests, and
    /// communicators of one rank).
    pub fn single_node(rank: usize, world_size: usize, transport: Transport, direct: bool) -> Self {
        let hosts = vec![String::new(); world_size];
        let reach = (0..world_size)
            .map(|p| PeerReach { transports: if p == rank { Vec::new() } else { vec![(transport, direct)] } })
            .collect();
        Topology::new(rank, &hosts, reach)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.node_of.len()
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The node of `rank` (`None` for a rank outside the communicator).
    pub fn node_of(&self, rank: usize) -> Option<usize> {
        self.node_of.get(rank).copied()
    }

    /// This rank's node.
    pub fn node(&self) -> usize {
        self.node_of[self.rank]
    }

    /// The ranks of `node`, ascending (empty for a node that does not exist).
    pub fn node_ranks(&self, node: usize) -> &[usize] {
        self.nodes.get(node).map_or(&[], |v| v.as_slice())
    }

    /// Most ranks on any node.
    pub fn max_ranks_per_node(&self) -> usize {
        self.nodes.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// How `peer` is reached (`None` for a rank outside the communicator).
    pub fn reach(&self, peer: usize) -> Option<&PeerReach> {
        self.reach.get(peer)
    }

    /// The nodes as a grid ([`NodeGrid`]), where every node holds the same number of
    /// consecutive ranks; `None` otherwise.
    pub fn node_grid(&self) -> Option<NodeGrid> {
        self.grid
    }

    /// Whether every peer's memory is mapped here by some transport: what the direct
    /// algorithm family needs.
    pub fn all_direct(&self) -> bool {
        self.all_direct
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_of_equal_consecutive_blocks_form_a_grid() {
        let topo = |names: &[&str]| {
            let hosts: Vec<String> = names.iter().map(|s| s.to_string()).collect();
            Topology::new(0, &hosts, (0..names.len()).map(|_| PeerReach::default()).collect())
        };
        let g = topo(&["a", "a", "b", "b", "c", "c"]).node_grid().unwrap();
        assert_eq!(g, NodeGrid { nodes: 3, ranks_per_node: 2 });
        assert_eq!((g.node_of(3), g.local_of(3)), (1, 1));
        assert_eq!(topo(&["a", "b", "c"]).node_grid(), Some(NodeGrid { nodes: 3, ranks_per_node: 1 }));
        assert_eq!(topo(&["a", "b", "a", "b"]).node_grid(), None, "interleaved nodes");
        assert_eq!(topo(&["a", "a", "b"]).node_grid(), None, "unequal nodes");
    }

    #[test]
    fn nodes_follow_host_identities_in_rank_order() {
        let hosts: Vec<String> = ["b", "a", "b", "c", "a"].iter().map(|s| s.to_string()).collect();
        let reach = (0..5).map(|_| PeerReach::default()).collect();
        let t = Topology::new(2, &hosts, reach);
        assert_eq!(t.node_count(), 3);
        assert_eq!(t.node(), 0);
        assert_eq!(t.node_ranks(0), &[0, 2]);
        assert_eq!(t.node_ranks(1), &[1, 4]);
        assert_eq!(t.node_ranks(2), &[3]);
        assert_eq!(t.node_ranks(9), &[] as &[usize]);
        assert_eq!(t.node_of(4), Some(1));
        assert_eq!(t.max_ranks_per_node(), 2);
    }

    #[test]
    fn direct_access_needs_a_mapping_transport_to_every_peer() {
        let mapping = Transport::named("topo-test-mapping").unwrap();
        let t = Topology::single_node(0, 3, mapping, true);
        assert!(t.all_direct());
        assert_eq!(t.reach(1).and_then(PeerReach::preferred), Some(mapping));
        let t = Topology::single_node(1, 3, Transport::named("topo-test-network").unwrap(), false);
        assert!(!t.all_direct());
        assert_eq!(t.node_count(), 1);
    }
}
