//! The logarithmic channel algorithms (`cuda/channel_log.cu`) compiled for the host by the
//! system's C++ compiler (`CXX`, else `c++`) and run over simulated links
//! (`tests/host/channel_log_sim.cpp`: every rank a thread, each link a queue with channel.cu's
//! credits): their schedules and results are checked without a GPU. Without a C++ compiler the
//! test fails under `CI` and prints SKIPPED elsewhere, as the NVRTC tests do.

use std::io::Write;
use std::path::Path;
use std::process::Command;

/// The simulation's source, embedded with what it includes (`channel_log.cu` and the device
/// headers), so the test binary runs from any folder, a GPU bundle's too.
const SIMULATION: &str = include_str!("host/channel_log_sim.cpp");

/// Writes the simulation and every file it includes under `dir`.
fn write_sources(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join("weave"))?;
    std::fs::write(dir.join("channel_log_sim.cpp"), SIMULATION)?;
    std::fs::write(dir.join("channel_log.cu"), kernels::channel::CHANNEL_LOG_SOURCE)?;
    for (name, text) in kernels::program_text::HEADERS {
        std::fs::write(dir.join(name), text)?;
    }
    Ok(())
}

#[test]
fn logarithmic_channel_algorithms_give_the_right_results_over_simulated_links() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    let dir = std::env::temp_dir().join(format!("weave-channel-log-sim-{}", std::process::id()));
    write_sources(&dir).unwrap_or_else(|e| panic!("write the simulation's sources into {}: {e}", dir.display()));
    let binary = dir.join("simulation");
    let compiled = Command::new(&cxx)
        .args(["-std=c++17", "-O1", "-pthread", "-I"])
        .arg(&dir)
        .arg(dir.join("channel_log_sim.cpp"))
        .arg("-o")
        .arg(&binary)
        .output();
    let run = compiled.as_ref().ok().filter(|c| c.status.success()).map(|_| Command::new(&binary).output());
    let _ = std::fs::remove_dir_all(&dir);
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
    let run = run.expect("compiled").expect("run the simulation");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && stdout.contains("OK: 0 wrong results"),
        "the simulation failed:\n{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
}
