//! The logarithmic channel algorithms (`cuda/channel_log.cu`) compiled for the host by the
//! system's C++ compiler (`CXX`, else `c++`) and run over simulated links
//! (`tests/host/channel_log_sim.cpp`: every rank a thread, each link a queue with channel.cu's
//! credits): their schedules and results are checked without a GPU. Without a C++ compiler the
//! test fails under `CI` and prints SKIPPED elsewhere, as the NVRTC tests do.

use std::io::Write;
use std::path::Path;
use std::process::Command;

#[test]
fn logarithmic_channel_algorithms_give_the_right_results_over_simulated_links() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let binary = std::env::temp_dir().join(format!("weave-channel-log-sim-{}", std::process::id()));
    let compiled = Command::new(&cxx)
        .args(["-std=c++17", "-O1", "-pthread", "-I"])
        .arg(dir.join("cuda"))
        .arg(dir.join("tests/host/channel_log_sim.cpp"))
        .arg("-o")
        .arg(&binary)
        .output();
    let compiled = match compiled {
        Ok(c) => c,
        Err(e) if std::env::var_os("CI").is_none() => {
            let _ = writeln!(std::io::stderr(), "SKIPPED: no C++ compiler ({cxx}: {e}); set CXX to one");
            return;
        }
        Err(e) => panic!("{cxx}: {e}; CI is set: the host simulation of channel_log.cu must run in CI"),
    };
    assert!(
        compiled.status.success(),
        "{cxx} could not build the simulation:\n{}",
        String::from_utf8_lossy(&compiled.stderr)
    );
    let run = Command::new(&binary).output();
    let _ = std::fs::remove_file(&binary);
    let run = run.expect("run the simulation");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && stdout.contains("OK: 0 wrong results"),
        "the simulation failed:\n{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
}
