//! `weave-bench node-exec`: what `weave-bench --nodes` gives mpirun as its ssh
//! (`--mca plm_rsh_agent`, through the agent script that `nodes.rs` writes). It runs
//! `sh -c 'CMD...'` (the words joined by spaces, as ssh does) inside the network, UTS and mount
//! namespaces of the node named HOST, waits for the command and everything it started, and
//! exits with the command's status; if its parent (mpirun) ends first, it kills all of them.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Args;
use weave_launch::run_in_node;

/// ssh options that take a value (skipped with it before HOST).
const SSH_VALUE_OPTIONS: &str = "BbcDEeFIiJLlmOopQRSWw";

/// The command line of `weave-bench node-exec`.
#[derive(Debug, Clone, PartialEq, Args)]
pub struct NodeExecArgs {
    /// A node: its address or hostname, and its holder's process id (HOST=PID); repeatable.
    #[arg(long = "node", value_name = "HOST=PID", value_parser = parse_node, required = true)]
    pub nodes: Vec<(String, u32)>,
    /// What mpirun passes its ssh: options (skipped), HOST, then the command's words.
    #[arg(last = true, value_name = "SSH-ARGS", required = true)]
    pub ssh: Vec<OsString>,
}

/// `HOST=PID`.
fn parse_node(text: &str) -> Result<(String, u32), String> {
    text.split_once('=')
        .and_then(|(h, p)| Some((h.to_string(), p.parse::<u32>().ok()?)))
        .ok_or_else(|| format!("expected HOST=PID, got {text:?}"))
}

/// The node's holder and the shell command, from the ssh arguments.
fn holder_and_command(a: &NodeExecArgs) -> Result<(u32, String), String> {
    let mut words = a.ssh.iter().map(|w| w.to_string_lossy());
    let host = loop {
        let Some(w) = words.next() else { return Err("no HOST after the ssh options".into()) };
        match w.strip_prefix('-') {
            // An option that takes a value, given apart (`-o X`): skip the value too.
            Some(o) if o.len() == 1 && SSH_VALUE_OPTIONS.contains(o) => {
                words.next();
            }
            Some(_) => {}
            None => break w.into_owned(),
        }
    };
    let command: Vec<String> = words.map(|w| w.into_owned()).collect();
    if command.is_empty() {
        return Err(format!("no command to run on {host} (an interactive shell is not offered)"));
    }
    let holder_pid = a.nodes.iter().find(|(h, _)| *h == host).map(|&(_, pid)| pid).ok_or_else(|| {
        let known: Vec<&str> = a.nodes.iter().map(|(h, _)| h.as_str()).collect();
        format!("{host:?} is not a node of this run; the nodes are {}", known.join(", "))
    })?;
    Ok((holder_pid, command.join(" ")))
}

/// Runs `weave-bench node-exec`: exit status 2 for arguments that name no node's command, the
/// command's own otherwise.
pub fn run(a: &NodeExecArgs) -> ExitCode {
    let (holder_pid, command) = match holder_and_command(a) {
        Ok(found) => found,
        Err(e) => {
            eprintln!("error: node-exec: {e}");
            return ExitCode::from(2);
        }
    };
    match run_in_node(holder_pid, "/bin/sh".as_ref(), &["-c".into(), command.into()]) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("error: node-exec: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Line {
        #[command(flatten)]
        a: NodeExecArgs,
    }

    fn parse(line: &[&str]) -> Result<(u32, String), String> {
        let line = Line::try_parse_from(std::iter::once("node-exec").chain(line.iter().copied()))
            .map_err(|e| e.to_string())?;
        holder_and_command(&line.a)
    }

    #[test]
    fn node_exec_takes_ssh_arguments() {
        let nodes = ["--node", "10.57.0.1=11", "--node=10.57.0.2=22", "--"];
        let line: Vec<&str> =
            nodes.iter().copied().chain(["-x", "-o", "A=b", "10.57.0.2", "orted", "-mca", "x"]).collect();
        assert_eq!(parse(&line).unwrap(), (22, "orted -mca x".into()));
        assert!(
            parse(&["--node", "a=1", "--", "b", "cmd"])
                .unwrap_err()
                .contains("not a node of this run; the nodes are a")
        );
        assert!(parse(&["--node", "a=1", "--", "a"]).unwrap_err().contains("no command"));
        assert!(parse(&["--node", "a=1", "--", "-o", "x"]).unwrap_err().contains("no HOST"));
        assert!(parse(&["--node", "a=x", "--", "a", "c"]).unwrap_err().contains("HOST=PID"));
        assert!(parse(&["--node", "a=1", "a", "c"]).is_err(), "the ssh arguments come after --");
        assert!(parse(&["--", "a", "c"]).is_err(), "at least one node");
    }
}
