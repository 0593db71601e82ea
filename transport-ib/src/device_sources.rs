//! Device memory a connection sends from: registered with the NIC once per region, through the
//! first way that works here ([`crate::gpu_direct`]), or staged through pinned host memory
//! ([`crate::staging`]). What CUDA must provide is [`CudaAccess`]; the backend has it under the
//! feature `cuda` (module `cuda`), and without it device memory is [`Error::Unsupported`].
//!
//! Not verified on real hardware: no machine here has both a GPU and an HCA.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};

use comm_core::memory::{MemoryKind, MemoryRegion};
use comm_core::{Error, Result};

use crate::gpu_direct::{DevicePath, GpuDirectSupport, PathRequest, candidates, peermem_loaded};
use crate::staging::CopyEngine;
use crate::verbs::{ProtectionDomain, Registration, dmabuf_registration_available};

/// What the IB transport needs from CUDA for device memory.
pub(crate) trait CudaAccess: Send + Sync {
    /// What device `ordinal` supports (its dmabuf export, and whether a copy engine is there);
    /// the verbs and kernel-module sides are filled in by the caller.
    fn support(&self, ordinal: u32) -> GpuDirectSupport;

    /// A dmabuf descriptor covering `[ptr, ptr + len)` of device `ordinal`, and the offset of
    /// `ptr` in it. `Err(Unsupported)` where the range cannot be exported (alignment, say).
    fn dmabuf(&self, ordinal: u32, ptr: u64, len: usize) -> Result<(OwnedFd, u64)>;

    /// The engine that copies device `ordinal`'s memory to host memory.
    fn copy_engine(&self, ordinal: u32) -> Result<Arc<dyn CopyEngine>>;

    /// `len` bytes of pinned host memory for staging device `ordinal`'s memory.
    fn pinned(&self, ordinal: u32, len: usize) -> Result<Box<dyn PinnedBuffer>>;
}

/// Pinned host memory a staging ring lives in; freed on drop.
pub(crate) trait PinnedBuffer: Send + Sync {
    /// The first byte (valid for [`len`](Self::len) bytes while the buffer lives).
    fn as_ptr(&self) -> *mut u8;
    /// Its length in bytes.
    fn len(&self) -> usize;
}

/// How a connection sends from one device region.
#[derive(Clone)]
pub(crate) enum DeviceSource {
    /// The NIC reads the region under this key.
    Registered(u32),
    /// Copied through pinned host memory by this engine first; the device's ordinal.
    Staged(Arc<dyn CopyEngine>, u32),
}

/// One device region's way, kept while the backend lives.
struct Entry {
    /// Declared first: deregistered before the region may be freed.
    _registration: Option<Registration>,
    source: DeviceSource,
    _region: Arc<dyn MemoryRegion>,
}

/// The device regions connections of one backend sent from, by region.
pub(crate) struct DeviceSources {
    cuda: Option<Arc<dyn CudaAccess>>,
    request: PathRequest,
    by_region: Mutex<HashMap<usize, Entry>>,
}

impl DeviceSources {
    /// Device sources through `cuda` (none: this build has no CUDA), as `request` allows.
    pub(crate) fn new(cuda: Option<Arc<dyn CudaAccess>>, request: PathRequest) -> Self {
        DeviceSources { cuda, request, by_region: Mutex::default() }
    }

    /// How to send from `region` (device memory of `ordinal`), found the first time.
    pub(crate) fn source(
        &self,
        pd: &Arc<ProtectionDomain>,
        region: &Arc<dyn MemoryRegion>,
        ordinal: u32,
    ) -> Result<DeviceSource> {
        let key = Arc::as_ptr(region).cast::<u8>() as usize;
        let mut map = self.by_region.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = map.get(&key) {
            return Ok(entry.source.clone());
        }
        let cuda = self.cuda.as_ref().ok_or_else(|| {
            Error::Unsupported(
                "ib: cannot send from device memory: transport-ib was built without its feature `cuda`".into(),
            )
        })?;
        let support = GpuDirectSupport {
            verbs_dmabuf: dmabuf_registration_available(),
            peermem: peermem_loaded(Path::new("/sys/module")),
            ..cuda.support(ordinal)
        };
        let paths = candidates(&support, self.request)?;
        let (ptr, len) = (region.as_ptr() as u64, region.len());
        let (registration, source) = first_that_works(&paths, |path| match path {
            DevicePath::DmaBuf => {
                let (fd, offset) = cuda.dmabuf(ordinal, ptr, len)?;
                // SAFETY: the entry keeps the region (and so its memory) past the registration.
                // The descriptor may close once registered: the registration holds the dmabuf.
                let r = unsafe { Registration::dmabuf(pd, fd.as_fd(), offset, len, ptr)? };
                let lkey = r.lkey();
                Ok((Some(r), DeviceSource::Registered(lkey)))
            }
            DevicePath::PeerMem => {
                // SAFETY: as above.
                let r = unsafe { Registration::device_pointer(pd, ptr, len)? };
                let lkey = r.lkey();
                Ok((Some(r), DeviceSource::Registered(lkey)))
            }
            DevicePath::Staging => Ok((None, DeviceSource::Staged(cuda.copy_engine(ordinal)?, ordinal))),
        })?;
        map.insert(key, Entry { _registration: registration, source: source.clone(), _region: region.clone() });
        Ok(source)
    }

    /// `len` bytes of pinned host memory for staging device `ordinal`'s memory.
    pub(crate) fn pinned(&self, ordinal: u32, len: usize) -> Result<Box<dyn PinnedBuffer>> {
        match &self.cuda {
            Some(cuda) => cuda.pinned(ordinal, len),
            None => Err(Error::Unsupported("ib: staging needs transport-ib's feature `cuda`".into())),
        }
    }
}

/// The device ordinal of `region`, when it is device memory.
pub(crate) fn device_ordinal(region: &dyn MemoryRegion) -> Option<u32> {
    match region.kind() {
        MemoryKind::Device(d) => Some(d),
        MemoryKind::Host => None,
    }
}

/// The result of the first of `paths` that `attempt` does not refuse as unsupported; a failure
/// of another kind stops there. When all refuse, `Unsupported` with each one's reason.
fn first_that_works<T>(paths: &[DevicePath], mut attempt: impl FnMut(DevicePath) -> Result<T>) -> Result<T> {
    let mut refused = Vec::new();
    for &path in paths {
        match attempt(path) {
            Ok(t) => return Ok(t),
            Err(Error::Unsupported(why)) => refused.push(format!("{path}: {why}")),
            Err(e) => return Err(e),
        }
    }
    Err(Error::Unsupported(format!("ib: no way to send from device memory worked here ({})", refused.join("; "))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use DevicePath::*;

    #[test]
    fn an_unsupported_way_falls_to_the_next_and_the_first_that_works_is_kept() {
        let mut tried = Vec::new();
        let got = first_that_works(&[DmaBuf, PeerMem, Staging], |p| {
            tried.push(p);
            match p {
                DmaBuf => Err(Error::Unsupported("provider refuses dmabufs".into())),
                other => Ok(other),
            }
        });
        assert_eq!(got.unwrap(), PeerMem);
        assert_eq!(tried, [DmaBuf, PeerMem], "staging is not tried once peermem worked");
    }

    #[test]
    fn another_failure_stops_and_all_refusals_are_listed() {
        let e = first_that_works(&[DmaBuf, PeerMem], |p| -> Result<()> {
            match p {
                DmaBuf => Err(Error::transport("ib", "ibv_reg_dmabuf_mr: ENOMEM")),
                _ => unreachable!("a real failure must not fall through"),
            }
        })
        .unwrap_err();
        assert!(e.to_string().contains("ENOMEM"), "{e}");
        let e = first_that_works(&[DmaBuf, Staging], |p| -> Result<()> { Err(Error::Unsupported(format!("no {p}"))) })
            .unwrap_err();
        assert!(
            matches!(&e, Error::Unsupported(m) if m.contains("dmabuf: no dmabuf") && m.contains("staging: no staging"))
        );
    }
}
