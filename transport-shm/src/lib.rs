//! # transport-shm
//!
//! weave's shared-memory transport: host buffers shared between processes of one host through
//! POSIX shared memory (`shm_open` + `mmap`). Hand [`ShmTransport`] to the communicator builder;
//! it opens one [`ShmBackend`] per communicator.
//!
//! ## Reachability
//!
//! Each rank's endpoint carries its hostname, boot id (`/proc/sys/kernel/random/boot_id`), the
//! device number of its `/dev/shm` mount, its pid namespace, pid and effective uid. Two ranks
//! use this transport only when all but the pid are equal: same host and boot, same `/dev/shm`
//! (containers with private mounts cannot share), same pid namespace (so the peer's pid can be
//! watched), same user (segments are 0600).
//!
//! ## Naming
//!
//! A segment is named `/weave-{job_key}-r{rank}-c{communicator_id}-{counter}` (the file
//! `/dev/shm/weave-…`): the job key comes from the job secret, so jobs never collide and a
//! job's leftovers can be listed ([`job_segments`]); the owner's rank, the communicator and a
//! per-process counter make names unique within a job. A name received from rank `p` is only
//! opened if it has exactly this form with `r{p}` and this job's key, so a peer cannot make a
//! rank open arbitrary shared-memory objects.
//!
//! ## Permissions
//!
//! Segments are created with `O_CREAT | O_EXCL` and mode 0600 (set again with `fchmod`, whatever
//! the umask), so only processes of the same user can open them. An importer checks with `fstat`
//! that the segment belongs to its own effective uid and holds the announced length before it
//! maps it. The whole segment is reserved with `posix_fallocate` at allocation, so a full
//! `/dev/shm` is an error from `allocate` rather than a `SIGBUS` later.
//!
//! ## Seal protocol
//!
//! The owner creates and maps a segment, exports its name, and every peer that needs it opens
//! and maps it. Once all have (the communicator knows, after its registration exchange), the
//! owner's [`seal`](comm_core::memory::MemoryRegion::seal) removes the name with `shm_unlink`.
//! The memory itself lives on as long as any process maps it, and the kernel frees it when the
//! last mapping goes — also when processes are killed. An owner region dropped before it was
//! sealed removes its name on drop; imported regions never remove names.
//!
//! ## When a rank dies
//!
//! - After sealing: nothing of it is left in `/dev/shm`; its segments vanish with the last
//!   process that maps them. Ranks waiting on it notice within about a millisecond through the
//!   connection's peer check ([`Error::PeerLost`]: the pid is gone,
//!   a zombie, or reused) and otherwise at their timeout.
//! - Between allocating and sealing (during setup): its unsealed segments stay in `/dev/shm`
//!   until removed; the surviving ranks' setup fails (their import finds no segment, or their
//!   bootstrap loses the peer). [`remove_job_segments`] cleans up after such a job.
//!
//! Same-user processes trust each other here as everywhere on Unix: a peer that shrinks a
//! segment it shared can make the importer fault. weave peers never do.

mod endpoint;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
mod segment;

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use comm_core::connection::{Connection, DirectConnection};
use comm_core::error::{Error, Result};
use comm_core::memory::{MemoryKind, MemoryRegion};
use comm_core::same_host::{SameHostEndpoint, checked_peer_endpoint};
use comm_core::transport::{PeerExport, Transport, TransportBackend, TransportContext, TransportFactory};
use nix::unistd::Pid;

use crate::endpoint::Endpoint;
use crate::segment::{Payload, check_job_key, check_peer_name};
use comm_core::peer_watch::PeerWatch;

pub use crate::segment::{SHM_DIR, ShmRegion, job_segments, remove_job_segments};

/// The name this transport registers, and answers to in `WEAVE_TRANSPORTS`.
pub const NAME: &str = "shm";

comm_core::transport_id!(NAME);

/// The shared-memory transport (id [`transport()`], name [`NAME`]): give it to
/// `Communicator::builder().with_transport(...)`.
#[derive(Debug, Default, Clone, Copy)]
pub struct ShmTransport;

impl TransportFactory for ShmTransport {
    fn transport(&self) -> Transport {
        transport()
    }

    fn open(&self, ctx: &TransportContext) -> Result<Arc<dyn TransportBackend>> {
        Ok(Arc::new(ShmBackend::open(ctx)?))
    }
}

/// Tells backends of one process apart, so a backend exports only what it allocated.
static NEXT_BACKEND_ID: AtomicU64 = AtomicU64::new(1);

/// The shared-memory transport serving one communicator: allocates segments, exports and
/// imports them, and builds [`DirectConnection`]s whose peer check watches the peer's process.
#[derive(Debug)]
pub struct ShmBackend {
    id: u64,
    rank: usize,
    world_size: usize,
    job_key: String,
    communicator_id: u64,
    endpoint: Endpoint,
}

impl ShmBackend {
    /// Opens the transport for the communicator described by `ctx`. Fails with
    /// [`Error::InvalidArgument`] for a job key that cannot go into a segment name, and with
    /// [`Error::Unsupported`] where there is no `/dev/shm` or boot id (off Linux).
    pub fn open(ctx: &TransportContext) -> Result<Self> {
        check_job_key(&ctx.job_key)?;
        if ctx.rank >= ctx.world_size {
            return Err(Error::invalid(format!("transport shm: rank {} of {} ranks", ctx.rank, ctx.world_size)));
        }
        Ok(ShmBackend {
            id: NEXT_BACKEND_ID.fetch_add(1, Ordering::Relaxed),
            rank: ctx.rank,
            world_size: ctx.world_size,
            job_key: ctx.job_key.clone(),
            communicator_id: ctx.communicator_id,
            endpoint: Endpoint::local(&comm_core::host::host_identity(ctx.config.host_id.as_deref()))?,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The job key that names this backend's segments.
    pub fn job_key(&self) -> &str {
        &self.job_key
    }

    /// `peer`'s endpoint, checked: a rank of this communicator that can share memory with this
    /// rank.
    fn check_peer(&self, peer: usize, peer_endpoint: &[u8]) -> Result<Endpoint> {
        checked_peer_endpoint(NAME, &self.endpoint, self.rank, self.world_size, peer, peer_endpoint)
    }
}

impl TransportBackend for ShmBackend {
    fn transport(&self) -> Transport {
        transport()
    }

    fn local_endpoint(&self) -> Result<Vec<u8>> {
        Ok(self.endpoint.encode())
    }

    fn can_reach(&self, a: &[u8], b: &[u8]) -> Result<bool> {
        Endpoint::can_reach(a, b)
    }

    fn direct_access(&self) -> bool {
        true
    }

    fn allocate(&self, len: usize, kind: MemoryKind) -> Result<Arc<dyn MemoryRegion>> {
        if kind != MemoryKind::Host {
            return Err(Error::Unsupported(format!(
                "transport shm allocates host memory only, not {kind:?}; device memory needs a GPU transport (cudaipc)"
            )));
        }
        let region = ShmRegion::create(&self.job_key, self.rank, self.communicator_id, len, self.id)?;
        Ok(Arc::new(region))
    }

    fn export(&self, region: &Arc<dyn MemoryRegion>) -> Result<Option<Vec<u8>>> {
        let Some(shm) = region.as_any().downcast_ref::<ShmRegion>() else { return Ok(None) };
        if !shm.allocated_by(self.id) {
            return Ok(None);
        }
        if shm.is_sealed() {
            return Err(Error::invalid(format!(
                "transport shm: segment {} was already sealed (its name removed); peers can no longer import it",
                shm.name()
            )));
        }
        Ok(Some(shm.export_payload().encode()))
    }

    fn import(&self, export: PeerExport<'_>) -> Result<Arc<dyn MemoryRegion>> {
        export.require_host(NAME)?;
        let PeerExport { peer, peer_endpoint, payload, len, .. } = export;
        let theirs = self.check_peer(peer, peer_endpoint)?;
        let p = Payload::decode(payload)?;
        check_peer_name(&p.name, &self.job_key, peer)?;
        if p.pid != theirs.process.pid {
            return Err(Error::protocol(format!(
                "shm export payload from rank {peer}: owner pid {} but the rank's endpoint says pid {}",
                p.pid, theirs.process.pid
            )));
        }
        if p.len != len {
            return Err(Error::protocol(format!(
                "shm export payload from rank {peer}: segment {} is {} bytes, the descriptor says {len}",
                p.name, p.len
            )));
        }
        Ok(Arc::new(ShmRegion::open(&p.name, len, peer)?))
    }

    fn connect(&self, peer: usize, peer_endpoint: &[u8]) -> Result<Arc<dyn Connection>> {
        let theirs = self.check_peer(peer, peer_endpoint)?;
        // Endpoint::decode accepted only pids in 1..=i32::MAX.
        let pid = i32::try_from(theirs.process.pid).map_err(|_| Error::protocol("shm endpoint: bad pid"))?;
        let watch = PeerWatch::new(peer, Pid::from_raw(pid), "shm peer check");
        Ok(Arc::new(DirectConnection::new(transport(), peer, Box::new(move || watch.check()))))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    use comm_core::config::Config;
    use comm_core::memory::{HeapRegion, MemoryDescriptor, RegisteredMemory};

    /// A job key unique to one test; removes whatever the test left in /dev/shm when dropped,
    /// even if the test panicked.
    struct Job {
        key: String,
    }

    impl Job {
        fn new(test: &str) -> Self {
            static N: AtomicU64 = AtomicU64::new(0);
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
            let test: String = test.chars().filter(char::is_ascii_alphanumeric).take(16).collect();
            let n = N.fetch_add(1, Ordering::Relaxed);
            Job { key: format!("t{test}_{}_{nanos:x}_{n}", std::process::id()) }
        }

        fn backend(&self, rank: usize) -> ShmBackend {
            let ctx = TransportContext {
                rank,
                world_size: 3,
                job_key: self.key.clone(),
                communicator_id: 7,
                config: Config::default(),
                abort: Arc::new(AtomicBool::new(false)),
                liveness: Default::default(),
            };
            ShmBackend::open(&ctx).unwrap()
        }

        fn segments(&self) -> Vec<String> {
            job_segments(&self.key).unwrap()
        }
    }

    impl Drop for Job {
        fn drop(&mut self) {
            let _ = remove_job_segments(&self.key);
        }
    }

    fn registered(region: Arc<dyn MemoryRegion>, owner: usize, local: bool) -> RegisteredMemory {
        let d = MemoryDescriptor::new(owner, 0, "buf", MemoryKind::Host, region.len(), vec![]);
        RegisteredMemory::new(d, region, transport(), local).unwrap()
    }

    fn shm(region: &Arc<dyn MemoryRegion>) -> &ShmRegion {
        region.as_any().downcast_ref::<ShmRegion>().unwrap()
    }

    /// Rank 0 allocates and exports, rank 1 imports; returns (owner region, imported region).
    fn share(a: &ShmBackend, b: &ShmBackend, len: usize) -> (Arc<dyn MemoryRegion>, Arc<dyn MemoryRegion>) {
        let owned = a.allocate(len, MemoryKind::Host).unwrap();
        let payload = a.export(&owned).unwrap().expect("shm exports its own regions");
        let peer_endpoint = a.local_endpoint().unwrap();
        let export = PeerExport {
            peer: a.rank(),
            peer_endpoint: &peer_endpoint,
            payload: &payload,
            len,
            kind: MemoryKind::Host,
        };
        let imported = b.import(export).unwrap();
        (owned, imported)
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn factory_opens_an_shm_backend() {
        let job = Job::new("factory");
        let ctx = TransportContext {
            rank: 0,
            world_size: 1,
            job_key: job.key.clone(),
            communicator_id: 1,
            config: Config::default(),
            abort: Arc::new(AtomicBool::new(false)),
            liveness: Default::default(),
        };
        assert_eq!((transport().name(), transport()), ("shm", Transport::named(NAME).unwrap()));
        assert_eq!(ShmTransport.transport(), transport());
        let backend = ShmTransport.open(&ctx).unwrap();
        assert_eq!(backend.transport(), transport());
        assert!(backend.direct_access());
        assert!(backend.as_any().downcast_ref::<ShmBackend>().is_some());
        let bad = TransportContext { job_key: "a-b".into(), ..ctx.clone() };
        assert!(matches!(ShmTransport.open(&bad), Err(Error::InvalidArgument(_))));
        let bad = TransportContext { rank: 1, ..ctx };
        assert!(matches!(ShmTransport.open(&bad), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn data_moves_both_ways_for_all_sizes() {
        let job = Job::new("sizes");
        let (a, b) = (job.backend(0), job.backend(1));
        let ep_a = a.local_endpoint().unwrap();
        let conn = b.connect(0, &ep_a).unwrap();
        assert_eq!((conn.transport(), conn.peer()), (transport(), 0));
        for len in [0, 1, 4095, (1 << 20) + 3] {
            let (owned, imported) = share(&a, &b, len);
            assert_eq!((owned.len(), imported.len()), (len, len));
            assert!(!owned.as_ptr().is_null() && !imported.as_ptr().is_null());
            assert!(
                shm(&owned).mapped_len() >= len.max(1) && shm(&owned).mapped_len().is_multiple_of(segment::page_size())
            );
            let on_owner = registered(owned, 0, true);
            let on_peer = registered(imported, 0, false);

            // Rank 1 writes into rank 0's memory through the connection.
            let data = pattern(len, 1);
            let src = registered(Arc::new(HeapRegion::new(len).unwrap()), 1, true);
            src.write_bytes(0, &data).unwrap();
            conn.write(&on_peer, 0, &src, 0, len).unwrap();
            conn.flush().unwrap();
            let mut seen = vec![0u8; len];
            on_owner.read_bytes(0, &mut seen).unwrap();
            assert!(seen == data, "len {len}: owner does not see the peer's write");

            // Rank 0 writes locally; rank 1 sees it through its mapping.
            let data = pattern(len, 2);
            on_owner.write_bytes(0, &data).unwrap();
            on_peer.read_bytes(0, &mut seen).unwrap();
            assert!(seen == data, "len {len}: peer does not see the owner's write");

            if len >= 16 {
                conn.update_and_sync(&on_peer, 8, 0xdead_beef_0000_0001).unwrap();
                assert_eq!(on_owner.load_u64(8).unwrap(), 0xdead_beef_0000_0001);
                // The last word of an unaligned length is still reachable, and no further.
                let last = len - 1;
                conn.write(&on_peer, last, &src, 0, 1).unwrap();
                assert!(conn.write(&on_peer, last, &src, 0, 2).is_err());
            }
            assert!(conn.write(&on_peer, 0, &src, 0, len + 1).is_err());
        }
        assert!(job.segments().is_empty(), "dropped owners left {:?}", job.segments());
    }

    #[test]
    fn seal_removes_the_name_but_keeps_both_mappings() {
        let job = Job::new("seal");
        let (a, b) = (job.backend(0), job.backend(1));
        let (owned, imported) = share(&a, &b, 100);
        let name = shm(&owned).name().to_string();
        assert_eq!(job.segments(), vec![name[1..].to_string()]);
        assert!(!shm(&owned).is_sealed());

        owned.seal().unwrap();
        assert!(shm(&owned).is_sealed());
        assert!(job.segments().is_empty());
        owned.seal().unwrap(); // idempotent
        imported.seal().unwrap(); // no-op for an importer

        let (on_owner, on_peer) = (registered(owned.clone(), 0, true), registered(imported, 0, false));
        on_peer.write_bytes(0, b"after seal").unwrap();
        let mut out = [0u8; 10];
        on_owner.read_bytes(0, &mut out).unwrap();
        assert_eq!(&out, b"after seal");

        // A sealed region cannot be exported again, and a late importer finds nothing.
        assert!(matches!(a.export(&owned), Err(Error::InvalidArgument(_))));
        let late = Payload { name, len: 100, pid: std::process::id() }.encode();
        let peer_endpoint = a.local_endpoint().unwrap();
        let r = b.import(PeerExport {
            peer: 0,
            peer_endpoint: &peer_endpoint,
            payload: &late,
            len: 100,
            kind: MemoryKind::Host,
        });
        assert!(matches!(r, Err(Error::Io { .. })), "{:?}", r.as_ref().err());
    }

    #[test]
    fn unsealed_owner_removes_the_segment_on_drop_importer_never_does() {
        let job = Job::new("drop");
        let (a, b) = (job.backend(0), job.backend(1));
        let (owned, imported) = share(&a, &b, 10);
        let name = shm(&owned).name()[1..].to_string();

        drop(imported);
        assert_eq!(job.segments(), vec![name.clone()], "dropping an import removed the segment");
        let (owned2, imported2) = share(&a, &b, 10);
        let name2 = shm(&owned2).name()[1..].to_string();
        drop(owned2);
        assert_eq!(job.segments(), vec![name.clone()]);
        // The importer's mapping outlives the owner's name and mapping.
        registered(imported2, 0, false).write_bytes(0, b"x").unwrap();
        assert!(!job.segments().contains(&name2));

        drop(owned);
        assert!(job.segments().is_empty());
    }

    #[test]
    fn segments_are_0600_and_belong_to_this_user() {
        use nix::fcntl::OFlag;
        use nix::sys::stat::{Mode, fstat, umask};

        let job = Job::new("perm");
        let a = job.backend(0);
        // Even under a umask that would strip the owner's write bit (other tests only create
        // segments, which get the same fchmod, so changing it briefly is harmless).
        let old = umask(Mode::from_bits_truncate(0o277));
        let owned = a.allocate(1, MemoryKind::Host);
        umask(old);
        let owned = owned.unwrap();
        let fd = nix::sys::mman::shm_open(shm(&owned).name(), OFlag::O_RDONLY, Mode::empty()).unwrap();
        let st = fstat(&fd).unwrap();
        assert_eq!(st.st_mode & 0o7777, 0o600);
        assert_eq!(st.st_uid, nix::unistd::geteuid().as_raw());
        assert_eq!(st.st_size as usize, segment::page_size());
        // posix_fallocate reserved the page: it is backed, not sparse.
        assert!(st.st_blocks > 0);
    }

    #[test]
    fn bad_imports_are_errors() {
        let job = Job::new("badimport");
        let (a, b, c) = (job.backend(0), job.backend(1), job.backend(2));
        let ep_a = a.local_endpoint().unwrap();
        let owned = a.allocate(4096, MemoryKind::Host).unwrap();
        let good = a.export(&owned).unwrap().unwrap();
        let name = shm(&owned).name().to_string();
        let pid = std::process::id();
        let good_export =
            PeerExport { peer: 0, peer_endpoint: &ep_a, payload: &good, len: 4096, kind: MemoryKind::Host };
        let import = |payload: &[u8], len: usize| b.import(PeerExport { payload, len, ..good_export });

        // The untouched payload works.
        import(&good, 4096).unwrap();

        // Outside this job's prefix, or elsewhere entirely.
        let other_job = Job::new("otherjob");
        let foreign = other_job.backend(0).allocate(8, MemoryKind::Host).unwrap();
        for bad_name in [shm(&foreign).name().to_string(), "/etc-passwd".into(), format!("{name}/x")] {
            let p = Payload { name: bad_name.clone(), len: 8, pid }.encode();
            assert!(matches!(import(&p, 8), Err(Error::Protocol(_))), "{bad_name}");
        }

        // A segment of rank 2 presented as rank 0's.
        let of_c = c.allocate(8, MemoryKind::Host).unwrap();
        let p = c.export(&of_c).unwrap().unwrap();
        assert!(matches!(import(&p, 8), Err(Error::Protocol(_))));
        // ...while as rank 2's it is fine.
        let ep_c = c.local_endpoint().unwrap();
        b.import(PeerExport { peer: 2, peer_endpoint: &ep_c, payload: &p, len: 8, ..good_export }).unwrap();

        // A well-formed name that does not exist.
        let missing = Payload { name: format!("/weave-{}-r0-c7-999999999", job.key), len: 8, pid }.encode();
        let r = import(&missing, 8);
        assert!(
            matches!(&r, Err(Error::Io { operation, .. }) if operation.contains("shm_open")),
            "{:?}",
            r.as_ref().err()
        );

        // Truncated or corrupted payloads.
        for cut in 0..good.len() {
            assert!(matches!(import(&good[..cut], 4096), Err(Error::Protocol(_))), "cut {cut}");
        }
        for i in 0..good.len() {
            // Every field is checked: magic, version, lengths, name (a digit ^ 0x41 is no
            // digit), length and pid against the descriptor and the endpoint.
            let mut bad = good.clone();
            bad[i] ^= 0x41;
            assert!(import(&bad, 4096).is_err(), "payload with byte {i} flipped was accepted");
        }

        // Lengths: descriptor and payload disagree, or both claim more than the segment holds.
        assert!(matches!(import(&good, 4097), Err(Error::Protocol(_))));
        let page = segment::page_size();
        let too_long = Payload { name: name.clone(), len: page + 1, pid }.encode();
        let r = import(&too_long, page + 1);
        assert!(matches!(&r, Err(Error::Protocol(m)) if m.contains("holds")), "{:?}", r.as_ref().err());

        // Wrong owner pid, wrong kind, bad endpoint, bad rank.
        let wrong_pid = Payload { name: name.clone(), len: 4096, pid: pid + 1 }.encode();
        assert!(matches!(import(&wrong_pid, 4096), Err(Error::Protocol(_))));
        assert!(matches!(
            b.import(PeerExport { kind: MemoryKind::Device(0), ..good_export }),
            Err(Error::Unsupported(_))
        ));
        assert!(matches!(b.import(PeerExport { peer_endpoint: &ep_a[..5], ..good_export }), Err(Error::Protocol(_))));
        assert!(matches!(b.import(PeerExport { peer: 3, ..good_export }), Err(Error::InvalidArgument(_))));
        let mut elsewhere = Endpoint::decode(&ep_a).unwrap();
        elsewhere.process.boot_id.push('x');
        assert!(matches!(
            b.import(PeerExport { peer_endpoint: &elsewhere.encode(), ..good_export }),
            Err(Error::Transport { .. })
        ));
    }

    #[test]
    fn export_only_what_this_backend_allocated() {
        let job = Job::new("export");
        let (a, b) = (job.backend(0), job.backend(1));
        let heap: Arc<dyn MemoryRegion> = Arc::new(HeapRegion::new(64).unwrap());
        assert_eq!(a.export(&heap).unwrap(), None);
        let (owned, imported) = share(&a, &b, 64);
        assert_eq!(b.export(&imported).unwrap(), None);
        assert_eq!(b.export(&owned).unwrap(), None);
        // Another communicator's backend of the same rank.
        assert_eq!(job.backend(0).export(&owned).unwrap(), None);
    }

    #[test]
    fn device_memory_is_unsupported() {
        let job = Job::new("device");
        let r = job.backend(0).allocate(16, MemoryKind::Device(0));
        assert!(matches!(&r, Err(Error::Unsupported(m)) if m.contains("shm")), "{:?}", r.err());
        assert!(job.segments().is_empty());
    }

    #[test]
    fn reachability_follows_host_identity() {
        let job = Job::new("reach");
        let a = job.backend(0);
        let ep = a.local_endpoint().unwrap();
        let mut other_pid = Endpoint::decode(&ep).unwrap();
        other_pid.process.pid = 1;
        let other_pid = other_pid.encode();
        assert!(a.can_reach(&ep, &other_pid).unwrap());
        assert!(a.can_reach(&other_pid, &ep).unwrap());
        let mut elsewhere = Endpoint::decode(&ep).unwrap();
        elsewhere.process.hostname.push_str(".other");
        let elsewhere = elsewhere.encode();
        assert!(!a.can_reach(&ep, &elsewhere).unwrap());
        assert!(!a.can_reach(&elsewhere, &ep).unwrap());
        assert!(matches!(a.can_reach(&ep, b"garbage"), Err(Error::Protocol(_))));
        assert!(matches!(a.can_reach(&[], &ep), Err(Error::Protocol(_))));
        assert!(matches!(a.connect(1, &elsewhere), Err(Error::Transport { .. })));
        assert!(matches!(a.connect(1, b"garbage"), Err(Error::Protocol(_))));
    }

    #[test]
    fn peer_check_sees_a_dead_process() {
        let job = Job::new("peercheck");
        let a = job.backend(0);
        let mut child = std::process::Command::new("/bin/true").spawn().unwrap();
        let child_pid = child.id();
        child.wait().unwrap();
        let mut dead = Endpoint::decode(&a.local_endpoint().unwrap()).unwrap();
        dead.process.pid = child_pid;
        let conn = a.connect(1, &dead.encode()).unwrap();
        let r = conn.check_peer();
        assert!(matches!(&r, Err(Error::PeerLost { peer: 1, .. })), "{r:?}");
        assert!(matches!(conn.flush(), Err(Error::PeerLost { .. })));

        let alive = a.connect(1, &a.local_endpoint().unwrap()).unwrap();
        for _ in 0..10_000 {
            alive.check_peer().unwrap();
        }
        alive.flush().unwrap();
    }

    #[test]
    fn leftovers_can_be_listed_and_removed() {
        let job = Job::new("leftover");
        let a = job.backend(0);
        let r1 = a.allocate(1, MemoryKind::Host).unwrap();
        let r2 = a.allocate(1, MemoryKind::Host).unwrap();
        assert_eq!(job.segments().len(), 2);
        assert!(job.segments().iter().all(|n| n.starts_with(&format!("weave-{}-r0-c7-", job.key))));
        assert_eq!(remove_job_segments(&job.key).unwrap(), 2);
        assert!(job.segments().is_empty());
        assert_eq!(remove_job_segments(&job.key).unwrap(), 0);
        // Mappings survive, and the owners' later unlink finds nothing to do.
        registered(r1.clone(), 0, true).write_bytes(0, b"z").unwrap();
        r1.seal().unwrap();
        drop((r1, r2));
        assert!(job.segments().is_empty());
    }
}
