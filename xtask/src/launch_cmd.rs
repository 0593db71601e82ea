//! `cargo xtask launch`: runs N ranks of a program on this host through
//! [`weave_launch`].

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use weave_launch::{CancelToken, LaunchSpec, forward_signals_to, launch};

use crate::args::{Arg, Args, UsageError};

/// One line for the command list of `cargo xtask help`.
pub(crate) const SUMMARY: &str = "run N ranks of a program on this host";

/// The help text of `cargo xtask launch`.
pub(crate) const USAGE: &str = "\
usage: cargo xtask launch -n N [--timeout SECS] [--master-addr ADDR] [--] CMD [ARGS...]

Runs N copies of CMD on this host as the ranks of one weave job. Each rank gets RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (a free port) and
WEAVE_SECRET (kept from the environment if set); its output lines are printed prefixed
`[rank R] `. When one rank fails, the others are killed. Ctrl-C is passed on to the ranks;
a second Ctrl-C kills them.

options:
  -n, --ranks N           number of ranks (required, at least 1)
  -t, --timeout SECS      kill every rank after SECS seconds (fractions allowed)
      --master-addr ADDR  MASTER_ADDR for the ranks (default 127.0.0.1)
  -h, --help              print this help

exit status: 0 when every rank exited 0; 1 otherwise (a summary goes to stderr);
2 on a usage error.
";

/// A parsed `launch` command line.
#[derive(Debug, PartialEq)]
struct LaunchArgs {
    ranks: usize,
    timeout: Option<Duration>,
    master_addr: Option<String>,
    command: Vec<OsString>,
}

/// What the command line asks for.
#[derive(Debug, PartialEq)]
enum Parsed {
    Help,
    Run(LaunchArgs),
}

fn parse(args: &mut Args) -> Result<Parsed, UsageError> {
    let mut ranks = None;
    let mut timeout = None;
    let mut master_addr = None;
    let mut command = Vec::new();
    while let Some(arg) = args.next()? {
        match arg {
            Arg::Flag(f) if f == "-h" || f == "--help" => return Ok(Parsed::Help),
            Arg::Flag(f) if f == "-n" || f == "--ranks" => {
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
            Arg::Flag(f) if f == "--master-addr" => {
                let v = args.value(&f)?;
                let addr = v.into_string().map_err(|v| UsageError(format!("{f} must be UTF-8, got {v:?}")))?;
                master_addr = Some(addr);
            }
            Arg::Flag(f) => return Err(UsageError(format!("unknown option {f} for `launch`"))),
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
    Ok(Parsed::Run(LaunchArgs { ranks, timeout, master_addr, command }))
}

/// Runs `cargo xtask launch` with the arguments after the subcommand name.
pub(crate) fn run(mut args: Args) -> ExitCode {
    let parsed = match parse(&mut args) {
        Ok(Parsed::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Run(parsed)) => parsed,
        Err(e) => return crate::usage_error(&e, "launch"),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_line(line: &[&str]) -> Result<Parsed, UsageError> {
        parse(&mut Args::new(line.iter().copied()))
    }

    #[test]
    fn parses_options_and_command() {
        let want = LaunchArgs {
            ranks: 4,
            timeout: Some(Duration::from_millis(1500)),
            master_addr: Some("10.0.0.1".into()),
            command: vec!["prog".into(), "-n".into(), "--x".into()],
        };
        let with_dashes = ["-n", "4", "--timeout", "1.5", "--master-addr=10.0.0.1", "--", "prog", "-n", "--x"];
        assert_eq!(parse_line(&with_dashes).unwrap(), Parsed::Run(want));
        let Parsed::Run(plain) = parse_line(&["--ranks=2", "echo", "-n", "hi"]).unwrap() else { panic!() };
        assert_eq!((plain.ranks, plain.timeout, plain.command.len()), (2, None, 3));
        assert_eq!(parse_line(&["-n", "2", "--help"]).unwrap(), Parsed::Help);
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
