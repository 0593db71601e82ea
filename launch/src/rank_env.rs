//! The environment every rank starts with: the torchrun-style variables that
//! `comm_core::bootstrap::from_env` reads (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`) and the job secret `WEAVE_SECRET`, with
//! the rank variables of other launchers removed; and where the port and the secret come from.

use std::io::Read;
use std::net::TcpListener;
use std::process::Command;

use crate::error::{Error, Result};
use crate::spec::LaunchSpec;

/// Variables that other launchers use to tell a process its rank; they are removed from every
/// rank's environment so they cannot disagree with the variables the launcher sets.
pub const FOREIGN_RANK_VARS: &[&str] = &[
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "PMI_RANK",
    "PMI_SIZE",
];

/// Gives `cmd` the environment of `rank`: ours without [`FOREIGN_RANK_VARS`], then
/// [`LaunchSpec::env`], then the launcher's variables (which win over both). `master` is the
/// job's `MASTER_ADDR` and `MASTER_PORT`. A rank of a namespace node (`in_namespace`) gets no
/// `WEAVE_HOST_ID` (not even ours): its hostname tells its node apart.
pub(crate) fn set_rank_env(
    cmd: &mut Command,
    spec: &LaunchSpec,
    rank: usize,
    secret: &str,
    (master_addr, master_port): (&str, u16),
    in_namespace: bool,
) {
    let n = spec.ranks;
    let per_node = spec.ranks_per_node().max(1);
    for var in FOREIGN_RANK_VARS {
        cmd.env_remove(var);
    }
    if in_namespace {
        cmd.env_remove("WEAVE_HOST_ID").env("GROUP_RANK", (rank / per_node).to_string());
    } else if spec.posed_nodes.is_some() {
        // The job's port names the posed nodes, so two jobs on one host never share one.
        cmd.env("GROUP_RANK", (rank / per_node).to_string())
            .env("WEAVE_HOST_ID", format!("posed-{master_port}-node-{}", rank / per_node));
    }
    cmd.envs(spec.env.iter().map(|(k, v)| (k, v)))
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", n.to_string())
        .env("LOCAL_RANK", (rank % per_node).to_string())
        .env("LOCAL_WORLD_SIZE", per_node.to_string())
        .env("MASTER_ADDR", master_addr)
        .env("MASTER_PORT", master_port.to_string())
        .env("WEAVE_SECRET", secret);
}

/// The job secret: our own `WEAVE_SECRET` when set (and not blank), else a fresh one.
pub(crate) fn secret_from_env() -> Result<String> {
    job_secret(std::env::var("WEAVE_SECRET").ok().filter(|v| !v.trim().is_empty()))
}

/// The job secret: `existing` (the caller's `WEAVE_SECRET`) when set, else 16 random bytes.
fn job_secret(existing: Option<String>) -> Result<String> {
    if let Some(s) = existing {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(Error::invalid(format!(
                "WEAVE_SECRET={s:?} is not 32 hex digits; fix it or unset it to let the launcher pick one"
            )));
        }
        return Ok(s);
    }
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).map_err(|e| {
        Error::io("read 16 random bytes from /dev/urandom for WEAVE_SECRET (or set WEAVE_SECRET to 32 hex digits)", e)
    })?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Binds port 0 on `addr`, reads the port the OS picked, and closes the socket again.
pub(crate) fn free_port(addr: &str) -> Result<u16> {
    let what = || format!("pick a free TCP port on master address {addr:?} (use an address of this host)");
    let listener = TcpListener::bind((addr, 0)).map_err(|e| Error::io(what(), e))?;
    Ok(listener.local_addr().map_err(|e| Error::io(what(), e))?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_is_kept_or_generated() {
        let s = "0123456789abcdefABCDEF0123456789".to_string();
        assert_eq!(job_secret(Some(s.clone())).unwrap(), s);
        assert!(matches!(job_secret(Some("xyz".into())), Err(Error::InvalidArgument(_))));
        let a = job_secret(None).unwrap();
        assert!(a.len() == 32 && a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, job_secret(None).unwrap());
    }
}
