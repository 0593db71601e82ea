//! The building block of the logarithmic algorithms (recursive doubling and halving, Bruck,
//! binomial trees): one step in which this rank sends one contiguous block to one peer and
//! receives one block from one peer (the same or another, either side absent), message by
//! message in lockstep — post message `c`, then take message `c` — so a rank runs at most one
//! message ahead of the peer it waits for and no credit wait can close a cycle, whatever the
//! pattern of the step. Every rank computes the lengths of both blocks from the same formulas,
//! so sender and receiver agree on the number of messages.
//!
//! Also [`Fold`]: how a world of any size maps onto the largest power of two inside it.

use comm_core::Result;

use super::{Call, ChannelEngine, piece, pieces};
use crate::dtype::Element;

/// One step: `out` = (peer, first element, elements) to send, `inc` = (peer, elements) to
/// receive; `take(offset, message, elements)` consumes each received message (at element
/// `offset` of the incoming block) before its slot is freed.
///
/// Message `c` is sent before message `c` is taken, so `take` may overwrite the part of the
/// outgoing block that message `c` covers (recursive doubling reduces into the buffer it sends).
///
/// # Safety
/// `out`'s pointer is valid for its elements (reads) for the whole step, except for ranges
/// `take` has already overwritten; `take` writes only where its caller made room.
pub(super) unsafe fn swap<T: Element>(
    e: &mut ChannelEngine,
    call: &mut Call,
    out: Option<(usize, *const T, usize)>,
    inc: Option<(usize, usize)>,
    mut take: impl FnMut(usize, *const T, usize),
) -> Result<()> {
    let chunk = e.chunk::<T>();
    let sz = std::mem::size_of::<T>();
    let messages = out.map_or(0, |(_, _, len)| pieces(len, chunk)).max(inc.map_or(0, |(_, len)| pieces(len, chunk)));
    for c in 0..messages {
        if let Some((to, src, len)) = out
            && let Some((a, k)) = piece(c, len, chunk)
        {
            // SAFETY: a + k <= len, inside the block (caller); k fits one message.
            unsafe { e.send_bytes(call, to, src.add(a).cast(), k * sz)? };
        }
        if let Some((from, len)) = inc
            && let Some((a, k)) = piece(c, len, chunk)
        {
            let inbox = e.receive(call, from, k * sz)?.cast::<T>();
            take(a, inbox, k);
            e.release(from)?;
        }
    }
    Ok(())
}

/// A world of `n` ranks seen as a power-of-two core of `p` ranks: the first `2 * rem` ranks
/// pair up (`rem = n - p`), the even rank of each pair folding its data into the odd one and
/// getting the result back at the end; the odd ranks and the ranks from `2 * rem` on form the
/// core. Core index `i` stands for the ranks `first(i)..first(i + 1)` (two ranks for `i < rem`,
/// one otherwise), so core indices cover the ranks in order.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fold {
    /// The core's size: the largest power of two at most `n`.
    pub(super) p: usize,
    /// Ranks outside the core.
    pub(super) rem: usize,
}

impl Fold {
    /// The fold of `n >= 1` ranks.
    pub(super) fn new(n: usize) -> Self {
        let p = 1usize << n.max(1).ilog2();
        Fold { p, rem: n.max(1) - p }
    }

    /// The core index of rank `r`, or `None` for a rank that folds into `r + 1`.
    pub(super) fn core(&self, r: usize) -> Option<usize> {
        if r < 2 * self.rem { (r % 2 == 1).then_some(r / 2) } else { Some(r - self.rem) }
    }

    /// The rank that holds core index `i`.
    pub(super) fn rank(&self, i: usize) -> usize {
        if i < self.rem { 2 * i + 1 } else { i + self.rem }
    }

    /// The first rank core index `i` stands for (`first(p) = n`).
    pub(super) fn first(&self, i: usize) -> usize {
        if i < self.rem { 2 * i } else { i + self.rem }
    }

    /// The rank whose data rank `r` holds besides its own (its folded partner), if any.
    pub(super) fn partner(&self, r: usize) -> Option<usize> {
        (r < 2 * self.rem).then_some(r ^ 1)
    }
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
}
