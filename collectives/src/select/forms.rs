//! The forms an executor picks inside the algorithm the table chose, by the size of the call.
//! They do not change what every rank must agree on (the algorithm, in the call's signature),
//! only how the executor runs it; they live here so that every size threshold of a plan is in
//! `select/`.

use super::table::Algorithm;

/// Ranks up to which a small host all-reduce carries its payload in the header line itself
/// ([`inline_all_reduce`]): what the executor gathers them into holds this many.
pub(crate) const INLINE_ALL_REDUCE_MAX_RANKS: usize = 16;

/// Whether a host all-reduce of `bytes` on `n` ranks, run with `algorithm`, travels in the
/// header line (one cache line per peer and step): a one-shot of at most `inline_bytes`, the
/// workspace's inline payload, on at most [`INLINE_ALL_REDUCE_MAX_RANKS`] ranks.
pub(crate) fn inline_all_reduce(algorithm: Algorithm, bytes: usize, n: usize, inline_bytes: usize) -> bool {
    // Every algorithm but the two-phase and the ring runs one-shot on the host executor.
    let one_shot = !matches!(algorithm, Algorithm::TwoPhase | Algorithm::Ring | Algorithm::Hierarchical);
    one_shot && bytes <= inline_bytes && n <= INLINE_ALL_REDUCE_MAX_RANKS
}

/// Bytes of a whole hierarchical all-reduce (or of an all-gather's whole output) below which
/// the call crosses the network on the last local rank's rail alone: a reduce (an all-gather)
/// to that rank in the node, its rail step, a broadcast from it in the node — one network
/// message per node instead of one on every rail (docs/perf-log/nodes.md, "Across nodes:
/// small calls on one rail").
pub(crate) const HIERARCHY_ONE_RAIL_BYTES: usize = 64 << 10;

/// Bytes of a hierarchical all-reduce's main part from which it runs in chunks, the rail step
/// of one beside the node steps of the others. Below, the node steps are short next to the
/// rail step and a second thread costs more than it saves.
pub(crate) const HIERARCHY_PIPELINE_BYTES: usize = 8 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_small_one_shots_of_few_ranks_go_inline() {
        assert!(inline_all_reduce(Algorithm::OneShot, 16, 16, 16));
        assert!(!inline_all_reduce(Algorithm::OneShot, 17, 2, 16));
        assert!(!inline_all_reduce(Algorithm::OneShot, 8, 17, 16));
        assert!(!inline_all_reduce(Algorithm::Ring, 8, 2, 16));
        assert!(!inline_all_reduce(Algorithm::Hierarchical, 8, 2, 16));
    }
}
