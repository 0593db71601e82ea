//! `weave-bench --gpu`: device buffers on this host's GPUs (or on namespace nodes), through
//! `gpu-bench`, with NCCL beside weave for `--vs-nccl`; and `--plot-from`, the plot of a saved
//! gpu-bench output.

use std::path::Path;
use std::process::{Command, ExitCode};

use collectives::{Collective, DataType, ReduceOp};
use weave_launch::{CancelToken, LaunchSpec, launch, launch_on};

use crate::cli::BenchArgs;
use crate::host_run::{build_worker, write_plot};
use crate::nodes::BenchNodes;
use crate::plot::Series;

/// `--plot-from`: the `op` table (out of place, eager launches) of a saved gpu-bench output.
pub(crate) fn plot_saved(log: &Path, svg: &Path, op: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(log).map_err(|e| format!("cannot read {}: {e}", log.display()))?;
    let (title, lines) = saved_table(&text, op)
        .ok_or_else(|| format!("{} holds no gpu-bench table for {op} (out of place, eager launches)", log.display()))?;
    write_plot(svg, &title, &gpu_series(&lines))
}

/// The title ("OP on N GPUs") and lines of the first out-of-place, eager `op` table in `text`.
fn saved_table(text: &str, op: &str) -> Option<(String, Vec<String>)> {
    let rank0 = text.lines().filter_map(|l| match l.strip_prefix("[rank ") {
        Some(rest) => rest.strip_prefix("0] "),
        None => Some(l),
    });
    let mut lines = Vec::new();
    let mut title = None;
    for l in rank0 {
        if let Some(header) = l.strip_prefix("# gpu-bench: ") {
            if title.is_some() {
                break;
            }
            let wanted =
                header.starts_with(&format!("{op} on ")) && header.contains("eager") && header.contains("out of place");
            if wanted {
                title = header.split(',').next().map(str::to_string);
            }
        } else if title.is_some() {
            lines.push(l.to_string());
        }
    }
    title.map(|t| (t, lines))
}

/// Parses gpu-bench's table lines (rank 0's stdout) into weave and NCCL series.
fn gpu_series(lines: &[String]) -> Vec<Series> {
    let mut weave = Series { name: "weave".into(), points: Vec::new() };
    let mut nccl = Series { name: "NCCL".into(), points: Vec::new() };
    for l in lines.iter().filter(|l| !l.trim_start().starts_with('#')) {
        let f: Vec<f64> = l.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        if f.len() >= 6 {
            weave.points.push((f[0], f[4]));
        }
        if f.len() >= 10 {
            nccl.points.push((f[0], f[7]));
        }
    }
    if nccl.points.is_empty() { vec![weave] } else { vec![weave, nccl] }
}

/// GPUs visible to `nvidia-smi`, if it runs.
pub(crate) fn gpu_count() -> Option<usize> {
    let out = Command::new("nvidia-smi").arg("-L").output().ok()?;
    let n = String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with("GPU ")).count();
    (n > 0).then_some(n)
}

/// `--gpu`: builds `gpu-bench` (with NCCL for `--vs-nccl`), launches one rank per GPU (or
/// `-n`), and passes rank 0's table through.
pub(crate) fn bench_gpu(a: &BenchArgs, root: &Path, target: &Path, token: &CancelToken) -> Result<ExitCode, String> {
    if a.op == Collective::Reduce || a.dtype != DataType::F32 || a.redop != ReduceOp::Sum {
        return Err(
            "--gpu benchmarks all_reduce, all_gather, reduce_scatter, broadcast and all_to_all on float sum".into()
        );
    }
    if !a.no_build {
        build_worker(root, "gpu-bench", if a.vs_nccl { &["nccl"] } else { &[] })?;
    }
    let worker = target.join("release").join("gpu-bench");
    if !worker.is_file() {
        return Err(format!("{} does not exist; run without --no-build to build it", worker.display()));
    }
    let ranks = match (a.nodes, a.ranks) {
        // One rank per node unless -n says how many per node.
        (Some(nodes), per_node) => (nodes * per_node.unwrap_or(1)) as usize,
        (None, Some(ranks)) => ranks as usize,
        (None, None) => gpu_count().ok_or("no GPU found by nvidia-smi; pass -n RANKS")?,
    };
    let mut args: Vec<String> = vec![
        "--op".into(),
        a.op.name().into(),
        "-b".into(),
        a.min_bytes().to_string(),
        "-e".into(),
        a.max_bytes().to_string(),
        "-f".into(),
        a.factor.to_string(),
        "--iters".into(),
        a.iters.to_string(),
        "--warmup".into(),
        a.warmup.to_string(),
        if a.check() { "--check" } else { "--no-check" }.into(),
    ];
    if a.graph {
        args.push("--graph".into());
    }
    if a.inplace {
        args.push("--inplace".into());
    }
    if a.vs_nccl {
        args.push("--nccl".into());
    }
    let spec = LaunchSpec::new(ranks, &worker)
        .args(args)
        .env("NCCL_NVLS_ENABLE", "0")
        .echo(true)
        .capture(a.plot.is_some())
        .timeout(a.timeout)
        .cancel_token(token.clone());
    let report = match a.nodes {
        None => launch(&spec).map_err(|e| format!("cannot start the GPU bench ranks: {e}"))?,
        Some(n) => {
            let per_node = ranks / n as usize;
            let nodes = BenchNodes::make(n as usize, per_node, a.rate, &target.join("weave-bench"))?;
            println!(
                "# across {}; NCCL over its socket transport on eth0 (NCCL_SOCKET_IFNAME=eth0, \
                 NCCL_IB_DISABLE=1), shared memory and peer access in a node; rank r on GPU r % GPUs",
                nodes.describe()
            );
            // NCCL finds the nodes' interface and stays off InfiniBand; weave reads the same eth0.
            let spec = spec.env("NCCL_SOCKET_IFNAME", "eth0").env("NCCL_IB_DISABLE", "1");
            let report = launch_on(&spec, nodes.fabric()).map_err(|e| format!("cannot start the GPU bench ranks: {e}"));
            let left = nodes.finish();
            let report = report?;
            left?;
            report
        }
    };
    if !report.success() {
        return Err(format!("the GPU benchmark failed:\n{}", report.summary()));
    }
    if let Some(path) = &a.plot {
        let lines = report.ranks.first().map(|r| r.stdout.clone()).unwrap_or_default();
        write_plot(path, &format!("{} on {ranks} GPUs", a.op.name()), &gpu_series(&lines))?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_log_yields_the_eager_out_of_place_table_of_the_op() {
        let log = "\
[rank 0] # gpu-bench: all_reduce on 4 GPUs, float sum, median of 5 batches, eager launches, out of place
[rank 0]             8            2       5.26      0.00      0.00       0       8.40      0.00       0      1.60
[rank 1] noise from another rank
[rank 0] # gpu-bench: all_gather on 4 GPUs, float sum, median of 5 batches, eager launches, out of place
[rank 0]           16            1       6.60      0.00      0.00       0       6.91      0.00       0      1.05
[rank 0] # gpu-bench: all_reduce on 4 GPUs, float sum, median of 5 batches, CUDA graph replay, out of place
[rank 0]             8            2       4.14      0.00      0.00       0       7.86      0.00       0      1.90
";
        let (title, lines) = saved_table(log, "all_gather").unwrap();
        assert_eq!(title, "all_gather on 4 GPUs");
        assert_eq!(gpu_series(&lines)[0].points, vec![(16.0, 0.0)]);
        let (_, lines) = saved_table(log, "all_reduce").unwrap();
        assert_eq!(lines.len(), 1, "the table ends at the next header and other ranks are skipped: {lines:?}");
        assert!(saved_table(log, "broadcast").is_none());
    }

    #[test]
    fn gpu_table_lines_become_weave_and_nccl_series() {
        let lines: Vec<String> = [
            "# gpu-bench: all_reduce on 4 GPUs",
            "#     size(B)        count   time(us)     algbw     busbw  #wrong   nccl(us)     busbw  #wrong nccl/weave",
            "            8            2       5.88      0.00      0.00       0      12.19      0.00       0      2.07",
            "      1048576       262144      32.31     32.45     48.68       0      18.12     86.82       0      0.56",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let s = gpu_series(&lines);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].points, vec![(8.0, 0.0), (1048576.0, 48.68)]);
        assert_eq!(s[1].points[1], (1048576.0, 86.82));
        let weave_only = gpu_series(
            &lines[..1].iter().chain(std::iter::once(&"  8 2 5.88 0.0 0.0 0".to_string())).cloned().collect::<Vec<_>>(),
        );
        assert_eq!(weave_only.len(), 1);
    }
}
