//! The compile target of a device.

use std::sync::Arc;

use comm_core::{Error, Result};
use cudarc::driver::CudaContext;

/// The NVRTC architecture of the context's device, from its compute capability: `sm_90` on
/// H100 and H200.
pub fn device_arch(ctx: &Arc<CudaContext>) -> Result<String> {
    let (major, minor) = ctx.compute_capability().map_err(|e| Error::Cuda {
        operation: format!("cuDeviceGetAttribute(compute capability) of device {}", ctx.ordinal()),
        message: e.to_string(),
    })?;
    arch_name(major, minor)
}

/// `sm_<major><minor>` for a compute capability.
pub fn arch_name(major: i32, minor: i32) -> Result<String> {
    if !(1..=99).contains(&major) || !(0..=9).contains(&minor) {
        return Err(Error::Cuda {
            operation: "compute capability".into(),
            message: format!("the driver reported an implausible compute capability {major}.{minor}"),
        });
    }
    Ok(format!("sm_{major}{minor}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_compute_capability() {
        assert_eq!(arch_name(9, 0).unwrap(), "sm_90");
        assert_eq!(arch_name(10, 0).unwrap(), "sm_100");
        assert_eq!(arch_name(8, 6).unwrap(), "sm_86");
        assert!(arch_name(0, 0).is_err() && arch_name(9, 10).is_err() && arch_name(-1, 0).is_err());
    }
}
