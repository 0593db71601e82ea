//! Safe typed collectives on cudarc buffers: anything that is [`DevicePtr`] (read) or
//! [`DevicePtrMut`] (written) — [`CudaSlice`](cudarc::driver::CudaSlice), its views — of an
//! [`Element`] type, out of place and in place, each a thin layer over the `*_device_raw` call
//! of the same collective.
//!
//! Every call checks, before it touches the GPU, the buffers' lengths against each other and the
//! world size (and roots, peers, counts), then that the stream and every buffer belong to the
//! communicator's CUDA context; a failed check returns [`Error::InvalidArgument`] and launches
//! nothing. The kernel goes on `stream`, ordered after the buffers' earlier uses and before their
//! later ones through cudarc's event tracking (see `checks`); nothing waits for the GPU. A
//! check fails on the rank that made the mistake only: the other ranks' kernels then wait until
//! `WEAVE_TIMEOUT` and report a device error ([`Communicator::check_gpu`]), so a length error is
//! a bug to fix, not a condition to retry.
//!
//! ```no_run
//! use collectives::{Communicator, ReduceOp};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let comm = Communicator::from_env()?; // cargo xtask launch -n 2 -- …
//! let ctx = comm.gpu_context().ok_or("no GPU path on this rank")?;
//! let stream = ctx.new_stream()?;
//! let grads = stream.clone_htod(&vec![comm.rank() as f32; 1024])?;
//! let mut sum = stream.alloc_zeros::<f32>(1024)?;
//! comm.all_reduce_device(&grads, &mut sum, ReduceOp::Sum, &stream)?;
//! let mut gathered = stream.alloc_zeros::<f32>(1024 * comm.world_size())?;
//! comm.all_gather_device(&sum, &mut gathered, &stream)?;
//! stream.synchronize()?;
//! comm.check_gpu()?; // how the kernels went
//! # Ok(()) }
//! ```

use std::sync::Arc;

use comm_core::{Error, Result};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};

use super::device_checks::{self as checks, Buffers, Side};
use crate::api::communicator::Communicator;
use crate::call::already_in_a_call;
use crate::dtype::Element;
use crate::exec::no_gpu;
use crate::op::ReduceOp;

impl Communicator {
    /// The device addresses of `call`'s buffers, taken on `stream` (see `checks::Buffers`).
    pub(super) fn device_buffers<'a>(&self, call: &'static str, stream: &'a Arc<CudaStream>) -> Result<Buffers<'a>> {
        let gpu = self.gpu.as_ref().ok_or_else(no_gpu)?;
        let ctx = gpu.try_borrow().map_err(|_| already_in_a_call())?.context().clone();
        Buffers::new(call, ctx, stream)
    }

    /// Runs `raw` with the addresses of `send` and `recv`, holding their guards until it returned.
    fn out_of_place<T, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        call: &'static str,
        (send, recv): (&S, &mut R),
        stream: &Arc<CudaStream>,
        raw: impl FnOnce(u64, u64) -> Result<()>,
    ) -> Result<()> {
        let mut buffers = self.device_buffers(call, stream)?;
        let s = buffers.read("send", send)?;
        let r = buffers.write("recv", recv)?;
        raw(s, r)
    }

    /// Runs `raw` with the address of `buf` (both read and written), holding its guard until
    /// it returned.
    fn in_place<T, B: DevicePtrMut<T>>(
        &self,
        call: &'static str,
        buf: &mut B,
        stream: &Arc<CudaStream>,
        raw: impl FnOnce(u64) -> Result<()>,
    ) -> Result<()> {
        let mut buffers = self.device_buffers(call, stream)?;
        raw(buffers.write("the buffer", buf)?)
    }

    /// The byte offset of this rank's block of `count` elements of `T`.
    fn own_block<T>(&self, count: usize) -> u64 {
        (self.rank() * count * std::mem::size_of::<T>()) as u64
    }

    /// Applies `op` to `send` across all ranks into `recv` (both of equal length), on `stream`.
    ///
    /// ```no_run
    /// # use collectives::{Communicator, ReduceOp}; fn f(comm: &Communicator, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), Box<dyn std::error::Error>> {
    /// let send = stream.clone_htod(&[1.0f32, 2.0, 3.0])?;
    /// let mut recv = stream.alloc_zeros::<f32>(3)?;
    /// comm.all_reduce_device(&send, &mut recv, ReduceOp::Sum, stream)?;
    /// # Ok(()) }
    /// ```
    pub fn all_reduce_device<T: Element, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const CALL: &str = "all_reduce_device";
        let count = checks::equal(CALL, send.len(), recv.len())?;
        // SAFETY: both buffers hold `count` elements (checked) of this GPU; their guards live
        // until the launch is enqueued.
        self.out_of_place(CALL, (send, recv), stream, |s, r| unsafe {
            self.all_reduce_device_raw(s, r, count, T::DTYPE, op, stream)
        })
    }

    /// [`all_reduce_device`](Self::all_reduce_device) with the result written over the input.
    ///
    /// ```no_run
    /// # use collectives::{Communicator, ReduceOp}; fn f(comm: &Communicator, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut grads = stream.clone_htod(&vec![0.5f32; 1 << 20])?;
    /// comm.all_reduce_device_in_place(&mut grads, ReduceOp::Avg, stream)?;
    /// # Ok(()) }
    /// ```
    pub fn all_reduce_device_in_place<T: Element, B: DevicePtrMut<T>>(
        &self,
        buf: &mut B,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const CALL: &str = "all_reduce_device_in_place";
        let count = buf.len();
        // SAFETY: in place on the `count` elements of `buf`, guarded until enqueued.
        self.in_place(CALL, buf, stream, |p| unsafe { self.all_reduce_device_raw(p, p, count, T::DTYPE, op, stream) })
    }

    /// Concatenates every rank's `send` into `recv`, which holds `world_size × send.len()`
    /// elements (rank r's block at `r × send.len()`).
    ///
    /// ```no_run
    /// # use collectives::Communicator; fn f(comm: &Communicator, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), Box<dyn std::error::Error>> {
    /// let mine = stream.clone_htod(&[comm.rank() as i32; 4])?;
    /// let mut all = stream.alloc_zeros::<i32>(4 * comm.world_size())?;
    /// comm.all_gather_device(&mine, &mut all, stream)?;
    /// # Ok(()) }
    /// ```
    pub fn all_gather_device<T: Element, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const CALL: &str = "all_gather_device";
        let count = checks::world_blocks(CALL, ("recv", recv.len()), ("send", send.len()), self.world_size())?;
        // SAFETY: send holds `count` and recv world × `count` elements (checked), guarded.
        self.out_of_place(CALL, (send, recv), stream, |s, r| unsafe {
            self.all_gather_device_raw(s, r, count, T::DTYPE, stream)
        })
    }

    /// All-gather where this rank's contribution already sits in its block of `buf` (`world_size`
    /// equal blocks, this rank's at `rank × buf.len() / world_size`).
    ///
    /// ```no_run
    /// # use collectives::Communicator; fn f(comm: &Communicator, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut table = stream.alloc_zeros::<u64>(16 * comm.world_size())?;
    /// // … this rank writes its 16 entries at 16 × rank …
    /// comm.all_gather_device_in_place(&mut table, stream)?;
    /// # Ok(()) }
    /// ```
    pub fn all_gather_device_in_place<T: Element, B: DevicePtrMut<T>>(
        &self,
        buf: &mut B,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const CALL: &str = "all_gather_device_in_place";
        let count = checks::split(CALL, buf.len(), self.world_size())?;
        let block = self.own_block::<T>(count);
        // SAFETY: `buf` holds world × `count` elements (checked); this rank's block is inside it.
        self.in_place(CALL, buf, stream, |p| unsafe {
            self.all_gather_device_raw(p + block, p, count, T::DTYPE, stream)
        })
    }

    /// Reduces every rank's `send` (`world_size` blocks of `recv.len()` elements) and leaves block
    /// `rank` of the result in `recv`.
    ///
    /// ```no_run
    /// # use collectives::{Communicator, ReduceOp}; fn f(comm: &Communicator, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), Box<dyn std::error::Error>> {
    /// let send = stream.clone_htod(&vec![1.0f64; 8 * comm.world_size()])?;
    /// let mut shard = stream.alloc_zeros::<f64>(8)?;
    /// comm.reduce_scatter_device(&send, &mut shard, ReduceOp::Sum, stream)?;
    /// # Ok(()) }
    /// ```
    pub fn reduce_scatter_device<T: Element, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const CALL: &str = "reduce_scatter_device";
        let count = checks::world_blocks(CALL, ("send", send.len()), ("recv", recv.len()), self.world_size())?;
        // SAFETY: send holds world × `count` and recv `count` elements (checked), guarded.
        self.out_of_place(CALL, (send, recv), stream, |s, r| unsafe {
            self.reduce_scatter_device_raw(s, r, count, T::DTYPE, op, stream)
        })
    }

    /// Reduce-scatter whose result lands in block `rank` of `buf` (`world_size` equal blocks);
    /// the other blocks are left undefined.
    ///
    /// ```no_run
    /// # use collectives::{Communicator, ReduceOp}; fn f(comm: &Communicator, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut buf = stream.clone_htod(&vec![2i32; 8 * comm.world_size()])?;
    /// comm.reduce_scatter_device_in_place(&mut buf, ReduceOp::Max, stream)?;
    /// let mine = buf.slice(8 * comm.rank()..8 * (comm.rank() + 1));
    /// # Ok(()) }
    /// ```
    pub fn reduce_scatter_device_in_place<T: Element, B: DevicePtrMut<T>>(
        &self,
        buf: &mut B,
        op: ReduceOp,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const CALL: &str = "reduce_scatter_device_in_place";
        let count = checks::split(CALL, buf.len(), self.world_size())?;
        let block = self.own_block::<T>(count);
        // SAFETY: `buf` holds world × `count` elements (checked); the result block is inside it.
        self.in_place(CALL, buf, stream, |p| unsafe {
            self.reduce_scatter_device_raw(p, p + block, count, T::DTYPE, op, stream)
        })
    }

    /// Copies `root`'s `send` into every rank's `recv`. `send` is read on the root only, where it
    /// must be as long as `recv`; other ranks may pass any buffer (its length is not checked).
    ///
    /// ```no_run
    /// # use collectives::Communicator; fn f(comm: &Communicator, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), Box<dyn std::error::Error>> {
    /// // Only the root's send is read: the others pass any buffer.
    /// let weights = stream.clone_htod(&[0.25f32; 64])?;
    /// let mut mine = stream.alloc_zeros::<f32>(64)?;
    /// comm.broadcast_device(&weights, &mut mine, 0, stream)?;
    /// # Ok(()) }
    /// ```
    pub fn broadcast_device<T: Element, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        root: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const CALL: &str = "broadcast_device";
        checks::root(CALL, root, self.world_size())?;
        if self.rank() != root {
            // `send` is not read here: the call runs as the in-place one, on `recv` alone.
            return self.broadcast_device_in_place(recv, root, stream);
        }
        let count = checks::equal(CALL, send.len(), recv.len())?;
        // SAFETY: both buffers hold `count` elements (checked), guarded.
        self.out_of_place(CALL, (send, recv), stream, |s, r| unsafe {
            self.broadcast_device_raw(s, r, count, T::DTYPE, root, stream)
        })
    }

    /// Broadcast from `root` in place: every rank's `buf` receives the root's.
    ///
    /// ```no_run
    /// # use collectives::Communicator; fn f(comm: &Communicator, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut seed = stream.clone_htod(&[comm.rank() as u64])?;
    /// comm.broadcast_device_in_place(&mut seed, 0, stream)?;
    /// # Ok(()) }
    /// ```
    pub fn broadcast_device_in_place<T: Element, B: DevicePtrMut<T>>(
        &self,
        buf: &mut B,
        root: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const CALL: &str = "broadcast_device_in_place";
        checks::root(CALL, root, self.world_size())?;
        let count = buf.len();
        // SAFETY: in place on the `count` elements of `buf`, guarded.
        self.in_place(CALL, buf, stream, |p| unsafe { self.broadcast_device_raw(p, p, count, T::DTYPE, root, stream) })
    }

    /// Reduces every rank's `send` into `recv` on `root`. `recv` is written on the root only,
    /// where it must be as long as `send`; other ranks may pass any buffer (its length is not checked).
    ///
    /// ```no_run
    /// # use collectives::{Communicator, ReduceOp}; fn f(comm: &Communicator, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), Box<dyn std::error::Error>> {
    /// let loss = stream.clone_htod(&[0.125f32])?;
    /// let mut total = stream.alloc_zeros::<f32>(1)?; // written on rank 0 only
    /// comm.reduce_device(&loss, &mut total, ReduceOp::Sum, 0, stream)?;
    /// # Ok(()) }
    /// ```
    pub fn reduce_device<T: Element, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        op: ReduceOp,
        root: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const CALL: &str = "reduce_device";
        checks::root(CALL, root, self.world_size())?;
        let count = send.len();
        if self.rank() == root {
            checks::equal(CALL, count, recv.len())?;
        }
        // SAFETY: send holds `count` elements, and so does recv on the root (checked), the only
        // rank whose kernel writes it; guarded.
        self.out_of_place(CALL, (send, recv), stream, |s, r| unsafe {
            self.reduce_device_raw(s, r, count, T::DTYPE, op, root, stream)
        })
    }

    /// Reduce to `root` in place: the root's `buf` receives the result, the others keep theirs.
    ///
    /// ```no_run
    /// # use collectives::{Communicator, ReduceOp}; fn f(comm: &Communicator, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut hits = stream.clone_htod(&[3u32, 0, 7])?;
    /// comm.reduce_device_in_place(&mut hits, ReduceOp::Sum, 0, stream)?;
    /// # Ok(()) }
    /// ```
    pub fn reduce_device_in_place<T: Element, B: DevicePtrMut<T>>(
        &self,
        buf: &mut B,
        op: ReduceOp,
        root: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const CALL: &str = "reduce_device_in_place";
        checks::root(CALL, root, self.world_size())?;
        let count = buf.len();
        // SAFETY: in place on the `count` elements of `buf`, guarded.
        self.in_place(CALL, buf, stream, |p| unsafe { self.reduce_device_raw(p, p, count, T::DTYPE, op, root, stream) })
    }

    /// Sends block q of `send` to rank q and receives rank p's block for this rank into block p of
    /// `recv` (both of equal length, `world_size` blocks).
    ///
    /// ```no_run
    /// # use collectives::Communicator; fn f(comm: &Communicator, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), Box<dyn std::error::Error>> {
    /// let tokens = stream.alloc_zeros::<u32>(32 * comm.world_size())?;
    /// let mut routed = stream.alloc_zeros::<u32>(32 * comm.world_size())?;
    /// comm.all_to_all_device(&tokens, &mut routed, stream)?;
    /// # Ok(()) }
    /// ```
    pub fn all_to_all_device<T: Element, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const CALL: &str = "all_to_all_device";
        let count = checks::split(CALL, checks::equal(CALL, send.len(), recv.len())?, self.world_size())?;
        // SAFETY: both buffers hold world × `count` elements (checked), guarded.
        self.out_of_place(CALL, (send, recv), stream, |s, r| unsafe {
            self.all_to_all_device_raw(s, r, count, T::DTYPE, stream)
        })
    }

    /// All-to-all in place (`buf` of `world_size` equal blocks).
    ///
    /// ```no_run
    /// # use collectives::Communicator; fn f(comm: &Communicator, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut blocks = stream.alloc_zeros::<i8>(100 * comm.world_size())?;
    /// comm.all_to_all_device_in_place(&mut blocks, stream)?;
    /// # Ok(()) }
    /// ```
    pub fn all_to_all_device_in_place<T: Element, B: DevicePtrMut<T>>(
        &self,
        buf: &mut B,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const CALL: &str = "all_to_all_device_in_place";
        let count = checks::split(CALL, buf.len(), self.world_size())?;
        // SAFETY: `buf` holds world × `count` elements (checked), guarded.
        self.in_place(CALL, buf, stream, |p| unsafe { self.all_to_all_device_raw(p, p, count, T::DTYPE, stream) })
    }

    /// All-to-all with per-rank counts and displacements (in elements) from host slices:
    /// `send_counts[q]` elements at `send_displs[q]` go to rank q; rank p's block for this rank
    /// lands at `recv_displs[p]` (`recv_counts[p]` elements, which must equal what p sends — a
    /// mismatch is a device error, [`check_gpu`](Self::check_gpu)). Every block must lie inside
    /// its buffer and the receive blocks must not overlap (checked).
    ///
    /// The counts travel to the GPU in a copy from pageable memory, which waits for the stream's
    /// earlier work and cannot be captured in a CUDA graph; with the counts already on the GPU,
    /// or inside a graph, use [`all_to_allv_device_counts`](Self::all_to_allv_device_counts).
    ///
    /// ```no_run
    /// # use collectives::Communicator; fn f(comm: &Communicator, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), Box<dyn std::error::Error>> {
    /// // Two ranks: rank r keeps r + 1 elements and sends the other rank 2.
    /// let r = comm.rank();
    /// let (counts, displs) = if r == 0 { ([1, 2], [0, 1]) } else { ([2, 2], [2, 0]) };
    /// let send = stream.alloc_zeros::<f32>(4)?;
    /// let mut recv = stream.alloc_zeros::<f32>(4)?;
    /// comm.all_to_allv_device(&send, &counts, &displs, &mut recv, &counts, &displs, stream)?;
    /// # Ok(()) }
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn all_to_allv_device<T: Element, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &mut R,
        recv_counts: &[usize],
        recv_displs: &[usize],
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const CALL: &str = "all_to_allv_device";
        let n = self.world_size();
        let (table, longest) = checks::all_to_allv_table(
            CALL,
            Side { name: "send", len: send.len(), counts: send_counts, displs: send_displs },
            Side { name: "recv", len: recv.len(), counts: recv_counts, displs: recv_displs },
            n,
        )?;
        // Freed when dropped below, stream-ordered after the kernel (cudarc frees on its stream,
        // once the kernel's read recorded into its event has happened).
        let table = stream.clone_htod(&table).map_err(|e| Error::Cuda {
            operation: format!("{CALL}: copy the counts to the GPU"),
            message: e.to_string(),
        })?;
        let part = |k: usize| table.slice(k * n..(k + 1) * n);
        let counts = [part(0), part(1), part(2), part(3)];
        // SAFETY: every block the table describes lies inside its buffer and the receive blocks
        // are disjoint (checked above).
        unsafe {
            self.all_to_allv_device_counts(
                send,
                recv,
                [&counts[0], &counts[1], &counts[2], &counts[3]],
                longest,
                stream,
            )
        }
    }

    /// All-to-all-v with the counts and displacements (elements) already on the GPU:
    /// `counts = [send_counts, send_displs, recv_counts, recv_displs]`, `world_size` u64 each
    /// (checked). The kernel reads them when it runs (no host synchronization, capturable in a
    /// CUDA graph), so it cannot check them against the buffers: that is the caller's promise.
    /// `max_block_hint` is the longest block in elements, for the algorithm choice.
    ///
    /// # Safety
    /// When the kernel runs, every block the arrays describe must lie inside `send` or `recv`,
    /// and the receive blocks must not overlap.
    ///
    /// ```no_run
    /// # use collectives::Communicator; fn f(comm: &Communicator, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), Box<dyn std::error::Error>> {
    /// let n = comm.world_size();
    /// let ones = stream.clone_htod(&vec![1u64; n])?;
    /// let at = stream.clone_htod(&(0..n as u64).collect::<Vec<_>>())?;
    /// let send = stream.alloc_zeros::<f32>(n)?;
    /// let mut recv = stream.alloc_zeros::<f32>(n)?;
    /// // SAFETY: one element to and from every rank, at its index: inside both buffers.
    /// unsafe { comm.all_to_allv_device_counts(&send, &mut recv, [&ones, &at, &ones, &at], 1, stream)? };
    /// # Ok(()) }
    /// ```
    pub unsafe fn all_to_allv_device_counts<T: Element, S: DevicePtr<T>, R: DevicePtrMut<T>, C: DevicePtr<u64>>(
        &self,
        send: &S,
        recv: &mut R,
        counts: [&C; 4],
        max_block_hint: usize,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        const CALL: &str = "all_to_allv_device_counts";
        let n = self.world_size();
        if let Some(k) = counts.iter().position(|c| c.len() != n) {
            let names = ["send counts", "send displacements", "recv counts", "recv displacements"];
            return Err(Error::invalid(format!(
                "{CALL}: the {} array has {} entries, not one per rank ({n})",
                names[k],
                counts[k].len()
            )));
        }
        let mut buffers = self.device_buffers(CALL, stream)?;
        let mut arrays = [0u64; 4];
        for (address, array) in arrays.iter_mut().zip(counts) {
            *address = buffers.read("a counts array", array)?;
        }
        let (s, r) = (buffers.read("send", send)?, buffers.write("recv", recv)?);
        let hint = max_block_hint.saturating_mul(std::mem::size_of::<T>());
        // SAFETY: the arrays hold `n` u64 each (checked) and the blocks they describe lie in the
        // buffers (the caller's promise); every buffer is guarded until `buffers` drops.
        unsafe { self.all_to_allv_device_raw(s, r, arrays, T::DTYPE, hint, stream) }
    }
}
