//! Owned handles on the verbs objects this transport uses: an opened device port, a protection
//! domain and memory registrations here; completion queues, the completion channel and RC queue
//! pairs in the submodule `queue` (re-exported here).
//!
//! `ibverbs` 0.9.2 hands these out as values borrowing each other (`QueuePair<'res>` borrows its
//! `ProtectionDomain<'ctx>`, which borrows the `Context`), which a backend living for a whole
//! communicator behind an `Arc` cannot hold; and it lacks RDMA write, atomics and registration of
//! existing memory. So this module wraps the C API (`ibverbs-sys`, the same project's bindings)
//! in owned types that keep their parents alive through `Arc`s and free themselves on drop, in
//! the order verbs requires (queue pairs and registrations before the protection domain, which
//! goes before the device context).
//!
//! Every call that can fail returns an error naming the verb, the device and the errno; "no RDMA
//! here" (no device list, no device, no active port) is [`Error::Unsupported`].

use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::Arc;

use comm_core::{Error, Result};
use ibverbs_sys as ffi;

mod device_memory;
mod queue;

pub use device_memory::dmabuf_registration_available;
pub use queue::{
    CompletionChannel, CompletionQueue, MAX_CHAIN, Operation, QueuePair, QueuePairAddress, ReceiveRequest, WorkRequest,
    completion_failure, empty_completion,
};

/// The largest message a work request carries here, whatever the port allows (the port's
/// `max_msg_sz` is usually 2 GiB or more).
pub const MAX_WRITE_BYTES: usize = 1 << 30;

/// The calling thread's last OS error (verbs report failures through `errno`).
fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// The error of a verbs call on `device` that returned the errno `rc` (as the post and modify
/// calls do, instead of setting `errno`): `what` names the call and its arguments.
fn verbs_failed(what: &str, device: &str, rc: i32) -> Error {
    Error::transport(crate::NAME, format!("{what} on {device}: errno {rc} ({})", std::io::Error::from_raw_os_error(rc)))
}

/// The object a verbs call that creates one (open, allocate, create) returned, or, where it
/// returned null, the error the call left in `errno`: `what` names the call, `device` the device
/// it was made on. Called right after the call, before anything else can change `errno`.
fn created<T>(object: *mut T, what: &str, device: &str) -> Result<NonNull<T>> {
    NonNull::new(object).ok_or_else(|| Error::transport(crate::NAME, format!("{what}({device}): {}", errno())))
}

/// An opened device with the port weave uses on it.
pub struct Port {
    context: NonNull<ffi::ibv_context>,
    device: String,
    port: u8,
    lid: u16,
    /// The GID of `gid_index` (all zero where the port needs none: InfiniBand without a GRH).
    gid: [u8; 16],
    gid_index: u8,
    /// Ethernet link layer (RoCE): addresses go by GID, not LID.
    roce: bool,
    active_mtu: ffi::ibv_mtu,
    max_msg_bytes: usize,
}

// SAFETY: an `ibv_context` may be used from any thread (libibverbs serializes internally where
// it must); this type only reads its immutable attributes and hands the pointer to verbs.
unsafe impl Send for Port {}
// SAFETY: as above.
unsafe impl Sync for Port {}

comm_core::debug_fields!(Port { device, port, lid, roce, gid_index });

/// Which device and port to open: `WEAVE_IB_HCA` as `name` or `name:port`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortChoice {
    /// Device name (`mlx5_0`, `rxe0`); the first device with an active port when `None`.
    pub device: Option<String>,
    /// Port number (from 1); the first active port of the device when `None`.
    pub port: Option<u8>,
    /// GID index (RoCE); the first RoCE v2 GID of an IPv4 address, else the first non-zero GID,
    /// when `None`.
    pub gid_index: Option<u8>,
}

impl PortChoice {
    /// Parses `WEAVE_IB_HCA`'s value: `name` or `name:port`.
    pub fn parse(hca: &str) -> Result<Self> {
        let hca = hca.trim();
        let (device, port) = match hca.split_once(':') {
            Some((d, p)) => {
                let port = p.trim().parse::<u8>().ok().filter(|&p| p > 0).ok_or_else(|| {
                    Error::invalid(format!("WEAVE_IB_HCA={hca:?}: the port after ':' must be a number from 1"))
                })?;
                (d.trim(), Some(port))
            }
            None => (hca, None),
        };
        if device.is_empty() {
            return Err(Error::invalid(format!("WEAVE_IB_HCA={hca:?} names no device")));
        }
        Ok(PortChoice { device: Some(device.to_string()), port, gid_index: None })
    }
}

impl Port {
    /// Opens the device and port `choice` names, or the first active one.
    pub fn open(choice: &PortChoice) -> Result<Arc<Port>> {
        let mut count = 0;
        // SAFETY: plain FFI; `count` receives the number of entries.
        let list = unsafe { ffi::ibv_get_device_list(&mut count) };
        if list.is_null() {
            let e = errno();
            return Err(Error::Unsupported(format!("no RDMA support here (ibv_get_device_list: {e})")));
        }
        // SAFETY: `list` holds `count` device pointers (verbs contract) until it is freed below.
        let devices = unsafe { std::slice::from_raw_parts(list, usize::try_from(count).unwrap_or(0)) };
        let result = Self::open_from(devices, choice);
        // SAFETY: `list` came from ibv_get_device_list; opened contexts stay valid after it is freed.
        unsafe { ffi::ibv_free_device_list(list) };
        result
    }

    fn open_from(devices: &[*mut ffi::ibv_device], choice: &PortChoice) -> Result<Arc<Port>> {
        if devices.is_empty() {
            return Err(Error::Unsupported("no RDMA device here (the verbs device list is empty)".into()));
        }
        let mut seen = Vec::new();
        for &device in devices {
            // SAFETY: a device of the live list; the name is a C string owned by it.
            let name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(device)) }.to_string_lossy().into_owned();
            if choice.device.as_ref().is_some_and(|want| *want != name) {
                seen.push(name);
                continue;
            }
            match Self::open_device(device, &name, choice)? {
                Some(port) => return Ok(Arc::new(port)),
                None => seen.push(format!("{name} (no active port)")),
            }
        }
        Err(Error::Unsupported(match &choice.device {
            Some(want) => format!("RDMA device {want} (WEAVE_IB_HCA) has no usable port; devices: {}", seen.join(", ")),
            None => format!("no RDMA device with an active port; devices: {}", seen.join(", ")),
        }))
    }

    /// Opens `device` and picks its port; `Ok(None)` when no port is active (or the chosen one
    /// is not).
    fn open_device(device: *mut ffi::ibv_device, name: &str, choice: &PortChoice) -> Result<Option<Port>> {
        // SAFETY: `device` is an entry of the live device list.
        let context = created(unsafe { ffi::ibv_open_device(device) }, "ibv_open_device", name)?;
        let close = |e: Error| {
            // SAFETY: the context was opened above and nothing else refers to it yet.
            unsafe { ffi::ibv_close_device(context.as_ptr()) };
            e
        };
        // SAFETY: zeroed is a valid `ibv_device_attr` (plain integers and arrays).
        let mut attr: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: an open context and a writable attribute struct.
        let rc = unsafe { ffi::ibv_query_device(context.as_ptr(), &mut attr) };
        if rc != 0 {
            return Err(close(Error::transport(crate::NAME, format!("ibv_query_device({name}): errno {rc}"))));
        }
        let ports: Vec<u8> = match choice.port {
            Some(p) if p <= attr.phys_port_cnt => vec![p],
            Some(p) => {
                return Err(close(Error::invalid(format!(
                    "WEAVE_IB_HCA asks for port {p} of {name}, which has {} ports",
                    attr.phys_port_cnt
                ))));
            }
            None => (1..=attr.phys_port_cnt).collect(),
        };
        for port in ports {
            // SAFETY: zeroed is a valid `ibv_port_attr`.
            let mut pa: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
            // SAFETY: the exported `ibv_query_port` fills the whole current `ibv_port_attr`
            // through the driver (its parameter type is the old prefix of that struct).
            let rc =
                unsafe { ffi::ibv_query_port(context.as_ptr(), port, (&mut pa as *mut ffi::ibv_port_attr).cast()) };
            if rc != 0 {
                return Err(close(Error::transport(
                    crate::NAME,
                    format!("ibv_query_port({name}, {port}): errno {rc}"),
                )));
            }
            if pa.state != ffi::ibv_port_state::IBV_PORT_ACTIVE {
                continue;
            }
            let roce = u32::from(pa.link_layer) == ffi::IBV_LINK_LAYER_ETHERNET;
            let (gid_index, gid) = match Self::pick_gid(context, port, pa.gid_tbl_len, roce, choice.gid_index) {
                Ok(g) => g,
                Err(e) => return Err(close(e)),
            };
            return Ok(Some(Port {
                context,
                device: name.to_string(),
                port,
                lid: pa.lid,
                gid,
                gid_index,
                roce,
                active_mtu: pa.active_mtu,
                max_msg_bytes: (pa.max_msg_sz as usize).clamp(1, MAX_WRITE_BYTES),
            }));
        }
        // SAFETY: nothing refers to the context.
        unsafe { ffi::ibv_close_device(context.as_ptr()) };
        Ok(None)
    }

    /// The GID to address this port by: the index asked for, else (RoCE) the first RoCE v2 GID
    /// holding an IPv4 address, else the first non-zero GID; index 0 on InfiniBand.
    fn pick_gid(
        context: NonNull<ffi::ibv_context>,
        port: u8,
        table_len: i32,
        roce: bool,
        asked: Option<u8>,
    ) -> Result<(u8, [u8; 16])> {
        let query = |index: u8| -> Option<([u8; 16], u32)> {
            // SAFETY: zeroed is a valid `ibv_gid_entry`.
            let mut entry: ffi::ibv_gid_entry = unsafe { std::mem::zeroed() };
            // SAFETY: an open context and a writable entry of the size passed.
            let rc = unsafe {
                ffi::_ibv_query_gid_ex(
                    context.as_ptr(),
                    u32::from(port),
                    u32::from(index),
                    &mut entry,
                    0,
                    std::mem::size_of::<ffi::ibv_gid_entry>(),
                )
            };
            // SAFETY: every bit pattern of the union is a valid byte array.
            let gid = unsafe { entry.gid.raw };
            (rc == 0).then_some((gid, entry.gid_type))
        };
        if let Some(index) = asked {
            let (gid, _) = query(index).ok_or_else(|| {
                Error::invalid(format!("GID index {index} (WEAVE_IB_GID_INDEX) does not exist on port {port}"))
            })?;
            return Ok((index, gid));
        }
        if !roce {
            return Ok((0, query(0).map(|(g, _)| g).unwrap_or([0; 16])));
        }
        let last = u8::try_from(table_len.clamp(0, 256) - 1).unwrap_or(u8::MAX);
        let gids: Vec<(u8, [u8; 16], u32)> =
            (0..=last).filter_map(|i| query(i).map(|(g, t)| (i, g, t))).filter(|(_, g, _)| *g != [0; 16]).collect();
        let ipv4_mapped = |g: &[u8; 16]| g[..10] == [0; 10] && g[10..12] == [0xff, 0xff];
        gids.iter()
            .find(|(_, g, t)| *t == ffi::IBV_GID_TYPE_ROCE_V2 && ipv4_mapped(g))
            .or_else(|| gids.first())
            .map(|&(i, g, _)| (i, g))
            .ok_or_else(|| Error::Unsupported(format!("port {port} has no GID (RoCE needs an address on its netdev)")))
    }

    /// The device name (`mlx5_0`, `rxe0`).
    pub fn device(&self) -> &str {
        &self.device
    }

    /// This port's address for peers.
    pub fn address(&self) -> PortAddress {
        PortAddress { lid: self.lid, gid: self.gid, roce: self.roce, mtu: self.active_mtu as u8 }
    }

    /// The largest message one work request may carry.
    pub fn max_msg_bytes(&self) -> usize {
        self.max_msg_bytes
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        // SAFETY: every child object holds an `Arc<Port>`, so none is alive any more.
        unsafe { ffi::ibv_close_device(self.context.as_ptr()) };
    }
}

/// Where a port is, for a peer's queue pair: LID (InfiniBand) or GID (RoCE), and its MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortAddress {
    /// Local identifier (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Global identifier (RoCE; all zero on InfiniBand without a GRH).
    pub gid: [u8; 16],
    /// Ethernet link layer: addressed by GID.
    pub roce: bool,
    /// `ibv_mtu` code (1 = 256 B … 5 = 4096 B).
    pub mtu: u8,
}

/// A protection domain: the scope of registrations and queue pairs.
pub struct ProtectionDomain {
    port: Arc<Port>,
    pd: NonNull<ffi::ibv_pd>,
}

// SAFETY: a protection domain is a handle verbs lets any thread use.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// Allocates a protection domain on `port`'s device.
    pub fn new(port: &Arc<Port>) -> Result<Arc<Self>> {
        // SAFETY: an open context.
        let pd = created(unsafe { ffi::ibv_alloc_pd(port.context.as_ptr()) }, "ibv_alloc_pd", &port.device)?;
        Ok(Arc::new(ProtectionDomain { port: port.clone(), pd }))
    }

    /// The port this domain's device serves.
    pub fn port(&self) -> &Arc<Port> {
        &self.port
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: registrations and queue pairs hold an `Arc` of this domain: none is alive.
        unsafe { ffi::ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}

/// Memory registered for RDMA: the device may read it (local writes) and peers may write and
/// update it (remote write and atomic access).
pub struct Registration {
    /// Keeps the domain alive while the registration is.
    _pd: Arc<ProtectionDomain>,
    mr: NonNull<ffi::ibv_mr>,
}

// SAFETY: a registration is an immutable handle (keys, address) once made.
unsafe impl Send for Registration {}
// SAFETY: as above.
unsafe impl Sync for Registration {}

impl Registration {
    /// Registers `len` bytes at `addr`.
    ///
    /// # Safety
    /// `[addr, addr + len)` must stay allocated until the registration is dropped (drop it
    /// first: verbs must stop using memory before it is freed).
    pub unsafe fn new(pd: &Arc<ProtectionDomain>, addr: *mut u8, len: usize) -> Result<Self> {
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC;
        // SAFETY: the range is live memory (caller); verbs pins it for the registration's life.
        let mr = unsafe { ffi::ibv_reg_mr(pd.pd.as_ptr(), addr.cast(), len.max(1), access.0 as i32) };
        let mr = NonNull::new(mr).ok_or_else(|| {
            Error::transport(
                crate::NAME,
                format!(
                    "ibv_reg_mr of {len} bytes on {}: {} (check `ulimit -l`: registered memory is locked)",
                    pd.port.device,
                    errno()
                ),
            )
        })?;
        Ok(Registration { _pd: pd.clone(), mr })
    }

    /// The key that lets the device read this memory in local work requests.
    pub fn lkey(&self) -> u32 {
        // SAFETY: a live registration.
        unsafe { self.mr.as_ref().lkey }
    }

    /// The key that lets peers write this memory.
    pub fn rkey(&self) -> u32 {
        // SAFETY: a live registration.
        unsafe { self.mr.as_ref().rkey }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: the registration is live and dropped once; its memory is still allocated
        // (the caller's contract on `new`).
        unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hca_choices_parse_and_bad_ones_say_why() {
        assert_eq!(
            PortChoice::parse("mlx5_0:2").unwrap(),
            PortChoice { device: Some("mlx5_0".into()), port: Some(2), gid_index: None }
        );
        assert_eq!(PortChoice::parse(" rxe0 ").unwrap().device.as_deref(), Some("rxe0"));
        for bad in ["", ":1", "mlx5_0:0", "mlx5_0:x"] {
            let e = PortChoice::parse(bad).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)), "{bad:?}: {e}");
        }
    }

    #[test]
    fn a_machine_without_rdma_is_unsupported_not_a_panic() {
        match Port::open(&PortChoice::default()) {
            // A machine with a verbs device (the SoftRoCE guest) opens it.
            Ok(port) => assert!(!port.device().is_empty()),
            Err(e) => assert!(matches!(e, Error::Unsupported(_)), "{e}"),
        }
    }
}

#[cfg(test)]
mod device_tests;
