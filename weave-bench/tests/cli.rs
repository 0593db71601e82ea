//! Runs the `weave-bench` binary as `cargo xtask bench` does: its help, its usage errors, and
//! what it says when the Open MPI baseline is missing.

use std::process::{Command, Output};

fn weave_bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weave-bench")).args(args).output().expect("run the weave-bench binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn help_and_usage_errors() {
    let out = weave_bench(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = text(&out.stdout);
    for word in ["--vs-mpi", "busbw", "2(n-1)/n", "median", "--json", "apt-get install openmpi-bin", "scale-model"] {
        assert!(help.contains(word), "help lacks {word}: {help}");
    }
    for bad in [&["-b", "1.5M"][..], &["--op", "gather"], &["-f", "1"], &["-n", "0"], &["-b", "1M", "-e", "1K"]] {
        let out = weave_bench(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains("--help"), "{bad:?}: {}", text(&out.stderr));
    }
    let out = weave_bench(&["scale-model", "--measured", "infiniband:x.json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("unknown fabric \"infiniband\""), "{}", text(&out.stderr));
}

#[test]
fn vs_mpi_without_mpi_says_how_to_install_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_weave-bench"))
        .args(["--vs-mpi", "--no-build", "--cpu"])
        .env("MPICC", "/nonexistent/mpicc")
        .env("MPIRUN", "/nonexistent/mpirun")
        .output()
        .expect("run the weave-bench binary");
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("apt-get install openmpi-bin libopenmpi-dev"), "{err}");
    assert!(err.contains("/nonexistent/mpicc and /nonexistent/mpirun were not found"), "{err}");
}

#[test]
fn the_scale_model_fits_saved_points() {
    let dir = std::env::temp_dir().join(format!("weave-bench-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("shm.json");
    // A ring all-reduce on 2 to 8 ranks at 1 µs a step and 1 GB/s: points the model can fit.
    let mut lines = String::new();
    for ranks in [2u64, 4, 8] {
        for bytes in [8u64, 65536, 1 << 20] {
            let n = ranks as f64;
            let time_us = 2.0 * (n - 1.0) + 2.0 * (n - 1.0) / n * bytes as f64 / 1e3;
            lines.push_str(&format!(
                "{{\"op\":\"all_reduce\",\"bytes\":{bytes},\"ranks\":{ranks},\"time_us\":{time_us},\"algorithm\":\"ring\"}}\n"
            ));
        }
    }
    std::fs::write(&file, lines).unwrap();
    let out = weave_bench(&["scale-model", "--measured", &format!("shm:{}", file.display())]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("shm (processes, this host)"), "{}", text(&out.stdout));
}
