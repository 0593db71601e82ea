//! The bench worker as the benchmark and other tests run it: one process of thread ranks, two
//! namespace nodes with a shaped link, and the yardstick of the ledger's cost.

use std::time::{Duration, Instant};

use weave_tests::launcher::{dump, launch_serialized, number_after};

const BENCH: &str = env!("CARGO_BIN_EXE_bench-worker");

/// `bench-worker --threads N` runs a whole timed job as N thread ranks of one process and
/// prints rank 0's line per size, as a job of N processes would.
#[test]
fn the_bench_worker_times_a_world_of_thread_ranks() {
    let out = std::process::Command::new(BENCH)
        .args(["--threads", "16", "--op", "all_gather", "-b", "1K", "-e", "8K", "-f", "8"])
        .args(["--iters", "3", "--warmup", "1", "--check"])
        .env("WEAVE_TIMEOUT", "60")
        .output()
        .expect("running bench-worker");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "bench-worker failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with('{')).collect();
    assert_eq!(lines.len(), 2, "one line per size (1 KiB, 8 KiB), from rank 0 only:\n{stdout}");
    for (line, bytes) in lines.iter().zip([1024, 8192]) {
        for field in [format!("\"bytes\":{bytes},"), "\"ranks\":16,".into(), "\"wrong\":0,".into()] {
            assert!(line.contains(&field), "{field} missing from {line}");
        }
        let time: f64 = number_after(line, "\"time_us\":");
        assert!(time > 0.0, "{line}");
    }
}

/// The bus bandwidth (GB/s) of a 32 MiB all-reduce between two namespace nodes of one rank.
fn all_reduce_busbw(rate: Option<weave_launch::Rate>) -> f64 {
    let args = ["--op", "all_reduce", "-b", "32M", "-e", "32M", "--warmup", "1", "--iters", "3"];
    let spec = weave_launch::LaunchSpec::new(2, BENCH)
        .args(args)
        .timeout(Duration::from_secs(120))
        .env("WEAVE_TIMEOUT", "60")
        .capture(true)
        .namespace_nodes(2, rate);
    let report = launch_serialized(&spec).expect("launch bench-worker");
    assert!(report.success(), "{}\n{}", report.summary(), dump(&report));
    let line = report.ranks[0].stdout.iter().find(|l| l.contains("\"busbw\":")).expect("a result line");
    number_after(line, "\"busbw\":")
}

#[test]
#[ignore = "needs root (network namespaces): cargo xtask test runs it as root"]
fn namespace_links_shaped_to_1gbit_carry_at_most_1gbit() {
    if let Err(e) = weave_launch::namespace_nodes_available(None) {
        panic!("namespace nodes cannot be made here, so this test cannot run (it needs root): {e}");
    }
    let rate: weave_launch::Rate = "1gbit".parse().unwrap();
    let line_rate = rate.bytes_per_sec() as f64 / 1e9;
    let free = all_reduce_busbw(None);
    let shaped = all_reduce_busbw(Some(rate));
    println!("all_reduce 32 MiB across 2 namespace nodes: {free:.3} GB/s unshaped, {shaped:.3} GB/s at {rate}");
    // Two ranks: each sends the whole buffer once over its link, so busbw is the link's payload rate.
    assert!(
        free > 2.0 * line_rate,
        "unshaped links carry only {free:.3} GB/s, too little to tell shaping at {line_rate} GB/s from none"
    );
    assert!(shaped <= 1.02 * line_rate, "shaped to {rate} ({line_rate} GB/s) yet carried {shaped:.3} GB/s");
    assert!(shaped >= 0.6 * line_rate, "shaped to {rate} ({line_rate} GB/s) but carried only {shaped:.3} GB/s");
}

/// What the ledger adds to every call — a begin and a finish — timed in this process, against
/// the latency of an 8-byte all-reduce of two shared-memory ranks (`bench-worker`, median of
/// 20,000 calls) measured in the same run. A timing: run it in release
/// (`cargo test --release -p weave-bench --test workers -- --ignored ledger`).
#[test]
#[ignore = "a timing: run in release"]
fn the_ledger_costs_at_most_two_percent_of_an_8_byte_all_reduce() {
    use comm_core::ledger::{CallKind, CallSignature, Ledger};
    let args = ["--op", "all_reduce", "-b", "8", "-e", "8", "--warmup", "2000", "--iters", "20000"];
    let spec = weave_launch::LaunchSpec::new(2, BENCH)
        .args(args)
        .timeout(Duration::from_secs(120))
        .env("WEAVE_TIMEOUT", "60")
        .capture(true);
    let report = launch_serialized(&spec).expect("launch bench-worker");
    assert!(report.success(), "{}", dump(&report));
    let line = report.ranks[0].stdout.iter().find(|l| l.contains("\"time_us\":")).expect("a result line");
    let all_reduce_ns = number_after::<f64>(line, "\"time_us\":") * 1e3;
    let ledger = Ledger::default();
    let calls = 20_000_000u64;
    // The loop without the ledger, to take away: building the signature, the loop itself.
    let started = Instant::now();
    for i in 0..calls {
        let signature = CallSignature::host(CallKind::AllReduce, std::hint::black_box(8 + (i & 1) as usize), None);
        std::hint::black_box(signature);
    }
    let bare = started.elapsed();
    let started = Instant::now();
    for i in 0..calls {
        let signature = CallSignature::host(CallKind::AllReduce, std::hint::black_box(8 + (i & 1) as usize), None);
        let seq = ledger.begin(signature);
        ledger.finish(&std::hint::black_box(signature), seq);
    }
    let ledger_ns = started.elapsed().saturating_sub(bare).as_nanos() as f64 / calls as f64;
    assert_eq!(ledger.entry().collectives_finished, calls);
    let ratio = ledger_ns / all_reduce_ns;
    println!(
        "ledger: {ledger_ns:.2} ns per call; 8 B all_reduce on 2 shm ranks: {all_reduce_ns:.0} ns; ratio {:.3} %",
        ratio * 100.0
    );
    assert!(ratio <= 0.02, "the ledger costs {:.2} % of an 8 B all-reduce", ratio * 100.0);
}
