//! What the typed device calls check before they launch anything: buffer lengths against the
//! world size, roots and peers (plain functions of lengths, so they are tested without a GPU),
//! then each buffer's CUDA context; and [`Buffers`], which takes the buffers' device addresses
//! on the call's stream with the cudarc guards that order the call against the buffers' other
//! uses.
//!
//! cudarc tracks every buffer's last read and last write with events: `device_ptr(&stream)`
//! makes `stream` wait for the buffer's last write (`device_ptr_mut` also for its last reads),
//! and dropping the returned guard records the work enqueued on `stream` so far into the
//! buffer's read (or write) event. So a guard must live until the kernel is enqueued: then any
//! later use of the buffer, on any stream, waits for the collective. [`Buffers`] keeps every
//! guard until it is dropped, after the launch.

use std::sync::Arc;

use comm_core::{Error, Result};
use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

/// `send` and `recv` hold the same number of elements; returns it.
pub(super) fn equal(call: &str, send: usize, recv: usize) -> Result<usize> {
    if send != recv {
        return Err(Error::invalid(format!(
            "{call}: send has {send} elements but recv has {recv}; they must be equal"
        )));
    }
    Ok(send)
}

/// The buffer `long` holds `world` blocks of the buffer `short` (all-gather: recv and send;
/// reduce-scatter: send and recv); returns the block length.
pub(super) fn world_blocks(call: &str, long: (&str, usize), short: (&str, usize), world: usize) -> Result<usize> {
    if short.1.checked_mul(world) != Some(long.1) {
        return Err(Error::invalid(format!(
            "{call}: {} has {} elements but must hold world_size ({world}) × {} ({} elements) = {}",
            long.0,
            long.1,
            short.0,
            short.1,
            short.1.saturating_mul(world)
        )));
    }
    Ok(short.1)
}

/// A buffer of `len` elements split into `world` equal blocks, one per rank (the in-place
/// all-gather, reduce-scatter and all-to-all); returns the block length.
pub(super) fn split(call: &str, len: usize, world: usize) -> Result<usize> {
    if world == 0 || !len.is_multiple_of(world) {
        return Err(Error::invalid(format!(
            "{call}: the buffer has {len} elements, which do not split into world_size ({world}) equal blocks"
        )));
    }
    Ok(len / world)
}

/// `root` is a rank of the communicator.
pub(super) fn root(call: &str, root: usize, world: usize) -> Result<()> {
    if root >= world {
        return Err(Error::invalid(format!("{call}: root {root} is not a rank of this {world}-rank communicator")));
    }
    Ok(())
}

/// `peer` is another rank (`what`: "send to" or "receive from").
pub(super) fn peer(call: &str, what: &str, peer: usize, me: usize, world: usize) -> Result<()> {
    if peer >= world || peer == me {
        return Err(Error::invalid(format!(
            "{call}: cannot {what} rank {peer}: rank {me} of {world} can only {what} another rank"
        )));
    }
    Ok(())
}

/// One side of an all-to-all-v: the buffer's length, and per rank a count and a displacement
/// (elements).
pub(super) struct Side<'a> {
    /// "send" or "recv".
    pub(super) name: &'static str,
    /// Elements of the buffer.
    pub(super) len: usize,
    /// Elements to or from each rank.
    pub(super) counts: &'a [usize],
    /// Where each rank's block starts (elements).
    pub(super) displs: &'a [usize],
}

/// Checks an all-to-all-v's counts and displacements (one per rank, every block inside its
/// buffer, receive blocks disjoint) and returns them as the device table the kernel reads —
/// `[send_counts, send_displs, recv_counts, recv_displs]`, `world` u64 each — with the longest
/// block in elements.
pub(super) fn all_to_allv_table(call: &str, send: Side<'_>, recv: Side<'_>, world: usize) -> Result<(Vec<u64>, usize)> {
    let mut table = Vec::with_capacity(4 * world);
    let mut longest = 0;
    for side in [&send, &recv] {
        if side.counts.len() != world || side.displs.len() != world {
            return Err(Error::invalid(format!(
                "{call}: {} counts ({}) and displacements ({}) need one entry per rank ({world})",
                side.name,
                side.counts.len(),
                side.displs.len()
            )));
        }
        for (rank, (&count, &at)) in side.counts.iter().zip(side.displs).enumerate() {
            if at.checked_add(count).is_none_or(|end| end > side.len) {
                return Err(Error::invalid(format!(
                    "{call}: the {} block of rank {rank} ({count} elements at {at}) runs past the {}-element buffer",
                    side.name, side.len
                )));
            }
            longest = longest.max(count);
        }
        table.extend(side.counts.iter().chain(side.displs).map(|&v| v as u64));
    }
    // Receive blocks must not overlap: sorted by start, each ends before the next begins.
    let mut blocks: Vec<(usize, usize)> =
        (0..world).filter(|&p| recv.counts[p] > 0).map(|p| (recv.displs[p], p)).collect();
    blocks.sort_unstable();
    for pair in blocks.windows(2) {
        let ((at, p), (next_at, q)) = (pair[0], pair[1]);
        if at + recv.counts[p] > next_at {
            return Err(Error::invalid(format!("{call}: the recv blocks of ranks {p} and {q} overlap")));
        }
    }
    Ok((table, longest))
}

/// The device addresses of one typed call, taken on the call's stream, with the guards that
/// record the call into each buffer's cudarc events: they drop with this value, which the
/// caller drops after enqueueing the kernel.
pub(super) struct Buffers<'a> {
    call: &'static str,
    ctx: Arc<CudaContext>,
    stream: &'a Arc<CudaStream>,
    guards: Vec<SyncOnDrop<'a>>,
}

impl<'a> Buffers<'a> {
    /// Buffers of `call` on `stream`, which must belong to `ctx` (the communicator's GPU).
    pub(super) fn new(call: &'static str, ctx: Arc<CudaContext>, stream: &'a Arc<CudaStream>) -> Result<Self> {
        let buffers = Buffers { call, ctx, stream, guards: Vec::with_capacity(2) };
        buffers.on_this_gpu("the stream", stream)?;
        Ok(buffers)
    }

    /// The address of `buf`, which the call reads (`what` names it in errors).
    pub(super) fn read<T, B: DevicePtr<T> + ?Sized>(&mut self, what: &str, buf: &'a B) -> Result<u64> {
        self.on_this_gpu(what, buf.stream())?;
        let (address, guard) = buf.device_ptr(self.stream);
        self.guards.push(guard);
        Ok(address)
    }

    /// The address of `buf`, which the call writes (and may read).
    pub(super) fn write<T, B: DevicePtrMut<T> + ?Sized>(&mut self, what: &str, buf: &'a mut B) -> Result<u64> {
        self.on_this_gpu(what, buf.stream())?;
        let (address, guard) = buf.device_ptr_mut(self.stream);
        self.guards.push(guard);
        Ok(address)
    }

    /// Errors unless `stream` (a buffer's, or the call's) belongs to the communicator's context:
    /// a kernel given another GPU's address would fault.
    fn on_this_gpu(&self, what: &str, stream: &Arc<CudaStream>) -> Result<()> {
        let theirs = stream.context();
        if **theirs != *self.ctx {
            return Err(Error::invalid(format!(
                "{}: {what} belongs to a CUDA context of GPU {}, not to this communicator's (GPU {}); allocate \
                 buffers and streams from comm.gpu_context()",
                self.call,
                theirs.ordinal(),
                self.ctx.ordinal()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(r: Result<impl std::fmt::Debug>) -> String {
        match r {
            Err(Error::InvalidArgument(m)) => m,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn equal_lengths() {
        assert_eq!(equal("all_reduce_device", 7, 7).unwrap(), 7);
        let m = message(equal("all_reduce_device", 7, 6));
        assert!(m.contains("all_reduce_device") && m.contains("send has 7") && m.contains("recv has 6"), "{m}");
    }

    #[test]
    fn blocks_of_the_world() {
        assert_eq!(world_blocks("all_gather_device", ("recv", 12), ("send", 3), 4).unwrap(), 3);
        assert_eq!(world_blocks("all_gather_device", ("recv", 0), ("send", 0), 4).unwrap(), 0);
        let m = message(world_blocks("reduce_scatter_device", ("send", 11), ("recv", 3), 4));
        assert!(m.contains("send has 11") && m.contains("world_size (4) × recv (3 elements) = 12"), "{m}");
        // A length whose product with the world overflows is an error, not a panic.
        assert!(world_blocks("all_gather_device", ("recv", 8), ("send", usize::MAX), 2).is_err());
    }

    #[test]
    fn split_into_blocks() {
        assert_eq!(split("all_to_all_device_in_place", 12, 3).unwrap(), 4);
        assert_eq!(split("all_to_all_device_in_place", 0, 3).unwrap(), 0);
        let m = message(split("all_gather_device_in_place", 10, 4));
        assert!(m.contains("10 elements") && m.contains("world_size (4)"), "{m}");
        assert!(split("x", 4, 0).is_err());
    }

    #[test]
    fn roots_and_peers() {
        assert!(root("broadcast_device", 1, 2).is_ok());
        assert!(message(root("broadcast_device", 2, 2)).contains("root 2 is not a rank of this 2-rank"));
        assert!(peer("send_device", "send to", 1, 0, 2).is_ok());
        assert!(message(peer("send_device", "send to", 0, 0, 2)).contains("cannot send to rank 0"));
        assert!(message(peer("recv_device", "receive from", 5, 0, 2)).contains("cannot receive from rank 5"));
    }

    fn side<'a>(name: &'static str, len: usize, counts: &'a [usize], displs: &'a [usize]) -> Side<'a> {
        Side { name, len, counts, displs }
    }

    #[test]
    fn all_to_allv_layout() {
        let (table, longest) =
            all_to_allv_table("v", side("send", 5, &[2, 3], &[0, 2]), side("recv", 6, &[1, 4], &[5, 0]), 2).unwrap();
        assert_eq!(table, [2, 3, 0, 2, 1, 4, 5, 0]);
        assert_eq!(longest, 4);
        // One entry per rank.
        let m = message(all_to_allv_table("v", side("send", 5, &[2], &[0]), side("recv", 6, &[1, 4], &[5, 0]), 2));
        assert!(m.contains("send counts (1) and displacements (1) need one entry per rank (2)"), "{m}");
        // A block past the end, and one whose end overflows.
        let m =
            message(all_to_allv_table("v", side("send", 5, &[2, 4], &[0, 2]), side("recv", 6, &[1, 4], &[5, 0]), 2));
        assert!(m.contains("send block of rank 1 (4 elements at 2) runs past the 5-element buffer"), "{m}");
        assert!(
            all_to_allv_table("v", side("send", 5, &[2, 1], &[0, usize::MAX]), side("recv", 6, &[1, 4], &[5, 0]), 2)
                .is_err()
        );
        // Overlapping receive blocks; empty blocks overlap nothing.
        let m =
            message(all_to_allv_table("v", side("send", 5, &[2, 3], &[0, 2]), side("recv", 6, &[2, 4], &[1, 0]), 2));
        assert!(m.contains("recv blocks of ranks 1 and 0 overlap"), "{m}");
        assert!(
            all_to_allv_table("v", side("send", 5, &[2, 3], &[0, 2]), side("recv", 6, &[0, 4], &[1, 0]), 2).is_ok()
        );
        // Send blocks may overlap (the same data to several ranks).
        assert!(
            all_to_allv_table("v", side("send", 3, &[3, 3], &[0, 0]), side("recv", 6, &[1, 4], &[5, 0]), 2).is_ok()
        );
    }
}
