//! How device (GPU) memory reaches the NIC: the choice between the three ways, made from what
//! this host supports and what `WEAVE_IB_GPU_DIRECT` asks for.
//!
//! - **dmabuf**: the CUDA driver exports the device range as a dmabuf file descriptor
//!   (`cuMemGetHandleForAddressRange`) and verbs registers that (`ibv_reg_dmabuf_mr`). Needs a
//!   GPU that says so (`CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`), an `libibverbs` that has the
//!   call (rdma-core 34 or later) and a provider that implements it (mlx5 does; rxe does not).
//! - **peermem**: `ibv_reg_mr` on the device pointer itself, which the kernel resolves through
//!   the `nvidia_peermem` module; without that module the registration fails.
//! - **staging**: the NIC never touches device memory. A device source is copied in chunks into
//!   pinned host memory registered with the NIC and written from there ([`crate::staging`]).
//!
//! Where a way is tried and the device refuses it as unsupported, the next one is tried. This
//! module is plain logic (no CUDA, no verbs calls), so the choice is tested everywhere; the
//! registrations themselves have not run on real hardware (no machine here has both a GPU and
//! an HCA).

use std::fmt;
use std::path::Path;

use comm_core::{Error, Result};

/// One way for the NIC to read device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DevicePath {
    /// A dmabuf of the range, registered with `ibv_reg_dmabuf_mr`.
    DmaBuf,
    /// `ibv_reg_mr` on the device pointer, through `nvidia_peermem`.
    PeerMem,
    /// Copies into registered pinned host memory, written from there.
    Staging,
}

impl fmt::Display for DevicePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DevicePath::DmaBuf => "dmabuf",
            DevicePath::PeerMem => "peermem",
            DevicePath::Staging => "staging",
        })
    }
}

/// What this host offers for device memory over verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct GpuDirectSupport {
    /// The GPU exports dmabufs of its memory (`CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`).
    pub(crate) gpu_dmabuf: bool,
    /// The loaded `libibverbs` has `ibv_reg_dmabuf_mr`.
    pub(crate) verbs_dmabuf: bool,
    /// The `nvidia_peermem` kernel module is loaded.
    pub(crate) peermem: bool,
    /// A CUDA copy engine can stage through pinned host memory (the driver is there).
    pub(crate) staging: bool,
}

/// What `WEAVE_IB_GPU_DIRECT` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum PathRequest {
    /// The best way this host supports (`auto`, or the variable unset).
    #[default]
    Auto,
    /// This way only (`dmabuf`, `peermem`, `staging`).
    Only(DevicePath),
    /// Device memory is not carried over verbs (`off`).
    Off,
}

impl PathRequest {
    /// Parses a value of `WEAVE_IB_GPU_DIRECT`.
    pub(crate) fn parse(value: &str) -> Result<Self> {
        match value.trim() {
            "" | "auto" => Ok(PathRequest::Auto),
            "dmabuf" => Ok(PathRequest::Only(DevicePath::DmaBuf)),
            "peermem" => Ok(PathRequest::Only(DevicePath::PeerMem)),
            "staging" => Ok(PathRequest::Only(DevicePath::Staging)),
            "off" => Ok(PathRequest::Off),
            other => {
                Err(Error::invalid(format!("WEAVE_IB_GPU_DIRECT={other:?}: use auto, dmabuf, peermem, staging or off")))
            }
        }
    }

    /// The request in `WEAVE_IB_GPU_DIRECT` (`Auto` when unset).
    pub(crate) fn from_env() -> Result<Self> {
        match std::env::var("WEAVE_IB_GPU_DIRECT") {
            Ok(v) => PathRequest::parse(&v),
            Err(_) => Ok(PathRequest::Auto),
        }
    }
}

/// The ways to try for device memory, best first: dmabuf, then peermem, then staging, each
/// where `support` has it and `request` allows it. `Err(Unsupported)` saying what is missing
/// when none is left.
pub(crate) fn candidates(support: &GpuDirectSupport, request: PathRequest) -> Result<Vec<DevicePath>> {
    let available = |path: DevicePath| match path {
        DevicePath::DmaBuf => support.gpu_dmabuf && support.verbs_dmabuf,
        DevicePath::PeerMem => support.peermem,
        DevicePath::Staging => support.staging,
    };
    let wanted: &[DevicePath] = match request {
        PathRequest::Off => {
            return Err(Error::Unsupported("ib: device memory is not carried (WEAVE_IB_GPU_DIRECT=off)".into()));
        }
        PathRequest::Auto => &[DevicePath::DmaBuf, DevicePath::PeerMem, DevicePath::Staging],
        PathRequest::Only(DevicePath::DmaBuf) => &[DevicePath::DmaBuf],
        PathRequest::Only(DevicePath::PeerMem) => &[DevicePath::PeerMem],
        PathRequest::Only(DevicePath::Staging) => &[DevicePath::Staging],
    };
    let paths: Vec<DevicePath> = wanted.iter().copied().filter(|&p| available(p)).collect();
    if paths.is_empty() {
        return Err(Error::Unsupported(format!(
            "ib: no way to carry device memory ({}): {}",
            match request {
                PathRequest::Only(p) => format!("WEAVE_IB_GPU_DIRECT={p}"),
                _ => "WEAVE_IB_GPU_DIRECT=auto".into(),
            },
            missing(support, wanted)
        )));
    }
    Ok(paths)
}

/// What each of `wanted` lacks here, for the error that none is possible.
fn missing(support: &GpuDirectSupport, wanted: &[DevicePath]) -> String {
    let why: Vec<&str> = wanted
        .iter()
        .map(|p| match p {
            DevicePath::DmaBuf if !support.gpu_dmabuf => "dmabuf: the GPU does not export dmabufs",
            DevicePath::DmaBuf => "dmabuf: this libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or later has)",
            DevicePath::PeerMem => "peermem: the nvidia_peermem module is not loaded (`modprobe nvidia_peermem`)",
            DevicePath::Staging => {
                "staging: no CUDA driver to copy with (or transport-ib built without its feature `cuda`)"
            }
        })
        .collect();
    why.join("; ")
}

/// Whether the `nvidia_peermem` module is loaded (it shows under `sys_module`, normally
/// `/sys/module`).
pub(crate) fn peermem_loaded(sys_module: &Path) -> bool {
    sys_module.join("nvidia_peermem").is_dir()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: GpuDirectSupport =
        GpuDirectSupport { gpu_dmabuf: true, verbs_dmabuf: true, peermem: true, staging: true };

    #[test]
    fn auto_prefers_dmabuf_then_peermem_then_staging() {
        use DevicePath::*;
        assert_eq!(candidates(&ALL, PathRequest::Auto).unwrap(), [DmaBuf, PeerMem, Staging]);
        let no_gpu_dmabuf = GpuDirectSupport { gpu_dmabuf: false, ..ALL };
        assert_eq!(candidates(&no_gpu_dmabuf, PathRequest::Auto).unwrap(), [PeerMem, Staging]);
        let old_verbs = GpuDirectSupport { verbs_dmabuf: false, peermem: false, ..ALL };
        assert_eq!(candidates(&old_verbs, PathRequest::Auto).unwrap(), [Staging]);
    }

    #[test]
    fn a_request_for_one_way_gets_that_way_or_says_what_is_missing() {
        let only = |p| PathRequest::Only(p);
        assert_eq!(candidates(&ALL, only(DevicePath::PeerMem)).unwrap(), [DevicePath::PeerMem]);
        let no_peermem = GpuDirectSupport { peermem: false, ..ALL };
        let e = candidates(&no_peermem, only(DevicePath::PeerMem)).unwrap_err();
        assert!(matches!(&e, Error::Unsupported(m) if m.contains("nvidia_peermem") && m.contains("=peermem")), "{e}");
        let no_dmabuf = GpuDirectSupport { gpu_dmabuf: false, ..ALL };
        let e = candidates(&no_dmabuf, only(DevicePath::DmaBuf)).unwrap_err();
        assert!(matches!(&e, Error::Unsupported(m) if m.contains("does not export dmabufs")), "{e}");
    }

    #[test]
    fn nothing_supported_or_off_is_unsupported() {
        let e = candidates(&GpuDirectSupport::default(), PathRequest::Auto).unwrap_err();
        match &e {
            Error::Unsupported(m) => {
                for what in ["dmabuf", "nvidia_peermem", "staging"] {
                    assert!(m.contains(what), "{m} does not mention {what}");
                }
            }
            other => panic!("expected Unsupported, got {other}"),
        }
        assert!(matches!(candidates(&ALL, PathRequest::Off), Err(Error::Unsupported(m)) if m.contains("off")));
    }

    #[test]
    fn the_variable_parses_and_bad_values_are_refused() {
        assert_eq!(PathRequest::parse("").unwrap(), PathRequest::Auto);
        assert_eq!(PathRequest::parse(" staging ").unwrap(), PathRequest::Only(DevicePath::Staging));
        assert_eq!(PathRequest::parse("off").unwrap(), PathRequest::Off);
        assert!(matches!(PathRequest::parse("gdr"), Err(Error::InvalidArgument(m)) if m.contains("gdr")));
    }

    #[test]
    fn peermem_is_seen_where_its_module_directory_is() {
        let dir = std::env::temp_dir().join(format!("weave-ib-sysmodule-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(!peermem_loaded(&dir));
        std::fs::create_dir_all(dir.join("nvidia_peermem")).unwrap();
        assert!(peermem_loaded(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
