//! The channel family on device buffers: one kernel per call (`kernels/cuda/channel.cu`) whose
//! links are of two kinds. Where the peer's side of a link is device memory mapped into this
//! GPU (CUDA IPC: any number of GPUs of one host, beyond the direct kernels' 8), a memory
//! channel: the kernel writes each message into the peer's slot and raises the peer's tokens
//! itself. Elsewhere (the link's memory is host memory a network transport writes), a port
//! channel: the kernel stages messages in its own outbox and pushes triggers into a proxy FIFO in
//! pinned host memory; this rank's [`ProxyService`] thread carries each trigger out through the
//! peer's [`Connection`](comm_core::connection::Connection) — copy, then signal. A memory channel
//! needs no CUDA stream: proxy copies on streams can queue behind whatever the caller put on its
//! own stream after the collective (the GPU serves a process's streams through a few hardware
//! queues), which waits for the collective — a deadlock seen with 16 ranks sharing one GPU.
//!
//! Links are built on demand, only to the peers a call uses, in ascending peer order on every
//! rank (as the host channel executor builds its own): each link is a pair of regions (each
//! side's inbox, written by the other) and one entry of the device link table the kernels read;
//! a port channel adds a private outbox per side and two signal-only semaphores per direction
//! (`ready` after each message, `freed` after each consumed one). Every kernel of the family that
//! the kernel cache holds is loaded when the family is set up (see `preload_cached`); any other
//! is compiled the first time a call needs it.
//!
//! The logarithmic algorithms (recursive doubling and halving, Bruck, binomial trees) run the
//! host's schedules (`kernels/cuda/channel_log.cu` mirrors `recursive.rs`, `bruck.rs` and
//! `tree.rs`, whose peer functions name the links built here). Where the host keeps a scratch
//! vector they use the family's scratch buffer in device memory: grown for the largest call so
//! far, each size kept until the communicator goes (a kernel launched earlier may still use it;
//! the sizes double, so all of them take less than twice the largest). Like the link counters,
//! it assumes the calls of one communicator run one after another (one stream, or ordered ones).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use comm_core::communicator::Communicator as CoreCommunicator;
use comm_core::device::DeviceStatusHandle;
use comm_core::diagnostics;
use comm_core::fifo::TriggerFifo;
use comm_core::memory::{MemoryKind, RegisteredMemory};
use comm_core::proxy::ProxyService;
use comm_core::semaphore::{HostSemaphore, Token};
use comm_core::{Error, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr};
use kernels::channel::{
    CHANNEL_THREADS, ChannelAlgorithm, ChannelArgs, ChannelCollective, ChannelKernel, ChannelLink, FREED_OFFSET,
    HEADER_BYTES, LINK_BYTES, NO_PEER, READY_OFFSET, SLOTS_OFFSET,
};
use kernels::module::KernelModule;

use crate::call::CallSpec;
use crate::dtype::DataType;
use crate::op::ReduceOp;
use crate::schedule::{SLOTS, binomial_tree, bruck_peers, doubling_peers, missing_links, payload_for};
use crate::select::device::{CountUnit, KernelPlan};
use crate::table::{Algorithm, Collective};

/// Slots of the proxy's trigger FIFO (every message takes two triggers: data, then credit).
const FIFO_CAPACITY: u32 = 1024;

/// The smallest scratch buffer the family allocates.
const MIN_SCRATCH_BYTES: usize = 64 << 10;

/// What one device call of the channel family asks for: the call as every rank must agree on it
/// (`spec.invalid` is never set on device calls), and this rank's buffers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceCollectiveCall {
    /// Collective, channel algorithm (one the device rows name for it), element type, operator, count
    /// (elements, per rank block where the collective has blocks) and root.
    pub(crate) spec: CallSpec,
    /// Input (device address).
    pub(crate) send: u64,
    /// Output (device address).
    pub(crate) recv: u64,
    /// All-to-all-v: device arrays of counts and displacements.
    pub(crate) aux: [u64; 4],
}

/// A point-to-point call: elements to send to a rank and to receive from a rank (either absent).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceSendRecv {
    /// (device address, elements, rank) to send.
    pub(crate) send: Option<(u64, usize, usize)>,
    /// (device address, elements, rank) to receive.
    pub(crate) recv: Option<(u64, usize, usize)>,
    /// Element type.
    pub(crate) dtype: DataType,
    /// The send's pair stamp digest, and the one the receive expects (`crate::matching`).
    pub(crate) stamps: (u32, u32),
}

/// The memories of one built link, kept alive as long as the proxy may name them. Host
/// memory the GPU maps (links to peers that no device-memory transport reaches) is unmapped
/// first: fields drop in order.
struct DeviceLink {
    _mapped: Vec<weave_cuda::PinnedHostMemory>,
    inbox: RegisteredMemory,
    _peer_region: RegisteredMemory,
    /// The staging region of a port channel (none over a memory channel, whose kernels stage
    /// into the peer's region).
    outbox: Option<RegisteredMemory>,
}

/// Per-communicator state of the GPU channel family.
pub(crate) struct DeviceChannels {
    ctx: Arc<CudaContext>,
    device: u32,
    rank: usize,
    world: usize,
    proxy: ProxyService,
    links: Vec<Option<DeviceLink>>,
    /// The link table (a `ChannelLink` per rank) and the stream that fills it.
    table: CudaSlice<u8>,
    table_address: u64,
    arch: String,
    functions: HashMap<ChannelKernel, CudaFunction>,
    payload: usize,
    /// The logarithmic algorithms' work buffers, the newest (largest) last; see the module doc.
    scratch: Vec<(CudaSlice<u8>, u64)>,
    /// Channel collectives launched so far (every rank counts them alike).
    calls: u64,
    timeout: Duration,
    /// The stream that fills the table and zeroes the scratch buffers; last, so that the
    /// buffers allocated on it go first.
    table_stream: weave_cuda::PrivateStream,
}

comm_core::debug_fields!(DeviceChannels { rank, links: |c| c.links.iter().filter(|l| l.is_some()).count(), calls });

impl DeviceChannels {
    /// The family's state for this rank's GPU `device` of `ctx` (compiled for `arch`): the proxy
    /// (started), its FIFO, and an empty link table. Local; links come with the first calls.
    pub(crate) fn new(core: &CoreCommunicator, ctx: &Arc<CudaContext>, device: u32, arch: &str) -> Result<Self> {
        let cuda = |operation: &str| {
            let operation = operation.to_string();
            move |e: cudarc::driver::DriverError| Error::Cuda { operation, message: e.to_string() }
        };
        let world = core.world_size();
        let storage = weave_cuda::PinnedFifoStorage::new(ctx, FIFO_CAPACITY)?;
        let fifo = TriggerFifo::with_storage(Box::new(storage))?;
        let proxy = ProxyService::with_fifo(fifo, core.config().timeout, core.abort_flag().clone());
        let bound = ctx.clone();
        proxy.start(move || weave_cuda::bind(&bound))?;
        // Not `ctx.new_stream()`: at a context handle's first stream, cudarc synchronizes the
        // whole context, which a first call being captured into a graph must not do.
        let table_stream = weave_cuda::PrivateStream::new(ctx)?;
        let table = table_stream
            .stream()
            .alloc_zeros::<u8>(world * LINK_BYTES)
            .map_err(cuda("allocate the channel link table"))?;
        let table_address = {
            let (address, _sync) = table.device_ptr(table_stream.stream());
            address
        };
        let mut channels = DeviceChannels {
            ctx: ctx.clone(),
            device,
            rank: core.rank(),
            world,
            proxy,
            links: (0..world).map(|_| None).collect(),
            table,
            table_address,
            arch: arch.to_string(),
            functions: HashMap::new(),
            payload: payload_for(world),
            scratch: Vec::new(),
            calls: 0,
            timeout: core.config().timeout,
            table_stream,
        };
        channels.preload_cached();
        Ok(channels)
    }

    /// Loads every kernel of the family that the kernel cache holds, so that a later call
    /// loads no code behind calls still queued (a first load then could deadlock them: see
    /// `kernels::direct::DirectLauncher::preload`). A kernel not in the cache, or one that does
    /// not load here, is compiled and loaded at its first call, which reports any error.
    fn preload_cached(&mut self) {
        if !kernels::compile::nvrtc_available() {
            // The cache is keyed by NVRTC's version; the first call will say what is missing.
            return;
        }
        let compiler = kernels::compile::Compiler::from_env();
        let every = std::iter::once(ChannelKernel::Moving)
            .chain(kernels::channel::REDUCING_TYPES.iter().map(|(t, _)| ChannelKernel::Reducing(t)));
        for kernel in every {
            let loaded = (|| -> Result<Option<CudaFunction>> {
                // Loading is no stream work: allowed while capturing.
                let _relaxed = weave_cuda::driver::RelaxedCapture::enter()?;
                let Some(compiled) = compiler.cached(&kernel.program()?, &self.arch)? else {
                    return Ok(None);
                };
                KernelModule::load(&self.ctx, &compiled)?.function(&kernel.name()).map(Some)
            })();
            match loaded {
                Ok(Some(f)) => {
                    self.functions.insert(kernel, f);
                }
                Ok(None) => {}
                Err(e) => {
                    let rank = self.rank;
                    tracing::info!(target: diagnostics::KERNELS, rank, "{} not loaded at setup: {e}", kernel.name());
                }
            }
        }
    }

    /// The proxy's recorded failure, if any (a copy or signal that failed: the kernels waiting
    /// for it will give up).
    pub(crate) fn proxy_error(&self) -> Option<Error> {
        self.proxy.error()
    }

    /// Stops the proxy thread: no trigger of this family's kernels goes out through the
    /// connections from then on (a shrink carrying them over). Waits for the trigger in hand,
    /// whose waits the communicator's abort flag or timeout bound.
    pub(crate) fn stop_proxy(&self) {
        self.proxy.stop();
    }

    /// Pairwise with `peer`: builds the link and writes its table entry.
    fn build_link(&mut self, core: &CoreCommunicator, peer: usize) -> Result<()> {
        let slot_bytes = (HEADER_BYTES + self.payload).next_multiple_of(64);
        let len = SLOTS_OFFSET + SLOTS * slot_bytes;
        let (lo, hi) = (self.rank.min(peer), self.rank.max(peer));
        let label = format!("weave gpu channel link {lo}<->{hi} ({SLOTS} x {} B)", self.payload);
        // Device memory where a transport to the peer carries it (CUDA IPC); else host memory
        // the GPU maps, which a network transport writes and the kernels read over the bus.
        let device = MemoryKind::Device(self.device);
        let kind = if core.pair_allocates(peer, device)? { device } else { MemoryKind::Host };
        let (inbox, peer_region) = core.exchange_pair_of(peer, len, kind, &label)?;
        let mapped_here = core.backend(peer_region.transport()).is_some_and(|b| b.direct_access());
        if kind == device && mapped_here {
            // A memory channel: the peer's region is mapped into this GPU (its transport has
            // direct access), so the kernels write into it themselves, with no proxy, no outbox
            // and no CUDA stream (see channel.cu).
            peer_region.check_range(0, len)?;
            let entry = ChannelLink {
                inbox: inbox.as_ptr() as u64,
                slots: SLOTS as u32,
                slot_bytes: slot_bytes as u32,
                peer: peer as u32,
                built: 1,
                peer_region: peer_region.as_ptr() as u64,
                ..ChannelLink::default()
            };
            self.write_entry(peer, &entry)?;
            self.links[peer] = Some(DeviceLink { _mapped: Vec::new(), inbox, _peer_region: peer_region, outbox: None });
            return Ok(());
        }
        let outbox = core.register_private(len, kind, &format!("{label} outbox"))?;
        let mut mapped = Vec::new();
        let (inbox_address, outbox_address) = if kind == device {
            (inbox.as_ptr() as u64, outbox.as_ptr() as u64)
        } else {
            for (memory, what) in [(&inbox, "inbox"), (&outbox, "outbox")] {
                memory.check_range(0, len)?;
                if !memory.is_host_mapped() {
                    return Err(Error::Unsupported(format!("{label}: the {what} is not host memory mapped here")));
                }
                // SAFETY: the registration holds `len` bytes of host memory mapped here (checked),
                // which this link keeps alive past the CUDA registration (field order).
                mapped.push(unsafe { weave_cuda::PinnedHostMemory::register(&self.ctx, memory.as_ptr(), len)? });
            }
            (mapped[0].device_ptr(), mapped[1].device_ptr())
        };
        let connection = core.connection_via(peer, peer_region.transport())?;
        let abort = core.abort_flag().clone();
        let signal = |offset: usize| -> Result<Arc<HostSemaphore>> {
            let token = Token { memory: peer_region.clone(), offset };
            Ok(Arc::new(HostSemaphore::signal_only(connection.clone(), token, self.timeout, abort.clone())?))
        };
        let data_semaphore = self.proxy.add_semaphore(signal(READY_OFFSET)?)?;
        let credit_semaphore = self.proxy.add_semaphore(signal(FREED_OFFSET)?)?;
        let outbox_memory = self.proxy.add_memory(outbox.clone())?;
        let peer_memory = self.proxy.add_memory(peer_region.clone())?;
        let entry = ChannelLink {
            inbox: inbox_address,
            outbox: outbox_address,
            posted: 0,
            consumed: 0,
            data_semaphore: data_semaphore.0,
            credit_semaphore: credit_semaphore.0,
            outbox_memory: outbox_memory.0,
            peer_memory: peer_memory.0,
            slots: SLOTS as u32,
            slot_bytes: slot_bytes as u32,
            peer: peer as u32,
            built: 1,
            peer_region: 0,
        };
        self.write_entry(peer, &entry)?;
        self.links[peer] = Some(DeviceLink { _mapped: mapped, inbox, _peer_region: peer_region, outbox: Some(outbox) });
        Ok(())
    }

    /// Writes `peer`'s entry of the device link table.
    fn write_entry(&mut self, peer: usize, entry: &ChannelLink) -> Result<()> {
        let bytes = entry.to_bytes();
        let mut slot = self.table.slice_mut(peer * LINK_BYTES..(peer + 1) * LINK_BYTES);
        let copied = self
            .table_stream
            .stream()
            .memcpy_htod(&bytes, &mut slot)
            .and_then(|()| self.table_stream.stream().synchronize());
        copied.map_err(|e| Error::Cuda {
            operation: format!("write the link table entry of rank {peer}"),
            message: e.to_string(),
        })
    }

    /// Builds the links to `peers` that do not exist yet, in ascending peer order.
    fn connect(&mut self, core: &CoreCommunicator, peers: &[usize]) -> Result<()> {
        for p in missing_links(self.rank, peers, &self.links) {
            self.build_link(core, p)?;
        }
        Ok(())
    }

    /// The function of `kernel`, compiled and loaded the first time.
    fn function(&mut self, kernel: ChannelKernel) -> Result<CudaFunction> {
        if let Some(f) = self.functions.get(&kernel) {
            return Ok(f.clone());
        }
        let compiled = kernels::compile::Compiler::from_env().compile(&kernel.program()?, &self.arch)?;
        let module = KernelModule::load(&self.ctx, &compiled)?;
        let f = module.function(&kernel.name())?;
        self.functions.insert(kernel, f.clone());
        Ok(f)
    }

    /// The peers a collective talks to on this rank (what the kernel will use).
    fn peers_of(&self, collective: Collective, algorithm: Algorithm, root: usize) -> Vec<usize> {
        let (n, me) = (self.world, self.rank);
        if n == 1 {
            return Vec::new();
        }
        let (left, right) = ((me + n - 1) % n, (me + 1) % n);
        let everyone = || (0..n).filter(|&p| p != me).collect::<Vec<_>>();
        match (collective, algorithm) {
            (Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter, Algorithm::ChannelRing) => {
                vec![left, right]
            }
            (Collective::Broadcast | Collective::Reduce, Algorithm::ChannelRing) => {
                let pos = (me + n - root) % n;
                let mut v = Vec::with_capacity(2);
                if pos > 0 {
                    v.push(left);
                }
                if pos + 1 < n {
                    v.push(right);
                }
                v
            }
            (
                Collective::AllReduce | Collective::ReduceScatter,
                Algorithm::ChannelDoubling | Algorithm::ChannelHalving,
            ) => doubling_peers(n, me),
            (Collective::AllGather | Collective::AllToAll, Algorithm::ChannelBruck) => bruck_peers(n, me),
            (Collective::Broadcast | Collective::Reduce, Algorithm::ChannelTree) => {
                let (parent, children) = binomial_tree(n, me, root);
                parent.into_iter().chain(children).collect()
            }
            (Collective::Broadcast | Collective::Reduce, _) if me != root => vec![root],
            _ => everyone(),
        }
    }

    /// Bytes of this rank's GPU memory the family holds: the links' inboxes and outboxes in
    /// device memory, the link table and the scratch buffers.
    pub(crate) fn memory(&self) -> usize {
        let device = MemoryKind::Device(self.device);
        let links: usize = self
            .links
            .iter()
            .flatten()
            .flat_map(|l| std::iter::once(&l.inbox).chain(&l.outbox))
            .filter(|m| m.kind() == device)
            .map(super::allocated_bytes)
            .sum();
        links + self.table.len() + self.scratch.iter().map(|(b, _)| b.len()).sum::<usize>()
    }

    /// The device address of a scratch buffer of at least `bytes` bytes (0 for none), allocating
    /// a larger one when the newest is too small.
    fn scratch_of(&mut self, bytes: usize) -> Result<u64> {
        if bytes == 0 {
            return Ok(0);
        }
        if let Some((buffer, address)) = self.scratch.last()
            && buffer.len() >= bytes
        {
            return Ok(*address);
        }
        let len = bytes.checked_next_power_of_two().unwrap_or(bytes).max(MIN_SCRATCH_BYTES);
        let cuda = |e: cudarc::driver::DriverError| Error::Cuda {
            operation: format!("allocate {len} bytes of channel scratch on GPU {}", self.device),
            message: e.to_string(),
        };
        let buffer = self.table_stream.stream().alloc_zeros::<u8>(len).map_err(cuda)?;
        self.table_stream.stream().synchronize().map_err(cuda)?;
        let address = {
            let (address, _sync) = buffer.device_ptr(self.table_stream.stream());
            address
        };
        self.scratch.push((buffer, address));
        Ok(address)
    }

    /// Launches `call` on `stream` (building its links and compiling its kernel first if needed).
    ///
    /// # Safety
    /// The device addresses in `call` must be valid for the collective until it completes on
    /// `stream`.
    pub(crate) unsafe fn launch(
        &mut self,
        core: &CoreCommunicator,
        call: DeviceCollectiveCall,
        plan: &KernelPlan,
        status: DeviceStatusHandle,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let spec = call.spec;
        let algorithm = match spec.algorithm {
            Algorithm::ChannelRing => ChannelAlgorithm::Ring,
            Algorithm::ChannelDirect => ChannelAlgorithm::Direct,
            Algorithm::ChannelDoubling => ChannelAlgorithm::Doubling,
            Algorithm::ChannelHalving => ChannelAlgorithm::Halving,
            Algorithm::ChannelBruck => ChannelAlgorithm::Bruck,
            Algorithm::ChannelTree => ChannelAlgorithm::Tree,
            other => return Err(Error::invalid(format!("{other} is not a channel algorithm of the GPU path"))),
        };
        if !spec.algorithm.runs_on_device(spec.collective) {
            return Err(Error::invalid(format!(
                "the GPU channel kernels have no {} for {}",
                spec.algorithm, spec.collective
            )));
        }
        let collective = match spec.collective {
            Collective::AllReduce => ChannelCollective::AllReduce,
            Collective::ReduceScatter => ChannelCollective::ReduceScatter,
            Collective::Reduce => ChannelCollective::Reduce,
            Collective::AllGather => ChannelCollective::AllGather,
            Collective::Broadcast => ChannelCollective::Broadcast,
            Collective::AllToAll => ChannelCollective::AllToAll,
            Collective::AllToAllv => ChannelCollective::AllToAllv,
            Collective::SendRecv => {
                return Err(Error::invalid("send/receive on device buffers goes through sendrecv"));
            }
        };
        self.connect(core, &self.peers_of(spec.collective, spec.algorithm, spec.root))?;
        let esz = spec.dtype.size();
        // The plan names the kernel: the reducing family per element type, or the byte kernel.
        let kernel = if plan.typed { ChannelKernel::Reducing(spec.dtype.rust_name()) } else { ChannelKernel::Moving };
        let count = match plan.count {
            CountUnit::Elements => spec.count,
            CountUnit::Bytes => spec.count * esz,
            CountUnit::ElementSize => esz,
        };
        let scratch_bytes =
            scratch_bytes(spec.collective, spec.algorithm, self.world, spec.count, esz).ok_or_else(|| {
                Error::invalid(format!(
                    "{} of {} elements: the work buffer's size overflows",
                    spec.collective, spec.count
                ))
            })?;
        let scratch = self.scratch_of(scratch_bytes)?;
        let f = self.function(kernel)?;
        self.calls += 1;
        let signature =
            crate::call::signature(spec.collective, spec.dtype, spec.op, spec.algorithm) | (spec.root as u64) << 32;
        let args = ChannelArgs {
            send: call.send,
            recv: call.recv,
            count: count as u64,
            aux: call.aux,
            links: self.table_address,
            scratch,
            call: self.calls,
            signature,
            agreed: if spec.collective == Collective::AllToAllv { 0 } else { spec.count as u64 },
            fifo: self.proxy_fifo(),
            status,
            rank: self.rank as u32,
            world: self.world as u32,
            root: spec.root as u32,
            op: spec.op.map_or(0, ReduceOp::kernel_code),
            collective: collective as u32,
            algorithm: algorithm as u32,
            from: NO_PEER,
            elem_size: esz as u32,
        };
        // SAFETY: forwarded from the caller; the link table and FIFO live as long as `self`,
        // which the communicator drops only after synchronizing its device work.
        unsafe { self.launch_kernel(&f, &kernel, args, stream) }
    }

    /// Launches a point-to-point call on `stream` (building its links first if needed).
    ///
    /// # Safety
    /// The device addresses in `call` must be valid until it completes on `stream`.
    pub(crate) unsafe fn sendrecv(
        &mut self,
        core: &CoreCommunicator,
        call: DeviceSendRecv,
        status: DeviceStatusHandle,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let peers: Vec<usize> = call.send.map(|s| s.2).into_iter().chain(call.recv.map(|r| r.2)).collect();
        self.connect(core, &peers)?;
        let kernel = ChannelKernel::Moving;
        let f = self.function(kernel)?;
        let esz = call.dtype.size();
        let rank_of = |p: Option<usize>| p.map_or(NO_PEER, |p| p as u32);
        let args = ChannelArgs {
            send: call.send.map_or(0, |s| s.0),
            recv: call.recv.map_or(0, |r| r.0),
            count: call.send.map_or(0, |s| s.1 * esz) as u64,
            aux: [call.recv.map_or(0, |r| r.1 * esz) as u64, u64::from(call.stamps.1), 0, 0],
            links: self.table_address,
            scratch: 0,
            // Point-to-point calls are not counted (only the two ranks of a pair take part):
            // their messages carry the send's pair stamp, the receive checks its own.
            call: u64::from(call.stamps.0),
            signature: crate::call::signature(Collective::SendRecv, call.dtype, None, Algorithm::ChannelDirect),
            agreed: 0,
            fifo: self.proxy_fifo(),
            status,
            rank: self.rank as u32,
            world: self.world as u32,
            root: rank_of(call.send.map(|s| s.2)),
            op: 0,
            collective: ChannelCollective::SendRecv as u32,
            algorithm: ChannelAlgorithm::Direct as u32,
            from: rank_of(call.recv.map(|r| r.2)),
            elem_size: esz as u32,
        };
        // SAFETY: forwarded from the caller; see `launch`.
        unsafe { self.launch_kernel(&f, &kernel, args, stream) }
    }

    fn proxy_fifo(&self) -> comm_core::fifo::FifoDeviceHandle {
        self.proxy.fifo().device_handle()
    }

    /// # Safety
    /// As [`launch`](Self::launch).
    unsafe fn launch_kernel(
        &self,
        f: &CudaFunction,
        kernel: &ChannelKernel,
        args: ChannelArgs,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let shape = kernels::launch::LaunchShape { blocks: 1, threads: CHANNEL_THREADS, overlapped: false };
        // SAFETY: the kernel's one parameter is exactly ChannelArgs (layout checked at compile
        // time); the caller guarantees the addresses inside it.
        unsafe { kernels::launch::launch_with_args(f, &args, shape, stream, kernel) }
    }
}

/// Bytes of scratch `algorithm` needs for `collective` of `count` elements of `esz` bytes (per
/// block where the collective has blocks) on `world` ranks: the host's scratch vectors (a copy of
/// the blocks to reduce or move, or of the input a tree reduces into); `None` on overflow.
fn scratch_bytes(
    collective: Collective,
    algorithm: Algorithm,
    world: usize,
    count: usize,
    esz: usize,
) -> Option<usize> {
    let block = count.checked_mul(esz)?;
    match (collective, algorithm) {
        (Collective::ReduceScatter, Algorithm::ChannelHalving)
        | (Collective::AllGather | Collective::AllToAll, Algorithm::ChannelBruck) => block.checked_mul(world),
        (Collective::Reduce, Algorithm::ChannelTree) => Some(block),
        _ => Some(0),
    }
}

impl Drop for DeviceChannels {
    fn drop(&mut self) {
        // The proxy may still name the links' memories: stop it before they go.
        self.proxy.stop();
    }
}
