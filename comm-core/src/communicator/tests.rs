//! The communicator's tests, and the helpers other modules' tests use to run ranks as threads
//! over the loopback transport.

use super::*;
use crate::loopback::{LoopbackBootstrap, LoopbackTransport};
use crate::memory::{MemoryKind, MemoryRegion};
use std::time::Duration;

/// Runs `f` on `n` ranks (threads) over the loopback transport, 5 s timeout.
pub(crate) fn run<F>(n: usize, f: F)
where
    F: Fn(Communicator) + Sync,
{
    run_with(n, Duration::from_secs(5), f)
}

/// [`run`] with another timeout.
pub(crate) fn run_with<F>(n: usize, timeout: Duration, f: F)
where
    F: Fn(Communicator) + Sync,
{
    let group = LoopbackBootstrap::group(n, timeout);
    let config = Config { timeout, ..Config::default() };
    std::thread::scope(|s| {
        for b in group {
            let (f, config) = (&f, config.clone());
            s.spawn(move || {
                let comm =
                    Communicator::builder(b).with_transport(LoopbackTransport).with_config(config).build().unwrap();
                f(comm)
            });
        }
    });
}

/// A user's bootstrap that breaks its contract: a rank outside its world, or an all-gather
/// that drops entries.
struct Contrary {
    inner: LoopbackBootstrap,
    rank_beyond: bool,
    short_gather: bool,
}

impl Bootstrap for Contrary {
    fn rank(&self) -> usize {
        if self.rank_beyond { self.inner.world_size() } else { self.inner.rank() }
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn local_rank(&self) -> usize {
        self.inner.local_rank()
    }
    fn local_world_size(&self) -> usize {
        self.inner.local_world_size()
    }
    fn job_key(&self) -> String {
        self.inner.job_key()
    }
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
    fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        self.inner.send(peer, tag, data)
    }
    fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        self.inner.recv(peer, tag)
    }
    fn all_gather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        let mut all = self.inner.all_gather(data)?;
        if self.short_gather {
            all.pop();
        }
        Ok(all)
    }
}

#[test]
fn a_bootstrap_that_breaks_its_contract_is_refused_with_an_error() {
    for (rank_beyond, short_gather) in [(true, false), (false, true)] {
        let inner = LoopbackBootstrap::group(1, Duration::from_secs(5)).pop().unwrap();
        let b = Contrary { inner, rank_beyond, short_gather };
        let e = Communicator::builder(b).with_transport(LoopbackTransport).build().unwrap_err().to_string();
        let said = if rank_beyond { "rank 1 of 1" } else { "returned 0 entries for a 1-rank job" };
        assert!(e.contains(said), "{e}");
    }
}

#[test]
fn exchange_and_memory_channels_between_all_pairs() {
    for n in [1, 2, 3, 4] {
        run(n, |comm| {
            let me = comm.rank();
            let n = comm.world_size();
            let buf = comm.register_host(64 * n, "buf").unwrap();
            let all = comm.exchange(&buf).unwrap();
            assert_eq!(all.len(), n);
            let channels: Vec<_> =
                (0..n).filter(|&p| p != me).map(|p| comm.memory_channel(&buf, &all[p]).unwrap()).collect();
            buf.write_bytes(64 * me, &[me as u8 + 1; 64]).unwrap();
            for ch in &channels {
                ch.put_with_signal(64 * me, 64 * me, 64).unwrap();
            }
            for ch in &channels {
                ch.wait().unwrap();
            }
            for p in (0..n).filter(|&p| p != me) {
                let mut got = [0u8; 64];
                buf.read_bytes(64 * p, &mut got).unwrap();
                assert_eq!(got, [p as u8 + 1; 64], "rank {me} slot of {p}");
            }
        });
    }
}

#[test]
fn port_channels_move_data_through_the_proxy() {
    run(3, |comm| {
        let (me, n) = (comm.rank(), comm.world_size());
        let buf = comm.register_host(4096 * n, "port").unwrap();
        let all = comm.exchange(&buf).unwrap();
        let proxy = comm.proxy().unwrap();
        let channels: Vec<_> =
            (0..n).filter(|&p| p != me).map(|p| comm.port_channel(&proxy, &buf, &all[p]).unwrap()).collect();
        proxy.start(|| Ok(())).unwrap();
        buf.write_bytes(4096 * me, &[me as u8 + 7; 4096]).unwrap();
        for ch in &channels {
            ch.put_with_signal(4096 * me, 4096 * me, 4096).unwrap();
        }
        for ch in &channels {
            ch.flush().unwrap();
            ch.wait().unwrap();
        }
        for p in (0..n).filter(|&p| p != me) {
            let mut got = vec![0u8; 4096];
            buf.read_bytes(4096 * p, &mut got).unwrap();
            assert!(got.iter().all(|&b| b == p as u8 + 7), "rank {me} from {p}");
        }
        assert!(matches!(channels[0].put(4096 * n - 1, 0, 2), Err(Error::InvalidArgument(_))));
    });
}

#[test]
fn a_build_given_a_cancel_flag_ends_when_it_is_set() {
    // Rank 1 of 2 never builds: rank 0's endpoint exchange waits for it (60 s at the most)
    // until the flag is set.
    let mut group = LoopbackBootstrap::group(2, Duration::from_secs(60));
    let _absent = group.pop();
    let b = group.pop().unwrap();
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = cancel.clone();
    let building = std::thread::spawn(move || {
        Communicator::builder(b).with_transport(LoopbackTransport).with_cancel_flag(flag).build().map(|_| ())
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(!building.is_finished(), "the build did not wait for rank 1");
    let started = std::time::Instant::now();
    cancel.store(true, Ordering::Release);
    let built = building.join().unwrap();
    assert!(matches!(&built, Err(Error::Aborted(_))), "{built:?}");
    // Far below the timeout, far above a loaded machine's delay (other tests run 256 threads).
    assert!(started.elapsed() < Duration::from_secs(10), "the build took {:?} to end", started.elapsed());
    // A flag set before the build begins ends it at once.
    let b = LoopbackBootstrap::group(1, Duration::from_secs(5)).pop().unwrap();
    let set = Arc::new(AtomicBool::new(true));
    let built = Communicator::builder(b).with_transport(LoopbackTransport).with_cancel_flag(set).build();
    assert!(matches!(&built, Err(Error::Aborted(_))), "{:?}", built.map(|_| ()));
}

#[test]
fn weave_transports_filters_factories_by_name() {
    let build = |allowed: &str| {
        let b = LoopbackBootstrap::group(1, Duration::from_secs(5)).pop().unwrap();
        let set = crate::config::TransportSet::parse(allowed).unwrap();
        let config = Config { transports: Some(set), ..Config::default() };
        Communicator::builder(b).with_transport(LoopbackTransport).with_config(config).build()
    };
    let r = build("not-compiled-in");
    assert!(matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("allows not-compiled-in")), "{r:?}");
    let comm = build("not-compiled-in,loopback").unwrap();
    assert!(comm.backend(crate::loopback::transport()).is_some());
}

#[test]
fn writes_past_the_registered_range_are_invalid() {
    run(2, |comm| {
        let buf = comm.register_host(100, "small").unwrap();
        let all = comm.exchange(&buf).unwrap();
        let ch = comm.memory_channel(&buf, &all[1 - comm.rank()]).unwrap();
        assert!(matches!(ch.put(90, 0, 11), Err(Error::InvalidArgument(_))));
        assert!(matches!(ch.put(0, 95, 6), Err(Error::InvalidArgument(_))));
        assert!(matches!(ch.get(usize::MAX, 0, 2), Err(Error::InvalidArgument(_))));
        ch.put(90, 0, 10).unwrap();
    });
}

/// Loopback, whose connections count the calls of `finish_before_release`.
struct Counting(Arc<AtomicU64>);

struct CountingBackend(Arc<dyn TransportBackend>, Arc<AtomicU64>);

struct CountingConnection(Arc<dyn Connection>, Arc<AtomicU64>);

impl TransportFactory for Counting {
    fn transport(&self) -> Transport {
        crate::loopback::transport()
    }
    fn open(&self, ctx: &TransportContext) -> Result<Arc<dyn TransportBackend>> {
        Ok(Arc::new(CountingBackend(LoopbackTransport.open(ctx)?, self.0.clone())))
    }
}

impl TransportBackend for CountingBackend {
    fn transport(&self) -> Transport {
        self.0.transport()
    }
    fn local_endpoint(&self) -> Result<Vec<u8>> {
        self.0.local_endpoint()
    }
    fn can_reach(&self, a: &[u8], b: &[u8]) -> Result<bool> {
        self.0.can_reach(a, b)
    }
    fn direct_access(&self) -> bool {
        self.0.direct_access()
    }
    fn allocate(&self, len: usize, kind: MemoryKind) -> Result<Arc<dyn MemoryRegion>> {
        self.0.allocate(len, kind)
    }
    fn export(&self, region: &Arc<dyn MemoryRegion>) -> Result<Option<Vec<u8>>> {
        self.0.export(region)
    }
    fn import(&self, export: crate::transport::PeerExport<'_>) -> Result<Arc<dyn MemoryRegion>> {
        self.0.import(export)
    }
    fn connect(&self, peer: usize, peer_endpoint: &[u8]) -> Result<Arc<dyn Connection>> {
        Ok(Arc::new(CountingConnection(self.0.connect(peer, peer_endpoint)?, self.1.clone())))
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Connection for CountingConnection {
    fn transport(&self) -> Transport {
        self.0.transport()
    }
    fn peer(&self) -> usize {
        self.0.peer()
    }
    fn write_checked(&self, write: crate::connection::CheckedWrite<'_>) -> Result<()> {
        self.0.write_checked(write)
    }
    fn update_and_sync(&self, dst: &RegisteredMemory, dst_offset: usize, value: u64) -> Result<()> {
        self.0.update_and_sync(dst, dst_offset, value)
    }
    fn flush(&self) -> Result<()> {
        self.0.flush()
    }
    fn finish_before_release(&self) {
        self.1.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn a_communicator_going_lets_each_connection_finish_unless_aborted() {
    for abort in [false, true] {
        let finished = Arc::new(AtomicU64::new(0));
        let group = LoopbackBootstrap::group(3, Duration::from_secs(5));
        std::thread::scope(|s| {
            for b in group {
                let finished = finished.clone();
                s.spawn(move || {
                    let comm = Communicator::builder(b).with_transport(Counting(finished.clone())).build().unwrap();
                    let me = comm.rank();
                    for peer in (0..3).filter(|&p| p != me) {
                        comm.connection(peer).unwrap();
                    }
                    if abort {
                        comm.abort();
                    }
                    drop(comm);
                });
            }
        });
        // Three ranks, two connections each: each finished once, or none after an abort.
        assert_eq!(finished.load(Ordering::Relaxed), if abort { 0 } else { 6 });
    }
}
