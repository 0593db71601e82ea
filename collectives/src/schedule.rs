//! Who talks to whom in the channel algorithms, and over links of what size — what the host
//! channel executor (`channel/`) and the GPU channel family (`gpu/channels.rs`) share, so that
//! both build the same links and run the same schedules (the device kernels of
//! `kernels/cuda/channel_log.cu` recompute these peers from the world, rank and root):
//! - [`Fold`]: a world of any size as the largest power of two inside it;
//! - the peers of recursive doubling and halving ([`doubling_peers`]), of Bruck's algorithms
//!   ([`bruck_peers`], [`bruck_distances`]) and of binomial trees ([`binomial_tree`]);
//! - link geometry: [`SLOTS`] and [`payload_for`];
//! - [`missing_links`]: the order in which every rank builds the links a call needs.

/// Largest payload of one message (and slot): per-message costs (headers, flags, and over TCP
/// a thread hand-off each way) fall with larger messages (docs/perf-log/cpu-host.md, "CPUs: the
/// channel family, over shared memory and over TCP").
const MAX_PAYLOAD_BYTES: usize = 512 << 10;
/// Smallest payload of one message.
const MIN_PAYLOAD_BYTES: usize = 64 << 10;
/// Payload bytes a rank may give all its links together, per slot: large worlds get smaller
/// messages so that links to every peer (direct all-to-all) stay within bounds.
const LINK_PAYLOAD_BUDGET: usize = 8 << 20;

/// Payload bytes per message in a world of `n` ranks.
pub(crate) fn payload_for(n: usize) -> usize {
    (LINK_PAYLOAD_BUDGET / n.saturating_sub(1).max(1)).clamp(MIN_PAYLOAD_BYTES, MAX_PAYLOAD_BYTES) / 4096 * 4096
}
/// Slots per link direction: messages a sender may have in flight to one peer.
pub(crate) const SLOTS: usize = 4;

/// The peers of `peers` that have no link in `links` yet (this rank and ranks outside the world
/// left out), in ascending order — the order in which every rank builds its links, so the
/// lowest pair not yet built always has both of its ranks ready to build it.
pub(crate) fn missing_links<L>(me: usize, peers: &[usize], links: &[Option<L>]) -> Vec<usize> {
    let mut missing: Vec<usize> =
        peers.iter().copied().filter(|&p| p != me && links.get(p).is_some_and(Option::is_none)).collect();
    missing.sort_unstable();
    missing.dedup();
    missing
}

/// A world of `n` ranks seen as a power-of-two core of `p` ranks: the first `2 * rem` ranks
/// pair up (`rem = n - p`), the even rank of each pair folding its data into the odd one and
/// getting the result back at the end; the odd ranks and the ranks from `2 * rem` on form the
/// core. Core index `i` stands for the ranks `first(i)..first(i + 1)` (two ranks for `i < rem`,
/// one otherwise), so core indices cover the ranks in order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fold {
    /// The core's size: the largest power of two at most `n`.
    pub(crate) p: usize,
    /// Ranks outside the core.
    pub(crate) rem: usize,
}

impl Fold {
    /// The fold of `n >= 1` ranks.
    pub(crate) fn new(n: usize) -> Self {
        let p = 1usize << n.max(1).ilog2();
        Fold { p, rem: n.max(1) - p }
    }

    /// The core index of rank `r`, or `None` for a rank that folds into `r + 1`.
    pub(crate) fn core(&self, r: usize) -> Option<usize> {
        if r < 2 * self.rem { (r % 2 == 1).then_some(r / 2) } else { Some(r - self.rem) }
    }

    /// The rank that holds core index `i`.
    pub(crate) fn rank(&self, i: usize) -> usize {
        if i < self.rem { 2 * i + 1 } else { i + self.rem }
    }

    /// The first rank core index `i` stands for (`first(p) = n`).
    pub(crate) fn first(&self, i: usize) -> usize {
        if i < self.rem { 2 * i } else { i + self.rem }
    }

    /// The rank whose data rank `r` holds besides its own (its folded partner), if any.
    pub(crate) fn partner(&self, r: usize) -> Option<usize> {
        (r < 2 * self.rem).then_some(r ^ 1)
    }
}

/// The distances of the steps of Bruck's algorithms in a world of `n`: 1, 2, 4, … below `n`.
pub(crate) fn bruck_distances(n: usize) -> impl Iterator<Item = usize> {
    std::iter::successors(Some(1usize), |d| d.checked_mul(2)).take_while(move |&d| d < n)
}

/// The peers of rank `me` in Bruck's algorithms in a world of `n`: the ranks at every distance
/// on either side.
pub(crate) fn bruck_peers(n: usize, me: usize) -> Vec<usize> {
    let mut peers: Vec<usize> = bruck_distances(n).flat_map(|d| [(me + d) % n, (me + n - d) % n]).collect();
    peers.sort_unstable();
    peers.dedup();
    peers
}

/// The peers of rank `me` in a world of `n` for doubling and halving: its folded partner, if
/// any, and its core partner of every bit.
pub(crate) fn doubling_peers(n: usize, me: usize) -> Vec<usize> {
    let f = Fold::new(n);
    let mut peers: Vec<usize> = f.partner(me).into_iter().collect();
    if let Some(i) = f.core(me) {
        peers.extend((0..f.p.ilog2()).map(|b| f.rank(i ^ (1 << b))));
    }
    peers
}

/// The binomial tree around `me` in a world of `n` with root `root`: its parent (if not the root) and
/// its children in the order the steps reach them.
pub(crate) fn binomial_tree(n: usize, me: usize, root: usize) -> (Option<usize>, Vec<usize>) {
    let v = (me + n - root) % n;
    let abs = |w: usize| (w + root) % n;
    // The parent differs from v in its highest set bit; the children add the bits above it.
    let parent = (v > 0).then(|| abs(v - (1 << v.ilog2())));
    let first: usize = if v == 0 { 1 } else { 2 << v.ilog2() };
    let children = std::iter::successors(Some(first), |m| m.checked_mul(2))
        .take_while(|&m| m < n && v + m < n)
        .map(|m| abs(v + m))
        .collect();
    (parent, children)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fold_covers_every_rank_once_in_order() {
        for n in 1..70 {
            let f = Fold::new(n);
            assert!(f.p.is_power_of_two() && f.p <= n && n < 2 * f.p, "{n}");
            assert_eq!(f.first(0), 0);
            assert_eq!(f.first(f.p), n);
            for i in 0..f.p {
                let r = f.rank(i);
                assert_eq!(f.core(r), Some(i), "{n} {i}");
                assert!((f.first(i)..f.first(i + 1)).contains(&r), "{n} {i}");
                for q in f.first(i)..f.first(i + 1) {
                    assert!(q == r || (f.core(q).is_none() && f.partner(q) == Some(r)), "{n} {q}");
                }
            }
        }
    }

    #[test]
    fn the_steps_gather_every_block_once() {
        for n in 1..70 {
            let mut held = 1;
            for d in bruck_distances(n) {
                assert!(d.min(n - d) <= held);
                held += d.min(n - d);
            }
            assert_eq!(held, n);
            assert_eq!(bruck_distances(n).count(), n.next_power_of_two().ilog2() as usize);
        }
    }

    #[test]
    fn every_rank_but_the_root_has_one_parent_and_the_tree_is_shallow() {
        for n in 1..40 {
            for root in [0, n / 2, n - 1] {
                let parents: Vec<Option<usize>> = (0..n).map(|me| binomial_tree(n, me, root).0).collect();
                for me in 0..n {
                    for c in binomial_tree(n, me, root).1 {
                        assert_eq!(parents[c], Some(me), "{n} {root} {me} -> {c}");
                    }
                }
                assert_eq!(parents[root], None);
                let depth = |mut r: usize| {
                    let mut d = 0;
                    while let Some(p) = parents[r] {
                        r = p;
                        d += 1;
                    }
                    d
                };
                let levels = n.next_power_of_two().ilog2() as usize;
                assert!((0..n).all(|r| r == root || parents[r].is_some()));
                assert!((0..n).all(|r| depth(r) <= levels), "{n} {root}");
            }
        }
    }
}
