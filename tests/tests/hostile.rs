//! A hostile process on the network of a 2 × 2 namespace-node job (`weave_tests::hostile`): it
//! knows every rank's listening ports — the bootstrap's link listeners and the TCP transport's
//! — but none of the job's secrets, and sends them garbage, truncated, oversized and replayed
//! messages, handshakes with a wrong secret or version, and frames naming registrations,
//! offsets and lengths out of range, while the ranks run checked collectives. The job must
//! finish exact and nothing may be left behind. Needs root, so it is `#[ignore]`d;
//! `cargo xtask test` runs it (`--ignored namespace`) where it runs as root.

use std::process::Command;
use std::time::Duration;

use weave_launch::{NamespaceNodes, NodeFabric, RankExit, launch_on, wait_namespaces_released};
use weave_tests::launcher::{dump, random_secret, scenario_spec};

const WORKER: &str = env!("CARGO_BIN_EXE_collectives-worker");
/// How long the attacker attacks.
const ATTACK_SECONDS: u64 = 6;

#[test]
#[ignore = "needs root (network namespaces): cargo xtask test runs it as root"]
fn a_hostile_process_on_a_namespace_job_network_changes_nothing() {
    let fabric = NodeFabric::build(NamespaceNodes { nodes: 2, rate: None })
        .unwrap_or_else(|e| panic!("namespace nodes cannot be made here, so this test cannot run (needs root): {e}"));
    let dir = std::env::temp_dir().join(format!("weave-hostile-{}", random_secret()));
    std::fs::create_dir_all(&dir).expect("a directory for the job's listeners");
    let ranks = 4;
    let spec = scenario_spec(WORKER.as_ref(), "hostile-target", ranks, 10.0, Duration::from_secs(180))
        .arg(dir.to_str().expect("a UTF-8 temporary directory"));
    let mut attacker = Command::new(WORKER);
    attacker
        .args(["hostile-attack", &format!("{}/{ATTACK_SECONDS}", dir.display())])
        .env("WEAVE_HOSTILE_RANKS", ranks.to_string());
    // On node 1, beside ranks 2 and 3: it reaches node 0's ranks over the job's network.
    fabric.enter_on_spawn(1, &mut attacker).expect("the attacker enters node 1");
    let (report, attack) = std::thread::scope(|s| {
        let job = s.spawn(|| launch_on(&spec, &fabric));
        let attack = attacker.output().expect("the attacker runs");
        (job.join().expect("the launcher thread"), attack)
    });
    let report = report.expect("the job starts");
    let _ = std::fs::remove_dir_all(&dir);
    let said = String::from_utf8_lossy(&attack.stdout);
    assert!(
        attack.status.success() && said.contains("OK hostile-attack"),
        "the attacker failed: {said}{}",
        String::from_utf8_lossy(&attack.stderr)
    );
    println!("{}", said.trim());
    for r in &report.ranks {
        let ok = r.stdout.iter().find(|l| l.starts_with("OK hostile-target"));
        assert!(
            r.exit == RankExit::Code(0) && ok.is_some(),
            "rank {} did not finish exact under attack\n{}",
            r.rank,
            dump(&report)
        );
        println!("rank {}: {}", r.rank, ok.map(String::as_str).unwrap_or_default());
    }
    let namespaces = fabric.namespaces();
    drop(fabric);
    if let Err(held) = wait_namespaces_released(&namespaces, Duration::from_secs(5)) {
        panic!("namespaces still held after the job:\n{}", held.join("\n"));
    }
}
