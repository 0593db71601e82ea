//! Device staging of hierarchical device calls (`hierarchy/device.rs`): the GPU memory that the
//! steps which reorder blocks or hold a node's partial result work in, and the stream-ordered
//! copies that reorder blocks between it and the caller's buffers.
//!
//! The memory is registered privately with the communicator (`register_private`: its own cuMem
//! allocation, mapped by no peer) at the first call that needs it, and grown for the largest call
//! so far. A call only queues work on its stream, so a buffer it used may still be read or
//! written by the GPU (or by a captured CUDA graph replayed later) when a larger call comes:
//! every size is kept until the communicator goes, and the sizes at least double, so all of
//! them take less than twice the largest. Like the direct kernels' workspace, the staging
//! assumes the device calls of one communicator run one after another on the GPU (one stream,
//! or streams the caller orders).
//!
//! The reorderings are copies of equal-sized blocks between a row-major and a column-major
//! grid: one strided (2D) copy per row or column, whichever are fewer, each queued on the
//! caller's stream like a kernel, so nothing waits on the host and a stream capture records
//! them as copy nodes.

use std::sync::Arc;

use comm_core::communicator::Communicator as CoreCommunicator;
use comm_core::memory::{MemoryKind, RegisteredMemory};
use comm_core::{Error, Result};
use cudarc::driver::sys::{self, CUdevice_attribute, CUmemorytype};
use cudarc::driver::{CudaContext, CudaStream};

/// The smallest staging buffer allocated (a cuMem allocation takes a whole granule anyway).
const MIN_STAGING_BYTES: usize = 2 << 20;

/// Where the second of two staging areas starts is rounded up to this many bytes, so both are
/// aligned for every element type and for the kernels' widest loads.
const AREA_ALIGN: usize = 256;

/// The device staging of one communicator's hierarchical calls (see the module doc).
#[derive(Default)]
pub(crate) struct DeviceStaging {
    /// Every buffer allocated so far, the newest (largest) last.
    buffers: Vec<RegisteredMemory>,
    /// The GPU's largest pitch of a strided copy, once asked.
    max_pitch: Option<usize>,
}

impl DeviceStaging {
    /// Device addresses of two staging areas of `a` and `b` bytes (the second aligned, see
    /// [`AREA_ALIGN`]), allocating a larger buffer through `core` on GPU `device` when the newest
    /// is too small. Valid until the communicator goes; see the module doc for reuse.
    pub(crate) fn areas(&mut self, core: &CoreCommunicator, device: u32, a: usize, b: usize) -> Result<(u64, u64)> {
        let overflow = || Error::invalid(format!("a hierarchical device call of {a} + {b} staging bytes is too large"));
        let second = a.checked_next_multiple_of(AREA_ALIGN).ok_or_else(overflow)?;
        let bytes = second.checked_add(b).ok_or_else(overflow)?;
        let fits = self.buffers.last().is_some_and(|m| m.len() >= bytes);
        if !fits {
            let len = bytes.checked_next_power_of_two().unwrap_or(bytes).max(MIN_STAGING_BYTES);
            // Allocating is no stream work: it may happen while the caller's stream captures.
            let _relaxed = weave_cuda::driver::RelaxedCapture::enter()?;
            let memory = core.register_private(len, MemoryKind::Device(device), "weave hierarchical staging")?;
            self.buffers.push(memory);
        }
        let base = self.buffers.last().map(|m| m.as_ptr() as u64).ok_or_else(|| Error::protocol("staging vanished"))?;
        Ok((base, base + second as u64))
    }

    /// Bytes of GPU memory the staging buffers take.
    #[cfg(feature = "cuda")]
    pub(crate) fn memory(&self) -> usize {
        self.buffers.iter().map(crate::gpu::allocated_bytes).sum()
    }

    /// The largest pitch `ctx`'s GPU takes in a strided copy (asked once).
    pub(crate) fn max_pitch(&mut self, ctx: &CudaContext) -> Result<usize> {
        if let Some(p) = self.max_pitch {
            return Ok(p);
        }
        let attr = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_PITCH;
        let pitch = ctx.attribute(attr).map_err(|e| Error::Cuda {
            operation: "ask the GPU's largest copy pitch".into(),
            message: e.to_string(),
        })?;
        let pitch = usize::try_from(pitch).unwrap_or(0);
        self.max_pitch = Some(pitch);
        Ok(pitch)
    }
}

/// A grid of `rows × cols` blocks of `block` bytes each, for [`transpose_blocks`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockGrid {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) block: usize,
}

/// Queues on `stream` the copy of the grid's blocks at device address `src` (row-major: block
/// (r, c) at `(r·cols + c)·block`) to `dst` in column-major order (block (r, c) at
/// `(c·rows + r)·block`), as `min(rows, cols)` strided copies; where a stride exceeds the GPU's
/// `max_pitch`, block by block instead.
///
/// # Safety
/// `src` valid for reads and `dst` for writes of `rows·cols·block` bytes until the copies have
/// run on `stream`, the two disjoint; the stream's context current on this thread.
pub(crate) unsafe fn transpose_blocks(
    src: u64,
    dst: u64,
    grid: BlockGrid,
    max_pitch: usize,
    stream: &Arc<CudaStream>,
) -> Result<()> {
    for (copy, height) in strided_copies(src, dst, grid) {
        // SAFETY: every strided copy stays inside the grid of its side (caller).
        unsafe { copy.queue(grid.block, height, max_pitch, stream)? };
    }
    Ok(())
}

/// The strided copies (and their heights) of [`transpose_blocks`]: one per row of the grid
/// when it has no more rows than columns, else one per column.
fn strided_copies(src: u64, dst: u64, grid: BlockGrid) -> Vec<(Strided, usize)> {
    let BlockGrid { rows, cols, block } = grid;
    let b = block as u64;
    if rows <= cols {
        // Row r: blocks (r, 0..cols) lie together in `src` and `rows` blocks apart in `dst`.
        (0..rows as u64)
            .map(|r| {
                let copy = Strided {
                    src: src + r * cols as u64 * b,
                    src_pitch: block,
                    dst: dst + r * b,
                    dst_pitch: rows * block,
                };
                (copy, cols)
            })
            .collect()
    } else {
        // Column c: blocks (0..rows, c) lie `cols` blocks apart in `src` and together in `dst`.
        (0..cols as u64)
            .map(|c| {
                let copy = Strided {
                    src: src + c * b,
                    src_pitch: cols * block,
                    dst: dst + c * rows as u64 * b,
                    dst_pitch: block,
                };
                (copy, rows)
            })
            .collect()
    }
}

/// `height` lines of equal width, `src_pitch` bytes apart at `src` and `dst_pitch` at `dst`.
struct Strided {
    src: u64,
    src_pitch: usize,
    dst: u64,
    dst_pitch: usize,
}

impl Strided {
    /// The (source, destination) addresses of the first `height` lines.
    fn lines(&self, height: usize) -> impl Iterator<Item = (u64, u64)> + '_ {
        (0..height as u64)
            .map(|line| (self.src + line * self.src_pitch as u64, self.dst + line * self.dst_pitch as u64))
    }

    /// Queues the copy of `height` lines of `width` bytes on `stream`: one 2D copy, or one copy
    /// per line where a pitch exceeds `max_pitch`.
    ///
    /// # Safety
    /// Every line inside memory valid until the copy has run on `stream`; sources and
    /// destinations disjoint; the stream's context current on this thread.
    unsafe fn queue(&self, width: usize, height: usize, max_pitch: usize, stream: &Arc<CudaStream>) -> Result<()> {
        if width == 0 || height == 0 {
            return Ok(());
        }
        let failed = |what: &str, r: sys::CUresult| Error::Cuda {
            operation: format!("{what} ({height} lines of {width} B) on the caller's stream"),
            message: weave_cuda::driver::describe(r),
        };
        if self.src_pitch.max(self.dst_pitch) <= max_pitch {
            let copy = sys::CUDA_MEMCPY2D {
                srcXInBytes: 0,
                srcY: 0,
                srcMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
                srcHost: std::ptr::null(),
                srcDevice: self.src,
                srcArray: std::ptr::null_mut(),
                srcPitch: self.src_pitch,
                dstXInBytes: 0,
                dstY: 0,
                dstMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
                dstHost: std::ptr::null_mut(),
                dstDevice: self.dst,
                dstArray: std::ptr::null_mut(),
                dstPitch: self.dst_pitch,
                WidthInBytes: width,
                Height: height,
            };
            // SAFETY: `copy` describes device memory the caller vouches for; the driver reads
            // the descriptor before returning and the copy runs in stream order.
            let r = unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream.cu_stream()) };
            if r != sys::CUresult::CUDA_SUCCESS {
                return Err(failed("cuMemcpy2DAsync", r));
            }
            return Ok(());
        }
        for (s, d) in self.lines(height) {
            // SAFETY: one line of the copy above, inside the caller's memory.
            let r = unsafe { sys::cuMemcpyDtoDAsync_v2(d, s, width, stream.cu_stream()) };
            if r != sys::CUresult::CUDA_SUCCESS {
                return Err(failed("cuMemcpyDtoDAsync", r));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_lands_at_its_column_major_place_once_in_few_copies() {
        let (src, dst) = (1 << 40, 3 << 40);
        for (rows, cols, block) in [(2, 2, 4), (2, 3, 12), (4, 2, 6), (1, 5, 2), (3, 1, 8), (8, 16, 1), (16, 8, 3)] {
            let copies = strided_copies(src, dst, BlockGrid { rows, cols, block });
            assert_eq!(copies.len(), rows.min(cols), "{rows} x {cols}");
            let mut moved: Vec<(u64, u64)> = copies.iter().flat_map(|(c, height)| c.lines(*height)).collect();
            moved.sort();
            let mut want: Vec<(u64, u64)> = (0..rows)
                .flat_map(|r| (0..cols).map(move |c| (r, c)))
                .map(|(r, c)| (src + ((r * cols + c) * block) as u64, dst + ((c * rows + r) * block) as u64))
                .collect();
            want.sort();
            assert_eq!(moved, want, "{rows} x {cols} blocks of {block} B");
            // The pitches are at most min(rows, cols) blocks: what the GPU's pitch limit is held to.
            for (c, _) in &copies {
                assert!(c.src_pitch.max(c.dst_pitch) <= rows.min(cols).max(1) * block, "{rows} x {cols}");
            }
        }
    }
}
