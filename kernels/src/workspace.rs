//! The byte layout of one rank's workspace for the direct kernels (`cuda/collectives.cu`): four
//! areas, each its own allocation made when a kernel first needs it — the control area (flags,
//! counters, LL16 packets, point-to-point mailboxes), the flag-based kernels' data slots, the
//! block-pipelined kernels' flags and slots, and the LL128 lines — with every offset inside an
//! area computed alike by every peer.

use crate::program_text::{PIPE_DEPTH, PIPE_FLAGS_BYTES};

/// Bytes of one LL128 line (`weave/packet.cuh`: 16 u64, the last one the flag).
pub const LL128_LINE_BYTES: usize = 128;

/// Payload bytes of one LL128 line.
pub const LL128_PAYLOAD_BYTES: usize = LL128_LINE_BYTES - 8;

/// Threads that move one LL128 line (16 bytes each).
pub const LL128_THREADS_PER_LINE: usize = LL128_LINE_BYTES / 16;

/// One area of a rank's workspace: a device allocation of its own, mapped by every peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkspaceArea {
    /// Flags, epochs and counters, the LL16 packets and the point-to-point mailboxes: what the
    /// packet kernels and point-to-point need (`GpuCollectiveArgs::peers`).
    Control,
    /// The flag-based kernels' data slots (reduce, all-to-all-v; `GpuCollectiveArgs::slots`).
    Slots,
    /// The block-pipelined kernels' flags and slots (`GpuCollectiveArgs::pipes`).
    Pipe,
    /// The LL128 lines (`GpuCollectiveArgs::lines`).
    Lines,
}

impl WorkspaceArea {
    /// Every area, the control area first.
    pub const ALL: [WorkspaceArea; 4] = [Self::Control, Self::Slots, Self::Pipe, Self::Lines];

    /// Position in [`ALL`](Self::ALL).
    pub fn index(self) -> usize {
        self as usize
    }

    /// What the area holds, for logs and errors.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Control => "control area (flags, LL packets, mailboxes)",
            Self::Slots => "data slots of the flag-based kernels",
            Self::Pipe => "pipelined kernels' slots",
            Self::Lines => "LL128 lines",
        }
    }
}

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
    /// Offset of the LL16 packet area in the control area.
    pub const PACKETS_OFFSET: usize = 4096;

    /// Offset of the point-to-point mailboxes in the control area (256-aligned, after the
    /// packets).
    pub fn mailbox_offset(&self) -> usize {
        (Self::PACKETS_OFFSET + self.world * 2 * self.packet_capacity * 16).next_multiple_of(256)
    }

    /// Bytes of the control area: header, packets, mailboxes.
    pub fn control_bytes(&self) -> usize {
        self.mailbox_offset() + self.world * 2 * self.mailbox_bytes
    }

    /// Bytes of the slot area: `[parity][world + 1]` slots of half a chunk.
    pub fn slot_bytes(&self) -> usize {
        2 * (self.world + 1) * (self.chunk_bytes / 2)
    }

    /// Bytes of the pipe area: `PIPE_FLAGS_BYTES` of flags, then
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

    /// Bytes of the line area: `[writer][parity][ll128_lines]` lines of 128 bytes (0 without
    /// NVLink).
    pub fn line_bytes(&self) -> usize {
        self.world * 2 * self.ll128_lines * LL128_LINE_BYTES
    }

    /// Bytes of `area`.
    pub fn area_bytes(&self, area: WorkspaceArea) -> usize {
        match area {
            WorkspaceArea::Control => self.control_bytes(),
            WorkspaceArea::Slots => self.slot_bytes(),
            WorkspaceArea::Pipe => self.pipe_bytes(),
            WorkspaceArea::Lines => self.line_bytes(),
        }
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

    /// Total bytes of the four areas.
    pub fn bytes(&self) -> usize {
        WorkspaceArea::ALL.iter().map(|&a| self.area_bytes(a)).sum()
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
    fn areas_are_sized_apart_and_add_up() {
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
        assert_eq!(l.mailbox_offset() % 256, 0);
        assert_eq!(l.mailbox_offset(), 4096 + 4 * 2 * (1 << 16) * 16);
        assert_eq!(l.control_bytes(), l.mailbox_offset() + 8 * (1 << 20));
        assert_eq!(l.slot_bytes(), 5 * (8 << 20));
        assert_eq!(l.pipe_bytes(), PIPE_FLAGS_BYTES + (128 << 20));
        assert_eq!(l.line_bytes(), 16 << 20);
        assert_eq!(l.bytes(), l.control_bytes() + l.slot_bytes() + l.pipe_bytes() + l.line_bytes());
        for (i, a) in WorkspaceArea::ALL.into_iter().enumerate() {
            assert_eq!(a.index(), i);
        }
        // 16384 lines per (writer, parity): shares of up to 8192 lines of 120 bytes.
        assert_eq!(l.ll128_two_shot_max_bytes(), 8192 * 120 * 4);
        // 1 MiB on 4 GPUs: shares of 256 KiB, 2185 lines of 8 threads.
        assert_eq!(l.ll128_two_shot_threads(1 << 20), 2185 * 8);
        // No line area (no NVLink): no LL128 message fits.
        let unlinked = WorkspaceLayout { ll128_lines: 0, ..l };
        assert_eq!(unlinked.line_bytes(), 0);
        assert_eq!(unlinked.ll128_two_shot_max_bytes(), 0);
        assert_eq!(WorkspaceLayout::pipe_share_for(3, 64, 100_000, 256 << 20) % 256, 0);
        assert_eq!(WorkspaceLayout::pipe_share_for(8, 64, 1 << 10, 256 << 20), 4096);
        assert_eq!(l.ll_max_bytes(), 512 << 10);
    }
}
