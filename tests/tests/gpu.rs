//! GPU integration tests: `gpu-worker SCENARIO` launched once per GPU, on 2 GPUs and on every
//! GPU of the host. A custom harness (`harness = false`): without a CUDA driver or with fewer
//! than 2 GPUs every test is reported SKIPPED and the summary says 0 passed — these tests never
//! count as passed on a machine that cannot run them.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use comm_core::testing::{report_skipped, run_named_tests};
use weave_tests::launcher::{
    assert_survivors_saw_the_killed_rank, dump, launch_serialized, median_and_max, run_ok, scenario_spec,
};

const WORKER: &str = env!("CARGO_BIN_EXE_gpu-worker");

fn worker() -> &'static Path {
    Path::new(WORKER)
}

/// World sizes to test: 2 and every GPU (at most 8); on one GPU shared by two ranks
/// (`WEAVE_TEST_SHARE_GPU=1`), 2.
fn worlds(gpus: usize) -> Vec<usize> {
    let mut w = vec![2, gpus.clamp(2, 8)];
    w.dedup();
    w
}

/// Whether the tests may run two ranks on one GPU (rank r takes device r % count): correctness,
/// fault and leak tests mean the same there; speed does not.
fn share_one_gpu() -> bool {
    std::env::var("WEAVE_TEST_SHARE_GPU").is_ok_and(|v| v == "1")
}

/// Runs `spec` (scenario `name`, which must pass on every rank) and prints rank 0's OK line
/// after `label`.
fn run_and_show(spec: &weave_launch::LaunchSpec, name: &str, label: &str) {
    let report = run_ok(spec, name);
    if let Some(line) = report.ranks[0].stdout.iter().find(|l| l.starts_with("OK ")) {
        println!("    [{label}, rank 0] {line}");
    }
}

fn scenario(name: &'static str, gpus: usize, timeout: Duration) {
    for n in worlds(gpus) {
        let report = run_ok(&scenario_spec(worker(), name, n, 20.0, timeout), name);
        for r in &report.ranks {
            if let Some(line) = r.stdout.iter().find(|l| l.starts_with("OK ")) {
                println!("    [{n} GPUs, rank {}] {line}", r.rank);
            }
        }
    }
}

fn matrix(gpus: usize) {
    scenario("matrix", gpus, Duration::from_secs(900));
}

/// The forced-algorithm scenario once per algorithm family: every packet kernel, the two-shot
/// all-reduces (LL16 packets, LL128 lines), every pipelined kernel; then the channel family
/// (its table rows, then each channel algorithm forced wherever it runs).
fn forced(gpus: usize) {
    const FAMILIES: [&str; 11] = [
        "all_reduce=one_shot,all_gather=one_shot,reduce_scatter=one_shot,broadcast=one_shot,all_to_all=one_shot,reduce=one_shot",
        "all_reduce=two_shot,broadcast=ring",
        "all_reduce=two_shot_ll128",
        "all_reduce=two_phase,all_gather=direct,reduce_scatter=direct,broadcast=two_phase,all_to_all=direct,reduce=direct",
        "channel",
        "channel_ring",
        "channel_direct",
        "channel_doubling",
        "channel_halving",
        "channel_bruck",
        "channel_tree",
    ];
    for n in worlds(gpus) {
        for family in FAMILIES {
            let spec = scenario_spec(worker(), "forced", n, 20.0, Duration::from_secs(300)).env("WEAVE_ALGO", family);
            run_and_show(&spec, "forced", &format!("{n} GPUs"));
        }
    }
}

fn graph(gpus: usize) {
    with_both_families("graph", gpus, Duration::from_secs(300));
}

fn stale_state(gpus: usize) {
    scenario("stale-state", gpus, Duration::from_secs(600));
}

/// `name` with the algorithms the table picks, then with the channel family forced.
fn with_both_families(name: &'static str, gpus: usize, timeout: Duration) {
    scenario(name, gpus, timeout);
    for n in worlds(gpus) {
        let spec = scenario_spec(worker(), name, n, 20.0, timeout).env("WEAVE_ALGO", "channel");
        run_and_show(&spec, name, &format!("{n} GPUs, channel family"));
    }
}

fn p2p(gpus: usize) {
    with_both_families("p2p", gpus, Duration::from_secs(300));
}

/// Every safe typed call on cudarc buffers (`gpu-worker typed`), on both kernel families.
fn typed(gpus: usize) {
    with_both_families("typed", gpus, Duration::from_secs(300));
}

/// The channel family's logarithmic algorithms (`kernels/cuda/channel_log.cu`).
const LOGARITHMIC: [&str; 4] = ["channel_doubling", "channel_halving", "channel_bruck", "channel_tree"];

/// `ranks` ranks (sharing the host's GPUs, rank r on GPU r % count): beyond the direct kernels'
/// eight, so every device call runs the channel family: every collective at small and odd sizes,
/// and a send/receive ring shift. The plan must pick the logarithmic algorithms for the small
/// calls by itself: rank 0's log (`WEAVE_DEBUG=info`, a line per call) must name each of them.
fn wide_world(ranks: usize) {
    let spec = scenario_spec(worker(), "wide", ranks, 60.0, Duration::from_secs(480)).env("WEAVE_DEBUG", "info");
    let report = run_ok(&spec, "wide");
    let log = &report.ranks[0].stderr;
    for algo in LOGARITHMIC {
        let ran = log.iter().filter(|l| l.contains(&format!("-> {algo} ("))).count();
        assert!(ran > 0, "{ranks} ranks: rank 0 never ran {algo}\n{}", dump(&report));
        println!("    [{ranks} ranks, rank 0] {ran} calls ran {algo}");
    }
    if let Some(line) = report.ranks[0].stdout.iter().find(|l| l.starts_with("OK ")) {
        println!("    [{ranks} ranks, rank 0] {line}");
    }
}

/// Sixteen ranks: see [`wide_world`].
fn sixteen_ranks(_gpus: usize) {
    wide_world(16);
}

/// Thirteen ranks, not a power of two: doubling and halving fold five pairs into a core of
/// eight; Bruck's last step and the trees are partial. See [`wide_world`].
fn thirteen_ranks(_gpus: usize) {
    wide_world(13);
}

/// Each logarithmic algorithm forced (the `forced` scenario: small, odd and edge sizes, every
/// collective it runs, the same bits on every rank) on worlds that are not powers of two: 3 (one
/// folded pair, the core of 2) and 7 (three folded pairs; Bruck's last step moves 3 of 4
/// blocks), ranks sharing the host's GPUs where it has fewer. Rank 0's log must show the forced
/// algorithm running.
fn logarithmic_forced_on_odd_worlds(_gpus: usize) {
    for n in [3, 7] {
        for algo in LOGARITHMIC {
            let spec = scenario_spec(worker(), "forced", n, 20.0, Duration::from_secs(300))
                .env("WEAVE_ALGO", algo)
                .env("WEAVE_DEBUG", "info");
            let report = run_ok(&spec, "forced");
            let ran = report.ranks[0].stderr.iter().filter(|l| l.contains(&format!("-> {algo} ("))).count();
            assert!(ran > 0, "{n} ranks, WEAVE_ALGO={algo}: rank 0 never ran it\n{}", dump(&report));
            if let Some(line) = report.ranks[0].stdout.iter().find(|l| l.starts_with("OK ")) {
                println!("    [{n} ranks, rank 0, {ran} calls ran {algo}] {line}");
            }
        }
    }
}

fn fault_kill(gpus: usize) {
    // The direct kernels (the table's choice), then the channel family (the proxy's links).
    for (n, algo) in worlds(gpus).into_iter().flat_map(|n| [(n, ""), (n, "channel")]) {
        let weave_timeout = 5.0;
        let spec = scenario_spec(worker(), "fault-kill", n, weave_timeout, Duration::from_secs(120))
            .keep_going(true)
            .env("WEAVE_ALGO", algo);
        let report = launch_serialized(&spec).expect("launch fault-kill");
        assert_survivors_saw_the_killed_rank(&report, "fault-kill");
        for r in &report.ranks[..n - 1] {
            if let Some(line) = r.stdout.iter().find(|l| l.starts_with("OK ")) {
                println!("    [{n} GPUs, WEAVE_ALGO={algo:?}, rank {}] {line}", r.rank);
            }
        }
        assert!(report.elapsed < Duration::from_secs(90), "fault job took {:?}", report.elapsed);
    }
}

/// The GPU fault figure: for every collective, 20 jobs in which the last rank SIGKILLs itself at
/// a pseudo-random point of back-to-back 64 MiB calls; every survivor must fail with PeerLost
/// within 1 s of the kill (`WEAVE_TIMEOUT` stays at 20 s, so only the peer watch is that fast).
fn kill_trials(gpus: usize) {
    let n = worlds(gpus)[0];
    for op in ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"] {
        let mut delays = Vec::new();
        for trial in 0..20 {
            let spec =
                scenario_spec(worker(), "kill-trial", n, 20.0, Duration::from_secs(120)).arg(op).keep_going(true);
            let report = launch_serialized(&spec).expect("launch kill-trial");
            let stamp = |r: &weave_launch::RankReport, key: &str| -> Option<u128> {
                r.stdout.iter().find_map(|l| l.strip_prefix(key).and_then(|v| v.trim().parse().ok()))
            };
            let killed = stamp(&report.ranks[n - 1], "KILL_AT ")
                .unwrap_or_else(|| panic!("{op} trial {trial}: no kill\n{}", dump(&report)));
            for r in &report.ranks[..n - 1] {
                let seen = stamp(r, "DETECTED_AT ").unwrap_or_else(|| {
                    panic!("{op} trial {trial}: rank {} saw no PeerLost\n{}", r.rank, dump(&report))
                });
                let delay = Duration::from_nanos(seen.saturating_sub(killed) as u64);
                assert!(delay < Duration::from_secs(1), "{op} trial {trial}: rank {} took {delay:?}", r.rank);
                delays.push(delay);
            }
        }
        let (median, max) = median_and_max(&mut delays);
        println!("    [{n} ranks] {op}: 20 kills, survivors failed after median {median:?}, max {max:?}");
    }
}

/// A rank SIGKILLed in the middle of a device all-reduce of three ranks (sharing the host's GPUs
/// where it has fewer): every survivor fails, revokes, agrees on exactly that rank, shrinks, and
/// runs checked device all-reduces and all-gathers on the shrunk communicator — the table's
/// family, then the channel family. Survivors must be done within 2 s of detecting the loss.
fn survive_a_rank_killed_mid_device_all_reduce(_gpus: usize) {
    let n = 3;
    for algo in ["", "channel"] {
        let spec = scenario_spec(worker(), "survive-device", n, 5.0, Duration::from_secs(300))
            .keep_going(true)
            .env("WEAVE_ALGO", algo);
        let report = launch_serialized(&spec).expect("launch survive-device");
        // The worker's victim: the middle rank, so that the last one is renumbered.
        let victim = n / 2;
        assert_eq!(
            report.ranks[victim].exit,
            weave_launch::RankExit::Signal(9),
            "rank {victim} was to die by SIGKILL\n{}",
            dump(&report)
        );
        for r in report.ranks.iter().filter(|r| r.rank != victim) {
            let line = r.stdout.iter().find(|l| l.starts_with("OK survive-device")).unwrap_or_else(|| {
                panic!("WEAVE_ALGO={algo:?}: survivor {} did not carry on\n{}", r.rank, dump(&report))
            });
            println!("    [{n} ranks, WEAVE_ALGO={algo:?}, rank {}] {line}", r.rank);
            let agreed: u64 = weave_tests::launcher::number_after(line, "] in ");
            let shrunk: u64 = weave_tests::launcher::number_after(line, "shrunk in ");
            assert!(agreed + shrunk < 2000, "rank {}: agree {agreed} ms + shrink {shrunk} ms", r.rank);
            let carried = format!("transports {}", weave_tests::survive::CARRIED);
            assert!(line.contains(&carried), "rank {}: the shrink opened transports of its own: {line}", r.rank);
        }
    }
}

/// Three ranks (sharing the host's GPUs where it has fewer): the last skips a device
/// all-reduce; the others' kernels wait until the timeout, and `check_gpu` must give both the
/// same verdict naming the last rank as behind, within a second of the timeout.
fn a_rank_that_skips_a_device_call_is_named_by_the_verdict(_gpus: usize) {
    let verdict = stalled_device_verdict("skip");
    assert!(verdict.contains("rank 2 is behind: finished 2 collectives, in no call now"), "{verdict}");
}

/// As [`a_rank_that_skips_a_device_call_is_named_by_the_verdict`], but the last rank makes the
/// call behind a kernel that keeps its GPU busy past the timeout: the verdict must name it as
/// the rank whose GPU has not started the call.
fn a_rank_whose_gpu_is_kept_busy_is_named_by_the_verdict(_gpus: usize) {
    let verdict = stalled_device_verdict("busy");
    assert!(
        verdict.contains("2 reached collective 3")
            && verdict.contains("rank 2 began it, but its GPU has not started it: the GPU is still on work queued")
            && verdict.contains("the latest collective it started is 2"),
        "{verdict}"
    );
}

/// Runs `gpu-worker stall-device MODE` on three ranks and returns the verdict, after checking
/// that the two ranks not holding up the call reported the same one within a second of the
/// timeout.
fn stalled_device_verdict(mode: &str) -> String {
    let n = 3;
    let spec = scenario_spec(worker(), "stall-device", n, 3.0, Duration::from_secs(120)).arg(mode);
    let report = launch_serialized(&spec).expect("launch stall-device");
    assert!(report.success(), "{}", dump(&report));
    let mut verdicts = Vec::new();
    for r in &report.ranks[..n - 1] {
        let line = r.stdout.iter().find(|l| l.contains("VERDICT ")).unwrap_or_else(|| panic!("{}", dump(&report)));
        println!("    [{n} ranks, {mode}, rank {}] {line}", r.rank);
        let took: u64 = weave_tests::launcher::number_after(line, "failed after ");
        assert!(took < 3000 + 1000, "rank {}: the verdict came {took} ms after the call (timeout 3 s)", r.rank);
        verdicts.push(line.split("VERDICT ").nth(1).unwrap_or_default().to_string());
    }
    assert!(verdicts.iter().all(|v| *v == verdicts[0]), "the verdicts differ\n{}", dump(&report));
    verdicts.swap_remove(0)
}

/// Three ranks: rank 1's device send that rank 0 never receives must be found at their next
/// device exchange (rank 0's `check_gpu` reports it), never taken for the later message, and
/// every rank's next call must fail with `Revoked` — the table's family, then the channel
/// family.
fn an_unmatched_device_send_is_found_at_the_next_exchange(_gpus: usize) {
    let n = 3;
    for algo in ["", "channel"] {
        let spec =
            scenario_spec(worker(), "p2p-mismatch-device", n, 5.0, Duration::from_secs(120)).env("WEAVE_ALGO", algo);
        let report = launch_serialized(&spec).expect("launch p2p-mismatch-device");
        assert!(report.success(), "WEAVE_ALGO={algo:?}\n{}", dump(&report));
        let line = report.ranks[0].stdout.iter().find(|l| l.starts_with("OK")).expect("checked by success");
        println!("    [{n} ranks, WEAVE_ALGO={algo:?}] {line}");
    }
}

/// A GPU test: its name and body (given the number of GPUs).
type GpuTest = (&'static str, fn(usize));

const TESTS: &[GpuTest] = &[
    ("survive_a_rank_killed_mid_device_all_reduce", survive_a_rank_killed_mid_device_all_reduce),
    (
        "a_rank_that_skips_a_device_call_is_named_by_the_verdict",
        a_rank_that_skips_a_device_call_is_named_by_the_verdict,
    ),
    ("a_rank_whose_gpu_is_kept_busy_is_named_by_the_verdict", a_rank_whose_gpu_is_kept_busy_is_named_by_the_verdict),
    ("an_unmatched_device_send_is_found_at_the_next_exchange", an_unmatched_device_send_is_found_at_the_next_exchange),
    ("every_device_collective_dtype_op_and_size", matrix),
    ("every_algorithm_forced_at_small_and_edge_sizes", forced),
    ("cuda_graph_capture_and_replay", graph),
    ("a_thousand_device_calls_with_changing_sizes", stale_state),
    ("device_send_recv", p2p),
    ("typed_device_calls_on_cudarc_buffers", typed),
    ("sixteen_ranks_run_every_device_collective_over_channels", sixteen_ranks),
    ("thirteen_ranks_run_every_device_collective_over_channels", thirteen_ranks),
    ("logarithmic_channel_algorithms_forced_on_odd_worlds", logarithmic_forced_on_odd_worlds),
    ("device_collectives_across_posed_nodes_over_tcp", across_posed_nodes),
    ("device_collectives_over_tcp_alone_without_cuda_ipc", over_tcp_alone),
    ("weave_gpu_off_leaves_the_gpu_alone", weave_gpu_off),
    ("device_memory_is_made_when_needed_and_suspends", device_memory),
    ("one_buffer_a_window_of_two_communicators_in_place", windows),
    ("buffers_registered_alone_are_used_in_place", registered),
    ("a_rank_killed_mid_collective_fails_the_others_within_the_timeout", fault_kill),
    ("twenty_kills_per_collective_fail_the_survivors_within_a_second", kill_trials),
];

/// Compiles every kernel program into the kernel cache once (`gpu-worker precompile`), before
/// any test runs: the kernels compile lazily at their first call, and a compile on a cold cache
/// (over a minute for the direct program) must not count against a test's time bound. A failed
/// warm-up is reported and the tests run anyway (they compile what they need themselves).
fn warm_kernel_cache() {
    let started = Instant::now();
    match std::process::Command::new(WORKER).arg("precompile").output() {
        Ok(out) if out.status.success() => {
            let said = String::from_utf8_lossy(&out.stdout);
            println!("kernel cache warmed in {:.1?}: {}", started.elapsed(), said.trim());
        }
        Ok(out) => println!("kernel cache warm-up failed: {}", String::from_utf8_lossy(&out.stderr).trim()),
        Err(e) => println!("kernel cache warm-up could not start {WORKER}: {e}"),
    }
}

fn gpu_count() -> Result<usize, String> {
    if !weave_cuda::driver_available() {
        return Err("no CUDA driver".into());
    }
    weave_cuda::device_count().map_err(|e| e.to_string())
}

/// Device calls across nodes posed on this host (`WEAVE_HOST_ID` per node, so CUDA IPC and
/// shared memory stay inside a node and TCP carries the rest): the channel family with links
/// through host memory the GPUs map, 2 nodes of 1 rank and 2 nodes of 2.
fn across_posed_nodes(_gpus: usize) {
    for (nodes, per_node) in [(2, 1), (2, 2)] {
        let spec = scenario_spec(worker(), "wide", nodes * per_node, 60.0, Duration::from_secs(480)).posed_nodes(nodes);
        run_and_show(&spec, "wide", &format!("{nodes} posed nodes x {per_node}"));
    }
}

/// Device calls with TCP the only transport (`WEAVE_TRANSPORTS=tcp`: no CUDA IPC, no shared
/// memory): the GPU engine opens its device itself (no transport serves one) and runs the
/// channel family with links in host memory the GPUs map, 2 and 3 ranks.
fn over_tcp_alone(_gpus: usize) {
    for ranks in [2, 3] {
        let spec =
            scenario_spec(worker(), "wide", ranks, 60.0, Duration::from_secs(480)).env("WEAVE_TRANSPORTS", "tcp");
        run_and_show(&spec, "wide", &format!("{ranks} ranks over tcp alone"));
    }
}

/// `WEAVE_GPU=off` on a GPU host: no GPU path, device calls refused naming the variable, host
/// calls run (a host-only job on a GPU machine need not touch the GPU).
/// What a communicator holds on its GPU: at most 64 MiB after creation, an 8-byte all-reduce
/// and all-reduces up to 1 MiB, at most 340 MiB after 256 MiB; suspended and resumed; a one-rank
/// communicator holds none (`gpu-worker device-memory`).
fn device_memory(gpus: usize) {
    scenario("device-memory", gpus, Duration::from_secs(180));
}

/// One buffer a symmetric window of two communicators over the same ranks, used in place from
/// two streams at once (1,000 all-reduces, exact; no workspace area made), a window of the
/// wrong communicator refused, deregistered memory copied (`gpu-worker windows`). Rank 0's
/// plan log must show the windowed kernel.
/// Runs `scenario` on each world and checks that rank 0's plan log shows all-reduces in place
/// of both forms, labelled `label` (`windowed`, `registered`).
fn in_place_all_reduces(gpus: usize, scenario: &str, label: &str) {
    for n in worlds(gpus) {
        let spec = scenario_spec(worker(), scenario, n, 20.0, Duration::from_secs(300)).env("WEAVE_DEBUG", "info");
        let report = run_ok(&spec, scenario);
        let log = report.ranks[0].stderr.join("\n");
        assert!(
            log.contains(&format!("-> {label} OneShot")) && log.contains(&format!("-> {label} TwoShot, in place")),
            "rank 0's plan log shows no {label} all-reduce:\n{}",
            &log[log.len().saturating_sub(4000)..]
        );
        if let Some(line) = report.ranks[0].stdout.iter().find(|l| l.starts_with("OK ")) {
            println!("    [{n} GPUs, rank 0] {line}");
        }
    }
}

fn windows(gpus: usize) {
    in_place_all_reduces(gpus, "windows", "windowed");
}

fn registered(gpus: usize) {
    in_place_all_reduces(gpus, "registered", "registered");
}

fn weave_gpu_off(_gpus: usize) {
    let spec = scenario_spec(worker(), "gpu-off", 2, 20.0, Duration::from_secs(60)).env("WEAVE_GPU", "off");
    run_and_show(&spec, "gpu-off", "2 ranks, WEAVE_GPU=off");
}

fn main() -> ExitCode {
    // As libtest: names containing any FILTER run, minus those containing a `--skip` value.
    let (mut filters, mut skips) = (Vec::new(), Vec::new());
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--skip" {
            skips.extend(args.next());
        } else if !a.starts_with('-') {
            filters.push(a);
        }
    }
    let selected: Vec<_> = TESTS
        .iter()
        .filter(|(n, _)| filters.is_empty() || filters.iter().any(|f| n.contains(f.as_str())))
        .filter(|(n, _)| !skips.iter().any(|s| n.contains(s.as_str())))
        .collect();
    if std::env::args().any(|a| a == "--list") {
        for (name, _) in &selected {
            println!("{name}: test");
        }
        return ExitCode::SUCCESS;
    }
    let gpus = match gpu_count() {
        Ok(n) if n >= 2 => n,
        Ok(1) if share_one_gpu() => {
            println!("weave GPU tests: two ranks share the one GPU (WEAVE_TEST_SHARE_GPU=1)");
            1
        }
        other => {
            let why = match other {
                Ok(n) => format!("{n} GPU(s); these tests need 2 (or 1 with WEAVE_TEST_SHARE_GPU=1)"),
                Err(e) => e,
            };
            return report_skipped(selected.iter().map(|(name, _)| *name), "weave GPU", &why);
        }
    };
    // Tests left out on purpose, each reported as skipped with why: `WEAVE_GPU_TESTS_SKIP`
    // (names or parts, comma-separated: to split the tests over several calls), and on one
    // shared GPU the timing trials, whose bound needs GPUs of their own.
    let asked: Vec<String> = std::env::var("WEAVE_GPU_TESTS_SKIP")
        .map(|v| v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect())
        .unwrap_or_default();
    let why_not = |name: &str| -> Option<&str> {
        if asked.iter().any(|s| name.contains(s.as_str())) {
            Some("left out by WEAVE_GPU_TESTS_SKIP")
        } else if gpus == 1 && name == "twenty_kills_per_collective_fail_the_survivors_within_a_second" {
            Some("its 1 s bound needs a GPU per rank; ranks share the one GPU here")
        } else {
            None
        }
    };
    let (left_out, selected): (Vec<_>, Vec<_>) = selected.into_iter().partition(|(n, _)| why_not(n).is_some());
    for (name, _) in &left_out {
        println!("test {name} ... SKIPPED ({})", why_not(name).unwrap_or_default());
    }
    println!("weave GPU tests on {gpus} GPUs (worlds {:?})", worlds(gpus));
    warm_kernel_cache();
    run_named_tests(selected.iter(), left_out.len(), |test| test(gpus))
}
