//! Joining a job from the environment a launcher sets: torchrun, Open MPI or Slurm.
//!
//! See [`EnvRendezvous`] for the variables read and how the job secret is chosen.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use super::tcp::TcpBootstrap;
use super::unique_id::UniqueId;
use crate::config::{self, Config};
use crate::error::{Error, Result};
use crate::wire;

/// The launchers understood, in order of precedence: (name, rank, world size, local rank).
const LAUNCHERS: [(&str, &str, &str, &str); 4] = [
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("MPICH/PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
];

/// Where launchers put the node list of a job: the first host is rank 0's when `MASTER_ADDR`
/// is not set.
const NODE_LIST_VARIABLES: [&str; 2] = ["SLURM_JOB_NODELIST", "SLURM_NODELIST"];

/// Job ids that go into a derived secret, when set.
const JOB_ID_VARIABLES: [&str; 3] = ["TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "OMPI_MCA_ess_base_jobid"];

/// What the environment says about this rank's job.
///
/// | launcher | rank | world size | local rank |
/// |---|---|---|---|
/// | torchrun | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` |
/// | Open MPI (`mpirun`) | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` |
/// | MPICH / Hydra / PMI | `PMI_RANK` | `PMI_SIZE` | `MPI_LOCALRANKID` |
/// | Slurm (`srun`) | `SLURM_PROCID` | `SLURM_NTASKS` | `SLURM_LOCALID` |
///
/// The first launcher in this order whose rank or world-size variable is set is used. Whatever
/// the launcher, the root's address comes from `MASTER_ADDR` (an IP address or a host name) and
/// `MASTER_PORT`, which MPI and Slurm users export themselves; under Slurm, an unset
/// `MASTER_ADDR` defaults to the first host of `SLURM_JOB_NODELIST` (where `srun` starts rank
/// 0), so only `MASTER_PORT` must be exported.
///
/// The job secret is `WEAVE_SECRET` (32 hex digits) when set. Otherwise it is derived from
/// `MASTER_ADDR`, `MASTER_PORT`, the world size and whichever job ids are set
/// (`TORCHELASTIC_RUN_ID`, `SLURM_JOB_ID`, `OMPI_MCA_ess_base_jobid`). Every rank of the job
/// derives the same value, and jobs with different ports or ids get different ones, but anyone
/// who can read those variables can compute it: a derived secret only guards against accidental
/// cross-talk between jobs, not against a process that wants to join. Set `WEAVE_SECRET` (the
/// weave launcher does) for the real guarantee.
#[derive(Clone, PartialEq, Eq)]
pub struct EnvRendezvous {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// The launcher's local rank, when it sets one (the bootstrap computes its own from host
    /// identities; this one is informational).
    pub local_rank: Option<usize>,
    /// `MASTER_ADDR`: where rank 0 listens (IP address or host name).
    pub master_addr: String,
    /// `MASTER_PORT`.
    pub master_port: u16,
    /// `WEAVE_SECRET`, when set; otherwise [`EnvRendezvous::job_secret`] derives one.
    pub secret: Option<[u8; 16]>,
    /// The job-id variables that were set, as (name, value); they go into a derived secret.
    pub job_ids: Vec<(&'static str, String)>,
    /// Which launcher's variables were used: `"torchrun"`, `"Open MPI"`, `"MPICH/PMI"` or
    /// `"Slurm"`.
    pub source: &'static str,
}

impl EnvRendezvous {
    /// Reads the variables through `get` (which returns `None` for unset ones; empty values
    /// count as unset), so it can be tested without touching the process environment.
    ///
    /// Missing or malformed variables give [`Error::InvalidArgument`] naming them.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let get = |name: &str| get(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let Some((source, rank_var, size_var, local_var)) =
            LAUNCHERS.into_iter().find(|(_, rank_var, size_var, _)| get(rank_var).is_some() || get(size_var).is_some())
        else {
            return Err(Error::invalid(
                "no rendezvous variables found: run under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), \
                 Open MPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE) or Slurm (SLURM_PROCID, SLURM_NTASKS) with \
                 MASTER_ADDR and MASTER_PORT exported, or use the weave launcher",
            ));
        };
        let require = |name: &str| {
            get(name).ok_or_else(|| {
                Error::invalid(format!(
                    "{source} rendezvous: {name} is not set (found {} variables, e.g. {})",
                    source,
                    if get(rank_var).is_some() { rank_var } else { size_var }
                ))
            })
        };
        let rank = parse_count(rank_var, &require(rank_var)?)?;
        let world_size = parse_count(size_var, &require(size_var)?)?;
        if world_size == 0 || world_size > super::MAX_WORLD_SIZE {
            return Err(Error::invalid(format!(
                "{size_var}={world_size}: a job has 1 to {} ranks",
                super::MAX_WORLD_SIZE
            )));
        }
        if rank >= world_size {
            return Err(Error::invalid(format!("{rank_var}={rank} is not below {size_var}={world_size}")));
        }
        let local_rank = get(local_var).map(|v| parse_count(local_var, &v)).transpose()?;
        if let Some(local) = local_rank.filter(|&l| l >= world_size) {
            return Err(Error::invalid(format!("{local_var}={local} is not below {size_var}={world_size}")));
        }

        let from_node_list = NODE_LIST_VARIABLES.iter().find_map(|v| get(v)).and_then(|list| first_host(&list));
        let master_addr = require("MASTER_ADDR").or_else(|e| from_node_list.ok_or(e)).map_err(|e| {
            Error::invalid(format!(
                "{e}; export MASTER_ADDR and MASTER_PORT: the address of rank 0's host and a free port"
            ))
        })?;
        let master_addr =
            master_addr.strip_prefix('[').and_then(|a| a.strip_suffix(']')).unwrap_or(&master_addr).to_string();
        let port_text = require("MASTER_PORT")?;
        let master_port =
            port_text.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(|| {
                Error::invalid(format!("MASTER_PORT={port_text:?} is not a port number (1 to 65535)"))
            })?;

        let secret = get("WEAVE_SECRET")
            .map(|v| {
                // The value is not echoed: it is a secret, and even a wrong one may be close.
                wire::parse_hex::<16>(&v).map_err(|_| {
                    Error::invalid(format!(
                        "WEAVE_SECRET must be exactly 32 hex digits (got {} characters; value not shown)",
                        v.chars().count()
                    ))
                })
            })
            .transpose()?;
        let job_ids = JOB_ID_VARIABLES.into_iter().filter_map(|name| get(name).map(|value| (name, value))).collect();
        Ok(EnvRendezvous { rank, world_size, local_rank, master_addr, master_port, secret, job_ids, source })
    }

    /// Reads the process environment (`WEAVE_SECRET` through [`config::var`]).
    pub fn detect() -> Result<Self> {
        Self::from_vars(|name| if name.starts_with("WEAVE_") { config::var(name) } else { std::env::var(name).ok() })
    }

    /// The job secret: [`secret`](EnvRendezvous::secret) when set, else derived from the master
    /// address and port, the world size and the job ids (the same on every rank; see the module
    /// [type documentation](EnvRendezvous) for what a derived secret does and does not guard against).
    pub fn job_secret(&self) -> [u8; 16] {
        if let Some(secret) = self.secret {
            return secret;
        }
        let port = self.master_port.to_le_bytes();
        let world_size = (self.world_size as u64).to_le_bytes();
        let mut parts: Vec<&[u8]> = vec![b"", self.master_addr.as_bytes(), &port, &world_size];
        for (name, value) in &self.job_ids {
            parts.push(name.as_bytes());
            parts.push(value.as_bytes());
        }
        let mut secret = [0u8; 16];
        parts[0] = b"weave derived secret, low half";
        secret[..8].copy_from_slice(&wire::digest64(&parts).to_le_bytes());
        parts[0] = b"weave derived secret, high half";
        secret[8..].copy_from_slice(&wire::digest64(&parts).to_le_bytes());
        secret
    }

    /// `MASTER_ADDR:MASTER_PORT`, resolved (IPv4 preferred), with the job secret: the id every
    /// rank other than 0 connects with.
    pub fn unique_id(&self) -> Result<UniqueId> {
        let addr = resolve(&self.master_addr, self.master_port, "MASTER_ADDR")?;
        Ok(UniqueId::with_secret(addr, self.job_secret()))
    }

    /// Joins the job as [`rank`](EnvRendezvous::rank), bounding every wait by `timeout`.
    ///
    /// Rank 0 listens on `MASTER_PORT` of: the address itself when `MASTER_ADDR` is an IP
    /// address or `localhost`; every interface when it is another host name (a host often
    /// resolves its own name to a loopback address that other hosts cannot reach).
    pub fn connect(&self, timeout: Duration) -> Result<TcpBootstrap> {
        let mut id = self.unique_id()?;
        if self.rank == 0 && !self.master_addr_is_literal() {
            id.addr.set_ip(match id.addr {
                SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            });
        }
        TcpBootstrap::new(&id, self.rank, self.world_size, timeout)
    }

    fn master_addr_is_literal(&self) -> bool {
        self.master_addr.parse::<IpAddr>().is_ok() || self.master_addr.eq_ignore_ascii_case("localhost")
    }
}

/// The first host of a Slurm node list: `gpu[07-09,12],cpu3` gives `gpu07`, `a,b` gives `a`.
/// `None` for a list that is empty or malformed.
fn first_host(list: &str) -> Option<String> {
    let first = list.trim();
    let end = first.find([',', '[']).unwrap_or(first.len());
    let prefix = &first[..end];
    let host = if first[end..].starts_with('[') {
        // The `]` that closes this bracket: one earlier in the list closes nothing.
        let close = end + first[end..].find(']')?;
        let inner = &first[end + 1..close];
        let range = inner.split(',').next()?;
        let start = range.split('-').next()?;
        if start.is_empty() || !start.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        format!("{prefix}{start}")
    } else {
        prefix.to_string()
    };
    (!host.is_empty() && host.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))).then_some(host)
}

impl fmt::Debug for EnvRendezvous {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EnvRendezvous")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("local_rank", &self.local_rank)
            .field("master_addr", &self.master_addr)
            .field("master_port", &self.master_port)
            .field("secret", &format_args!("{}", if self.secret.is_some() { "<hidden>" } else { "<derived>" }))
            .field("job_ids", &self.job_ids)
            .field("source", &self.source)
            .finish()
    }
}

/// `host:port` resolved, an IPv4 address preferred; errors name `what` (the variable it came
/// from).
pub fn resolve(host: &str, port: u16, what: &str) -> Result<SocketAddr> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::invalid(format!("{what}={host:?} does not resolve: {e}")))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| Error::invalid(format!("{what}={host:?} resolves to no address")))
}

/// Joins the job described by the environment ([`EnvRendezvous::detect`]), with the timeout of
/// [`Config::from_env`] (`WEAVE_TIMEOUT`).
pub fn from_env() -> Result<TcpBootstrap> {
    let config = Config::from_env()?;
    EnvRendezvous::detect()?.connect(config.timeout)
}

fn parse_count(name: &str, value: &str) -> Result<usize> {
    value.parse::<usize>().map_err(|_| Error::invalid(format!("{name}={value:?} is not a non-negative integer")))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::bootstrap::Bootstrap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| map.get(name).cloned()
    }

    fn invalid_message(result: Result<EnvRendezvous>) -> String {
        match result {
            Err(Error::InvalidArgument(message)) => message,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    const MASTER: [(&str, &str); 2] = [("MASTER_ADDR", "10.1.2.3"), ("MASTER_PORT", "29500")];

    #[test]
    fn torchrun() {
        let r = EnvRendezvous::from_vars(vars(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", " 10.1.2.3 "),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_RUN_ID", "abc"),
            // torchrun wins over the Slurm allocation it runs in.
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
        ]))
        .unwrap();
        assert_eq!((r.rank, r.world_size, r.local_rank, r.source), (3, 8, Some(1), "torchrun"));
        assert_eq!((r.master_addr.as_str(), r.master_port), ("10.1.2.3", 29500));
        assert_eq!(r.secret, None);
        assert_eq!(r.job_ids, vec![("TORCHELASTIC_RUN_ID", "abc".to_string())]);
        assert_eq!(r.unique_id().unwrap().addr, "10.1.2.3:29500".parse().unwrap());
    }

    #[test]
    fn open_mpi_and_slurm() {
        let mut mpi = vec![
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
        ];
        mpi.extend(MASTER);
        let r = EnvRendezvous::from_vars(vars(&mpi)).unwrap();
        assert_eq!((r.rank, r.world_size, r.local_rank, r.source), (0, 2, Some(0), "Open MPI"));

        let mut slurm = vec![("SLURM_PROCID", "5"), ("SLURM_NTASKS", "6"), ("SLURM_JOB_ID", "777")];
        slurm.extend(MASTER);
        let r = EnvRendezvous::from_vars(vars(&slurm)).unwrap();
        assert_eq!((r.rank, r.world_size, r.local_rank, r.source), (5, 6, None, "Slurm"));
        assert_eq!(r.job_ids, vec![("SLURM_JOB_ID", "777".to_string())]);
    }

    #[test]
    fn missing_variables_are_named() {
        assert!(invalid_message(EnvRendezvous::from_vars(vars(&[]))).contains("RANK"));
        assert!(
            invalid_message(EnvRendezvous::from_vars(vars(&[("RANK", "0"), ("WORLD_SIZE", " ")])))
                .contains("WORLD_SIZE")
        );
        assert!(
            invalid_message(EnvRendezvous::from_vars(vars(&[("OMPI_COMM_WORLD_SIZE", "2")])))
                .contains("OMPI_COMM_WORLD_RANK")
        );
        let message = invalid_message(EnvRendezvous::from_vars(vars(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")])));
        assert!(message.contains("MASTER_ADDR") && message.contains("Slurm"), "{message}");
        let message = invalid_message(EnvRendezvous::from_vars(vars(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.0.0.1"),
        ])));
        assert!(message.contains("MASTER_PORT"), "{message}");
    }

    #[test]
    fn world_sizes_beyond_the_limit_are_refused() {
        for size in ["0", "18446744073709551615", "1048577"] {
            let message = invalid_message(EnvRendezvous::from_vars(vars(&[
                ("RANK", "0"),
                ("WORLD_SIZE", size),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", "29500"),
            ])));
            assert!(message.contains("WORLD_SIZE") && message.contains("1 to 1048576 ranks"), "{size}: {message}");
        }
        let id = UniqueId::with_secret(SocketAddr::from(([127, 0, 0, 1], 1)), [7; 16]);
        match TcpBootstrap::with_roots(&[id], 0, usize::MAX, Duration::from_secs(1)) {
            Err(Error::InvalidArgument(message)) => assert!(message.contains("1 to 1048576 ranks"), "{message}"),
            other => panic!("a bootstrap of usize::MAX ranks: expected InvalidArgument, got {:?}", other.err()),
        }
    }

    #[test]
    fn bad_numbers_are_named() {
        for (name, value) in [
            ("RANK", "abc"),
            ("RANK", "-1"),
            ("RANK", "4"),
            ("WORLD_SIZE", "0"),
            ("WORLD_SIZE", "1.5"),
            ("LOCAL_RANK", "x"),
            ("LOCAL_RANK", "9"),
            ("MASTER_PORT", "70000"),
            ("MASTER_PORT", "0"),
            ("MASTER_PORT", "http"),
        ] {
            let mut all: HashMap<&str, &str> =
                [("RANK", "1"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1")].into_iter().chain(MASTER).collect();
            all.insert(name, value);
            let pairs: Vec<(&str, &str)> = all.into_iter().collect();
            let message = invalid_message(EnvRendezvous::from_vars(vars(&pairs)));
            assert!(message.contains(name), "{name}={value}: {message}");
        }
    }

    #[test]
    fn secrets_given_and_derived() {
        let hex = "00112233445566778899aabbccddeeff";
        let mut given = vec![("RANK", "0"), ("WORLD_SIZE", "2"), ("WEAVE_SECRET", hex)];
        given.extend(MASTER);
        let r = EnvRendezvous::from_vars(vars(&given)).unwrap();
        assert_eq!(r.secret, Some(wire::parse_hex::<16>(hex).unwrap()));
        assert_eq!(r.job_secret(), r.secret.unwrap());
        let debug = format!("{r:?}");
        assert!(debug.contains("<hidden>") && !debug.contains(hex) && !debug.contains("[0, 17"), "{debug}");

        for bad in ["xyz", "00112233445566778899aabbccddeefg", "00112233"] {
            let mut pairs = vec![("RANK", "0"), ("WORLD_SIZE", "2"), ("WEAVE_SECRET", bad)];
            pairs.extend(MASTER);
            let message = invalid_message(EnvRendezvous::from_vars(vars(&pairs)));
            assert!(message.contains("WEAVE_SECRET") && !message.contains(bad), "{message}");
        }

        let derive = |extra: &[(&'static str, &'static str)]| {
            let mut pairs = vec![("WORLD_SIZE", "2")];
            pairs.extend(MASTER);
            pairs.extend_from_slice(extra);
            EnvRendezvous::from_vars(vars(&pairs)).unwrap().job_secret()
        };
        let base = derive(&[("RANK", "0")]);
        assert_eq!(base, derive(&[("RANK", "1")]), "every rank derives the same secret");
        assert_ne!(base, derive(&[("RANK", "0"), ("TORCHELASTIC_RUN_ID", "other")]));
        assert_ne!(derive(&[("RANK", "0"), ("SLURM_JOB_ID", "1")]), derive(&[("RANK", "0"), ("SLURM_JOB_ID", "2")]));
        assert_ne!(base, derive(&[("RANK", "0"), ("MASTER_PORT", "29501")]));
    }

    #[test]
    fn host_names_resolve() {
        let mut pairs = vec![("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "localhost"), ("MASTER_PORT", "1234")];
        let id = EnvRendezvous::from_vars(vars(&pairs)).unwrap().unique_id().unwrap();
        assert!(id.addr.ip().is_loopback() && id.addr.port() == 1234, "{id:?}");
        pairs[2] = ("MASTER_ADDR", "[::1]");
        let id = EnvRendezvous::from_vars(vars(&pairs)).unwrap().unique_id().unwrap();
        assert_eq!(id.addr, "[::1]:1234".parse().unwrap());
    }

    #[test]
    fn ranks_join_through_their_variables() {
        let port = UniqueId::on_free_port(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap().addr.port().to_string();
        std::thread::scope(|scope| {
            let ranks: Vec<_> = ["0", "1", "2"]
                .into_iter()
                .map(|rank| {
                    let port = port.as_str();
                    scope.spawn(move || {
                        let r = EnvRendezvous::from_vars(vars(&[
                            ("OMPI_COMM_WORLD_RANK", rank),
                            ("OMPI_COMM_WORLD_SIZE", "3"),
                            ("MASTER_ADDR", "127.0.0.1"),
                            ("MASTER_PORT", port),
                        ]))
                        .unwrap();
                        let b = r.connect(Duration::from_secs(10)).unwrap();
                        let all = b.all_gather(rank.as_bytes()).unwrap();
                        b.barrier().unwrap();
                        (all, b.job_key())
                    })
                })
                .collect();
            let results: Vec<_> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
            for (all, key) in &results {
                assert_eq!(all, &vec![b"0".to_vec(), b"1".to_vec(), b"2".to_vec()]);
                assert_eq!(key, &results[0].1);
            }
        });
    }

    #[test]
    fn mpich_pmi_variables_and_the_slurm_node_list_are_understood() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        let pmi = EnvRendezvous::from_vars(vars(&[
            ("PMI_RANK", "3"),
            ("PMI_SIZE", "4"),
            ("MPI_LOCALRANKID", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap();
        assert_eq!((pmi.rank, pmi.world_size, pmi.local_rank, pmi.source), (3, 4, Some(1), "MPICH/PMI"));
        let slurm = EnvRendezvous::from_vars(vars(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_JOB_NODELIST", "gpu[07-09,12],cpu3"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap();
        assert_eq!(slurm.master_addr, "gpu07");
        for (list, want) in
            [("a,b", Some("a")), ("n[1-2]", Some("n1")), ("solo", Some("solo")), ("x[a-b]", None), ("", None)]
        {
            assert_eq!(first_host(list).as_deref(), want, "{list:?}");
        }
        // A `]` before the bracket it should close (found by the rendezvous_variables fuzz
        // target: the slice ran backwards and panicked), and brackets never closed.
        for (list, want) in [("]pu[01-04]", None), ("a]b[1]", None), ("g[1", None), ("g[]", None), ("h]", None)] {
            assert_eq!(first_host(list).as_deref(), want, "{list:?}");
        }
        let missing =
            EnvRendezvous::from_vars(vars(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("MASTER_PORT", "1")]));
        assert!(matches!(missing, Err(Error::InvalidArgument(_))));
    }
}
