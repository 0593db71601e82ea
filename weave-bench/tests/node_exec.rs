//! Root-only check of `weave-bench node-exec`, the agent through which `weave-bench --nodes`
//! has mpirun start its daemons on the other nodes. It is `#[ignore]`d (it needs
//! namespaces); `cargo xtask test` runs it as root with the other namespace tests.

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use weave_launch::{NamespaceNodes, NodeFabric, namespace_holders};

/// The `sleep` processes inside `fabric`'s namespaces.
fn sleepers(fabric: &NodeFabric) -> usize {
    namespace_holders(&fabric.namespaces()).iter().filter(|l| l.contains("(sleep) is in net:")).count()
}

/// Waits up to `limit` for `sleepers(fabric) == want`.
fn wait_for_sleepers(fabric: &NodeFabric, want: usize, limit: Duration) {
    let end = Instant::now() + limit;
    while sleepers(fabric) != want {
        assert!(Instant::now() < end, "{} sleep processes in the nodes after {limit:?}, want {want}", sleepers(fabric));
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
#[ignore = "needs root (network namespaces): cargo xtask test runs it as root"]
fn namespace_node_exec_runs_in_the_node_and_its_leftovers_die_with_its_parent() {
    let fabric = NodeFabric::build(NamespaceNodes { nodes: 2, rate: None })
        .unwrap_or_else(|e| panic!("namespace nodes cannot be made here, so this test cannot run (needs root): {e}"));
    let weave_bench = env!("CARGO_BIN_EXE_weave-bench");
    let node = format!("10.57.0.2={}", fabric.holder_pid(1).unwrap());
    // As mpirun calls ssh: options, HOST, then the command's words, joined for `sh -c`.
    let out = Command::new(weave_bench)
        .args(["node-exec", "--node", &node, "--", "-x", "10.57.0.2", "cat /proc/sys/kernel/hostname;", "exit", "3"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "weave-node1\n", "{out:?}");
    assert_eq!(out.status.code(), Some(3), "the command's exit status comes back");

    // Its parent killed with SIGKILL (mpirun dying with a killed weave-bench): what the command
    // started in the node is killed too, even what left its session.
    let script = format!("'{weave_bench}' node-exec --node {node} -- 10.57.0.2 'setsid sleep 61 & sleep 62'; true");
    let mut parent = Command::new("/bin/sh").arg("-c").arg(script).spawn().unwrap();
    wait_for_sleepers(&fabric, 2, Duration::from_secs(5));
    parent.kill().unwrap();
    parent.wait().unwrap();
    wait_for_sleepers(&fabric, 0, Duration::from_secs(3));
}
