//! Runs the `xtask` binary the way `cargo xtask` does.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn xtask(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask")).args(args).output().expect("run the xtask binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn launch_prefixes_output_and_succeeds() {
    let out =
        xtask(&["launch", "-n", "3", "--", "/bin/sh", "-c", r#"echo "hi $RANK/$WORLD_SIZE"; echo "e $RANK" >&2"#]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    for r in 0..3 {
        assert!(stdout.contains(&format!("[rank {r}] hi {r}/3\n")), "{stdout}");
        assert!(stderr.contains(&format!("[rank {r}] e {r}\n")), "{stderr}");
    }
}

#[test]
fn launch_fails_when_a_rank_fails() {
    let t = Instant::now();
    let out = xtask(&["launch", "-n", "2", "/bin/sh", "-c", r#"[ "$RANK" = 1 ] && exit 7; sleep 60"#]);
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("rank 1 failed first: it exited with code 7"), "{}", text(&out.stderr));
}

#[test]
fn launch_timeout_fails() {
    let out = xtask(&["launch", "-n", "2", "--timeout", "0.3", "--", "sleep", "60"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("timed out"), "{}", text(&out.stderr));
}

#[test]
fn usage_errors_exit_2() {
    let out = xtask(&["launch", "-n", "2", "--frobnicate", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("unexpected argument '--frobnicate'"), "{}", text(&out.stderr));
    assert_eq!(xtask(&["nonsense"]).status.code(), Some(2));
    assert_eq!(xtask(&[]).status.code(), Some(2));
}

#[test]
fn help_prints_usage() {
    for args in [&["help"][..], &["--help"], &["help", "launch"], &["launch", "--help"]] {
        let out = xtask(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(text(&out.stdout).contains("launch"), "{args:?}");
    }
}

#[test]
fn missing_program_is_reported() {
    let out = xtask(&["launch", "-n", "2", "--", "/nonexistent/program"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("/nonexistent/program"), "{}", text(&out.stderr));
}

/// Starts `xtask launch` with ranks running `script`, waits until every rank printed `ready`,
/// sends `signals` to the launcher one by one, and returns its output and how long it took.
fn signal_launcher(ranks: usize, script: &str, signals: &[&str]) -> (Output, Duration) {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let n = ranks.to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(["launch", "-n", &n, "--", "/bin/sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the xtask binary");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for _ in 0..ranks {
        assert!(lines.next().unwrap().unwrap().ends_with("ready"));
    }
    let t = Instant::now();
    for sig in signals {
        let kill = Command::new("kill").args([*sig, &child.id().to_string()]).status().unwrap();
        assert!(kill.success());
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (out, t.elapsed())
}

// SIGTERM rather than SIGINT: a shell that starts a background job without job control makes
// it ignore SIGINT, and ignored signals stay ignored in the ranks.
#[test]
fn signals_are_forwarded_to_the_ranks() {
    let (out, took) = signal_launcher(2, "echo ready; exec sleep 60", &["-TERM"]);
    assert!(took < Duration::from_secs(2), "took {took:?}: {}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("cancelled with SIGTERM"), "{}", text(&out.stderr));
}

#[test]
fn a_second_signal_kills_the_ranks() {
    // The ranks ignore SIGTERM; without the second signal this would take the 3 s grace time.
    let (out, took) = signal_launcher(2, "trap '' TERM; echo ready; exec sleep 60", &["-TERM", "-TERM"]);
    assert!(took < Duration::from_secs(2), "took {took:?}: {}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("stopped rank(s) 0, 1 of 2"), "{}", text(&out.stderr));
}
