//! Port channels: a one-way data path to a peer whose copies, signals and flushes are carried
//! out by a [`ProxyService`] thread, fed through the trigger FIFO.
//!
//! The host object, [`PortChannel`], checks every range on the host before it pushes anything
//! (nothing is ever masked to fit a trigger field), splits puts larger than a trigger can carry,
//! and bounds every wait. [`PortChannelDeviceHandle`] is the plain layout kernels will receive
//! for the GPU path.
//!
//! Ordering: the proxy executes triggers in FIFO order, and a connection orders a signal after
//! its earlier writes, so `put` then `signal` delivers the data before the peer's `wait`
//! returns. `flush` returns once the proxy has executed everything pushed before it.

use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::fifo::{
    FifoDeviceHandle, MAX_TRIGGER_OFFSET, MAX_TRIGGER_SIZE, MemoryId, SemaphoreId, TRIGGER_SIZE_BITS, Trigger,
    TriggerFields, TriggerType,
};
use crate::memory::RegisteredMemory;
use crate::proxy::{ProxyService, ProxyShared};
use crate::semaphore::{HostSemaphore, Token};

/// Bytes per trigger when a put is split: the largest power of two a trigger's size field holds,
/// so chunk boundaries stay aligned.
const PUT_CHUNK: u64 = 1 << (TRIGGER_SIZE_BITS - 1);
const _: () = assert!(PUT_CHUNK <= MAX_TRIGGER_SIZE);

const _: () = assert!(std::mem::size_of::<PortChannelDeviceHandle>() == 64);

/// A port channel as device code sees it: plain data a kernel receives by value
/// (`#[repr(C)]`, 64 bytes; the C++ mirror must match field for field). A kernel pushes
/// triggers naming `semaphore_id`, `dst` and `src` into `fifo`, and waits on its semaphore by
/// comparing the inbound token with the expected token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct PortChannelDeviceHandle {
    /// The proxy's trigger FIFO.
    pub fifo: FifoDeviceHandle,
    /// Device address of the `u64` inbound token the peer signals; 0 when not provided (see
    /// [`PortChannel::with_device_tokens`]): the kernel must not wait on this channel.
    pub inbound_token: u64,
    /// Device address of the `u64` expected-inbound counter; 0 when not provided.
    pub expected_inbound_token: u64,
    /// Semaphore id for triggers (selects the semaphore and the connection).
    pub semaphore_id: u32,
    /// Destination memory id for triggers.
    pub dst: u32,
    /// Source memory id for triggers.
    pub src: u32,
    /// Zero; keeps the size a multiple of 8 bytes.
    pub reserved: u32,
}

/// Host side of a port channel, built by
/// [`PortChannel::new`].
///
/// Every method is bounded by the proxy's timeout. Once the proxy has recorded an error, every
/// method that pushes returns that error. Cloning is cheap; clones share the proxy and the
/// semaphore.
#[derive(Clone)]
pub struct PortChannel {
    proxy: Arc<ProxyShared>,
    semaphore_id: SemaphoreId,
    semaphore: Arc<HostSemaphore>,
    dst_id: MemoryId,
    dst: RegisteredMemory,
    src_id: MemoryId,
    src: RegisteredMemory,
    inbound_token: u64,
    expected_inbound_token: u64,
    max_chunk: u64,
}

impl fmt::Debug for PortChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PortChannel")
            .field("peer", &self.peer())
            .field("semaphore_id", &self.semaphore_id.0)
            .field("dst", &(self.dst_id.0, self.dst.label()))
            .field("src", &(self.src_id.0, self.src.label()))
            .finish()
    }
}

/// `(dst_offset, src_offset, size)` of each trigger a `len`-byte put is split into.
fn chunks(dst_offset: u64, src_offset: u64, len: u64, max_chunk: u64) -> impl Iterator<Item = (u64, u64, u64)> {
    (0..len.div_ceil(max_chunk)).map(move |i| {
        let done = i * max_chunk;
        (dst_offset + done, src_offset + done, max_chunk.min(len - done))
    })
}

impl PortChannel {
    /// A port channel that copies from `src` (usually this rank's memory) to `dst` (usually the
    /// peer's) through the connection of `semaphore`, and signals that semaphore, driven by
    /// `proxy`, which holds all three ids. `Err(InvalidArgument)` for an id it does not hold.
    pub fn new(proxy: &ProxyService, semaphore: SemaphoreId, dst: MemoryId, src: MemoryId) -> Result<PortChannel> {
        let sem = proxy.semaphore(semaphore)?;
        let dst_memory = proxy.memory(dst)?;
        let src_memory = proxy.memory(src)?;
        Ok(PortChannel::from_parts(Arc::clone(proxy.shared()), semaphore, sem, (dst, dst_memory), (src, src_memory)))
    }

    fn from_parts(
        proxy: Arc<ProxyShared>,
        semaphore_id: SemaphoreId,
        semaphore: Arc<HostSemaphore>,
        (dst_id, dst): (MemoryId, RegisteredMemory),
        (src_id, src): (MemoryId, RegisteredMemory),
    ) -> Self {
        PortChannel {
            proxy,
            semaphore_id,
            semaphore,
            dst_id,
            dst,
            src_id,
            src,
            inbound_token: 0,
            expected_inbound_token: 0,
            max_chunk: PUT_CHUNK,
        }
    }

    /// The peer rank (of the semaphore's connection).
    pub fn peer(&self) -> usize {
        self.semaphore.peer()
    }

    /// The semaphore id triggers carry.
    pub fn semaphore_id(&self) -> SemaphoreId {
        self.semaphore_id
    }

    /// The destination memory id triggers carry.
    pub fn dst_id(&self) -> MemoryId {
        self.dst_id
    }

    /// The source memory id triggers carry.
    pub fn src_id(&self) -> MemoryId {
        self.src_id
    }

    /// The destination memory (usually the peer's).
    pub fn dst(&self) -> &RegisteredMemory {
        &self.dst
    }

    /// The source memory (usually this rank's).
    pub fn src(&self) -> &RegisteredMemory {
        &self.src
    }

    fn trigger(&self, kind: TriggerType, dst_offset: u64, src_offset: u64, size: u64) -> Result<Trigger> {
        Trigger::new(TriggerFields {
            kind,
            size,
            src_memory: self.src_id,
            src_offset,
            dst_memory: self.dst_id,
            dst_offset,
            semaphore: self.semaphore_id,
        })
    }

    /// Checks the ranges and builds the triggers of a put (the last one also carrying `extra`),
    /// then pushes them; nothing is pushed when an argument is wrong. Returns the last ticket.
    fn push_put(&self, dst_offset: usize, src_offset: usize, len: usize, extra: TriggerType) -> Result<Option<u64>> {
        self.dst.check_range(dst_offset, len)?;
        self.src.check_range(src_offset, len)?;
        let (dst_offset, src_offset, len) = (dst_offset as u64, src_offset as u64, len as u64);
        if len > 0 {
            let last_dst = dst_offset + (len - 1) / self.max_chunk * self.max_chunk;
            let last_src = src_offset + (len - 1) / self.max_chunk * self.max_chunk;
            if last_dst.max(last_src) > MAX_TRIGGER_OFFSET {
                return Err(Error::invalid(format!(
                    "port channel put of {len} bytes at destination offset {dst_offset}, source offset \
                     {src_offset}: a trigger offset would exceed {MAX_TRIGGER_OFFSET} (32 bits)"
                )));
            }
        }
        let mut triggers = Vec::with_capacity(len.div_ceil(self.max_chunk) as usize + 1);
        for (d, s, n) in chunks(dst_offset, src_offset, len, self.max_chunk) {
            triggers.push(self.trigger(TriggerType::DATA, d, s, n)?);
        }
        match triggers.last_mut() {
            Some(last) if !extra.is_empty() => {
                let f = last.fields();
                *last = Trigger::new(TriggerFields { kind: f.kind | extra, ..f })?;
            }
            None if !extra.is_empty() => triggers.push(self.trigger(extra, 0, 0, 0)?),
            _ => {}
        }
        self.push_all(triggers, "port channel put")
    }

    fn push_all(&self, triggers: Vec<Trigger>, operation: &str) -> Result<Option<u64>> {
        self.proxy.check_usable()?;
        let connection = self.semaphore.connection();
        let mut ticket = None;
        for t in triggers {
            ticket = Some(self.proxy.push(t, operation, connection.as_ref())?);
        }
        Ok(ticket)
    }

    fn wait_processed(&self, ticket: u64, operation: &str) -> Result<()> {
        self.proxy.wait_processed(ticket, operation, self.semaphore.connection().as_ref())
    }

    /// Copies `len` bytes from `src[src_offset..]` to `dst[dst_offset..]` through the proxy;
    /// returns once queued. `Err(InvalidArgument)` (nothing pushed) when a range lies outside
    /// its memory or an offset does not fit a trigger.
    pub fn put(&self, dst_offset: usize, src_offset: usize, len: usize) -> Result<()> {
        self.push_put(dst_offset, src_offset, len, TriggerType::empty()).map(|_| ())
    }

    /// Signals the peer's semaphore after everything queued before on this proxy.
    pub fn signal(&self) -> Result<()> {
        let t = self.trigger(TriggerType::FLAG, 0, 0, 0)?;
        self.push_all(vec![t], "port channel signal").map(|_| ())
    }

    /// [`put`](Self::put), then [`signal`](Self::signal), in one trigger where possible.
    pub fn put_with_signal(&self, dst_offset: usize, src_offset: usize, len: usize) -> Result<()> {
        self.push_put(dst_offset, src_offset, len, TriggerType::FLAG).map(|_| ())
    }

    /// [`put_with_signal`](Self::put_with_signal), then [`flush`](Self::flush).
    pub fn put_with_signal_and_flush(&self, dst_offset: usize, src_offset: usize, len: usize) -> Result<()> {
        let ticket = self.push_put(dst_offset, src_offset, len, TriggerType::FLAG | TriggerType::SYNC)?;
        match ticket {
            Some(t) => self.wait_processed(t, "port channel put-with-signal-and-flush"),
            None => Ok(()),
        }
    }

    /// Waits (bounded) until the proxy executed everything pushed before, and the connection
    /// completed it at the peer. Returns the proxy's recorded error, if any. Before the proxy is
    /// started this waits until the timeout.
    pub fn flush(&self) -> Result<()> {
        let t = self.trigger(TriggerType::SYNC, 0, 0, 0)?;
        match self.push_all(vec![t], "port channel flush")? {
            Some(ticket) => self.wait_processed(ticket, "port channel flush"),
            None => Ok(()),
        }
    }

    /// Waits (bounded) for the peer's next signal.
    pub fn wait(&self) -> Result<()> {
        self.semaphore.wait()
    }

    /// Consumes the peer's next signal if it has arrived; never blocks.
    pub fn poll(&self) -> bool {
        self.semaphore.poll()
    }

    /// Gives the device handle the semaphore's tokens as kernels will see them: `inbound` (the
    /// token the peer signals) and `expected` (the counter a waiting kernel bumps). Each must be
    /// 8 bytes, 8-byte aligned, inside its memory and mapped here (host address, or device
    /// address for device memory).
    pub fn with_device_tokens(mut self, inbound: &Token, expected: &Token) -> Result<Self> {
        let address = |token: &Token, what: &str| -> Result<u64> {
            token.memory.check_range(token.offset, 8)?;
            let base = token.memory.as_ptr() as usize;
            if base == 0 || !(base + token.offset).is_multiple_of(8) {
                return Err(Error::invalid(format!(
                    "{what} token at offset {} of {:?} must be mapped here and 8-byte aligned",
                    token.offset,
                    token.memory.label()
                )));
            }
            Ok((base + token.offset) as u64)
        };
        self.inbound_token = address(inbound, "inbound")?;
        self.expected_inbound_token = address(expected, "expected")?;
        Ok(self)
    }

    /// The layout kernels receive for this channel (see [`PortChannelDeviceHandle`]). The FIFO
    /// addresses are valid while the proxy service's FIFO lives.
    pub fn device_handle(&self) -> PortChannelDeviceHandle {
        PortChannelDeviceHandle {
            fifo: self.proxy.fifo().device_handle(),
            inbound_token: self.inbound_token,
            expected_inbound_token: self.expected_inbound_token,
            semaphore_id: self.semaphore_id.0,
            dst: self.dst_id.0,
            src: self.src_id.0,
            reserved: 0,
        }
    }

    /// Splits puts into chunks of at most `max_chunk` bytes (tests exercise splitting without
    /// 4 GiB buffers).
    #[cfg(test)]
    fn with_max_chunk(mut self, max_chunk: u64) -> Self {
        self.max_chunk = max_chunk.clamp(1, PUT_CHUNK);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::test_support::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::{Mutex, OnceLock};
    use std::thread::ThreadId;
    use std::time::{Duration, Instant};

    const MIB: usize = 1 << 20;

    /// Deterministic pseudo-random bytes (xorshift64*).
    fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x >> 12;
                x ^= x << 25;
                x ^= x >> 27;
                (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 56) as u8
            })
            .collect()
    }

    fn channel(side: &Side) -> PortChannel {
        PortChannel::new(&side.proxy, side.semaphore_id, side.dst_id, side.src_id).unwrap()
    }

    fn start(sides: &[Side]) {
        for s in sides {
            s.proxy.start(|| Ok(())).unwrap();
        }
    }

    /// A [`pair`] of ranks joined by `len`-byte buffers, with both proxies started.
    fn started_pair(len: usize) -> [Side; 2] {
        let sides = pair(len);
        start(&sides);
        sides
    }

    fn check_put(a: &Side, b: &Side, ch_a: &PortChannel, ch_b: &PortChannel, dst: usize, src: usize, len: usize) {
        let data = random_bytes(len, (dst * 31 + src * 7 + len) as u64);
        a.data.write_bytes(src, &data).unwrap();
        ch_a.put(dst, src, len).unwrap();
        ch_a.signal().unwrap();
        ch_b.wait().unwrap();
        let mut out = vec![0u8; len];
        b.data.read_bytes(dst, &mut out).unwrap();
        assert!(out == data, "put of {len} bytes {src} -> {dst} delivered wrong data");
    }

    #[test]
    fn put_signal_wait_delivers_data() {
        let sides = started_pair(4 * MIB);
        let [a, b] = &sides;
        let (ch_a, ch_b) = (channel(a), channel(b));
        for (dst, src, len) in [(1, 4095, 1), (4095, 1, 4095), (MIB + 3, 3, MIB + 3), (0, 0, 4 * MIB)] {
            check_put(a, b, &ch_a, &ch_b, dst, src, len);
        }
        // The other direction, through B's proxy, with put_with_signal.
        let data = random_bytes(4095, 99);
        b.data.write_bytes(MIB + 3, &data).unwrap();
        ch_b.put_with_signal(1, MIB + 3, 4095).unwrap();
        ch_a.wait().unwrap();
        let mut out = vec![0u8; 4095];
        a.data.read_bytes(1, &mut out).unwrap();
        assert!(out == data);
        assert!(!ch_a.poll(), "no extra signal");
        ch_a.flush().unwrap();
        ch_b.flush().unwrap();
    }

    #[test]
    fn large_puts_are_split() {
        let sides = started_pair(2 * MIB);
        let [a, b] = &sides;
        let ch_a = channel(a).with_max_chunk(1000);
        let ch_b = channel(b);
        let head = a.proxy.fifo().head();
        check_put(a, b, &ch_a, &ch_b, 5, MIB + 3, MIB - 10);
        // ceil((MIB - 10) / 1000) DATA triggers and one FLAG trigger.
        assert_eq!(a.proxy.fifo().head() - head, (MIB as u64 - 10).div_ceil(1000) + 1);
        let head = a.proxy.fifo().head();
        ch_a.put_with_signal_and_flush(0, 0, 2500).unwrap();
        assert_eq!(a.proxy.fifo().head() - head, 3, "2500 bytes: 3 triggers, FLAG|SYNC on the last");
        assert!(ch_b.poll(), "signal arrived by the time the flush returned");
        let got: Vec<_> = chunks(10, 20, 2500, 1000).collect();
        assert_eq!(got, [(10, 20, 1000), (1010, 1020, 1000), (2010, 2020, 500)]);
        assert_eq!(chunks(0, 0, 0, 1000).count(), 0);
        assert_eq!(chunks(0, 0, 1000, 1000).count(), 1);
    }

    #[test]
    fn zero_length_puts() {
        let sides = started_pair(64);
        let [a, b] = &sides;
        let (ch_a, ch_b) = (channel(a), channel(b));
        let head = a.proxy.fifo().head();
        ch_a.put(64, 0, 0).unwrap();
        assert_eq!(a.proxy.fifo().head(), head, "an empty put pushes nothing");
        ch_a.put_with_signal(0, 64, 0).unwrap();
        ch_b.wait().unwrap();
        ch_a.put_with_signal_and_flush(3, 3, 0).unwrap();
        ch_b.wait().unwrap();
    }

    #[test]
    fn out_of_range_put_is_refused_without_pushing() {
        let sides = started_pair(4096);
        let [a, _b] = &sides;
        let ch = channel(a);
        let head = a.proxy.fifo().head();
        for (dst, src, len) in [(4095, 0, 2), (0, 4095, 2), (0, 0, 4097), (usize::MAX, 0, 2), (0, 1, usize::MAX)] {
            assert!(matches!(ch.put(dst, src, len), Err(Error::InvalidArgument(_))), "({dst}, {src}, {len})");
            assert!(matches!(ch.put_with_signal(dst, src, len), Err(Error::InvalidArgument(_))));
        }
        assert_eq!(a.proxy.fifo().head(), head, "nothing was pushed");
        ch.flush().unwrap();
        assert!(a.proxy.error().is_none(), "refused puts do not fail the proxy");
    }

    #[test]
    fn failing_trigger_is_reported_by_the_next_flush() {
        let sides = started_pair(4096);
        let [a, _b] = &sides;
        let ch = channel(a);
        let bad = Trigger::new(TriggerFields {
            kind: TriggerType::DATA,
            size: 16,
            src_memory: a.src_id,
            src_offset: 4090,
            dst_memory: a.dst_id,
            dst_offset: 0,
            semaphore: a.semaphore_id,
        })
        .unwrap();
        let abort = AtomicBool::new(false);
        a.proxy.fifo().push(bad, &test_ctx(&abort)).unwrap();
        let r = ch.flush();
        assert!(matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("proxy trigger #0")), "{r:?}");
        assert!(matches!(ch.signal(), Err(Error::InvalidArgument(_))), "a failed proxy refuses pushes");
        assert!(matches!(ch.put(0, 0, 1), Err(Error::InvalidArgument(_))));
        assert!(matches!(a.proxy.error(), Some(Error::InvalidArgument(_))));
    }

    #[test]
    fn init_hook_runs_first_on_the_proxy_thread() {
        let [a, b] = pair(64);
        let ch = channel(&a);
        ch.signal().unwrap(); // queued before start: must not run before the hook
        let seen: Arc<OnceLock<(ThreadId, u64)>> = Arc::default();
        let (seen2, peer_token) = (Arc::clone(&seen), b.token.clone());
        a.proxy
            .start(move || {
                std::thread::sleep(Duration::from_millis(20));
                let _ = seen2.set((std::thread::current().id(), peer_token.load_u64(0)?));
                Ok(())
            })
            .unwrap();
        ch.flush().unwrap();
        let (hook_thread, token_during_hook) = *seen.get().expect("hook ran");
        assert_eq!(Some(hook_thread), a.proxy.thread_id());
        assert_ne!(hook_thread, std::thread::current().id());
        assert_eq!(token_during_hook, 0, "the signal queued before start ran before the hook");
        assert_eq!(b.semaphore.received(), 1);
    }

    #[test]
    fn failing_init_hook_is_reported() {
        let [a, _b] = pair(64);
        let ch = channel(&a);
        a.proxy
            .start(|| Err(Error::Cuda { operation: "cuCtxSetCurrent".into(), message: "no device".into() }))
            .unwrap();
        let start = Instant::now();
        let r = ch.flush();
        assert!(matches!(&r, Err(Error::Cuda { operation, .. }) if operation == "cuCtxSetCurrent"), "{r:?}");
        assert!(start.elapsed() < Duration::from_secs(1), "noticed without waiting for the timeout");
        assert!(matches!(ch.signal(), Err(Error::Cuda { .. })));
        assert!(matches!(a.proxy.error(), Some(Error::Cuda { .. })));
        let deadline = Instant::now() + TIMEOUT;
        while a.proxy.is_running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!a.proxy.is_running(), "the thread exits after a failed hook");
    }

    #[test]
    fn channels_outlive_their_proxy_and_report_it_stopped() {
        let [a, b] = pair(64);
        let ch = channel(&a);
        for _ in 0..200 {
            ch.signal().unwrap();
        }
        drop_while_starting(a.proxy);
        assert!(b.semaphore.received() < 200);
        assert!(matches!(ch.signal(), Err(Error::Aborted(_))));
        assert!(matches!(ch.flush(), Err(Error::Aborted(_))));
    }

    #[test]
    fn flush_waits_for_a_full_fifo_and_many_threads_share_a_channel() {
        let sides = pair_with(4096, 4);
        start(&sides);
        let [a, b] = &sides;
        let ch = channel(a);
        let errors = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for t in 0..4usize {
                let (ch, errors) = (&ch, &errors);
                s.spawn(move || {
                    for i in 0..250 {
                        let off = (t * 250 + i) % 4096;
                        if let Err(e) = ch.put_with_signal(off, off, 1) {
                            errors.lock().unwrap().push(e.to_string());
                        }
                    }
                });
            }
        });
        assert!(errors.lock().unwrap().is_empty(), "{:?}", errors.lock().unwrap());
        ch.flush().unwrap();
        assert_eq!(b.semaphore.received(), 1000);
    }

    #[test]
    fn device_handle_layout() {
        let [a, b] = pair(64);
        let ch = channel(&a);
        let h = ch.device_handle();
        assert_eq!((h.semaphore_id, h.dst, h.src), (a.semaphore_id.0, a.dst_id.0, a.src_id.0));
        assert_eq!(h.fifo, a.proxy.fifo().device_handle());
        assert_eq!((h.inbound_token, h.expected_inbound_token), (0, 0));
        let inbound = Token { memory: a.token.clone(), offset: 0 };
        let expected = Token { memory: a.token.clone(), offset: 8 };
        let h = ch.clone().with_device_tokens(&inbound, &expected).unwrap().device_handle();
        assert_eq!(h.inbound_token, a.token.as_ptr() as u64);
        assert_eq!(h.expected_inbound_token, a.token.as_ptr() as u64 + 8);
        let misaligned = Token { memory: a.token.clone(), offset: 4 };
        assert!(matches!(ch.clone().with_device_tokens(&inbound, &misaligned), Err(Error::InvalidArgument(_))));
        let outside = Token { memory: b.token.clone(), offset: 64 };
        assert!(matches!(ch.with_device_tokens(&outside, &inbound), Err(Error::InvalidArgument(_))));
    }
}
