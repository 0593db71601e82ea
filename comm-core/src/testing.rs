//! Helpers for testing a transport backend inside one process: memory one backend owns and
//! another imports, patterned sources, byte comparison. Transport crates use them in their unit
//! tests; they are ordinary library code (no panics: every failure is an error).
//!
//! Also the reporting of the custom (`harness = false`) test binaries that need a GPU:
//! [`report_skipped`] where the machine lacks one (a GPU test never counts as passed there) and
//! [`run_named_tests`] where it has one, both in libtest's line format.

use std::panic::AssertUnwindSafe;
use std::process::ExitCode;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::memory::{MemoryDescriptor, MemoryKind, RegisteredMemory};
use crate::transport::{PeerExport, TransportBackend};

/// A descriptor of `len` bytes of host memory owned by `owner` (label `t`, sequence 0).
pub fn descriptor(owner: usize, len: usize) -> MemoryDescriptor {
    MemoryDescriptor::new(owner, 0, "t", MemoryKind::Host, len, Vec::new())
}

/// `len` bytes of host memory that `owner` (rank 1) allocates and `viewer` (rank 0) imports:
/// (rank 1's registration, rank 0's handle on it).
pub fn remote_region(
    owner: &dyn TransportBackend,
    viewer: &dyn TransportBackend,
    len: usize,
) -> Result<(RegisteredMemory, RegisteredMemory)> {
    region_of(owner, 1, viewer, len)
}

/// `len` bytes of host memory that `owner` (rank `owner_rank`) allocates and `viewer` imports:
/// (the owner's registration, the viewer's handle on it).
pub fn region_of(
    owner: &dyn TransportBackend,
    owner_rank: usize,
    viewer: &dyn TransportBackend,
    len: usize,
) -> Result<(RegisteredMemory, RegisteredMemory)> {
    let region = owner.allocate(len, MemoryKind::Host)?;
    let payload = owner
        .export(&region)?
        .ok_or_else(|| Error::invalid(format!("transport {} did not export its own region", owner.transport())))?;
    let local = RegisteredMemory::new_local(descriptor(owner_rank, len), region, owner.transport())?;
    let peer_endpoint = owner.local_endpoint()?;
    let export =
        PeerExport { peer: owner_rank, peer_endpoint: &peer_endpoint, payload: &payload, len, kind: MemoryKind::Host };
    let imported = viewer.import(export)?;
    Ok((local, RegisteredMemory::new_imported(descriptor(owner_rank, len), imported, viewer.transport())?))
}

/// `len` bytes of rank 0's host memory from `backend`, holding a pattern that `seed` shifts.
pub fn patterned_source(backend: &dyn TransportBackend, len: usize, seed: u8) -> Result<RegisteredMemory> {
    let region = backend.allocate(len, MemoryKind::Host)?;
    if region.as_ptr().is_null() || region.len() < len {
        return Err(Error::invalid(format!("transport {} allocated memory not mapped here", backend.transport())));
    }
    // SAFETY: a fresh, private region of at least `len` bytes mapped here (checked).
    let bytes = unsafe { std::slice::from_raw_parts_mut(region.as_ptr(), len) };
    for (i, v) in bytes.iter_mut().enumerate() {
        *v = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
    RegisteredMemory::new_local(descriptor(0, len), region, backend.transport())
}

/// Whether `len` bytes at `a_off` of `a` equal those at `b_off` of `b` (both host memory mapped
/// here; the ranges are checked).
pub fn same_bytes(a: &RegisteredMemory, a_off: usize, b: &RegisteredMemory, b_off: usize, len: usize) -> Result<bool> {
    a.check_range(a_off, len)?;
    b.check_range(b_off, len)?;
    if !a.is_host_mapped() || !b.is_host_mapped() {
        return Err(Error::invalid("same_bytes compares host memory mapped into this process only"));
    }
    // SAFETY: both ranges lie inside host memory mapped here (checked); the tests read them only
    // after the writes they check were flushed.
    let (x, y) = unsafe {
        (std::slice::from_raw_parts(a.as_ptr().add(a_off), len), std::slice::from_raw_parts(b.as_ptr().add(b_off), len))
    };
    Ok(x == y)
}

/// The context a backend of rank `rank` in a world of two gets from a communicator with
/// `timeout` (job key `job_key`, communicator 1, not aborted).
pub fn context(rank: usize, job_key: &str, timeout: std::time::Duration) -> crate::transport::TransportContext {
    crate::transport::TransportContext {
        rank,
        world_size: 2,
        job_key: job_key.into(),
        communicator_id: 1,
        config: crate::config::Config { timeout, ..crate::config::Config::default() },
        abort: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
        liveness: crate::transport::PeerLiveness::default(),
    }
}

/// Reports every test of `names` as skipped, then why (`SKIPPED: {why}: the {suite} tests did
/// not run`) and a summary of 0 passed, and returns success: what a custom harness prints on a
/// machine without what its tests need.
pub fn report_skipped<'a>(names: impl IntoIterator<Item = &'a str>, suite: &str, why: &str) -> ExitCode {
    let mut skipped = 0;
    for name in names {
        println!("test {name} ... SKIPPED");
        skipped += 1;
    }
    println!("SKIPPED: {why}: the {suite} tests did not run");
    println!("gpu: 0 passed, 0 failed, {skipped} skipped");
    ExitCode::SUCCESS
}

/// Runs each named test through `run`, catching its panic: prints `test {name} ... ok ({time})`
/// or `test {name} ... FAILED` for each and a summary (`gpu: P passed, F failed, S skipped`,
/// `skipped` being the tests the caller reported as skipped before), and returns failure if any
/// test failed.
pub fn run_named_tests<'a, T: 'a>(
    tests: impl IntoIterator<Item = &'a (&'a str, T)>,
    skipped: usize,
    run: impl Fn(&T),
) -> ExitCode {
    let (mut passed, mut failed) = (0, 0);
    for (name, test) in tests {
        let started = Instant::now();
        match std::panic::catch_unwind(AssertUnwindSafe(|| run(test))) {
            Ok(()) => {
                passed += 1;
                println!("test {name} ... ok ({:.2?})", started.elapsed());
            }
            Err(_) => {
                failed += 1;
                println!("test {name} ... FAILED");
            }
        }
    }
    println!("gpu: {passed} passed, {failed} failed, {skipped} skipped");
    if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// A process identity that never changes (host `node-7`, pid 4242): for seeds and tests that
/// must encode the same bytes on every machine.
pub fn fixed_process_identity() -> crate::same_host::ProcessIdentity {
    crate::same_host::ProcessIdentity {
        hostname: "node-7".into(),
        boot_id: "0f2c9e4a-51d7-4b8e-9a3c-6d1e2f3a4b5c".into(),
        pid_ns: 4026531836,
        pid: 4242,
        uid: 1000,
    }
}

/// For the fuzz targets' entry points: decodes `data` with `decode`; when that accepts it,
/// `encode` must make exactly `data` of the result — a decoder that accepts two spellings of
/// one message is lax, and a check made on one spelling can be slipped past with the other.
/// Returns whether `decode` accepted. Unlike the rest of this module it panics, naming `what`:
/// that is a fuzz target's finding.
pub fn round_trip<T, E>(
    data: &[u8],
    decode: impl FnOnce(&[u8]) -> std::result::Result<T, E>,
    encode: impl FnOnce(&T) -> Vec<u8>,
    what: &str,
) -> bool {
    let Ok(value) = decode(data) else { return false };
    assert_eq!(encode(&value), data, "an accepted {what} encodes back differently");
    true
}

/// Checks the fuzz seeds `seeds` — (target, valid input) pairs: `run(target, seed)` (a crate's
/// entry point for the target) must accept each, and each must lie in the workspace's
/// `fuzz/seeds/TARGET/seed-N` (N counting each target's seeds from 0) as made now; with
/// `WEAVE_BLESS` set the files are written first. `manifest_dir` is the calling crate's
/// `CARGO_MANIFEST_DIR` (a member of the workspace). A seed rejected, for a target `run` does
/// not know (`None`), stale or missing is an error naming it.
pub fn check_fuzz_seeds(
    manifest_dir: &str,
    seeds: &[(&str, Vec<u8>)],
    run: impl Fn(&str, &[u8]) -> Option<bool>,
) -> Result<()> {
    let root = std::path::Path::new(manifest_dir).join("../fuzz/seeds");
    let mut counts: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (target, seed) in seeds {
        match run(target, seed) {
            Some(true) => {}
            Some(false) => return Err(Error::invalid(format!("a seed of fuzz target {target} is rejected"))),
            None => return Err(Error::invalid(format!("a seed for {target}, which is no fuzz target of this crate"))),
        }
        let n = counts.entry(target).or_default();
        let path = root.join(target).join(format!("seed-{n}"));
        *n += 1;
        if std::env::var_os("WEAVE_BLESS").is_some() {
            std::fs::create_dir_all(root.join(target)).map_err(|e| Error::io("create a fuzz seeds directory", e))?;
            std::fs::write(&path, seed).map_err(|e| Error::io("write a fuzz seed", e))?;
        }
        let kept = std::fs::read(&path)
            .map_err(|e| Error::invalid(format!("{}: {e}; write it with WEAVE_BLESS=1", path.display())))?;
        if &kept != seed {
            return Err(Error::invalid(format!("{} is stale; rewrite it with WEAVE_BLESS=1", path.display())));
        }
    }
    Ok(())
}

/// A listener on this host that drops connection handshakes, as a host gone dark or a
/// firewall does: its accept queue (backlog 0) is full of connections it holds and never
/// accepts, so the kernel answers no further SYN. Connects to [`addr`](Self::addr) wait for
/// their own limit; tests show with it that a called-off connect ends at once.
pub struct HandshakeDropper {
    addr: std::net::SocketAddr,
    _listener: std::net::TcpListener,
    /// The connections that fill the accept queue, kept open.
    _queued: Vec<std::net::TcpStream>,
}

impl HandshakeDropper {
    /// Binds a listener on 127.0.0.1 and fills its accept queue; an error where this kernel
    /// kept answering (a test could then show nothing).
    pub fn open() -> Result<Self> {
        use std::time::Duration;
        fn io(what: &'static str) -> impl Fn(std::io::Error) -> Error {
            move |e| Error::io(format!("handshake dropper: {what}"), e)
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("bind"))?;
        let zero = nix::sys::socket::Backlog::new(0).map_err(|e| io("backlog")(e.into()))?;
        nix::sys::socket::listen(&listener, zero).map_err(|e| io("listen")(e.into()))?;
        let addr = listener.local_addr().map_err(io("local address"))?;
        let mut queued = Vec::new();
        for _ in 0..8 {
            match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
                Ok(stream) => queued.push(stream),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    return Ok(HandshakeDropper { addr, _listener: listener, _queued: queued });
                }
                Err(e) => return Err(io("fill the accept queue")(e)),
            }
        }
        Err(Error::Unsupported(format!("handshake dropper: {addr} answered 8 connects with a full accept queue")))
    }

    /// Where connects get no answer.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }
}
