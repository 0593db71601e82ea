//! `cargo xtask <command>`: developer tasks for weave.
//!
//! Each command lives in its own module with a `SUMMARY` and a `run(Args) -> ExitCode` that
//! prints its usage for `--help`; add it to [`COMMANDS`] to make it reachable.

mod args;
mod bench_cmd;
mod fuzz_cmd;
mod gpu_bundle_cmd;
mod ib_vm_cmd;
mod launch_cmd;
mod loom_cmd;
mod nccl_cmd;
mod prerequisites;
mod sanitize_cmd;
mod test_cmd;

use std::process::ExitCode;

use args::{Arg, Args, UsageError};

/// One subcommand.
struct Command {
    name: &'static str,
    summary: &'static str,
    run: fn(Args) -> ExitCode,
}

/// A [`Command`] named `$name`: from a module's `SUMMARY` and `run`, or from the two given.
macro_rules! command {
    ($name:literal, $module:ident) => {
        command!($name, $module::SUMMARY, $module::run)
    };
    ($name:literal, $summary:expr, $run:expr) => {
        Command { name: $name, summary: $summary, run: $run }
    };
}

/// Every subcommand, in the order `help` lists them.
const COMMANDS: &[Command] = &[
    command!("gpu-bundle", gpu_bundle_cmd),
    command!("fuzz", fuzz_cmd),
    command!("ib-vm", ib_vm_cmd),
    command!("launch", launch_cmd),
    command!("loom", loom_cmd),
    command!("multinode", launch_cmd::MULTINODE_SUMMARY, launch_cmd::run_multinode),
    command!("nccl", nccl_cmd),
    command!("sanitize", sanitize_cmd),
    command!("scale-model", bench_cmd::SCALE_MODEL_SUMMARY, bench_cmd::run_scale_model),
    command!("test", test_cmd),
    command!("bench", bench_cmd),
];

fn usage() -> String {
    let mut s = String::from("usage: cargo xtask <command> [options]\n\ncommands:\n");
    for c in COMMANDS {
        s.push_str(&format!("  {:<10} {}\n", c.name, c.summary));
    }
    s.push_str(&format!("  {:<10} {}\n", "help", "print this help, or `help <command>` for one command"));
    s
}

/// Prints a command-line mistake with a pointer to the help; exit status 2.
fn usage_error(err: &UsageError, command: &str) -> ExitCode {
    eprintln!("error: {err}\nrun `cargo xtask help {command}` for usage");
    ExitCode::from(2)
}

/// Reads the command line of subcommand `command`: `-h` or `--help` prints `usage` and ends the
/// command with success; every other token goes to `take`, with the tokens left (for a flag's
/// value); a mistake, found by `args` or by `take`, ends the command with [`usage_error`].
/// `None` once every token is taken: the command goes on.
fn read_args(
    mut args: Args,
    command: &str,
    usage: &str,
    mut take: impl FnMut(Arg, &mut Args) -> Result<(), UsageError>,
) -> Option<ExitCode> {
    loop {
        let taken = match args.next() {
            Ok(None) => return None,
            Ok(Some(Arg::Flag(f))) if f == "-h" || f == "--help" => {
                print!("{usage}");
                return Some(ExitCode::SUCCESS);
            }
            Ok(Some(arg)) => take(arg, &mut args),
            Err(e) => Err(e),
        };
        if let Err(e) = taken {
            return Some(usage_error(&e, command));
        }
    }
}

fn main() -> ExitCode {
    let mut args = Args::from_env();
    let Some(name) = args.subcommand() else {
        eprint!("{}", usage());
        return ExitCode::from(2);
    };
    let name = name.to_string_lossy().into_owned();
    if matches!(name.as_str(), "help" | "--help" | "-h") {
        return match args.subcommand() {
            None => {
                print!("{}", usage());
                ExitCode::SUCCESS
            }
            Some(topic) => match COMMANDS.iter().find(|c| topic == c.name) {
                // `help X` is `X --help`: every command prints its own usage.
                Some(c) => (c.run)(Args::new(["--help"])),
                None => {
                    eprintln!("error: no command named {topic:?}\n\n{}", usage());
                    ExitCode::from(2)
                }
            },
        };
    }
    match COMMANDS.iter().find(|c| c.name == name) {
        Some(c) => (c.run)(args),
        None => {
            eprintln!("error: unknown command {name:?}\n\n{}", usage());
            ExitCode::from(2)
        }
    }
}
