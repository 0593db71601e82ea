//! Eager broadcast and reduce: the ranks that send — the root of a broadcast, every other rank
//! of a reduce — post their data into per-peer slots and return without waiting for anyone,
//! as long as the slots have room; receivers find the data already there. A sender runs up to
//! its eager links' slot count of messages ahead of each receiver, and no rank ever waits for a
//! rank that is ahead of it, so back-to-back calls overlap instead of synchronizing: what small
//! broadcasts and reduces want, where one synchronizing step costs more than the data.
//!
//! The host table runs broadcasts and reduces of up to one message (4 KiB) this way in worlds
//! of up to 8 ranks, where every peer is mapped and across nodes alike; over shared memory a
//! message of up to 32 bytes is one cache line for the receiver (see [`super::link`]).
//!
//! The eager links are a set of their own (many slots of [`EAGER_PAYLOAD_BYTES`]), built on
//! first use: the root links to every rank, every other rank to the root. Larger calls (when
//! `WEAVE_ALGO` forces this algorithm) go as a stream of slot-sized messages.
//!
//! **Agreement.** Every sender marks its last message of a call to a receiver, and receivers
//! take messages until they see that mark, so a mismatched call (count, type, operator,
//! invalid arguments) fails on the receivers with [`Error::InvalidArgument`] and still leaves
//! every link in step. The senders hear of nothing: they returned already, as an MPI eager send
//! does. A root that differs between ranks pairs the wrong ranks: a receiver waiting for a
//! rank that does not send ends in a timeout naming it, and messages nobody took fail the
//! next call that meets them with a protocol error. Counts so different that one rank's call
//! runs eagerly and another's does not (across 4 KiB) end in a timeout, as in the other
//! channel algorithms when ranks exchange different numbers of messages.

use comm_core::{Error, Result};

use super::link::Link;
use super::{Call, ChannelEngine, EAGER_PAYLOAD_BYTES, Run, piece, pieces, stage_and_post};
use crate::call::CollectiveCall;
use crate::copy::copy;
use crate::dtype::Element;
use crate::per_rank::PerRank;
use crate::reduce::reduce_raw;

/// Ranks whose per-rank state the eager reduce keeps on the stack: the table runs it in worlds
/// of up to 8 ranks (larger ones, when forced, allocate).
const EAGER_STACK: usize = 8;

/// The ranks whose last message of a call the root of a reduce has taken (and the root
/// itself): bits in worlds of up to 64 ranks, so that a call clears no array; a vector beyond.
struct Finished {
    bits: u64,
    many: Vec<bool>,
}

impl Finished {
    /// Only `me` of `n` ranks.
    #[inline(always)]
    fn new(n: usize, me: usize) -> Self {
        if n <= 64 {
            return Finished { bits: 1 << me, many: Vec::new() };
        }
        let mut many = vec![false; n];
        many[me] = true;
        Finished { bits: 0, many }
    }

    /// Whether `p` is in the set.
    #[inline(always)]
    fn has(&self, p: usize) -> bool {
        if self.many.is_empty() { self.bits >> p & 1 != 0 } else { self.many[p] }
    }

    /// Puts `p` in the set.
    #[inline(always)]
    fn add(&mut self, p: usize) {
        if self.many.is_empty() {
            self.bits |= 1 << p;
        } else {
            self.many[p] = true;
        }
    }
}

/// Runs a broadcast or reduce eagerly. Safety: as [`ChannelEngine::run`].
#[inline]
pub(super) unsafe fn run<T: Element>(Run { e, core, spec, c }: Run<'_, T>) -> Result<()> {
    let (n, me) = (e.world_size, e.rank);
    let (send, recv, root, op) = match c {
        CollectiveCall::Broadcast { send, recv, root, .. } => (send, recv, root, None),
        CollectiveCall::Reduce { send, recv, root, op, .. } => (send, recv, root, Some(op)),
        other => {
            return Err(Error::invalid(format!(
                "{} runs broadcast and reduce only, not {}",
                spec.algorithm,
                other.collective().0
            )));
        }
    };
    if root >= n {
        return Err(Error::invalid(format!("{}: root {root} is not a rank of this {n}-rank world", spec.collective)));
    }
    // An invalid rank announces count 0 and sends one empty message.
    let count = spec.count;
    if me == root {
        e.eager.connect_to_all(core, me)?;
    } else {
        e.eager.connect(core, me, &[root])?;
    }
    let mut call = e.next_call(spec);
    if n == 1 {
        if !spec.invalid {
            // SAFETY: both buffers hold count elements (caller); identical or disjoint.
            unsafe { copy(send, recv, count) };
        }
        return call.finish();
    }
    // SAFETY: (every arm) forwarded from the caller: the buffers hold `count` elements where
    // the collective reads or writes them.
    unsafe {
        match (op, me == root) {
            (None, true) => {
                if !spec.invalid {
                    copy(send, recv, count);
                }
                post_to_all(e, &call, send, count)?;
                call.finish()
            }
            (None, false) => {
                let link = e.eager.get(root)?;
                take_all(link, &mut call, me, count, n == 2, |piece, (at, k)| copy(piece, recv.add(at), k))?;
                call.finish()
            }
            (Some(_), false) => {
                post_all(e.eager.get(root)?, &call, send, count)?;
                call.finish()
            }
            (Some(op), true) => {
                reduce_at_root(e, &mut call, send, recv, count, op)?;
                call.finish()
            }
        }
    }
}

/// Elements of `T` one eager message carries.
fn chunk<T>() -> usize {
    EAGER_PAYLOAD_BYTES / std::mem::size_of::<T>()
}

/// Posts `count` elements at `src` to every peer, message by message (each peer gets message
/// `c` before any gets message `c + 1`, so receivers progress together).
///
/// # Safety
/// `src` valid for `count` reads.
#[inline(always)]
unsafe fn post_to_all<T: Element>(e: &mut ChannelEngine, call: &Call, src: *const T, count: usize) -> Result<()> {
    let (n, me, chunk) = (e.world_size, e.rank, chunk::<T>());
    let total = pieces(count, chunk);
    for c in 0..total {
        let (a, k) = piece(c, count, chunk).unwrap_or((0, 0));
        for q in (0..n).filter(|&q| q != me) {
            let link = e.eager.get(q)?;
            // SAFETY: piece c lies inside the `count` elements at src (caller).
            unsafe { stage_and_post(link, call, src.add(a).cast(), k * std::mem::size_of::<T>(), c + 1 == total)? };
        }
    }
    Ok(())
}

/// Posts `count` elements at `src` over `link`.
///
/// # Safety
/// `src` valid for `count` reads.
#[inline(always)]
unsafe fn post_all<T: Element>(link: &mut Link, call: &Call, src: *const T, count: usize) -> Result<()> {
    let chunk = chunk::<T>();
    let total = pieces(count, chunk);
    for c in 0..total {
        let (a, k) = piece(c, count, chunk).unwrap_or((0, 0));
        // SAFETY: piece c lies inside the `count` elements at src (caller).
        unsafe { stage_and_post(link, call, src.add(a).cast(), k * std::mem::size_of::<T>(), c + 1 == total)? };
    }
    Ok(())
}

/// Takes the peer's messages of this call over `link` until its last one, giving each piece
/// of `count` elements to `use_piece` (its payload, and its first element and length) while
/// the call has no mismatch. `pair`: the world is this rank and the peer, whose receiver
/// pauses when it has caught up (see [`Link::receive_paced`]).
#[inline(always)]
fn take_all<T: Element>(
    link: &mut Link,
    call: &mut Call,
    me: usize,
    count: usize,
    pair: bool,
    mut use_piece: impl FnMut(*const T, (usize, usize)),
) -> Result<()> {
    let peer = link.peer();
    let mut c = 0;
    loop {
        let (header, payload) = link.receive_paced(call.what, pair)?;
        call.check(peer, &header, me)?;
        if call.problem.is_none() {
            let part = expect_piece::<T>(call, peer, me, c, count, header.len, header.last)?;
            use_piece(payload.cast(), part);
        } else {
            check_drain(call, peer, c, header.count)?;
        }
        link.release()?;
        if header.last {
            return Ok(());
        }
        c += 1;
    }
}

/// Checks that message `c` of a matching call has the length and last mark that piece `c` of
/// `count` elements has; returns the piece.
#[inline(always)]
fn expect_piece<T>(
    call: &Call,
    peer: usize,
    me: usize,
    c: usize,
    count: usize,
    len: u64,
    last: bool,
) -> Result<(usize, usize)> {
    let chunk = chunk::<T>();
    let total = pieces(count, chunk);
    let (a, k) = piece(c, count, chunk).unwrap_or((0, 0));
    if c >= total || len != (k * std::mem::size_of::<T>()) as u64 || last != (c + 1 == total) {
        return Err(unexpected_piece(call.what, peer, me, (c, total), len, last));
    }
    Ok((a, k))
}

/// The error of message `c` (of `total` due) whose length or last mark is not its piece's,
/// kept off the path of every message.
#[cold]
#[inline(never)]
fn unexpected_piece(what: &str, peer: usize, me: usize, (c, total): (usize, usize), len: u64, last: bool) -> Error {
    Error::protocol(format!(
        "{what}: message {c} of rank {peer} has {len} bytes{} where rank {me} expects piece {c} of {total}",
        if last { " and ends the call" } else { "" }
    ))
}

/// While draining a mismatched call: message `c` of `peer`, whose header announced `count`
/// elements, is a protocol error once past the most messages such a count takes (at 8 bytes an
/// element, the largest type) — a stream that long is a broken peer, not a long drain.
fn check_drain(call: &Call, peer: usize, c: usize, count: u64) -> Result<()> {
    let bound = usize::try_from(count.saturating_mul(8)).unwrap_or(usize::MAX).div_ceil(EAGER_PAYLOAD_BYTES);
    if c > bound {
        return Err(Error::protocol(format!(
            "{}: rank {peer} sent more messages than its count of {count} elements needs",
            call.what
        )));
    }
    Ok(())
}

/// The root of a reduce: message `c` from every peer, combined with this rank's piece `c` in
/// rank order into `recv`, until every peer's last message.
///
/// # Safety
/// `send` valid for `count` reads and `recv` for `count` writes (identical or disjoint).
#[inline(always)]
unsafe fn reduce_at_root<T: Element>(
    e: &mut ChannelEngine,
    call: &mut Call,
    send: *const T,
    recv: *mut T,
    count: usize,
    op: crate::op::ReduceOp,
) -> Result<()> {
    let (n, me) = (e.world_size, e.rank);
    // The payload each peer sent for the current piece, null where none is held.
    let mut held = PerRank::<_, EAGER_STACK>::filled(n, std::ptr::null::<T>());
    let held = held.as_mut_slice();
    let mut finished = Finished::new(n, me);
    let mut open = n - 1;
    let mut c = 0;
    while open > 0 {
        let mut part = None;
        for (p, slot) in held.iter_mut().enumerate() {
            if finished.has(p) {
                continue;
            }
            let link = e.eager.get(p)?;
            // A pair's root pauses when it has caught up (see `Link::receive_paced`).
            let (header, payload) = link.receive_paced(call.what, n == 2)?;
            call.check(p, &header, me)?;
            if header.last {
                finished.add(p);
                open -= 1;
            }
            if call.problem.is_none() {
                part = Some(expect_piece::<T>(call, p, me, c, count, header.len, header.last)?);
                *slot = payload.cast();
            } else {
                link.release()?;
                check_drain(call, p, c, header.count)?;
            }
        }
        if let (None, Some((a, k))) = (&call.problem, part) {
            // SAFETY: this rank's piece of its input (caller).
            held[me] = unsafe { send.add(a) };
            // SAFETY: every held payload holds k elements (its length was checked), the input
            // too; recv + a is valid for k writes and may alias the input exactly.
            unsafe { reduce_raw(op, n, recv.add(a), held, k) };
        }
        for (p, payload) in held.iter_mut().enumerate() {
            if p != me && !payload.is_null() {
                e.eager.get(p)?.release()?;
                *payload = std::ptr::null();
            }
        }
        c += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Finished;

    #[test]
    fn finished_sets_hold_exactly_the_ranks_added_in_bits_and_beyond() {
        for (n, me) in [(2, 1), (64, 63), (65, 0), (200, 130)] {
            let mut f = Finished::new(n, me);
            let added = [0, n / 2, n - 1];
            for &p in &added {
                f.add(p);
            }
            for p in 0..n {
                assert_eq!(f.has(p), p == me || added.contains(&p), "{n} ranks, rank {p}");
            }
        }
    }
}
