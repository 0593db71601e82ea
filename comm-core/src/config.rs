//! Configuration: every `WEAVE_*` environment variable is read here and nowhere else.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `WEAVE_TIMEOUT` | seconds any blocking call may wait (fractions allowed) | `60` |
//! | `WEAVE_TRANSPORTS` | comma list of transports to use (`shm,loopback,cudaipc,ib`) | all compiled in |
//! | `WEAVE_HOST_ID` | this rank's host identity: ranks with equal ids form one node (lets one machine pose as several nodes) | `hostname/boot-id` |
//! | `WEAVE_DEBUG` | log level on stderr: `off`, `warn`, `info`, `trace` | `warn` |
//! | `WEAVE_SECRET` | 32 hex digits shared by all ranks of a job (the launcher sets it) | derived, see [`crate::bootstrap::EnvRendezvous`] |
//! | `WEAVE_ALGO` | algorithm overrides: `ring` for every collective that has it, or `all_reduce=one_shot,all_gather=ring` | the algorithm table |
//! | `WEAVE_HOST_SCRATCH` | bytes of each half of a rank's host scratch (`4M`, `262144`) | 4 MiB |
//! | `WEAVE_GPU_BLOCKS` | most thread blocks of a block-pipelined GPU kernel (1–128; a tuning knob) | 128 |
//! | `WEAVE_GPU_PACKETS` | LL packets (8 bytes of payload each) per peer and parity (4K–1M; a tuning knob) | 64K |
//! | `WEAVE_GPU_TILE` | bytes one pipelined block moves per peer and step (4K–4M, multiple of 256; a tuning knob) | 128K |
//! | `WEAVE_GPU_STEPS` | least tiles per block a block-pipelined GPU kernel aims for (1–16; a tuning knob) | 1 |
//! | `WEAVE_GPU_SCHEDULE` | `lockstep` or `overlapped`: how the block-pipelined all-reduce, all-gather, reduce-scatter and all-to-all order their tiles (a tuning knob; the mix of ranks may differ) | per world size and message size |
//! | `WEAVE_GPU_OVERLAP` | `1`/`0`: launch each GPU collective while the kernel before it on the stream still runs (programmatic dependent launch, sm_90+), hiding the launch latency | `1` |
//!
//! Every value can be overridden through the API ([`Config`] fields are public).

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::transport::Transport;

/// Default bound on every blocking call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// How much weave prints on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Nothing.
    Off,
    /// Warnings only.
    Warn,
    /// Decisions (algorithm choices, transport choices).
    Info,
    /// Everything.
    Trace,
}

/// Settings shared by one communicator and everything it builds.
#[derive(Debug, Clone)]
pub struct Config {
    /// Bound on every blocking call (bootstrap, semaphore waits, proxy flushes).
    pub timeout: Duration,
    /// Transports allowed at run time; `None` means every transport that was given to the builder.
    pub transports: Option<Transport>,
    /// Host identity override (`WEAVE_HOST_ID`); `None` means `hostname/boot-id`
    /// (see [`crate::host`]).
    pub host_id: Option<String>,
    /// Log level.
    pub log_level: LogLevel,
    /// Algorithm overrides, as written in `WEAVE_ALGO` (parsed by the collectives crate).
    pub algorithm_overrides: Option<String>,
    /// Bytes of each half of the host scratch of a collectives communicator.
    pub host_scratch_bytes: Option<usize>,
    /// Most thread blocks of a block-pipelined GPU kernel (`WEAVE_GPU_BLOCKS`, 1..=128).
    pub gpu_pipeline_blocks: Option<u32>,
    /// LL packets per peer and parity in the GPU workspace (`WEAVE_GPU_PACKETS`).
    pub gpu_packets: Option<usize>,
    /// Bytes one pipelined block moves per peer and step (`WEAVE_GPU_TILE`).
    pub gpu_pipeline_tile: Option<usize>,
    /// Least tiles per block of a block-pipelined GPU kernel (`WEAVE_GPU_STEPS`, 1..=16).
    pub gpu_pipeline_steps: Option<u32>,
    /// How the block-pipelined GPU kernels order their tiles (`WEAVE_GPU_SCHEDULE`): `Some(true)`
    /// overlapped (push a tile, then finish earlier ones), `Some(false)` lockstep (consume each
    /// tile right after it arrived), `None` as the table decides.
    pub gpu_overlapped_schedule: Option<bool>,
    /// Whether GPU collectives launch as programmatic dependents of the kernel before them on
    /// the stream, where the GPU supports it (`WEAVE_GPU_OVERLAP`, default on).
    pub gpu_overlap_launches: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: DEFAULT_TIMEOUT,
            transports: None,
            host_id: None,
            log_level: LogLevel::Warn,
            algorithm_overrides: None,
            host_scratch_bytes: None,
            gpu_pipeline_blocks: None,
            gpu_pipeline_tile: None,
            gpu_packets: None,
            gpu_pipeline_steps: None,
            gpu_overlapped_schedule: None,
            gpu_overlap_launches: true,
        }
    }
}

impl Config {
    /// Reads the `WEAVE_*` variables; unset variables keep their defaults, malformed ones are
    /// an [`Error::InvalidArgument`] naming the variable.
    pub fn from_env() -> Result<Self> {
        let mut c = Config::default();
        if let Some(v) = var("WEAVE_TIMEOUT") {
            c.timeout = parse_timeout(&v)?;
        }
        if let Some(v) = var("WEAVE_TRANSPORTS") {
            c.transports =
                Some(Transport::parse_list(&v).map_err(|e| Error::invalid(format!("WEAVE_TRANSPORTS={v:?}: {e}")))?);
        }
        c.host_id = host_id_from_env()?;
        if let Some(v) = var("WEAVE_DEBUG") {
            c.log_level = parse_log_level(&v)?;
        }
        c.algorithm_overrides = var("WEAVE_ALGO");
        if let Some(v) = var("WEAVE_HOST_SCRATCH") {
            c.host_scratch_bytes =
                Some(parse_bytes(&v).map_err(|e| Error::invalid(format!("WEAVE_HOST_SCRATCH: {e}")))?);
        }
        if let Some(v) = var("WEAVE_GPU_BLOCKS") {
            c.gpu_pipeline_blocks = Some(parse_gpu_blocks(&v)?);
        }
        if let Some(v) = var("WEAVE_GPU_PACKETS") {
            c.gpu_packets = Some(parse_gpu_packets(&v)?);
        }
        if let Some(v) = var("WEAVE_GPU_TILE") {
            c.gpu_pipeline_tile = Some(parse_gpu_tile(&v)?);
        }
        if let Some(v) = var("WEAVE_GPU_STEPS") {
            c.gpu_pipeline_steps = Some(match v.trim().parse::<u32>() {
                Ok(n @ 1..=16) => n,
                _ => return Err(Error::invalid(format!("WEAVE_GPU_STEPS={v:?}: expected a step count from 1 to 16"))),
            });
        }
        if let Some(v) = var("WEAVE_GPU_SCHEDULE") {
            c.gpu_overlapped_schedule = Some(parse_gpu_schedule(&v)?);
        }
        if let Some(v) = var("WEAVE_GPU_OVERLAP") {
            c.gpu_overlap_launches = parse_switch(&v).map_err(|e| Error::invalid(format!("WEAVE_GPU_OVERLAP: {e}")))?;
        }
        Ok(c)
    }

    /// A deadline [`Config::timeout`] from now.
    pub fn deadline(&self) -> Deadline {
        Deadline::after(self.timeout)
    }

    /// True when messages at `level` should be printed.
    pub fn logs(&self, level: LogLevel) -> bool {
        level <= self.log_level && level != LogLevel::Off
    }
}

/// Reads one `WEAVE_*` variable; empty counts as unset.
pub fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `1`, `on`, `true`, `yes` or `0`, `off`, `false`, `no` (any case).
fn parse_switch(v: &str) -> std::result::Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "on" | "true" | "yes" => Ok(true),
        "0" | "off" | "false" | "no" => Ok(false),
        _ => Err(format!("{v:?} is not on/off (1, 0, on, off, true, false, yes, no)")),
    }
}

/// `overlapped` (true) or `lockstep` (false), any case.
fn parse_gpu_schedule(v: &str) -> Result<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "overlapped" => Ok(true),
        "lockstep" => Ok(false),
        _ => Err(Error::invalid(format!("WEAVE_GPU_SCHEDULE={v:?}: expected lockstep or overlapped"))),
    }
}

/// `WEAVE_HOST_ID`, checked: at most [`MAX_HOST_ID_LEN`](crate::host::MAX_HOST_ID_LEN) bytes.
/// Read by the bootstrap too (it groups ranks by host before any communicator exists).
pub fn host_id_from_env() -> Result<Option<String>> {
    match var("WEAVE_HOST_ID") {
        Some(v) if v.len() > crate::host::MAX_HOST_ID_LEN => Err(Error::invalid(format!(
            "WEAVE_HOST_ID is {} bytes long; at most {} are allowed",
            v.len(),
            crate::host::MAX_HOST_ID_LEN
        ))),
        v => Ok(v.map(|v| v.trim().to_string())),
    }
}

fn parse_timeout(v: &str) -> Result<Duration> {
    let secs: f64 =
        v.trim().parse().map_err(|_| Error::invalid(format!("WEAVE_TIMEOUT={v:?} is not a number of seconds")))?;
    if !(secs.is_finite() && secs > 0.0 && secs <= 1e7) {
        return Err(Error::invalid(format!("WEAVE_TIMEOUT={v:?} must be between 0 and 1e7 seconds")));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_gpu_blocks(v: &str) -> Result<u32> {
    match v.trim().parse::<u32>() {
        Ok(b) if (1..=128).contains(&b) => Ok(b),
        _ => Err(Error::invalid(format!("WEAVE_GPU_BLOCKS={v:?}: expected a block count from 1 to 128"))),
    }
}

fn parse_gpu_packets(v: &str) -> Result<usize> {
    let n = parse_bytes(v).map_err(|e| Error::invalid(format!("WEAVE_GPU_PACKETS: {e}")))?;
    if !(4 << 10..=1 << 20).contains(&n) {
        return Err(Error::invalid(format!("WEAVE_GPU_PACKETS={v:?}: expected 4K to 1M packets")));
    }
    Ok(n)
}

fn parse_gpu_tile(v: &str) -> Result<usize> {
    let bytes = parse_bytes(v).map_err(|e| Error::invalid(format!("WEAVE_GPU_TILE: {e}")))?;
    if !(4 << 10..=4 << 20).contains(&bytes) || bytes % 256 != 0 {
        return Err(Error::invalid(format!("WEAVE_GPU_TILE={v:?}: expected 4K to 4M bytes in a multiple of 256")));
    }
    Ok(bytes)
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

fn parse_log_level(v: &str) -> Result<LogLevel> {
    match v.trim().to_ascii_lowercase().as_str() {
        "off" | "0" | "none" => Ok(LogLevel::Off),
        "warn" | "1" => Ok(LogLevel::Warn),
        "info" | "2" => Ok(LogLevel::Info),
        "trace" | "3" | "debug" => Ok(LogLevel::Trace),
        _ => Err(Error::invalid(format!("WEAVE_DEBUG={v:?}: expected off, warn, info or trace"))),
    }
}

/// A point in time after which a blocking call gives up.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    start: Instant,
    end: Instant,
}

impl Deadline {
    /// `timeout` from now.
    pub fn after(timeout: Duration) -> Self {
        let start = Instant::now();
        let end = start.checked_add(timeout).unwrap_or(start + Duration::from_secs(1 << 30));
        Deadline { start, end }
    }

    /// Time left, zero once passed.
    pub fn remaining(&self) -> Duration {
        self.end.saturating_duration_since(Instant::now())
    }

    /// True once the deadline has passed.
    pub fn expired(&self) -> bool {
        Instant::now() >= self.end
    }

    /// Time since the deadline was set.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// `Err(Error::Timeout)` naming `operation` and `peer` once the deadline has passed.
    pub fn check(&self, operation: &str, peer: Option<usize>) -> Result<()> {
        if self.expired() { Err(Error::timeout(operation, peer, self.elapsed())) } else { Ok(()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_timeouts_and_levels() {
        assert_eq!(parse_timeout("2.5").unwrap(), Duration::from_millis(2500));
        assert!(parse_timeout("-1").is_err());
        assert!(parse_timeout("abc").is_err());
        assert!(parse_timeout("inf").is_err());
        assert_eq!(parse_log_level("INFO").unwrap(), LogLevel::Info);
        assert!(parse_log_level("loud").is_err());
        assert_eq!(parse_bytes("4M").unwrap(), 4 << 20);
        assert_eq!(parse_bytes("64k").unwrap(), 64 << 10);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert!(parse_bytes("4X").is_err());
        assert!(parse_bytes("99999999999999999999G").is_err());
        assert_eq!(parse_gpu_blocks(" 32 ").unwrap(), 32);
        assert!(parse_gpu_blocks("0").is_err() && parse_gpu_blocks("129").is_err() && parse_gpu_blocks("x").is_err());
        assert_eq!(parse_gpu_tile("256K").unwrap(), 256 << 10);
        assert_eq!(parse_switch(" Off "), Ok(false));
        assert_eq!(parse_switch("1"), Ok(true));
        assert!(parse_switch("maybe").is_err());
        assert_eq!(parse_gpu_packets("64K").unwrap(), 64 << 10);
        assert!(parse_gpu_packets("1K").is_err() && parse_gpu_packets("2M").is_err());
        assert!(parse_gpu_tile("1K").is_err() && parse_gpu_tile("8M").is_err() && parse_gpu_tile("5000").is_err());
    }

    #[test]
    fn gpu_schedules_parse_and_anything_else_is_refused() {
        assert!(parse_gpu_schedule(" Overlapped ").unwrap());
        assert!(!parse_gpu_schedule("lockstep").unwrap());
        let e = parse_gpu_schedule("fast").unwrap_err().to_string();
        assert!(e.contains("WEAVE_GPU_SCHEDULE") && e.contains("lockstep or overlapped"), "{e}");
    }

    #[test]
    fn deadline_expires() {
        let d = Deadline::after(Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(3));
        assert!(d.expired());
        assert!(matches!(d.check("x", Some(2)), Err(Error::Timeout { peer: Some(2), .. })));
        assert!(!Deadline::after(Duration::from_secs(10)).expired());
    }
}
