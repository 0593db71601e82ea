//! End-to-end tests of namespace nodes: jobs of `/bin/sh` ranks, each node a network, UTS and
//! mount namespace. They need root, so they are `#[ignore]`d; `cargo xtask test` runs them
//! (`--ignored namespace`) where it runs as root. Run by hand without root they fail, saying
//! why — they never pass where they could not run.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use weave_launch::{
    CancelToken, LaunchReport, LaunchSpec, RankExit, Signal, launch, namespace_holders, namespace_nodes_available,
    node_address, wait_namespaces_released,
};

/// Set in the child process of [`namespace_launcher_killed_with_sigkill_leaves_nothing`].
const CHILD_ENV: &str = "WEAVE_TEST_NAMESPACE_LAUNCHER_CHILD";

/// Panics with the reason unless namespace nodes can be made here.
fn require_namespaces() {
    if let Err(e) = namespace_nodes_available(None) {
        panic!("namespace nodes cannot be made here, so this test cannot run (it needs root): {e}");
    }
}

/// `ranks` ranks of `/bin/sh -c script` on `nodes` namespace nodes, output captured, 20 s bound.
fn sh(ranks: usize, nodes: usize, script: &str) -> LaunchSpec {
    LaunchSpec::new(ranks, "/bin/sh")
        .arg("-c")
        .arg(script)
        .capture(true)
        .timeout(Duration::from_secs(20))
        .namespace_nodes(nodes, None)
}

/// The interfaces of this process's network namespace (the host's).
fn host_links() -> BTreeSet<String> {
    let dev = std::fs::read_to_string("/proc/net/dev").expect("read /proc/net/dev");
    dev.lines().skip(2).filter_map(|l| l.split(':').next()).map(|n| n.trim().to_string()).collect()
}

/// This process's mount table without the fields that change by themselves.
fn host_mounts() -> BTreeSet<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo");
    info.lines().map(|l| l.split_whitespace().skip(4).take(1).chain(l.split(" - ").nth(1)).collect()).collect()
}

/// Waits up to 5 s until nothing holds the job's namespaces; panics with what still does.
fn assert_namespaces_gone(report: &LaunchReport) {
    assert!(!report.namespaces.is_empty(), "the report names no namespaces");
    if let Err(held) = wait_namespaces_released(&report.namespaces, Duration::from_secs(5)) {
        panic!("namespaces still held after the job:\n{}", held.join("\n"));
    }
}

/// Asks `left` every 50 ms, for up to 5 s, what is still there, until it answers `None`; panics
/// with `what` and its last answer otherwise.
fn assert_soon_gone(what: &str, mut left: impl FnMut() -> Option<String>) {
    let end = Instant::now() + Duration::from_secs(5);
    while let Some(still) = left() {
        assert!(Instant::now() < end, "{what}:\n{still}");
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "needs root (network namespaces): cargo xtask test runs it as root"]
fn namespace_nodes_have_their_own_hostname_network_and_shm() {
    require_namespaces();
    let marker = Marker(format!("/dev/shm/weave-netns-test-{}", std::process::id()));
    std::fs::write(&marker.0, b"host").unwrap();
    let (links, mounts) = (host_links(), host_mounts());
    // Each rank leaves a file in its /dev/shm, waits for its node-mate, then lists /dev/shm.
    let script = r#"
        echo "$RANK $(cat /proc/sys/kernel/hostname) $GROUP_RANK $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT ${WEAVE_HOST_ID-none} $(pwd)"
        touch /dev/shm/r$RANK; sleep 0.7; echo $(ls -A /dev/shm)
        echo $(tail -n +3 /proc/net/dev | cut -d: -f1) / $(ls /sys/class/net)
        echo $(grep -o '10\.57\.0\.[0-9]*' /proc/net/fib_trie | sort -u)
        sleep 0.5"#;
    let spec = sh(4, 2, script);
    let job = thread::spawn(move || launch(&spec));
    // While the job runs, the host's namespace has no new link.
    thread::sleep(Duration::from_millis(600));
    assert_eq!(host_links(), links, "a link appeared in the host's namespace during the job");
    let report = job.join().unwrap().unwrap();
    assert!(report.success(), "{}\n{:?}", report.summary(), report.ranks);
    let cwd = std::env::current_dir().unwrap();
    for r in &report.ranks {
        let node = r.rank / 2;
        let out = &r.stdout;
        assert_eq!(out.len(), 4, "{out:?}");
        let want = format!(
            "{} weave-node{node} {node} {} 2 {} 29500 none {}",
            r.rank,
            r.rank % 2,
            node_address(0),
            cwd.display()
        );
        assert_eq!(out[0], want, "hostname, variables, no WEAVE_HOST_ID, the launcher's directory");
        assert_eq!(out[1], format!("r{} r{}", node * 2, node * 2 + 1), "its node's /dev/shm, and only that");
        assert_eq!(out[2], "lo eth0 / eth0 lo");
        let own = node_address(node).to_string();
        let other = node_address(1 - node).to_string();
        let addrs: Vec<&str> = out[3].split(' ').collect();
        assert!(addrs.contains(&own.as_str()) && !addrs.contains(&other.as_str()), "{out:?}");
    }
    assert_eq!(report.namespaces.len(), 1 + 3 * 2);
    assert_namespaces_gone(&report);
    assert_eq!(host_links(), links);
    assert_eq!(host_mounts(), mounts, "the host's mount table changed");
    assert_eq!(std::fs::read(&marker.0).unwrap(), b"host");
    assert!(!std::path::Path::new("/dev/shm/r0").exists(), "a rank's file reached the host's /dev/shm");
}

#[test]
#[ignore = "needs root (network namespaces): cargo xtask test runs it as root"]
fn namespace_job_with_a_killed_rank_ends_and_leaves_nothing() {
    require_namespaces();
    let spec = sh(4, 2, r#"if [ "$RANK" = 3 ]; then sleep 0.3; kill -9 $$; fi; sleep 60"#);
    let t = Instant::now();
    let report = launch(&spec).unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
    assert_eq!(report.first_failure, Some(3), "{}", report.summary());
    assert_eq!(report.ranks[3].exit, RankExit::Signal(9));
    assert!(report.ranks[..3].iter().all(|r| r.killed_by_launcher));
    assert_namespaces_gone(&report);
}

#[test]
#[ignore = "needs root (network namespaces): cargo xtask test runs it as root"]
fn namespace_job_cancelled_like_ctrl_c_leaves_nothing() {
    require_namespaces();
    let token = CancelToken::new();
    let spec = sh(3, 3, "sleep 60").cancel_token(token.clone()).cancel_grace(Duration::from_millis(300));
    let canceller = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        token.cancel(Signal::SIGINT);
    });
    let report = launch(&spec).unwrap();
    canceller.join().unwrap();
    assert_eq!(report.cancelled, Some(Signal::SIGINT));
    assert!(report.ranks.iter().all(|r| r.killed_by_launcher));
    assert_namespaces_gone(&report);
}

#[test]
#[ignore = "needs root (network namespaces): cargo xtask test runs it as root"]
fn namespace_launcher_killed_with_sigkill_leaves_nothing() {
    require_namespaces();
    // The launcher is a child process (this test binary, running the helper below).
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "namespace_launcher_child", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        // Namespace ranks get no WEAVE_HOST_ID, not even the launcher's own.
        .env("WEAVE_HOST_ID", "must-not-reach-the-ranks")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut ready = 0;
    let end = Instant::now() + Duration::from_secs(20);
    while ready < 4 {
        let line = rx.recv_timeout(end.saturating_duration_since(Instant::now())).expect("the ranks did not start");
        if line.contains("] ready") {
            assert!(line.ends_with("] ready none"), "{line}");
            ready += 1;
        }
    }
    // Every process the launcher started (holders and ranks), and every namespace they are in
    // that is not ours.
    let ours: Vec<String> = ["net", "uts", "mnt"].iter().map(|k| ns_link("self", k)).collect();
    let started = children_of(child.id());
    assert_eq!(started.len(), 1 + 2 + 4, "switch, 2 node holders, 4 ranks: {started:?}");
    let mut namespaces: Vec<String> = started
        .iter()
        .flat_map(|p| ["net", "uts", "mnt"].map(|k| ns_link(&p.to_string(), k)))
        .filter(|id| !id.is_empty() && !ours.contains(id))
        .collect();
    namespaces.sort();
    namespaces.dedup();
    assert_eq!(namespaces.len(), 1 + 3 * 2, "{namespaces:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_soon_gone("left after the launcher died", || {
        let alive: Vec<u32> = started.iter().copied().filter(|&p| alive(p)).collect();
        let held = namespace_holders(&namespaces);
        (!alive.is_empty() || !held.is_empty()).then(|| format!("alive {alive:?}, held:\n{}", held.join("\n")))
    });
}

/// The launcher of [`namespace_launcher_killed_with_sigkill_leaves_nothing`], run only as its
/// child process: a job of 2 x 2 sleeping ranks that say when they are ready.
#[test]
#[ignore = "helper: runs only as the child process of namespace_launcher_killed_with_sigkill_leaves_nothing"]
fn namespace_launcher_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let spec = sh(4, 2, r#"echo "ready ${WEAVE_HOST_ID-none}"; exec sleep 60"#).echo(true);
    let _ = launch(&spec);
}

/// A file in the host's `/dev/shm`, removed on drop (also when the test fails).
struct Marker(String);

impl Drop for Marker {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `/proc/PID/ns/KIND`'s target, or "" when it cannot be read.
fn ns_link(pid: &str, kind: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
        if stat_field(pid, 1).is_some_and(|ppid| ppid == parent.to_string()) {
            found.push(pid);
        }
    }
    found
}

/// Field `i` after the command name in `/proc/PID/stat` (0: state, 1: parent pid).
fn stat_field(pid: u32, i: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    after.split_whitespace().nth(i).map(str::to_string)
}

/// Alive and not a zombie (a zombie holds no namespace, and its reaper is not ours).
fn alive(pid: u32) -> bool {
    stat_field(pid, 0).is_some_and(|state| state != "Z")
}
