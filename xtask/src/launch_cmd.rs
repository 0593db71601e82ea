//! `cargo xtask launch`: runs N ranks of a program on this host through
//! [`weave_launch`].

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use weave_launch::{
    CancelToken, LaunchSpec, MAX_NAMESPACE_NODES, NAMESPACE_MASTER_PORT, Rate, forward_signals_to, launch,
    namespace_nodes_available, node_address, node_hostname, parse_seconds,
};

/// Runs N copies of CMD on this host as the ranks of one weave job.
///
/// Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (a
/// free port) and WEAVE_SECRET (kept from the environment if set); its output lines are printed
/// prefixed `[rank R] `. When one rank fails, the others are killed. Ctrl-C is passed on to the
/// ranks; a second Ctrl-C kills them. Exit status: 0 when every rank exited 0; 1 otherwise (a
/// summary goes to stderr); 2 on a usage error.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub(crate) struct LaunchArgs {
    /// Number of ranks
    #[arg(short = 'n', long = "ranks", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    ranks: u32,
    /// Address of rank 0's bootstrap (MASTER_ADDR) [default: 127.0.0.1]
    #[arg(long, value_name = "ADDR")]
    master_addr: Option<String>,
    #[command(flatten)]
    job: JobArgs,
}

/// Runs NODES x RANKS_PER_NODE ranks of CMD on this host as a job of NODES nodes.
///
/// Ranks r = node x RANKS_PER_NODE + i share node `node`, and each rank gets the variables
/// torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
/// MASTER_PORT). Each node is a set of Linux namespaces: its own network stack (eth0 with
/// `10.57.0.<node+1>/24` on a bridge, and lo), its own hostname (`weave-node<node>`) and its own
/// /dev/shm, so shared memory and CUDA IPC stay inside a node and TCP carries the rest, as
/// between machines. MASTER_ADDR is node 0's address, MASTER_PORT 29500; the nodes reach each
/// other, not the outside. The namespaces are held by processes only, so nothing is left behind
/// however the job ends, even when the launcher is killed. This needs root (or CAP_SYS_ADMIN
/// and CAP_NET_ADMIN); without it, multinode falls back to posed nodes: the ranks share this
/// host's network, hostname and /dev/shm and are told apart by WEAVE_HOST_ID (one line on
/// stderr says so). Stderr always names the mode that ran. Otherwise as `cargo xtask launch`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub(crate) struct MultinodeArgs {
    /// Nodes (1 to 250)
    #[arg(short = 'N', long, value_name = "NODES", value_parser = clap::value_parser!(u32).range(1..=MAX_NAMESPACE_NODES as i64))]
    nodes: u32,
    /// Ranks per node
    #[arg(short = 'n', long = "ranks-per-node", alias = "ranks", value_name = "R", value_parser = clap::value_parser!(u32).range(1..))]
    ranks_per_node: u32,
    /// Shape each node's link to RATE in each direction (tc units: 10gbit, 100mbit, 1gbps =
    /// 8gbit); needs namespaces
    #[arg(long, value_name = "RATE", conflicts_with = "posed", value_parser = |s: &str| s.parse::<Rate>().map_err(|e| e.to_string()))]
    rate: Option<Rate>,
    /// Posed nodes even where namespaces can be made
    #[arg(long)]
    posed: bool,
    /// With --posed: MASTER_ADDR [default: 127.0.0.1]
    #[arg(long, value_name = "ADDR", requires = "posed")]
    master_addr: Option<String>,
    #[command(flatten)]
    job: JobArgs,
}

/// What `launch` and `multinode` share: limits and the command.
#[derive(Debug, Clone, PartialEq, clap::Args)]
struct JobArgs {
    /// Kill every rank after SECS seconds (fractions allowed)
    #[arg(short = 't', long, value_name = "SECS", value_parser = parse_seconds)]
    timeout: Option<Duration>,
    /// Let the other ranks run on when one fails (for jobs that survive failures: revoke,
    /// agree_on_failed, shrink); the exit status is still 1 unless every rank exited 0
    #[arg(long)]
    keep_going: bool,
    /// The program every rank runs, and its arguments (after the options, or after --)
    #[arg(value_name = "CMD", required = true, trailing_var_arg = true)]
    command: Vec<OsString>,
}

/// Runs `cargo xtask launch`.
pub(crate) fn run(a: LaunchArgs) -> ExitCode {
    let spec = spec(a.ranks as usize, a.job);
    start(match a.master_addr {
        Some(addr) => spec.master_addr(addr),
        None => spec,
    })
}

/// Runs `cargo xtask multinode`.
pub(crate) fn run_multinode(a: MultinodeArgs) -> ExitCode {
    let (nodes, per_node) = (a.nodes as usize, a.ranks_per_node as usize);
    let mut spec = spec(nodes * per_node, a.job);
    match choose_nodes(nodes, per_node, a.rate, a.posed) {
        Ok(NodeMode::Namespaces) => spec.namespace_nodes = Some(weave_launch::NamespaceNodes { nodes, rate: a.rate }),
        Ok(NodeMode::Posed) => spec.posed_nodes = Some(nodes),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    }
    start(match a.master_addr {
        Some(addr) => spec.master_addr(addr),
        None => spec,
    })
}

/// The job of `ranks` ranks that `job` describes, with Ctrl-C passed on to its ranks.
fn spec(ranks: usize, job: JobArgs) -> LaunchSpec {
    let token = CancelToken::new();
    // Before any thread starts (the launcher's readers inherit the blocked signals).
    if let Err(e) = forward_signals_to(&token) {
        eprintln!("warning: {e}; Ctrl-C will stop only the launcher, not the ranks");
    }
    let mut command = job.command.into_iter();
    let program = command.next().unwrap_or_default();
    let mut spec = LaunchSpec::new(ranks, program).args(command).echo(true).cancel_token(token);
    spec.timeout = job.timeout;
    spec.keep_going(job.keep_going)
}

/// Launches `spec`: success when every rank exited 0.
fn start(spec: LaunchSpec) -> ExitCode {
    match launch(&spec) {
        Ok(report) if report.success() => ExitCode::SUCCESS,
        Ok(report) => {
            eprintln!("launch failed:\n{}", report.summary());
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// How `multinode` makes its nodes.
#[derive(Debug, PartialEq)]
enum NodeMode {
    Namespaces,
    Posed,
}

/// Namespaces where they can be made, else posed nodes (an error with `--rate`); prints the
/// mode to stderr.
fn choose_nodes(nodes: usize, per_node: usize, rate: Option<Rate>, posed: bool) -> Result<NodeMode, String> {
    let job = format!("{nodes} node(s) x {per_node} rank(s)");
    let posed_line = |why: &str| {
        eprintln!(
            "multinode: {job} as posed nodes ({why}): the ranks share this host's network, hostname and /dev/shm and \
             are told apart by WEAVE_HOST_ID"
        )
    };
    if posed {
        posed_line("--posed");
        return Ok(NodeMode::Posed);
    }
    match namespace_nodes_available(rate) {
        Ok(()) => {
            let last = nodes - 1;
            let shaped = rate.map(|r| format!(", each link shaped to {r} each way")).unwrap_or_default();
            eprintln!(
                "multinode: {job} as network namespaces: hostnames {}..{}, addresses {}..{} on a bridge{shaped}, \
                 MASTER_ADDR {}:{NAMESPACE_MASTER_PORT}",
                node_hostname(0),
                node_hostname(last),
                node_address(0),
                node_address(last),
                node_address(0),
            );
            Ok(NodeMode::Namespaces)
        }
        Err(e) if rate.is_some() => Err(format!(
            "--rate needs a network namespace per node, and none can be made here ({e}); run as root, or drop --rate"
        )),
        Err(e) => {
            posed_line(&format!("network namespaces cannot be made here: {e}"));
            Ok(NodeMode::Posed)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    enum Line {
        Launch(LaunchArgs),
        Multinode(MultinodeArgs),
    }

    fn parse(line: &[&str]) -> Result<Line, String> {
        Line::try_parse_from(std::iter::once("xtask").chain(line.iter().copied())).map_err(|e| e.to_string())
    }

    fn launch(line: &[&str]) -> Result<LaunchArgs, String> {
        match parse(&[&["launch"], line].concat())? {
            Line::Launch(a) => Ok(a),
            Line::Multinode(_) => Err("parsed as multinode".into()),
        }
    }

    fn multinode(line: &[&str]) -> Result<MultinodeArgs, String> {
        match parse(&[&["multinode"], line].concat())? {
            Line::Multinode(a) => Ok(a),
            Line::Launch(_) => Err("parsed as launch".into()),
        }
    }

    #[test]
    fn parses_options_and_command() {
        let with_dashes =
            ["-n", "4", "--timeout", "1.5", "--master-addr=10.0.0.1", "--keep-going", "--", "prog", "-n", "--x"];
        let a = launch(&with_dashes).unwrap();
        assert_eq!((a.ranks, a.master_addr.as_deref()), (4, Some("10.0.0.1")));
        assert_eq!((a.job.timeout, a.job.keep_going), (Some(Duration::from_millis(1500)), true));
        assert_eq!(a.job.command, ["prog", "-n", "--x"]);
        let plain = launch(&["--ranks=2", "echo", "-n", "hi"]).unwrap();
        assert_eq!((plain.ranks, plain.job.timeout, plain.job.keep_going), (2, None, false));
        assert_eq!(plain.job.command, ["echo", "-n", "hi"]);
    }

    #[test]
    fn multinode_counts_ranks_per_node() {
        let p = multinode(&["-N", "2", "-n", "3", "--", "prog"]).unwrap();
        assert_eq!((p.nodes, p.ranks_per_node), (2, 3));
        let err = |line: &[&str]| multinode(line).unwrap_err();
        assert!(err(&["-n", "2", "x"]).contains("--nodes"));
        assert!(err(&["-N", "0", "-n", "2", "x"]).contains("0 is not in 1..=250"));
        let p = multinode(&["-N", "2", "-n", "1", "--rate=10gbit", "x"]).unwrap();
        assert_eq!((p.rate.map(Rate::bytes_per_sec), p.posed), (Some(1_250_000_000), false));
        let p = multinode(&["-N", "2", "-n", "1", "--posed", "--master-addr", "127.0.0.2", "x"]).unwrap();
        assert!(p.posed && p.rate.is_none());
        assert!(err(&["-N", "2", "-n", "2", "--rate", "10gigabit", "x"]).contains("unknown unit"));
        assert!(err(&["-N", "2", "-n", "2", "--rate", "10gbit", "--posed", "x"]).contains("cannot be used with"));
        assert!(err(&["-N", "2", "-n", "2", "--master-addr", "10.0.0.1", "x"]).contains("--posed"));
        assert!(err(&["-N", "251", "-n", "1", "x"]).contains("251 is not in 1..=250"));
        assert!(launch(&["--rate", "1gbit", "-n", "2", "x"]).unwrap_err().contains("--rate"));
        assert!(launch(&["-N", "2", "-n", "2", "x"]).unwrap_err().contains("-N"));
    }

    #[test]
    fn rejects_bad_command_lines() {
        let err = |line: &[&str]| launch(line).unwrap_err();
        assert!(err(&["-n", "2", "--bogus", "x"]).contains("--bogus"));
        assert!(err(&["echo"]).contains("--ranks"));
        assert!(err(&["-n", "2"]).contains("CMD"));
        assert!(err(&["-n", "0", "x"]).contains("0 is not in 1.."));
        let negative = err(&["-n", "2", "-t", "-1", "x"]);
        assert!(negative.contains("-1"), "{negative}");
        assert!(err(&["-n", "2", "-t", "abc", "x"]).contains("seconds"));
    }
}
