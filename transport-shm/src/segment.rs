//! POSIX shared-memory segments: naming, creation, import checks, the mapped region, and the
//! leak helpers.

use std::any::Any;
use std::fs::{File, Permissions};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use comm_core::error::{Error, Result};
use comm_core::memory::{MAX_REGISTRATION_LEN, MemoryKind, MemoryRegion};
use comm_core::wire::{Decoder, Encoder};
use memmap2::{MmapOptions, MmapRaw};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::mman::{shm_open, shm_unlink};
use nix::sys::stat::Mode;

/// Where Linux keeps POSIX shared-memory objects: segment `/weave-x` is the file
/// `/dev/shm/weave-x`.
pub const SHM_DIR: &str = "/dev/shm";

/// Longest segment name, leading `/` included (a `/dev/shm` file name is at most 255 bytes).
const MAX_NAME_LEN: usize = 256;
/// How many fresh names [`ShmRegion::create`] tries when a name is taken.
const CREATE_ATTEMPTS: u32 = 8;
/// Added to every OS error while creating a segment: the usual cause.
const SPACE_HINT: &str = "is /dev/shm full or too small? check `df -h /dev/shm`; in a container raise --shm-size";

const PAYLOAD_MAGIC: [u8; 4] = *b"WVSS";
const PAYLOAD_VERSION: u16 = 1;
const PAYLOAD_WHAT: &str = "shm export payload";

/// Numbers segments of this process, so names never repeat even across backends.
static COUNTER: AtomicU64 = AtomicU64::new(0);

/// The system page size (4 KiB when `sysconf` cannot tell).
pub(crate) fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|p| usize::try_from(p).ok())
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096)
    })
}

/// `len` rounded up to whole pages, at least one page.
fn mapped_size(len: usize) -> Result<usize> {
    if len > MAX_REGISTRATION_LEN {
        return Err(Error::invalid(format!("shm segment of {len} bytes is larger than {MAX_REGISTRATION_LEN}")));
    }
    let page = page_size();
    // Cannot overflow: len <= 2^48.
    Ok(len.div_ceil(page).max(1) * page)
}

fn off_t(n: usize) -> Result<i64> {
    i64::try_from(n).map_err(|_| Error::invalid(format!("{n} bytes does not fit off_t")))
}

/// The file-name prefix (no leading `/`) of every segment of job `job_key`.
pub(crate) fn job_prefix(job_key: &str) -> String {
    format!("weave-{job_key}-")
}

/// The segment-name prefix (with leading `/`) of every segment `rank` of job `job_key` creates.
pub(crate) fn rank_prefix(job_key: &str, rank: usize) -> String {
    format!("/{}r{rank}-", job_prefix(job_key))
}

/// Checks a job key before it goes into names: 1 to 64 ASCII letters, digits or `_` (no `-`, so
/// one job's prefix is never a prefix of another's; no `/`).
pub(crate) fn check_job_key(job_key: &str) -> Result<()> {
    if job_key.is_empty() || job_key.len() > 64 || !job_key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(Error::invalid(format!(
            "transport shm: job key {job_key:?} must be 1 to 64 ASCII letters, digits or '_'"
        )));
    }
    Ok(())
}

/// Checks that `name`, received from rank `peer`, names a segment that rank may have created
/// for job `job_key`: `/weave-{job_key}-r{peer}-c{communicator}-{counter}`, nothing else.
/// Peers therefore cannot make this rank open arbitrary shared-memory objects.
pub(crate) fn check_peer_name(name: &str, job_key: &str, peer: usize) -> Result<()> {
    let refuse =
        |why: &str| Err(Error::protocol(format!("{PAYLOAD_WHAT}: segment name {name:?} from rank {peer} {why}")));
    if name.len() > MAX_NAME_LEN {
        return refuse(&format!("is longer than {MAX_NAME_LEN} bytes"));
    }
    if name.get(1..).is_none_or(|rest| rest.contains('/')) || name.contains('\0') {
        return refuse("contains '/' or NUL after its first character");
    }
    let prefix = rank_prefix(job_key, peer);
    let Some(rest) = name.strip_prefix(&prefix) else {
        return refuse(&format!("does not start with {prefix:?}"));
    };
    let numbers = rest.strip_prefix('c').and_then(|r| r.split_once('-'));
    let is_number = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    match numbers {
        Some((comm, counter)) if is_number(comm) && is_number(counter) => Ok(()),
        _ => refuse(&format!("does not end in c<communicator>-<counter> after {prefix:?}")),
    }
}

/// What [`ShmRegion::export_payload`] sends to peers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Payload {
    /// Segment name, leading `/` included.
    pub(crate) name: String,
    /// Length the owner asked for (not rounded).
    pub(crate) len: usize,
    /// The owner's pid.
    pub(crate) pid: u32,
}

impl Payload {
    /// Wire format: magic `WVSS`, version 1, name (`u32` length + UTF-8), length `u64`, pid `u32`.
    pub(crate) fn encode(&self) -> Vec<u8> {
        Encoder::new(PAYLOAD_MAGIC, PAYLOAD_VERSION).str(&self.name).usize(self.len).u32(self.pid).finish()
    }

    /// Parses a payload; every field is checked, garbage is [`Error::Protocol`].
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self> {
        let mut d = Decoder::new(bytes, PAYLOAD_MAGIC, PAYLOAD_VERSION, PAYLOAD_WHAT)?;
        let name = d.str()?;
        if name.len() > MAX_NAME_LEN {
            return Err(Error::protocol(format!("{PAYLOAD_WHAT}: name longer than {MAX_NAME_LEN} bytes")));
        }
        let name = name.to_string();
        let len = d.usize()?;
        if len > MAX_REGISTRATION_LEN {
            return Err(Error::protocol(format!("{PAYLOAD_WHAT}: length {len} is larger than {MAX_REGISTRATION_LEN}")));
        }
        let pid = d.u32()?;
        d.finish()?;
        Ok(Payload { name, len, pid })
    }
}

/// The owner's side of a segment.
#[derive(Debug)]
struct Owner {
    /// The backend that allocated it (exports are refused elsewhere).
    backend: u64,
    /// Set once the name is removed (by `seal`, `remove_job_segments` does not set it).
    unlinked: AtomicBool,
}

/// A POSIX shared-memory segment mapped into this process: either allocated here (the owner)
/// or imported from a peer.
///
/// The mapping covers whole pages; [`len`](MemoryRegion::len) is the length that was asked for.
/// The owner removes the segment's name on [`seal`](MemoryRegion::seal), or on drop if it was
/// never sealed; an imported region never removes it. Dropping either unmaps it.
pub struct ShmRegion {
    map: MmapRaw,
    len: usize,
    name: String,
    owner: Option<Owner>,
}

comm_core::debug_fields!(ShmRegion {
    name,
    len,
    mapped_len: |r| r.map.len(),
    owner: |r| r.is_owner(),
    sealed: |r| r.is_sealed(),
});

/// Removes a freshly created name unless creation got all the way through.
struct UnlinkOnError<'a> {
    name: &'a str,
    armed: bool,
}

impl Drop for UnlinkOnError<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = shm_unlink(self.name);
        }
    }
}

/// Maps `size` bytes of `file` shared and read-write.
///
/// `MmapRaw` hands out only raw pointers, never `&[u8]`: other processes write this memory
/// concurrently, so references to it would be unsound. Every access goes through the pointer
/// with synchronization done by weave's semaphores and atomics.
fn map(file: &File, size: usize, name: &str) -> Result<MmapRaw> {
    MmapOptions::new().len(size).map_raw(file).map_err(|e| Error::io(format!("mmap {name} ({size} bytes)"), e))
}

impl ShmRegion {
    /// Creates and maps a new segment of `len` bytes (rounded up to whole pages, at least one)
    /// named `/weave-{job_key}-r{rank}-c{communicator_id}-{counter}`, mode 0600.
    pub(crate) fn create(job_key: &str, rank: usize, communicator_id: u64, len: usize, backend: u64) -> Result<Self> {
        let size = mapped_size(len)?;
        let mut attempt = 0;
        let (name, fd) = loop {
            let counter = COUNTER.fetch_add(1, Ordering::Relaxed);
            let name = format!("{}c{communicator_id}-{counter}", rank_prefix(job_key, rank));
            let flags = OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR;
            match shm_open(name.as_str(), flags, Mode::S_IRUSR | Mode::S_IWUSR) {
                Ok(fd) => break (name, fd),
                // A leftover of an earlier process with the same names: take the next number.
                Err(Errno::EEXIST) if attempt + 1 < CREATE_ATTEMPTS => attempt += 1,
                Err(e) => return Err(Error::errno(format!("shm_open {name} (create; {SPACE_HINT})"), e)),
            }
        };
        let mut guard = UnlinkOnError { name: &name, armed: true };
        let file = File::from(fd);
        // The umask may have cleared bits of the requested mode; make it exactly 0600.
        file.set_permissions(Permissions::from_mode(0o600))
            .map_err(|e| Error::io(format!("fchmod {name} to 0600"), e))?;
        let size_off = off_t(size)?;
        file.set_len(size as u64)
            .map_err(|e| Error::io(format!("ftruncate {name} to {size} bytes ({SPACE_HINT})"), e))?;
        // tmpfs allocates pages on first touch, and a full /dev/shm then kills the writer with
        // SIGBUS; reserving them now turns that into an error here.
        nix::fcntl::posix_fallocate(&file, 0, size_off)
            .map_err(|e| Error::errno(format!("posix_fallocate {name} ({size} bytes; {SPACE_HINT})"), e))?;
        let map = map(&file, size, &name)?;
        guard.armed = false;
        drop(guard);
        Ok(ShmRegion { map, len, name, owner: Some(Owner { backend, unlinked: AtomicBool::new(false) }) })
    }

    /// Opens and maps the existing segment `name` (already checked by [`check_peer_name`]) that
    /// `peer` exported, after checking that it belongs to this user and holds `len` bytes.
    pub(crate) fn open(name: &str, len: usize, peer: usize) -> Result<Self> {
        let size = mapped_size(len)?;
        let fd = shm_open(name, OFlag::O_RDWR, Mode::empty()).map_err(|e| {
            let why = if e == Errno::ENOENT { "; the owner sealed it before this import, or died" } else { "" };
            Error::errno(format!("shm_open {name} (import from rank {peer}{why})"), e)
        })?;
        let file = File::from(fd);
        let meta = file.metadata().map_err(|e| Error::io(format!("fstat {name}"), e))?;
        if !meta.file_type().is_file() {
            return Err(Error::transport(
                crate::NAME,
                format!("{name} from rank {peer} is not a shared-memory segment"),
            ));
        }
        let euid = nix::unistd::geteuid().as_raw();
        if meta.uid() != euid {
            return Err(Error::transport(
                crate::NAME,
                format!(
                    "segment {name} from rank {peer} is owned by uid {}, this process runs as uid {euid}; refusing to map it",
                    meta.uid()
                ),
            ));
        }
        if meta.size() < len as u64 {
            return Err(Error::protocol(format!(
                "segment {name} from rank {peer} holds {} bytes, its descriptor says {len}",
                meta.size()
            )));
        }
        // Pages past the end of the file (only possible in the last, partial page) are never
        // touched: the region exposes `len` bytes, which all lie inside the file.
        let map = map(&file, size, name)?;
        Ok(ShmRegion { map, len, name: name.to_string(), owner: None })
    }

    /// The payload peers import this region with.
    pub(crate) fn export_payload(&self) -> Payload {
        Payload { name: self.name.clone(), len: self.len, pid: std::process::id() }
    }

    /// True when `backend` allocated this region.
    pub(crate) fn allocated_by(&self, backend: u64) -> bool {
        self.owner.as_ref().is_some_and(|o| o.backend == backend)
    }

    /// The segment name, leading `/` included (the file is `/dev/shm/` + the rest).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True when this process created the segment; false when it was imported from a peer.
    pub fn is_owner(&self) -> bool {
        self.owner.is_some()
    }

    /// True once the owner removed the segment's name with [`seal`](MemoryRegion::seal);
    /// always false for imported regions.
    pub fn is_sealed(&self) -> bool {
        self.owner.as_ref().is_some_and(|o| o.unlinked.load(Ordering::Acquire))
    }

    /// Bytes actually mapped: [`len`](MemoryRegion::len) rounded up to whole pages, at least one.
    pub fn mapped_len(&self) -> usize {
        self.map.len()
    }
}

impl MemoryRegion for ShmRegion {
    fn as_ptr(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    fn len(&self) -> usize {
        self.len
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Host
    }

    /// Owner: removes the segment's name (once; a name already gone counts as removed). The
    /// mapping stays valid here and in every peer that already imported it. Imported: no-op.
    fn seal(&self) -> Result<()> {
        let Some(owner) = &self.owner else { return Ok(()) };
        if owner.unlinked.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        match shm_unlink(self.name.as_str()) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => {
                // Leave it to a later seal or to drop.
                owner.unlinked.store(false, Ordering::Release);
                Err(Error::errno(format!("shm_unlink {}", self.name), e))
            }
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for ShmRegion {
    fn drop(&mut self) {
        let owns_name = self.owner.as_ref().is_some_and(|o| !o.unlinked.swap(true, Ordering::AcqRel));
        if owns_name {
            // Nothing to do about a failure in drop; ENOENT (already removed) is the usual one.
            let _ = shm_unlink(self.name.as_str());
        }
        // `map` unmaps itself.
    }
}

/// Lists the segments of job `job_key` that exist now: the file names in `/dev/shm` (without a
/// leading `/`) that start with `weave-{job_key}-`, sorted.
///
/// Used by leak tests: after a job's communicators have set up (every region sealed) or dropped
/// their memory, the list is empty, even if some rank was killed.
pub fn job_segments(job_key: &str) -> std::io::Result<Vec<String>> {
    let prefix = job_prefix(job_key);
    let mut names = Vec::new();
    for entry in std::fs::read_dir(SHM_DIR)? {
        let entry = entry?;
        let file_name = entry.file_name();
        match file_name.to_str() {
            Some(name) if name.starts_with(&prefix) => names.push(name.to_string()),
            _ => {}
        }
    }
    names.sort();
    Ok(names)
}

/// Removes every segment of job `job_key` (see [`job_segments`]) and returns how many it
/// removed. Processes that mapped them keep their mappings.
///
/// For cleanup tools (after a job was killed between allocating and sealing its memory). weave
/// itself never needs it: owners remove their names when sealing or dropping their regions.
pub fn remove_job_segments(job_key: &str) -> std::io::Result<usize> {
    let mut removed = 0;
    for name in job_segments(job_key)? {
        match shm_unlink(format!("/{name}").as_str()) {
            Ok(()) => removed += 1,
            Err(Errno::ENOENT) => {}
            Err(e) => return Err(std::io::Error::from(e)),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_to_pages() {
        let p = page_size();
        assert!(p >= 4096 && p.is_power_of_two());
        assert_eq!(mapped_size(0).unwrap(), p);
        assert_eq!(mapped_size(1).unwrap(), p);
        assert_eq!(mapped_size(p).unwrap(), p);
        assert_eq!(mapped_size(p + 1).unwrap(), 2 * p);
        assert!(mapped_size(MAX_REGISTRATION_LEN + 1).is_err());
        assert!(mapped_size(usize::MAX).is_err());
    }

    #[test]
    fn job_keys_are_checked() {
        check_job_key("00ff_Ab").unwrap();
        for bad in ["", "a-b", "a/b", "a.b", "é", &"a".repeat(65)] {
            assert!(check_job_key(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn peer_names_are_checked() {
        check_peer_name("/weave-k1-r3-c0-17", "k1", 3).unwrap();
        check_peer_name("/weave-k1-r3-c18446744073709551615-0", "k1", 3).unwrap();
        for bad in [
            "/weave-k2-r3-c0-17",
            "/weave-k1-r4-c0-17",
            "/weave-k1-r31-c0-17",
            "/weave-k1-r3-c0-17/x",
            "/weave-k1-r3-c0-",
            "/weave-k1-r3-c-1",
            "/weave-k1-r3-c0-1-2",
            "/weave-k1-r3-x0-1",
            "/weave-k1-r3-c0-1\0",
            "weave-k1-r3-c0-17",
            "/weave-k1-r3-",
            "/",
            "",
            "/weave-k1-r3-c0-../../etc/passwd",
            "//weave-k1-r3-c0-1",
        ] {
            assert!(matches!(check_peer_name(bad, "k1", 3), Err(Error::Protocol(_))), "{bad:?}");
        }
        let long = format!("/weave-k1-r3-c0-{}", "1".repeat(300));
        assert!(check_peer_name(&long, "k1", 3).is_err());
    }

    #[test]
    fn payload_round_trips_and_rejects_garbage() {
        let p = Payload { name: "/weave-k-r0-c1-2".into(), len: 12345, pid: 42 };
        let bytes = p.encode();
        assert_eq!(Payload::decode(&bytes).unwrap(), p);
        for bad in comm_core::wire::damaged_messages(&bytes) {
            assert!(matches!(Payload::decode(&bad), Err(Error::Protocol(_))), "{bad:02x?}");
        }
        let huge = Payload { len: MAX_REGISTRATION_LEN + 1, ..p.clone() }.encode();
        assert!(matches!(Payload::decode(&huge), Err(Error::Protocol(_))));
        let long_name = Payload { name: "x".repeat(MAX_NAME_LEN + 1), ..p }.encode();
        assert!(matches!(Payload::decode(&long_name), Err(Error::Protocol(_))));
    }
}
