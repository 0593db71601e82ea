//! `cargo xtask launch`: runs N ranks of a program on this host through
//! [`weave_launch`].

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use weave_launch::{
    CancelToken, LaunchSpec, MAX_NAMESPACE_NODES, NAMESPACE_MASTER_PORT, Rate, forward_signals_to, launch,
    namespace_nodes_available, node_address, node_hostname,
};

use crate::args::{Arg, Args, UsageError};

/// One line for the command list of `cargo xtask help`.
pub(crate) const SUMMARY: &str = "run N ranks of a program on this host";

/// One line for the command list of `cargo xtask help` (`multinode`).
pub(crate) const MULTINODE_SUMMARY: &str = "run a program as ranks of several nodes (network namespaces) on this host";

/// The help text of `cargo xtask multinode`.
pub(crate) const MULTINODE_USAGE: &str = "\
usage: cargo xtask multinode -N NODES -n RANKS_PER_NODE [--rate RATE | --posed] [--timeout SECS]
                             [--] CMD [ARGS...]

Runs NODES x RANKS_PER_NODE ranks of CMD on this host as a job of NODES nodes: ranks
r = node x RANKS_PER_NODE + i share node `node`, and each rank gets the variables torchrun sets
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT).

Each node is a set of Linux namespaces: its own network stack (eth0 with 10.57.0.<node+1>/24 on
a bridge, and lo), its own hostname (weave-node<node>) and its own /dev/shm, so shared memory
and CUDA IPC stay inside a node and TCP carries the rest, as between machines. MASTER_ADDR is
node 0's address, MASTER_PORT 29500; the nodes reach each other, not the outside. The namespaces are held by processes only, so nothing is
left behind however the job ends, even when the launcher is killed. This needs root (or
CAP_SYS_ADMIN and CAP_NET_ADMIN); without it, multinode falls back to posed nodes: the ranks
share this host's network, hostname and /dev/shm and are told apart by WEAVE_HOST_ID (one line
on stderr says so). Stderr always names the mode that ran. Otherwise as `cargo xtask launch`.

options:
  -N, --nodes NODES            nodes (required, 1 to 250)
  -n, --ranks-per-node R       ranks per node (required, at least 1)
      --rate RATE              shape each node's link to RATE in each direction (tc units:
                               10gbit, 100mbit, 1gbps = 8gbit); needs namespaces
      --posed                  posed nodes even where namespaces can be made
      --master-addr ADDR       with --posed: MASTER_ADDR (default 127.0.0.1)
  -t, --timeout SECS           kill every rank after SECS seconds
      --keep-going             let the other ranks run on when one fails (for jobs that
                               survive failures: revoke, agree_on_failed, shrink)
  -h, --help                   print this help
";

/// The help text of `cargo xtask launch`.
pub(crate) const USAGE: &str = "\
usage: cargo xtask launch -n N [--timeout SECS] [--master-addr ADDR] [--keep-going] [--] CMD [ARGS...]

Runs N copies of CMD on this host as the ranks of one weave job. Each rank gets RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (a free port) and
WEAVE_SECRET (kept from the environment if set); its output lines are printed prefixed
`[rank R] `. When one rank fails, the others are killed. Ctrl-C is passed on to the ranks;
a second Ctrl-C kills them.

options:
  -n, --ranks N           number of ranks (required, at least 1)
  -t, --timeout SECS      kill every rank after SECS seconds (fractions allowed)
      --master-addr ADDR  MASTER_ADDR for the ranks (default 127.0.0.1)
      --keep-going        let the other ranks run on when one fails (for jobs that survive
                          failures: revoke, agree_on_failed, shrink); the exit status is
                          still 1 unless every rank exited 0
  -h, --help              print this help

exit status: 0 when every rank exited 0; 1 otherwise (a summary goes to stderr);
2 on a usage error.
";

/// A parsed `launch` command line.
#[derive(Debug, PartialEq)]
struct LaunchArgs {
    ranks: usize,
    /// Nodes (`multinode`).
    nodes: Option<usize>,
    /// `--rate`: shape the nodes' links (`multinode`).
    rate: Option<Rate>,
    /// `--posed`: posed nodes even where namespaces can be made (`multinode`).
    posed: bool,
    timeout: Option<Duration>,
    master_addr: Option<String>,
    /// `--keep-going`: the others run on when a rank fails.
    keep_going: bool,
    command: Vec<OsString>,
}

/// What the command line asks for.
#[derive(Debug, PartialEq)]
enum Parsed {
    Help,
    Run(LaunchArgs),
}

/// How `-n` counts: ranks of the job (`launch`) or ranks per node (`multinode`, with `-N`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Launch,
    Multinode,
}

fn parse_as(args: &mut Args, mode: Mode) -> Result<Parsed, UsageError> {
    let mut nodes = None;
    let mut rate = None;
    let mut posed = false;
    let mut ranks = None;
    let mut timeout = None;
    let mut master_addr = None;
    let mut keep_going = false;
    let mut command = Vec::new();
    while let Some(arg) = args.next()? {
        match arg {
            Arg::Flag(f) if f == "-h" || f == "--help" => return Ok(Parsed::Help),
            Arg::Flag(f) if mode == Mode::Multinode && (f == "-N" || f == "--nodes") => {
                let n: usize = args.parse(&f, "a number of nodes")?;
                if n == 0 || n > MAX_NAMESPACE_NODES {
                    return Err(UsageError(format!("{f} must be at least 1 and at most {MAX_NAMESPACE_NODES}")));
                }
                nodes = Some(n);
            }
            Arg::Flag(f) if mode == Mode::Multinode && f == "--rate" => {
                let v = args.value(&f)?;
                let text = v.to_str().ok_or_else(|| UsageError(format!("{f} must be UTF-8, got {v:?}")))?;
                rate = Some(text.parse::<Rate>().map_err(|e| UsageError(format!("{f}: {e}")))?);
            }
            Arg::Flag(f) if mode == Mode::Multinode && f == "--posed" => posed = true,
            Arg::Flag(f) if f == "-n" || f == "--ranks" || (mode == Mode::Multinode && f == "--ranks-per-node") => {
                let n: usize = args.parse(&f, "a number of ranks")?;
                if n == 0 {
                    return Err(UsageError(format!("{f} must be at least 1")));
                }
                ranks = Some(n);
            }
            Arg::Flag(f) if f == "-t" || f == "--timeout" => {
                let secs: f64 = args.parse(&f, "a number of seconds")?;
                let t = Duration::try_from_secs_f64(secs)
                    .ok()
                    .filter(|t| !t.is_zero())
                    .ok_or_else(|| UsageError(format!("{f} must be a positive number of seconds, got {secs}")))?;
                timeout = Some(t);
            }
            Arg::Flag(f) if f == "--keep-going" => keep_going = true,
            Arg::Flag(f) if f == "--master-addr" => {
                let v = args.value(&f)?;
                let addr = v.into_string().map_err(|v| UsageError(format!("{f} must be UTF-8, got {v:?}")))?;
                master_addr = Some(addr);
            }
            Arg::Flag(f) => {
                let name = if mode == Mode::Launch { "launch" } else { "multinode" };
                return Err(UsageError(format!("unknown option {f} for `{name}`")));
            }
            Arg::Separator => {
                command = args.rest();
                break;
            }
            Arg::Positional(p) => {
                command.push(p);
                command.extend(args.rest());
                break;
            }
        }
    }
    let ranks = ranks.ok_or_else(|| UsageError("give the number of ranks with -n N".into()))?;
    if command.is_empty() {
        return Err(UsageError("give the command every rank runs after the options (or after --)".into()));
    }
    let ranks = match (mode, nodes) {
        (Mode::Launch, _) => ranks,
        (Mode::Multinode, Some(nodes)) => {
            nodes.checked_mul(ranks).ok_or_else(|| UsageError(format!("{nodes} x {ranks} ranks overflow")))?
        }
        (Mode::Multinode, None) => return Err(UsageError("give the number of nodes with -N NODES".into())),
    };
    if posed && rate.is_some() {
        return Err(UsageError(
            "--rate shapes the links of network namespaces, and --posed nodes have none; drop one of them".into(),
        ));
    }
    if mode == Mode::Multinode && master_addr.is_some() && !posed {
        return Err(UsageError(
            "--master-addr is node 0's address in network namespaces; give it only with --posed".into(),
        ));
    }
    Ok(Parsed::Run(LaunchArgs { ranks, nodes, rate, posed, timeout, master_addr, keep_going, command }))
}

/// Runs `cargo xtask launch` with the arguments after the subcommand name.
pub(crate) fn run(args: Args) -> ExitCode {
    run_as(args, Mode::Launch)
}

/// Runs `cargo xtask multinode` with the arguments after the subcommand name.
pub(crate) fn run_multinode(args: Args) -> ExitCode {
    run_as(args, Mode::Multinode)
}

fn run_as(mut args: Args, mode: Mode) -> ExitCode {
    let (usage, name) = match mode {
        Mode::Launch => (USAGE, "launch"),
        Mode::Multinode => (MULTINODE_USAGE, "multinode"),
    };
    let parsed = match parse_as(&mut args, mode) {
        Ok(Parsed::Help) => {
            print!("{usage}");
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Run(parsed)) => parsed,
        Err(e) => return crate::usage_error(&e, name),
    };
    let token = CancelToken::new();
    // Before any thread starts (the launcher's readers inherit the blocked signals).
    if let Err(e) = forward_signals_to(&token) {
        eprintln!("warning: {e}; Ctrl-C will stop only the launcher, not the ranks");
    }
    let mut command = parsed.command.into_iter();
    let program = command.next().unwrap_or_default();
    let mut spec = LaunchSpec::new(parsed.ranks, program).args(command).echo(true).cancel_token(token);
    spec.timeout = parsed.timeout;
    spec = spec.keep_going(parsed.keep_going);
    if let Some(nodes) = parsed.nodes {
        match choose_nodes(nodes, parsed.ranks / nodes, parsed.rate, parsed.posed) {
            Ok(NodeMode::Namespaces) => {
                spec.namespace_nodes = Some(weave_launch::NamespaceNodes { nodes, rate: parsed.rate })
            }
            Ok(NodeMode::Posed) => spec.posed_nodes = Some(nodes),
            Err(e) => return crate::usage_error(&e, name),
        }
    }
    if let Some(addr) = parsed.master_addr {
        spec = spec.master_addr(addr);
    }
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
fn choose_nodes(nodes: usize, per_node: usize, rate: Option<Rate>, posed: bool) -> Result<NodeMode, UsageError> {
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
        Err(e) if rate.is_some() => Err(UsageError(format!(
            "--rate needs a network namespace per node, and none can be made here ({e}); run as root, or drop --rate"
        ))),
        Err(e) => {
            posed_line(&format!("network namespaces cannot be made here: {e}"));
            Ok(NodeMode::Posed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_line(line: &[&str]) -> Result<Parsed, UsageError> {
        parse_as(&mut Args::new(line.iter().copied()), Mode::Launch)
    }

    #[test]
    fn parses_options_and_command() {
        let want = LaunchArgs {
            ranks: 4,
            nodes: None,
            rate: None,
            posed: false,
            timeout: Some(Duration::from_millis(1500)),
            master_addr: Some("10.0.0.1".into()),
            keep_going: true,
            command: vec!["prog".into(), "-n".into(), "--x".into()],
        };
        let with_dashes =
            ["-n", "4", "--timeout", "1.5", "--master-addr=10.0.0.1", "--keep-going", "--", "prog", "-n", "--x"];
        assert_eq!(parse_line(&with_dashes).unwrap(), Parsed::Run(want));
        let Parsed::Run(plain) = parse_line(&["--ranks=2", "echo", "-n", "hi"]).unwrap() else { panic!() };
        assert_eq!((plain.ranks, plain.timeout, plain.command.len(), plain.keep_going), (2, None, 3, false));
        assert_eq!(parse_line(&["-n", "2", "--help"]).unwrap(), Parsed::Help);
    }

    #[test]
    fn multinode_counts_ranks_per_node() {
        let line = ["-N", "2", "-n", "3", "--", "prog"];
        let Parsed::Run(p) = parse_as(&mut Args::new(line.iter().copied()), Mode::Multinode).unwrap() else { panic!() };
        assert_eq!((p.ranks, p.nodes), (6, Some(2)));
        let err = |line: &[&str]| parse_as(&mut Args::new(line.iter().copied()), Mode::Multinode).unwrap_err().0;
        assert!(err(&["-n", "2", "x"]).contains("-N NODES"));
        assert!(err(&["-N", "0", "-n", "2", "x"]).contains("at least 1"));
        let line = ["-N", "2", "-n", "1", "--rate=10gbit", "x"];
        let Parsed::Run(p) = parse_as(&mut Args::new(line.iter().copied()), Mode::Multinode).unwrap() else { panic!() };
        assert_eq!((p.rate.map(Rate::bytes_per_sec), p.posed), (Some(1_250_000_000), false));
        let line = ["-N", "2", "-n", "1", "--posed", "--master-addr", "127.0.0.2", "x"];
        let Parsed::Run(p) = parse_as(&mut Args::new(line.iter().copied()), Mode::Multinode).unwrap() else { panic!() };
        assert!(p.posed && p.rate.is_none());
        assert!(err(&["-N", "2", "-n", "2", "--rate", "10gigabit", "x"]).contains("unknown unit"));
        assert!(err(&["-N", "2", "-n", "2", "--rate", "10gbit", "--posed", "x"]).contains("drop one"));
        assert!(err(&["-N", "2", "-n", "2", "--master-addr", "10.0.0.1", "x"]).contains("only with --posed"));
        assert!(err(&["-N", "251", "-n", "1", "x"]).contains("at most 250"));
        assert!(parse_line(&["--rate", "1gbit", "-n", "2", "x"]).unwrap_err().0.contains("unknown option --rate"));
        assert!(parse_line(&["-N", "2", "-n", "2", "x"]).unwrap_err().0.contains("unknown option -N"));
    }

    #[test]
    fn rejects_bad_command_lines() {
        let err = |line: &[&str]| parse_line(line).unwrap_err().0;
        assert!(err(&["-n", "2", "--bogus", "x"]).contains("unknown option --bogus"));
        assert!(err(&["echo"]).contains("-n N"));
        assert!(err(&["-n", "2"]).contains("command"));
        assert!(err(&["-n", "0", "x"]).contains("at least 1"));
        assert!(err(&["-n", "2", "-t", "-1", "x"]).contains("positive"));
        assert!(err(&["-n", "2", "-t", "abc", "x"]).contains("seconds"));
    }
}
