//! Registrations of device (GPU) memory: a dmabuf of it (`ibv_reg_dmabuf_mr`, found at run
//! time, since a `libibverbs` older than rdma-core 34 lacks it and the binary must still load
//! there), or the device pointer itself (`ibv_reg_mr`, which only `nvidia_peermem` lets the
//! kernel resolve). A device or host that cannot is [`Error::Unsupported`], so the caller moves
//! on to the next way ([`crate::gpu_direct`]).

use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::OnceLock;

use super::*;

/// `ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access)`.
type RegDmabufMr = unsafe extern "C" fn(*mut ffi::ibv_pd, u64, usize, u64, i32, i32) -> *mut ffi::ibv_mr;

/// `ibv_reg_dmabuf_mr` of the loaded `libibverbs`, if it has one.
fn reg_dmabuf_mr() -> Option<RegDmabufMr> {
    static FOUND: OnceLock<Option<RegDmabufMr>> = OnceLock::new();
    *FOUND.get_or_init(|| {
        // SAFETY: a NUL-terminated name looked up among the loaded objects.
        let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"ibv_reg_dmabuf_mr".as_ptr()) };
        // SAFETY: the symbol, where present, is the function of this signature (verbs.h).
        (!symbol.is_null()).then(|| unsafe { std::mem::transmute::<*mut libc::c_void, RegDmabufMr>(symbol) })
    })
}

/// Whether the loaded `libibverbs` can register dmabufs (the provider may still refuse).
pub fn dmabuf_registration_available() -> bool {
    reg_dmabuf_mr().is_some()
}

/// What a device registration may do: the NIC reads it for sends and peers write it.
fn device_access() -> i32 {
    (ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
        | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
        | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ)
        .0 as i32
}

/// Whether `e` (an errno of a registration) says the device or kernel cannot do it at all.
fn not_supported(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EPROTONOSUPPORT))
}

impl Registration {
    /// Registers `len` bytes of the dmabuf `fd`, from `offset` in it, which the NIC will be
    /// handed at address `iova` (the device address, so work requests name it as usual).
    ///
    /// # Safety
    /// The memory behind the dmabuf stays allocated until the registration is dropped.
    pub unsafe fn dmabuf(
        pd: &Arc<ProtectionDomain>,
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        iova: u64,
    ) -> Result<Self> {
        let Some(register) = reg_dmabuf_mr() else {
            return Err(Error::Unsupported(
                "ib: this libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or later has)".into(),
            ));
        };
        // SAFETY: a live domain and an open descriptor; the memory stays (caller).
        let mr = unsafe { register(pd.pd.as_ptr(), offset, len.max(1), iova, fd.as_raw_fd(), device_access()) };
        match NonNull::new(mr) {
            Some(mr) => Ok(Registration { _pd: pd.clone(), mr }),
            None => {
                let e = errno();
                let what = format!("ibv_reg_dmabuf_mr of {len} bytes at {iova:#x} on {}: {e}", pd.port.device);
                if not_supported(&e) {
                    Err(Error::Unsupported(format!("{what} (the device does not register dmabufs)")))
                } else {
                    Err(Error::transport(crate::NAME, what))
                }
            }
        }
    }

    /// Registers `len` bytes of device memory at device address `ptr` with `ibv_reg_mr`, which
    /// works only where the `nvidia_peermem` module lets the kernel pin GPU pages.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` stays allocated device memory until the registration is dropped.
    pub unsafe fn device_pointer(pd: &Arc<ProtectionDomain>, ptr: u64, len: usize) -> Result<Self> {
        // SAFETY: verbs only resolves the range (through the peer-memory client); the range
        // stays allocated (caller).
        let mr = unsafe { ffi::ibv_reg_mr(pd.pd.as_ptr(), ptr as *mut libc::c_void, len.max(1), device_access()) };
        match NonNull::new(mr) {
            Some(mr) => Ok(Registration { _pd: pd.clone(), mr }),
            None => {
                let e = errno();
                let what = format!("ibv_reg_mr of {len} bytes of device memory at {ptr:#x} on {}: {e}", pd.port.device);
                // Without a peer-memory client the kernel finds no user pages there: EFAULT.
                if not_supported(&e) || e.raw_os_error() == Some(libc::EFAULT) {
                    Err(Error::Unsupported(format!("{what} (it needs the nvidia_peermem module)")))
                } else {
                    Err(Error::transport(crate::NAME, what))
                }
            }
        }
    }
}
