//! The byte layout of one rank's workspace for the direct kernels (`cuda/collectives.cu`): the
//! LL16 packets, the data slots, the point-to-point mailboxes, the block-pipelined kernels'
//! flags and slots, and the LL128 lines, each at an offset every peer computes alike.

use crate::program_text::{PIPE_DEPTH, PIPE_FLAGS_BYTES};

/// Bytes of one LL128 line (`weave/packet.cuh`: 16 u64, the last one the flag).
pub const LL128_LINE_BYTES: usize = 128;

/// Payload bytes of one LL128 line.
pub const LL128_PAYLOAD_BYTES: usize = LL128_LINE_BYTES - 8;

/// Threads that move one LL128 line (16 bytes each).
pub const LL128_THREADS_PER_LINE: usize = LL128_LINE_BYTES / 16;

/// Byte layout of one rank's GPU workspace (see `collectives.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceLayout {
    /// Ranks.
    pub world: usize,
    /// LL16 packets per (writer, parity).
    pub packet_capacity: usize,
    /// Bytes of one data slot pair.
    pub chunk_bytes: usize,
    /// Bytes of one point-to-point mailbox slot (header included).
    pub mailbox_bytes: usize,
    /// Most blocks of a block-pipelined kernel (the slots are sized for this many).
    pub pipe_blocks: usize,
    /// Bytes of one slot of the block-pipelined kernels (a multiple of 256).
    pub pipe_share_bytes: usize,
    /// LL128 lines (128 bytes) per (writer, parity); 0 (no line area) unless every pair of
    /// GPUs is joined by NVLink.
    pub ll128_lines: usize,
}

impl WorkspaceLayout {
    /// Offset of the LL16 packet area.
    pub const PACKETS_OFFSET: usize = 4096;

    /// Offset of the data slots (256-aligned, after the packets).
    pub fn data_offset(&self) -> usize {
        (Self::PACKETS_OFFSET + self.world * 2 * self.packet_capacity * 16).next_multiple_of(256)
    }

    /// Offset of the point-to-point mailboxes (after the data slots).
    pub fn mailbox_offset(&self) -> usize {
        self.data_offset() + 2 * (self.world + 1) * (self.chunk_bytes / 2)
    }

    /// Offset of the block-pipelined kernels' area (flags, then slots), after the mailboxes.
    pub fn pipe_offset(&self) -> usize {
        (self.mailbox_offset() + self.world * 2 * self.mailbox_bytes).next_multiple_of(256)
    }

    /// Bytes of the pipelined kernels' area: `PIPE_FLAGS_BYTES` of flags, then
    /// `[block][depth][inbox, results][writer]` slots.
    pub fn pipe_bytes(&self) -> usize {
        PIPE_FLAGS_BYTES + self.pipe_blocks * PIPE_DEPTH * 2 * self.world * self.pipe_share_bytes
    }

    /// The pipelined slot size for `blocks` blocks of `world` ranks: `tile`, made smaller
    /// where the area would pass `max_area` bytes (a multiple of 256, at least 4 KiB).
    pub fn pipe_share_for(world: usize, blocks: usize, tile: usize, max_area: usize) -> usize {
        let fits = max_area / (blocks.max(1) * PIPE_DEPTH * 2 * world.max(1));
        (tile.min(fits) / 256 * 256).max(4096)
    }

    /// Offset of the LL128 line area (`[writer][parity][ll128_lines]` lines of 128 bytes),
    /// after the pipelined kernels' area.
    pub fn ll128_offset(&self) -> usize {
        (self.pipe_offset() + self.pipe_bytes()).next_multiple_of(256)
    }

    /// LL128 lines per (writer, parity) for `world` ranks in an area of `area` bytes.
    pub fn ll128_lines_for(world: usize, area: usize) -> usize {
        area / (world.max(1) * 2 * LL128_LINE_BYTES)
    }

    /// Largest all-reduce (bytes) the LL128 two-shot kernel takes: every share (a world-th of
    /// the message, in 8-byte words) fits half a line area.
    pub fn ll128_two_shot_max_bytes(&self) -> usize {
        self.ll128_lines / 2 * LL128_PAYLOAD_BYTES * self.world
    }

    /// Threads the LL128 two-shot all-reduce of `bytes` bytes keeps busy: one line group per
    /// line of a share.
    pub fn ll128_two_shot_threads(&self, bytes: usize) -> usize {
        bytes.div_ceil(self.world.max(1)).div_ceil(LL128_PAYLOAD_BYTES) * LL128_THREADS_PER_LINE
    }

    /// Total bytes.
    pub fn bytes(&self) -> usize {
        self.ll128_offset() + self.world * 2 * self.ll128_lines * LL128_LINE_BYTES
    }

    /// Largest message (bytes) the LL one-shot kernel takes.
    pub fn ll_max_bytes(&self) -> usize {
        self.packet_capacity * 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_follow_each_other_aligned_and_sizes_add_up() {
        let share = WorkspaceLayout::pipe_share_for(4, 64, 64 << 10, 256 << 20);
        assert_eq!(share, 64 << 10);
        assert_eq!(WorkspaceLayout::pipe_share_for(8, 64, 1 << 20, 256 << 20), 64 << 10);
        let l = WorkspaceLayout {
            world: 4,
            packet_capacity: 1 << 16,
            chunk_bytes: 8 << 20,
            mailbox_bytes: 1 << 20,
            pipe_blocks: 64,
            pipe_share_bytes: share,
            ll128_lines: WorkspaceLayout::ll128_lines_for(4, 16 << 20),
        };
        assert_eq!(l.data_offset() % 256, 0);
        assert_eq!(l.mailbox_offset(), l.data_offset() + 5 * (8 << 20));
        assert_eq!(l.pipe_offset(), l.mailbox_offset() + 8 * (1 << 20));
        assert_eq!(l.ll128_offset(), l.pipe_offset() + PIPE_FLAGS_BYTES + (128 << 20));
        assert_eq!(l.ll128_offset() % 256, 0);
        assert_eq!(l.bytes(), l.ll128_offset() + (16 << 20));
        // 16384 lines per (writer, parity): shares of up to 8192 lines of 120 bytes.
        assert_eq!(l.ll128_two_shot_max_bytes(), 8192 * 120 * 4);
        // 1 MiB on 4 GPUs: shares of 256 KiB, 2185 lines of 8 threads.
        assert_eq!(l.ll128_two_shot_threads(1 << 20), 2185 * 8);
        // No line area (no NVLink): the workspace ends where it would start, no LL128 message fits.
        let unlinked = WorkspaceLayout { ll128_lines: 0, ..l };
        assert_eq!(unlinked.bytes(), unlinked.ll128_offset());
        assert_eq!(unlinked.ll128_two_shot_max_bytes(), 0);
        assert_eq!(WorkspaceLayout::pipe_share_for(3, 64, 100_000, 256 << 20) % 256, 0);
        assert_eq!(WorkspaceLayout::pipe_share_for(8, 64, 1 << 10, 256 << 20), 4096);
        assert_eq!(l.ll_max_bytes(), 512 << 10);
    }
}
