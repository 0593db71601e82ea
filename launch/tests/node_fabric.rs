//! End-to-end test of a [`NodeFabric`] shared by several jobs. It needs root, so it is
//! `#[ignore]`d; `cargo xtask test` runs it (`--ignored namespace`) where it runs as root.
//! Run by hand without root it fails, saying why.

use std::process::Command;
use std::time::Duration;

use weave_launch::{
    Error, LaunchSpec, NamespaceNodes, NodeFabric, launch_on, namespace_holders, wait_namespaces_released,
};

#[test]
#[ignore = "needs root (network namespaces): cargo xtask test runs it as root"]
fn namespace_fabric_outlives_its_jobs_and_takes_their_leftovers_along() {
    let fabric = NodeFabric::build(NamespaceNodes { nodes: 2, rate: None })
        .unwrap_or_else(|e| panic!("namespace nodes cannot be made here, so this test cannot run (needs root): {e}"));
    // Each rank leaves a process outside its process group behind, which the job's end misses.
    let script = "echo $(cat /proc/sys/kernel/hostname) $GROUP_RANK; setsid sleep 60 </dev/null >/dev/null 2>&1 &";
    let spec = LaunchSpec::new(4, "/bin/sh").arg("-c").arg(script).capture(true).timeout(Duration::from_secs(20));
    let report = launch_on(&spec, &fabric).unwrap();
    assert!(report.success(), "{}", report.summary());
    let lines: Vec<&str> = report.ranks.iter().map(|r| r.stdout[0].as_str()).collect();
    assert_eq!(lines, ["weave-node0 0", "weave-node0 0", "weave-node1 1", "weave-node1 1"]);
    assert_eq!(report.namespaces, fabric.namespaces());
    let left = namespace_holders(&fabric.namespaces());
    assert!(left.iter().filter(|l| l.contains("(sleep)")).count() >= 4, "the leftovers run on: {left:?}");

    // Another program on the same nodes, as mpirun runs beside weave's ranks.
    let mut cmd = Command::new("/bin/sh");
    cmd.arg("-c").arg("cat /proc/sys/kernel/hostname; ls /sys/class/net");
    fabric.enter_on_spawn(1, &mut cmd).unwrap();
    let out = cmd.output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "weave-node1\neth0\nlo\n", "{out:?}");
    assert!(fabric.holder_pid(1).is_some() && fabric.holder_pid(2).is_none());

    // A spec that does not fit the fabric is refused before anything starts.
    let odd = LaunchSpec::new(3, "/bin/true");
    assert!(matches!(launch_on(&odd, &fabric), Err(Error::InvalidArgument(_))));
    let other = LaunchSpec::new(4, "/bin/true").namespace_nodes(4, None);
    assert!(matches!(launch_on(&other, &fabric), Err(Error::InvalidArgument(m)) if m.contains("leave it None")));

    // Dropping the fabric kills what is left inside, so the namespaces go.
    let namespaces = fabric.namespaces();
    drop(fabric);
    if let Err(held) = wait_namespaces_released(&namespaces, Duration::from_secs(5)) {
        panic!("namespaces still held after the fabric was dropped:\n{}", held.join("\n"));
    }
}
