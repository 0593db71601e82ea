//! Configuration of the core: its `WEAVE_*` environment variables are read here and nowhere
//! else. The GPU path's tuning knobs (`WEAVE_GPU_*`) belong to the GPU layer and are read by
//! the collectives crate's `gpu::GpuConfig`.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `WEAVE_TIMEOUT` | seconds any blocking call may wait (fractions allowed; or with a unit: `20s`, `500ms`, `2min`) | `60` |
//! | `WEAVE_TRANSPORTS` | comma list of transport names to use (e.g. `shm`; preference stays the builder's order), see [`TransportSet`] | every transport given to the builder |
//! | `WEAVE_HOST_ID` | this rank's host identity: ranks with equal ids form one node (lets one machine pose as several nodes) | `hostname/boot-id` |
//! | `WEAVE_DEBUG` | what a binary's subscriber prints on stderr: `off`, `warn`, `info`, `debug`, `trace` or `tracing` filter directives (read by [`crate::diagnostics`], not here) | `warn` |
//! | `WEAVE_SECRET` | 32 hex digits shared by all ranks of a job (the launcher sets it) | derived, see [`crate::bootstrap::EnvRendezvous`] |
//! | `WEAVE_ALGO` | algorithm overrides: `ring` for every collective that has it, or `all_reduce=one_shot,all_gather=ring` | the algorithm table |
//! | `WEAVE_HOST_SCRATCH` | bytes of each half of a rank's host scratch (`4M`, `262144`; at most 1 GiB) | 4 MiB |
//!
//! Every value can be overridden through the API ([`Config`] fields are public).

use std::fmt;
use std::time::Duration;

use crate::deadline::Deadline;
use crate::error::{Error, Result};
use crate::transport_names::Transport;

/// Default bound on every blocking call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// The most `WEAVE_HOST_SCRATCH` may ask for, per half of a rank's host scratch.
pub const MAX_HOST_SCRATCH: usize = 1 << 30;

/// Settings shared by one communicator and everything it builds.
#[derive(Debug, Clone)]
pub struct Config {
    /// Bound on every blocking call (bootstrap, semaphore waits, proxy flushes).
    pub timeout: Duration,
    /// Transports allowed at run time (`WEAVE_TRANSPORTS`); `None` means every transport that
    /// was given to the builder.
    pub transports: Option<TransportSet>,
    /// Host identity override (`WEAVE_HOST_ID`); `None` means `hostname/boot-id`
    /// (see [`crate::host`]).
    pub host_id: Option<String>,
    /// Algorithm overrides, as written in `WEAVE_ALGO` (parsed by the collectives crate).
    pub algorithm_overrides: Option<String>,
    /// Bytes of each half of the host scratch of a collectives communicator (`None`: the
    /// collectives crate's default for the world size).
    pub host_scratch_bytes: Option<usize>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: DEFAULT_TIMEOUT,
            transports: None,
            host_id: None,
            algorithm_overrides: None,
            host_scratch_bytes: None,
        }
    }
}

impl Config {
    /// Reads the `WEAVE_*` variables; unset variables keep their defaults, malformed ones are
    /// an [`Error::InvalidArgument`] naming the variable.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(var)
    }

    /// [`from_env`](Self::from_env) with the variables read through `get` (`None` for unset
    /// ones; empty values count as unset), so it can be tested without touching the process
    /// environment.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let var = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        let mut c = Config::default();
        if let Some(v) = var("WEAVE_TIMEOUT") {
            c.timeout = parse_timeout(&v)?;
        }
        if let Some(v) = var("WEAVE_TRANSPORTS") {
            c.transports =
                Some(TransportSet::parse(&v).map_err(|e| Error::invalid(format!("WEAVE_TRANSPORTS={v:?}: {e}")))?);
        }
        c.host_id = checked_host_id(var("WEAVE_HOST_ID"))?;
        c.algorithm_overrides = var("WEAVE_ALGO");
        if let Some(v) = var("WEAVE_HOST_SCRATCH") {
            let bytes = parse_bytes(&v).map_err(|e| Error::invalid(format!("WEAVE_HOST_SCRATCH: {e}")))?;
            if bytes > MAX_HOST_SCRATCH {
                return Err(Error::invalid(format!(
                    "WEAVE_HOST_SCRATCH={v:?} is more than the {} GiB a half may hold: a few MiB is plenty",
                    MAX_HOST_SCRATCH >> 30
                )));
            }
            c.host_scratch_bytes = Some(bytes);
        }
        Ok(c)
    }

    /// A deadline [`Config::timeout`] from now.
    pub fn deadline(&self) -> Deadline {
        Deadline::after(self.timeout)
    }
}

/// The transports a communicator may use, by name: what `WEAVE_TRANSPORTS` allows.
///
/// Names are checked ([`Transport::check_name`]) but not registered: a name no transport of this
/// build answers to is allowed (that transport may simply not be compiled in) and matches
/// nothing. The order does not matter; the builder's order decides preference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportSet {
    names: Vec<String>,
}

impl TransportSet {
    /// The set of `names`; [`Error::InvalidArgument`] on a malformed name or an empty list.
    pub fn new<I, S>(names: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut set = TransportSet { names: Vec::new() };
        for name in names {
            let name = name.as_ref();
            Transport::check_name(name)?;
            if !set.names.iter().any(|n| n == name) {
                set.names.push(name.to_string());
            }
        }
        if set.names.is_empty() {
            return Err(Error::invalid("the list of transports is empty; name at least one"));
        }
        Ok(set)
    }

    /// Parses a comma-separated list (`shm,mynet`); blanks around names are ignored.
    pub fn parse(list: &str) -> Result<Self> {
        TransportSet::new(list.split(',').map(str::trim).filter(|p| !p.is_empty()))
    }

    /// Whether transport `t` is allowed.
    pub fn contains(&self, t: Transport) -> bool {
        self.allows(t.name())
    }

    /// Whether the transport called `name` is allowed.
    pub fn allows(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }

    /// The names, in the order given, without repeats.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }
}

impl fmt::Display for TransportSet {
    /// The names joined by commas, as `WEAVE_TRANSPORTS` writes them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.names.join(","))
    }
}

/// Reads one `WEAVE_*` variable; empty counts as unset.
pub fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `WEAVE_HOST_ID`, checked: at most [`MAX_HOST_ID_LEN`](crate::host::MAX_HOST_ID_LEN) bytes.
/// Read by the bootstrap too (it groups ranks by host before any communicator exists).
pub fn host_id_from_env() -> Result<Option<String>> {
    checked_host_id(var("WEAVE_HOST_ID"))
}

/// A `WEAVE_HOST_ID` value, checked (see [`host_id_from_env`]).
fn checked_host_id(value: Option<String>) -> Result<Option<String>> {
    match value {
        Some(v) if v.len() > crate::host::MAX_HOST_ID_LEN => Err(Error::invalid(format!(
            "WEAVE_HOST_ID is {} bytes long; at most {} are allowed",
            v.len(),
            crate::host::MAX_HOST_ID_LEN
        ))),
        v => Ok(v.map(|v| v.trim().to_string())),
    }
}

/// Seconds (fractions allowed), optionally with a unit: `s`, `ms` or `min` (`20`, `20s`,
/// `500ms`, `2min`).
fn parse_timeout(v: &str) -> Result<Duration> {
    let t = v.trim();
    let (number, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix("min") {
        (n, 60.0)
    } else {
        (t.strip_suffix('s').unwrap_or(t), 1.0)
    };
    let secs = number.trim().parse::<f64>().map(|n| n * scale).map_err(|_| {
        Error::invalid(format!("WEAVE_TIMEOUT={v:?} is not a number of seconds (e.g. 60, 2.5, 20s, 500ms, 2min)"))
    })?;
    if !(secs.is_finite() && secs > 0.0 && secs <= 1e7) {
        return Err(Error::invalid(format!("WEAVE_TIMEOUT={v:?} must be between 0 and 1e7 seconds")));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a byte count with an optional `K`, `M` or `G` suffix (powers of 1024).
pub fn parse_bytes(v: &str) -> Result<usize> {
    let t = v.trim();
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1usize << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.trim()
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| Error::invalid(format!("{v:?} is not a byte count like 4096, 64K, 4M or 1G")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_timeouts_and_levels() {
        assert_eq!(parse_timeout("2.5").unwrap(), Duration::from_millis(2500));
        assert_eq!(parse_timeout(" 20s").unwrap(), Duration::from_secs(20));
        assert_eq!(parse_timeout("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_timeout("2min").unwrap(), Duration::from_secs(120));
        assert!(parse_timeout("20h").is_err());
        assert!(parse_timeout("ms").is_err());
        assert!(parse_timeout("-1").is_err());
        assert!(parse_timeout("abc").is_err());
        assert!(parse_timeout("inf").is_err());
        assert_eq!(parse_bytes("4M").unwrap(), 4 << 20);
        assert_eq!(parse_bytes("64k").unwrap(), 64 << 10);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert!(parse_bytes("4X").is_err());
        assert!(parse_bytes("99999999999999999999G").is_err());
    }

    #[test]
    fn host_scratch_is_bounded() {
        let with = |v: &str| Config::from_vars(|name| (name == "WEAVE_HOST_SCRATCH").then(|| v.to_string()));
        assert_eq!(with("1G").unwrap().host_scratch_bytes, Some(1 << 30));
        for huge in ["9223372036854775808", "2G", "1025M"] {
            let e = with(huge).unwrap_err().to_string();
            assert!(e.contains("WEAVE_HOST_SCRATCH") && e.contains("1 GiB"), "{huge}: {e}");
        }
    }

    #[test]
    fn transport_sets_take_valid_names_known_or_not() {
        let known = Transport::named("config-test-known").unwrap();
        let set = TransportSet::parse(" config-test-known , not-compiled-in,,config-test-known ").unwrap();
        assert_eq!(set.names().collect::<Vec<_>>(), ["config-test-known", "not-compiled-in"]);
        assert_eq!(set.to_string(), "config-test-known,not-compiled-in");
        assert!(set.contains(known) && set.allows("not-compiled-in") && !set.allows("other"));
        assert_eq!(Transport::lookup("not-compiled-in"), None, "parsing registered a name");
        assert!(!TransportSet::parse("config-test-other").unwrap().contains(known));
        for bad in ["", " , ", "Known", "a b", "a;b", &"x".repeat(33)] {
            assert!(matches!(TransportSet::parse(bad), Err(Error::InvalidArgument(_))), "{bad:?} was accepted");
        }
    }
}
