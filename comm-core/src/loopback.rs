//! The in-process loopback transport and bootstrap: ranks are threads of one process.
//!
//! They exist so that the connection, semaphore, channel and communicator logic can be tested
//! without other processes, and as the smallest example of a transport: read this file to see
//! what a transport crate implements.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Duration;

use crate::bootstrap::Bootstrap;
use crate::connection::{Connection, DirectConnection};
use crate::deadline::Deadline;
use crate::error::{Error, Result};
use crate::memory::{HeapRegion, HostRegion, MemoryKind, MemoryRegion};
use crate::transport::{PeerExport, Transport, TransportBackend, TransportContext, TransportFactory};
use crate::wire::{Decoder, Encoder};

const ENDPOINT_MAGIC: [u8; 4] = *b"WVLE";
const EXPORT_MAGIC: [u8; 4] = *b"WVLX";
const WIRE_VERSION: u16 = 1;

/// Regions exported through the loopback transport, by key. Importers look regions up here
/// instead of trusting an address from the peer.
fn registry() -> &'static Mutex<HashMap<u64, Weak<LoopbackRegion>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<u64, Weak<LoopbackRegion>>>> = OnceLock::new();
    REGISTRY.get_or_init(|| Mutex::new(HashMap::new()))
}

fn next_key() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Identifies this process instance (pid alone can repeat across reboots or containers).
fn process_nonce() -> u64 {
    static NONCE: OnceLock<u64> = OnceLock::new();
    *NONCE.get_or_init(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        crate::wire::digest64(&[&t.to_le_bytes(), &std::process::id().to_le_bytes()])
    })
}

/// The name the loopback transport registers.
pub const NAME: &str = "loopback";

crate::transport_id!(NAME);

/// The loopback transport factory: hand it to the communicator builder in in-process tests.
#[derive(Debug, Default, Clone, Copy)]
pub struct LoopbackTransport;

impl TransportFactory for LoopbackTransport {
    fn transport(&self) -> Transport {
        transport()
    }

    fn open(&self, ctx: &TransportContext) -> Result<Arc<dyn TransportBackend>> {
        Ok(Arc::new(LoopbackBackend { rank: ctx.rank }))
    }
}

/// The loopback transport serving one communicator.
#[derive(Debug)]
pub struct LoopbackBackend {
    rank: usize,
}

/// A heap region that loopback peers in the same process can import.
pub struct LoopbackRegion {
    heap: HeapRegion,
    key: u64,
}

impl Drop for LoopbackRegion {
    fn drop(&mut self) {
        let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        reg.remove(&self.key);
    }
}

impl HostRegion for LoopbackRegion {
    fn host_base(&self) -> *mut u8 {
        self.heap.as_ptr()
    }
    fn host_len(&self) -> usize {
        self.heap.len()
    }
}

fn decode_endpoint(bytes: &[u8]) -> Result<(u32, u64)> {
    let mut d = Decoder::new(bytes, ENDPOINT_MAGIC, WIRE_VERSION, "loopback endpoint")?;
    let pid = d.u32()?;
    let nonce = d.u64()?;
    d.finish()?;
    Ok((pid, nonce))
}

impl TransportBackend for LoopbackBackend {
    fn transport(&self) -> Transport {
        transport()
    }

    fn local_endpoint(&self) -> Result<Vec<u8>> {
        Ok(Encoder::new(ENDPOINT_MAGIC, WIRE_VERSION).u32(std::process::id()).u64(process_nonce()).finish())
    }

    fn can_reach(&self, a: &[u8], b: &[u8]) -> Result<bool> {
        Ok(decode_endpoint(a)? == decode_endpoint(b)?)
    }

    fn direct_access(&self) -> bool {
        true
    }

    fn allocate(&self, len: usize, kind: MemoryKind) -> Result<Arc<dyn MemoryRegion>> {
        if kind != MemoryKind::Host {
            return Err(Error::Unsupported(format!("loopback transport cannot allocate {kind:?} memory")));
        }
        let region = Arc::new(LoopbackRegion { heap: HeapRegion::new(len)?, key: next_key() });
        registry().lock().unwrap_or_else(|p| p.into_inner()).insert(region.key, Arc::downgrade(&region));
        Ok(region)
    }

    fn export(&self, region: &Arc<dyn MemoryRegion>) -> Result<Option<Vec<u8>>> {
        let Some(r) = region.as_any().downcast_ref::<LoopbackRegion>() else { return Ok(None) };
        Ok(Some(Encoder::new(EXPORT_MAGIC, WIRE_VERSION).u64(r.key).finish()))
    }

    fn import(&self, export: PeerExport<'_>) -> Result<Arc<dyn MemoryRegion>> {
        let PeerExport { peer, peer_endpoint, payload, len, kind } = export;
        let (pid, nonce) = decode_endpoint(peer_endpoint)?;
        if pid != std::process::id() || nonce != process_nonce() {
            return Err(Error::transport(NAME, format!("rank {peer} is in another process")));
        }
        if kind != MemoryKind::Host {
            return Err(Error::protocol(format!("loopback import from rank {peer}: {kind:?} memory")));
        }
        let mut d = Decoder::new(payload, EXPORT_MAGIC, WIRE_VERSION, "loopback export")?;
        let key = d.u64()?;
        d.finish()?;
        let region = registry()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .and_then(Weak::upgrade)
            .ok_or_else(|| Error::transport(NAME, format!("rank {peer} exported region {key}, which is gone")))?;
        if region.len() < len {
            return Err(Error::protocol(format!("loopback import from rank {peer}: region shorter than {len} bytes")));
        }
        Ok(region)
    }

    fn connect(&self, peer: usize, _peer_endpoint: &[u8]) -> Result<Arc<dyn Connection>> {
        if peer == self.rank {
            return Err(Error::invalid("a loopback connection needs a peer other than this rank"));
        }
        Ok(Arc::new(DirectConnection::new(transport(), peer, Box::new(|| Ok(())))))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

type Mailboxes = HashMap<(usize, usize, u64), VecDeque<Vec<u8>>>;

struct Shared {
    boxes: Mutex<Mailboxes>,
    /// One per rank, signalled when a message for that rank arrives (or a rank leaves): a
    /// message wakes only its receiver, not every thread of a large group.
    arrived: Vec<Condvar>,
    gone: Vec<AtomicBool>,
    job_key: String,
}

/// A bootstrap whose ranks are threads of this process, for tests.
pub struct LoopbackBootstrap {
    shared: Arc<Shared>,
    rank: usize,
    timeout: Duration,
}

/// How often a loopback receive that an abort may end looks at its flag.
const ABORT_LOOK: Duration = Duration::from_millis(5);

impl LoopbackBootstrap {
    /// The next message from `peer` under `tag`, waiting at most the timeout, and giving up
    /// once `abort` (where given) is set, looking at it every [`ABORT_LOOK`].
    fn recv_until(&self, peer: usize, tag: u64, abort: Option<&AtomicBool>) -> Result<Vec<u8>> {
        self.check_peer(peer)?;
        let deadline = Deadline::after(self.timeout);
        let mut boxes = self.shared.boxes.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(m) = boxes.get_mut(&(peer, self.rank, tag)).and_then(VecDeque::pop_front) {
                return Ok(m);
            }
            if self.shared.gone[peer].load(Ordering::Acquire) {
                return Err(Error::peer_lost(
                    peer,
                    format!("loopback recv tag {tag:#x}"),
                    "peer dropped its bootstrap",
                ));
            }
            if abort.is_some_and(|a| a.load(Ordering::Acquire)) {
                return Err(Error::Aborted(format!("loopback recv tag {tag:#x} from rank {peer} was aborted")));
            }
            let left = deadline.remaining();
            if left.is_zero() {
                return Err(Error::timeout(format!("loopback recv tag {tag:#x}"), Some(peer), deadline.elapsed()));
            }
            let nap = if abort.is_some() { left.min(ABORT_LOOK) } else { left };
            let arrived = &self.shared.arrived[self.rank];
            boxes = arrived.wait_timeout(boxes, nap).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// Creates the bootstraps of an `n`-rank group, one per thread-rank.
    pub fn group(n: usize, timeout: Duration) -> Vec<LoopbackBootstrap> {
        let shared = Arc::new(Shared {
            boxes: Mutex::new(HashMap::new()),
            arrived: (0..n).map(|_| Condvar::new()).collect(),
            gone: (0..n).map(|_| AtomicBool::new(false)).collect(),
            job_key: format!("lb{:014x}", next_key() ^ (process_nonce() & 0xffff_ffff_ffff)),
        });
        (0..n).map(|rank| LoopbackBootstrap { shared: shared.clone(), rank, timeout }).collect()
    }

    /// Makes this rank vanish as a killed process would: peers see it lost, and its own sends
    /// and notice reads fail from now on (for fault tests).
    pub fn kill(&self) {
        self.shared.gone[self.rank].store(true, Ordering::Release);
        drop(self.shared.boxes.lock().unwrap_or_else(|p| p.into_inner()));
        for c in &self.shared.arrived {
            c.notify_all();
        }
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.shared.gone.len() {
            return Err(Error::invalid(format!(
                "rank {} cannot talk to rank {peer} in a {}-rank loopback group",
                self.rank,
                self.shared.gone.len()
            )));
        }
        Ok(())
    }
}

impl Drop for LoopbackBootstrap {
    fn drop(&mut self) {
        self.shared.gone[self.rank].store(true, Ordering::Release);
        // Taking the lock orders the store before any waiter's next look at `gone`.
        drop(self.shared.boxes.lock().unwrap_or_else(|p| p.into_inner()));
        for c in &self.shared.arrived {
            c.notify_all();
        }
    }
}

impl Bootstrap for LoopbackBootstrap {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.shared.gone.len()
    }
    fn local_rank(&self) -> usize {
        self.rank
    }
    fn local_world_size(&self) -> usize {
        self.shared.gone.len()
    }
    fn job_key(&self) -> String {
        self.shared.job_key.clone()
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn peer_lost(&self, peer: usize) -> Option<String> {
        let gone = self.shared.gone.get(peer)?.load(Ordering::Acquire);
        (gone && peer != self.rank).then(|| "peer dropped its bootstrap".to_string())
    }

    fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        self.check_peer(peer)?;
        if self.shared.gone[self.rank].load(Ordering::Acquire) {
            return Err(Error::Aborted(format!("loopback rank {} was killed", self.rank)));
        }
        if self.shared.gone[peer].load(Ordering::Acquire) {
            return Err(Error::peer_lost(peer, format!("loopback send tag {tag:#x}"), "peer dropped its bootstrap"));
        }
        let mut boxes = self.shared.boxes.lock().unwrap_or_else(|p| p.into_inner());
        if tag == crate::bootstrap::TAG_NOTICE {
            // One queue of notices per receiver, each prefixed with its sender.
            let mut notice = (self.rank as u64).to_le_bytes().to_vec();
            notice.extend_from_slice(data);
            boxes.entry((NOTICES, peer, tag)).or_default().push_back(notice);
        } else {
            boxes.entry((self.rank, peer, tag)).or_default().push_back(data.to_vec());
        }
        self.shared.arrived[peer].notify_all();
        Ok(())
    }

    fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        self.recv_until(peer, tag, None)
    }

    fn recv_or_abort(&self, peer: usize, tag: u64, abort: &AtomicBool) -> Result<Vec<u8>> {
        self.recv_until(peer, tag, Some(abort))
    }

    fn carries_notices(&self) -> bool {
        true
    }

    fn recv_notice(&self, timeout: Duration) -> Result<Option<(usize, Vec<u8>)>> {
        let deadline = Deadline::after(timeout);
        let mut boxes = self.shared.boxes.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let key = (NOTICES, self.rank, crate::bootstrap::TAG_NOTICE);
            if let Some(mut m) = boxes.get_mut(&key).and_then(VecDeque::pop_front) {
                let from =
                    m.get(..8).map_or(usize::MAX, |b| u64::from_le_bytes(b.try_into().unwrap_or([0xff; 8])) as usize);
                m.drain(..8.min(m.len()));
                return Ok(Some((from, m)));
            }
            if self.shared.gone[self.rank].load(Ordering::Acquire) {
                return Err(Error::Aborted(format!("loopback rank {} was killed", self.rank)));
            }
            let left = deadline.remaining();
            if left.is_zero() {
                return Ok(None);
            }
            let arrived = &self.shared.arrived[self.rank];
            boxes = arrived.wait_timeout(boxes, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

/// The sender slot of the notice queues' keys (no rank has it).
const NOTICES: usize = usize::MAX;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_collectives_and_tags() {
        let group = LoopbackBootstrap::group(3, Duration::from_secs(5));
        std::thread::scope(|s| {
            for b in &group {
                s.spawn(move || {
                    let all = b.all_gather(&[b.rank() as u8]).unwrap();
                    assert_eq!(all, vec![vec![0], vec![1], vec![2]]);
                    assert_eq!(b.broadcast(1, &[b.rank() as u8 + 10]).unwrap(), vec![11]);
                    b.barrier().unwrap();
                    let next = (b.rank() + 1) % 3;
                    let prev = (b.rank() + 2) % 3;
                    b.send(next, 7, b"seven").unwrap();
                    b.send(next, 8, b"eight").unwrap();
                    assert_eq!(b.recv(prev, 8).unwrap(), b"eight");
                    assert_eq!(b.recv(prev, 7).unwrap(), b"seven");
                });
            }
        });
    }

    #[test]
    fn recv_times_out_and_notices_dropped_peers() {
        let mut group = LoopbackBootstrap::group(2, Duration::from_millis(50));
        let r = group[0].recv(1, 1);
        assert!(matches!(r, Err(Error::Timeout { peer: Some(1), .. })), "{r:?}");
        group.pop();
        assert!(matches!(group[0].recv(1, 1), Err(Error::PeerLost { peer: 1, .. })));
        assert!(matches!(group[0].send(2, 1, &[]), Err(Error::InvalidArgument(_))), "no rank 2");
        group[0].send(0, 1, b"self").unwrap();
        assert_eq!(group[0].recv(0, 1).unwrap(), b"self", "a rank's message to itself");
    }

    #[test]
    fn import_refuses_foreign_endpoints_and_unknown_keys() {
        let b = LoopbackBackend { rank: 0 };
        let ep = b.local_endpoint().unwrap();
        let other = Encoder::new(ENDPOINT_MAGIC, WIRE_VERSION).u32(std::process::id() + 1).u64(1).finish();
        assert!(!b.can_reach(&ep, &other).unwrap());
        assert!(b.can_reach(&ep, &b"junk"[..]).is_err());
        let import = |peer_endpoint: &[u8], payload: &[u8], len: usize| {
            b.import(PeerExport { peer: 1, peer_endpoint, payload, len, kind: MemoryKind::Host })
        };
        let payload = Encoder::new(EXPORT_MAGIC, WIRE_VERSION).u64(u64::MAX).finish();
        assert!(import(&ep, &payload, 8).is_err());
        assert!(import(&other, &payload, 8).is_err());
        let region = b.allocate(100, MemoryKind::Host).unwrap();
        let payload = b.export(&region).unwrap().unwrap();
        let imported = import(&ep, &payload, 100).unwrap();
        assert_eq!(imported.as_ptr(), region.as_ptr());
        assert!(import(&ep, &payload, 101).is_err());
        assert!(import(&ep, &payload[..payload.len() - 1], 100).is_err());
    }
}
