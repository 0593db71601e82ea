//! The building block of the logarithmic algorithms (recursive doubling and halving, Bruck,
//! binomial trees): one step in which this rank sends one contiguous block to one peer and
//! receives one block from one peer (the same or another, either side absent), message by
//! message in lockstep — post message `c`, then take message `c` — so a rank runs at most one
//! message ahead of the peer it waits for and no credit wait can close a cycle, whatever the
//! pattern of the step. Every rank computes the lengths of both blocks from the same formulas,
//! so sender and receiver agree on the number of messages.

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
