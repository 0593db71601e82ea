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
mod segment;

pub use crate::segment::{SHM_DIR, ShmRegion, job_segments, remove_job_segments};
