//! Two ranks' proxies over loopback memory, for the proxy's and the port channels' tests.

use super::*;
use crate::connection::DirectConnection;
use crate::fifo::DEFAULT_FIFO_CAPACITY;
use crate::loopback::transport;
use crate::memory::{HeapRegion, MemoryDescriptor, MemoryKind, MemoryRegion};
use crate::semaphore::Token;
use std::time::Instant;

/// Timeout for every wait in these tests.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(2);

/// One rank's view: its proxy, its own memories, and the peer's imported ones.
pub(crate) struct Side {
    pub(crate) proxy: ProxyService,
    /// This rank's data buffer (local).
    pub(crate) data: RegisteredMemory,
    /// This rank's inbound token memory (local).
    pub(crate) token: RegisteredMemory,
    /// The semaphore towards the peer.
    pub(crate) semaphore: Arc<HostSemaphore>,
    pub(crate) semaphore_id: SemaphoreId,
    /// Id of `data` in this rank's proxy.
    pub(crate) src_id: MemoryId,
    /// Id of the peer's data buffer (imported) in this rank's proxy.
    pub(crate) dst_id: MemoryId,
}

fn registered(region: &Arc<dyn MemoryRegion>, owner: usize, seq: u64, label: &str, local: bool) -> RegisteredMemory {
    let descriptor = MemoryDescriptor::new(owner, seq, label, MemoryKind::Host, region.len(), Vec::new());
    RegisteredMemory::new(descriptor, Arc::clone(region), transport(), local).unwrap()
}

/// Ranks 0 and 1, each with a `data_len`-byte buffer, a token, a semaphore towards the
/// other and an unstarted proxy with FIFO capacity `capacity`.
pub(crate) fn pair_with(data_len: usize, capacity: u32) -> [Side; 2] {
    let abort = Arc::new(AtomicBool::new(false));
    let region = |len| -> Arc<dyn MemoryRegion> { Arc::new(HeapRegion::new(len).unwrap()) };
    let data = [region(data_len), region(data_len)];
    let tokens = [region(64), region(64)];
    [0usize, 1].map(|rank| {
        let peer = 1 - rank;
        let local_data = registered(&data[rank], rank, 0, "data", true);
        let local_token = registered(&tokens[rank], rank, 1, "token", true);
        let peer_data = registered(&data[peer], peer, 0, "data", false);
        let peer_token = registered(&tokens[peer], peer, 1, "token", false);
        let connection: Arc<dyn Connection> = Arc::new(DirectConnection::new(transport(), peer, Box::new(|| Ok(()))));
        let semaphore = Arc::new(
            HostSemaphore::new(
                connection,
                Token { memory: local_token.clone(), offset: 0 },
                Token { memory: peer_token, offset: 0 },
                TIMEOUT,
                Arc::clone(&abort),
            )
            .unwrap(),
        );
        let proxy = ProxyService::new(capacity, TIMEOUT, Arc::clone(&abort)).unwrap();
        let src_id = proxy.add_memory(local_data.clone()).unwrap();
        let dst_id = proxy.add_memory(peer_data).unwrap();
        let semaphore_id = proxy.add_semaphore(Arc::clone(&semaphore)).unwrap();
        Side { proxy, data: local_data, token: local_token, semaphore, semaphore_id, src_id, dst_id }
    })
}

/// [`pair_with`] and the default FIFO capacity.
pub(crate) fn pair(data_len: usize) -> [Side; 2] {
    pair_with(data_len, DEFAULT_FIFO_CAPACITY)
}

/// Starts `proxy` with a thread-init hook that sleeps 300 ms, so what was pushed before
/// stays pending, then drops it: the drop stops and joins the thread within a second,
/// without waiting for the hook's end to drain the FIFO.
pub(crate) fn drop_while_starting(proxy: ProxyService) {
    proxy
        .start(|| {
            std::thread::sleep(Duration::from_millis(300));
            Ok(())
        })
        .unwrap();
    let start = Instant::now();
    drop(proxy);
    assert!(start.elapsed() < Duration::from_secs(1), "drop took {:?}", start.elapsed());
}

/// A wait context for pushing straight into a FIFO.
pub(crate) fn test_ctx(abort: &AtomicBool) -> WaitContext<'_> {
    WaitContext { operation: "test push", peer: None, timeout: TIMEOUT, abort, check_peer: &|| Ok(()) }
}
