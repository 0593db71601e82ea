//! Configuration of the GPU path: its tuning knobs, read from `WEAVE_GPU_*` variables here and
//! nowhere else, and overridable through the API
//! ([`Builder::with_gpu_config`](crate::Builder::with_gpu_config); [`GpuConfig`] fields are
//! public). Every rank should pass the same values: where one differs, the ranks agree on the
//! smallest (blocks, packets, tile, steps) when the communicator is built.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `WEAVE_GPU` | `on`/`off`: `off` leaves the GPU alone (no GPU engine, no CUDA context of its own; device calls are refused), for host-only jobs on GPU machines; with `WEAVE_TRANSPORTS` leaving `cudaipc` out no rank opens a CUDA context at all | `on` |
//! | `WEAVE_GPU_BLOCKS` | most thread blocks of a block-pipelined GPU kernel (1–128; a tuning knob) | 128 |
//! | `WEAVE_GPU_PACKETS` | LL packets (8 bytes of payload each) per peer and parity (4K–1M; a tuning knob) | 64K |
//! | `WEAVE_GPU_TILE` | bytes one pipelined block moves per peer and step (4K–4M, multiple of 256; a tuning knob) | 128K |
//! | `WEAVE_GPU_STEPS` | least tiles per block a block-pipelined GPU kernel aims for (1–16; a tuning knob) | 1 |
//! | `WEAVE_GPU_SCHEDULE` | `lockstep` or `overlapped`: how the block-pipelined all-reduce, all-gather, reduce-scatter and all-to-all order their tiles (a tuning knob; the mix of ranks may differ) | per world size and message size |
//! | `WEAVE_GPU_OVERLAP` | `1`/`0`: launch each GPU collective while the kernel before it on the stream still runs (programmatic dependent launch, sm_90+), hiding the launch latency | `1` |

use comm_core::config::{parse_bytes, var};
use comm_core::{Error, Result};

/// The GPU path's tuning knobs; `None` means the built-in default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuConfig {
    /// Most thread blocks of a block-pipelined GPU kernel (`WEAVE_GPU_BLOCKS`, 1..=128).
    pub pipeline_blocks: Option<u32>,
    /// LL packets per peer and parity in the GPU workspace (`WEAVE_GPU_PACKETS`).
    pub packets: Option<usize>,
    /// Bytes one pipelined block moves per peer and step (`WEAVE_GPU_TILE`).
    pub pipeline_tile: Option<usize>,
    /// Least tiles per block of a block-pipelined GPU kernel (`WEAVE_GPU_STEPS`, 1..=16).
    pub pipeline_steps: Option<u32>,
    /// How the block-pipelined GPU kernels order their tiles (`WEAVE_GPU_SCHEDULE`): `Some(true)`
    /// overlapped (push a tile, then finish earlier ones), `Some(false)` lockstep (consume each
    /// tile right after it arrived), `None` as the table decides.
    pub overlapped_schedule: Option<bool>,
    /// Whether GPU collectives launch as programmatic dependents of the kernel before them on
    /// the stream, where the GPU supports it (`WEAVE_GPU_OVERLAP`, default on).
    pub overlap_launches: bool,
    /// The GPU (ordinal, as this process numbers its visible devices) that device calls run on
    /// where no transport serves one (a communicator without CUDA IPC); `None`: device
    /// `rank % count`. A transport's device (`CudaIpcTransport::on_device`) takes precedence.
    pub device: Option<u32>,
    /// Whether the communicator builds its GPU engine where every rank has a GPU (`WEAVE_GPU`,
    /// default on). Off on any rank: off on every rank, and device calls are refused.
    pub enabled: bool,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            pipeline_blocks: None,
            packets: None,
            pipeline_tile: None,
            pipeline_steps: None,
            overlapped_schedule: None,
            overlap_launches: true,
            device: None,
            enabled: true,
        }
    }
}

impl GpuConfig {
    /// Reads the `WEAVE_GPU_*` variables; unset variables keep their defaults, malformed ones
    /// are an [`Error::InvalidArgument`] naming the variable.
    pub fn from_env() -> Result<Self> {
        let mut c = GpuConfig::default();
        if let Some(v) = var("WEAVE_GPU") {
            c.enabled = parse_switch(&v).map_err(|e| Error::invalid(format!("WEAVE_GPU: {e}")))?;
        }
        if let Some(v) = var("WEAVE_GPU_BLOCKS") {
            c.pipeline_blocks = Some(parse_gpu_blocks(&v)?);
        }
        if let Some(v) = var("WEAVE_GPU_PACKETS") {
            c.packets = Some(parse_gpu_packets(&v)?);
        }
        if let Some(v) = var("WEAVE_GPU_TILE") {
            c.pipeline_tile = Some(parse_gpu_tile(&v)?);
        }
        if let Some(v) = var("WEAVE_GPU_STEPS") {
            c.pipeline_steps = Some(match v.trim().parse::<u32>() {
                Ok(n) if STEPS.contains(&n) => n,
                _ => return Err(Error::invalid(format!("WEAVE_GPU_STEPS={v:?}: expected a step count from 1 to 16"))),
            });
        }
        if let Some(v) = var("WEAVE_GPU_SCHEDULE") {
            c.overlapped_schedule = Some(parse_gpu_schedule(&v)?);
        }
        if let Some(v) = var("WEAVE_GPU_OVERLAP") {
            c.overlap_launches = parse_switch(&v).map_err(|e| Error::invalid(format!("WEAVE_GPU_OVERLAP: {e}")))?;
        }
        Ok(c)
    }

    /// `self`, once every knob set through the API is checked against the range of its
    /// variable: [`Error::InvalidArgument`] naming the field otherwise.
    pub fn checked(self) -> Result<Self> {
        let out_of = |field: &str, value: String, range: &str| {
            Err(Error::invalid(format!("GpuConfig::{field} is {value}: expected {range}")))
        };
        if let Some(b) = self.pipeline_blocks.filter(|b| !BLOCKS.contains(b)) {
            return out_of("pipeline_blocks", b.to_string(), "a block count from 1 to 128");
        }
        if let Some(p) = self.packets.filter(|p| !PACKETS.contains(p)) {
            return out_of("packets", p.to_string(), "4K to 1M packets");
        }
        if let Some(t) = self.pipeline_tile.filter(|&t| !tile_fits(t)) {
            return out_of("pipeline_tile", t.to_string(), "4K to 4M bytes in a multiple of 256");
        }
        if let Some(s) = self.pipeline_steps.filter(|s| !STEPS.contains(s)) {
            return out_of("pipeline_steps", s.to_string(), "a step count from 1 to 16");
        }
        Ok(self)
    }
}

/// The knobs' ranges, for their variables and the API alike.
const BLOCKS: std::ops::RangeInclusive<u32> = 1..=128;
const PACKETS: std::ops::RangeInclusive<usize> = 4 << 10..=1 << 20;
const STEPS: std::ops::RangeInclusive<u32> = 1..=16;

/// Whether a tile of `bytes` is one the pipelined kernels take (4K to 4M, a multiple of 256).
fn tile_fits(bytes: usize) -> bool {
    (4 << 10..=4 << 20).contains(&bytes) && bytes.is_multiple_of(256)
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

fn parse_gpu_blocks(v: &str) -> Result<u32> {
    match v.trim().parse::<u32>() {
        Ok(b) if BLOCKS.contains(&b) => Ok(b),
        _ => Err(Error::invalid(format!("WEAVE_GPU_BLOCKS={v:?}: expected a block count from 1 to 128"))),
    }
}

fn parse_gpu_packets(v: &str) -> Result<usize> {
    let n = parse_bytes(v).map_err(|e| Error::invalid(format!("WEAVE_GPU_PACKETS: {e}")))?;
    if !PACKETS.contains(&n) {
        return Err(Error::invalid(format!("WEAVE_GPU_PACKETS={v:?}: expected 4K to 1M packets")));
    }
    Ok(n)
}

fn parse_gpu_tile(v: &str) -> Result<usize> {
    let bytes = parse_bytes(v).map_err(|e| Error::invalid(format!("WEAVE_GPU_TILE: {e}")))?;
    if !tile_fits(bytes) {
        return Err(Error::invalid(format!("WEAVE_GPU_TILE={v:?}: expected 4K to 4M bytes in a multiple of 256")));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_gpu_knobs_and_switches() {
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
    fn knobs_set_through_the_api_keep_the_variables_ranges() {
        let ok = GpuConfig { pipeline_blocks: Some(128), packets: Some(1 << 20), ..GpuConfig::default() };
        assert_eq!(ok.clone().checked().unwrap(), ok);
        for (bad, field) in [
            (GpuConfig { pipeline_blocks: Some(0), ..GpuConfig::default() }, "pipeline_blocks"),
            (GpuConfig { packets: Some(1 << 32), ..GpuConfig::default() }, "packets"),
            (GpuConfig { pipeline_tile: Some(5000), ..GpuConfig::default() }, "pipeline_tile"),
            (GpuConfig { pipeline_steps: Some(17), ..GpuConfig::default() }, "pipeline_steps"),
        ] {
            let e = bad.checked().unwrap_err().to_string();
            assert!(e.contains(&format!("GpuConfig::{field}")), "{e}");
        }
    }

    #[test]
    fn gpu_schedules_parse_and_anything_else_is_refused() {
        assert!(parse_gpu_schedule(" Overlapped ").unwrap());
        assert!(!parse_gpu_schedule("lockstep").unwrap());
        let e = parse_gpu_schedule("fast").unwrap_err().to_string();
        assert!(e.contains("WEAVE_GPU_SCHEDULE") && e.contains("lockstep or overlapped"), "{e}");
    }

    #[test]
    fn defaults_leave_every_knob_to_the_tables_and_overlap_on() {
        let c = GpuConfig::default();
        assert_eq!((c.pipeline_blocks, c.packets, c.pipeline_tile, c.pipeline_steps), (None, None, None, None));
        assert_eq!(c.overlapped_schedule, None);
        assert!(c.overlap_launches);
        assert!(c.enabled, "the GPU engine is on unless WEAVE_GPU=off");
    }
}
