//! Two ranks of this test binary in two namespace nodes (each its own network stack and
//! hostname, eth0 on a bridge, no default route), without a GPU (`WEAVE_NCCL_ALLOW_CPU=1`):
//! rank 0 makes the `ncclUniqueId` and hands it to rank 1 through a file, and both init a
//! communicator on it — which only works when the id names an address rank 1 can reach (the
//! route towards the job's rendezvous host, never 127.0.0.1). Namespaces need root, so the test
//! is ignored; `cargo xtask test` runs it as root (`--ignored namespace`).

use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use nccl::abi::{NcclCommPtr, NcclResult, NcclUniqueId};
use nccl::api_comm::*;

/// The name of the test below, which each rank runs alone.
const TEST: &str = "namespace_nodes_init_on_a_unique_id_made_in_another_node";

/// Where rank 0 leaves the id for rank 1 (a folder both nodes see: the nodes share this host's
/// file system but for /dev/shm).
const ID_DIR: &str = "WEAVE_TEST_ID_DIR";

#[test]
#[ignore = "needs root to make namespace nodes; cargo xtask test runs it"]
fn namespace_nodes_init_on_a_unique_id_made_in_another_node() {
    if let Some(rank) = std::env::var_os("RANK") {
        let rank: c_int = rank.to_string_lossy().parse().expect("RANK is a number");
        let dir = PathBuf::from(std::env::var_os(ID_DIR).expect("the launcher sets the id folder"));
        rank_body(rank, &dir);
        return;
    }
    if let Err(e) = weave_launch::namespace_nodes_available(None) {
        panic!("namespace nodes cannot be made here, so this test cannot run (it needs root): {e}");
    }
    let dir = std::env::temp_dir().join(format!("weave-nccl-nodes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a folder for the id");
    let program = std::env::current_exe().expect("the path of this test binary");
    let spec = weave_launch::LaunchSpec::new(2, program)
        .args([TEST, "--exact", "--nocapture", "--ignored", "--test-threads=1"])
        .namespace_nodes(2, None)
        .env("WEAVE_NCCL_ALLOW_CPU", "1")
        .env("WEAVE_TIMEOUT", "20")
        .env(ID_DIR, &dir)
        .capture(true)
        .timeout(Duration::from_secs(120));
    let report = weave_launch::launch(&spec);
    let _ = std::fs::remove_dir_all(&dir);
    let report = report.expect("starting 2 ranks in 2 namespace nodes");
    assert!(report.success(), "{}", report.summary());
    for r in &report.ranks {
        let line = format!("rank {} of 2 joined", r.rank);
        assert!(r.stdout.iter().any(|l| l.contains(&line)), "rank {} did not join: {:?}", r.rank, r.stdout);
    }
}

/// One rank: rank 0 makes the id and writes it (through a rename, so rank 1 never reads half
/// of it), rank 1 waits for it; then both init, check the communicator and destroy it.
fn rank_body(rank: c_int, dir: &Path) {
    let path = dir.join("id");
    let mut id = NcclUniqueId { internal: [0; 128] };
    if rank == 0 {
        // SAFETY: `id` is a live local.
        assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, NcclResult::SUCCESS);
        let part = dir.join("id.part");
        std::fs::write(&part, id.internal.map(|b| b as u8)).expect("write the id");
        std::fs::rename(&part, &path).expect("publish the id");
    } else {
        let started = Instant::now();
        let bytes = loop {
            match std::fs::read(&path) {
                Ok(b) => break b,
                Err(_) if started.elapsed() < Duration::from_secs(30) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => panic!("rank 0 wrote no id into {} within 30 s: {e}", path.display()),
            }
        };
        assert_eq!(bytes.len(), 128, "the id file holds {} bytes", bytes.len());
        for (slot, b) in id.internal.iter_mut().zip(bytes) {
            *slot = b as _;
        }
    }
    let mut comm: NcclCommPtr = null_mut();
    // SAFETY: live locals; the id came from rank 0's ncclGetUniqueId.
    unsafe {
        let r = ncclCommInitRank(&mut comm, 2, id, rank);
        assert_eq!(r, NcclResult::SUCCESS, "rank {rank}: ncclCommInitRank: {}", last_error());
        let (mut n, mut me) = (0, -1);
        assert_eq!(ncclCommCount(comm, &mut n), NcclResult::SUCCESS);
        assert_eq!(ncclCommUserRank(comm, &mut me), NcclResult::SUCCESS);
        assert_eq!((n, me), (2, rank));
        assert_eq!(ncclCommDestroy(comm), NcclResult::SUCCESS);
    }
    println!("rank {rank} of 2 joined");
}

/// `ncclGetLastError`'s text.
fn last_error() -> String {
    // SAFETY: the library returns a NUL-terminated string it keeps alive.
    unsafe { std::ffi::CStr::from_ptr(ncclGetLastError(null_mut())) }.to_string_lossy().into_owned()
}
