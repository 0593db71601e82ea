//! `#[repr(C)]` handles that GPU kernels receive by value, and the wire formats kernels share.
//!
//! Each host concept has a plain device handle here; its C++ mirror lives in the `kernels`
//! crate (`weave/handles.cuh`), and the NVRTC compile checks sizes and field offsets against
//! [`LAYOUTS`]. Addresses are `u64` device virtual addresses (0 = absent). comm-core knows no
//! CUDA: transports fill these in.

/// A semaphore between this GPU and one peer GPU (memory-channel semaphore).
///
/// `signal` adds 1 to `*remote_inbound` (release, system scope); `wait` bumps
/// `*expected_inbound` and spins, bounded, until `*inbound >= *expected_inbound` (acquire).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceSemaphoreHandle {
    /// Local `u64` counter the peer adds to.
    pub inbound: u64,
    /// The peer's inbound counter, mapped into this GPU's address space.
    pub remote_inbound: u64,
    /// Local `u64`: how many signals this side has waited for (persists across launches, so CUDA
    /// graph replays stay in step).
    pub expected_inbound: u64,
}

/// A memory channel between this GPU and one peer GPU: direct loads/stores into `dst` (peer
/// memory mapped here) from `src` (local), LL packets into the peer's packet buffer, and a
/// semaphore.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryChannelDeviceHandle {
    /// The channel's semaphore.
    pub semaphore: DeviceSemaphoreHandle,
    /// Peer memory this channel writes (`put`) or reads (`get`).
    pub dst: u64,
    /// Local memory.
    pub src: u64,
    /// The peer's packet buffer (where `put_packets` writes LL packets), mapped here.
    pub remote_packets: u64,
    /// This GPU's packet buffer (where the peer's packets arrive).
    pub local_packets: u64,
}

/// Where a kernel reports that it gave up, and how long it may spin.
///
/// `error` points at host-visible (pinned, device-mapped) memory: a kernel whose spin exceeds
/// `timeout_cycles` stores a non-zero [`DeviceError`] code there and returns; the host reads it
/// without synchronizing. `abort` (host-visible too) is polled by spins so the host can stop a
/// stuck kernel. `progress` (host-visible, may be 0) is where a collective kernel, once it
/// runs, stores `call` — the [ledger](crate::ledger)'s number of the collective it belongs to —
/// so the host sees how far its GPU got (a GPU kept busy by earlier work has not started the
/// latest call).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStatusHandle {
    /// `u32*` error code (0 = fine), host-visible.
    pub error: u64,
    /// `u32*` abort request (non-zero = stop), host-visible.
    pub abort: u64,
    /// Spin budget in GPU clock cycles (`clock64`), from `WEAVE_TIMEOUT`.
    pub timeout_cycles: u64,
    /// `u64*` the latest call whose kernel started, host-visible (0: kernels report nothing).
    pub progress: u64,
    /// The call this launch belongs to: the ledger's number of the latest collective begun.
    pub call: u64,
}

/// Codes a kernel stores into [`DeviceStatusHandle::error`].
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceError {
    /// A semaphore wait ran out of cycles.
    SemaphoreTimeout = 1,
    /// An LL packet wait ran out of cycles.
    PacketTimeout = 2,
    /// The host asked the kernel to stop.
    Aborted = 3,
    /// A FIFO push found no room in time.
    FifoTimeout = 4,
    /// The kernel found arguments it cannot handle.
    BadArgument = 5,
    /// A peer's message belonged to a different call (collective, count, root or order
    /// differ between the ranks).
    CallMismatch = 6,
}

impl DeviceError {
    /// Decodes a code read from the error word.
    pub fn from_code(code: u32) -> Option<DeviceError> {
        Some(match code {
            1 => DeviceError::SemaphoreTimeout,
            2 => DeviceError::PacketTimeout,
            3 => DeviceError::Aborted,
            4 => DeviceError::FifoTimeout,
            5 => DeviceError::BadArgument,
            6 => DeviceError::CallMismatch,
            _ => return None,
        })
    }

    /// What it means, for error messages.
    pub fn describe(self) -> &'static str {
        match self {
            DeviceError::SemaphoreTimeout => "a GPU semaphore wait timed out (a peer GPU stopped signalling)",
            DeviceError::PacketTimeout => "a GPU packet wait timed out (a peer GPU stopped sending)",
            DeviceError::Aborted => "the GPU kernel was aborted from the host",
            DeviceError::FifoTimeout => "a GPU push into the proxy FIFO timed out",
            DeviceError::BadArgument => "a GPU kernel was given arguments it cannot handle",
            DeviceError::CallMismatch => {
                "a peer GPU sent a message of a different call (ranks disagree on the collective, count, root or \
                 call order, or on a point-to-point group's sends and receives)"
            }
        }
    }
}

/// An 8-byte LL packet: 4 bytes of data and a 4-byte flag written together by one 8-byte store.
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ll8Packet {
    /// Payload.
    pub data: u32,
    /// Equals the launch's flag once the payload is valid.
    pub flag: u32,
}

/// A 16-byte LL packet: 8 bytes of data interleaved with two flags, written by one 16-byte store.
#[repr(C, align(16))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ll16Packet {
    /// First payload word.
    pub data1: u32,
    /// Flag for `data1`.
    pub flag1: u32,
    /// Second payload word.
    pub data2: u32,
    /// Flag for `data2`.
    pub flag2: u32,
}

/// One struct's layout as the Rust compiler sees it: its C++ name, size, alignment and the
/// offset of each field. The kernels crate turns these into `static_assert`s in every NVRTC
/// compile, so a drift between the Rust and C++ definitions fails the build.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// The C++ type name in namespace `weave`.
    pub name: &'static str,
    /// `size_of`.
    pub size: usize,
    /// `align_of`.
    pub align: usize,
    /// (field name, offset).
    pub fields: &'static [(&'static str, usize)],
}

/// The [`Layout`] of the Rust type `$t`, whose C++ mirror is `weave::$name`, listing the fields
/// `[$f, ...]` in declaration order: `device_layout!(Ll8Packet, "LL8Packet", [data, flag])`.
#[macro_export]
macro_rules! device_layout {
    ($t:ty, $name:literal, [$($f:ident),* $(,)?]) => {
        $crate::device::Layout {
            name: $name,
            size: std::mem::size_of::<$t>(),
            align: std::mem::align_of::<$t>(),
            fields: &[$((stringify!($f), std::mem::offset_of!($t, $f))),*],
        }
    };
}

/// Every device-visible layout comm-core defines.
pub const LAYOUTS: &[Layout] = &[
    device_layout!(DeviceSemaphoreHandle, "DeviceSemaphoreHandle", [inbound, remote_inbound, expected_inbound]),
    device_layout!(
        MemoryChannelDeviceHandle,
        "MemoryChannelDeviceHandle",
        [semaphore, dst, src, remote_packets, local_packets]
    ),
    device_layout!(DeviceStatusHandle, "DeviceStatusHandle", [error, abort, timeout_cycles, progress, call]),
    device_layout!(Ll8Packet, "LL8Packet", [data, flag]),
    device_layout!(Ll16Packet, "LL16Packet", [data1, flag1, data2, flag2]),
    device_layout!(crate::fifo::FifoDeviceHandle, "FifoDeviceHandle", [triggers, head, tail, capacity]),
    device_layout!(
        crate::port_channel::PortChannelDeviceHandle,
        "PortChannelDeviceHandle",
        [fifo, inbound_token, expected_inbound_token, semaphore_id, dst, src]
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_what_the_cuda_side_expects() {
        assert_eq!(std::mem::size_of::<DeviceSemaphoreHandle>(), 24);
        assert_eq!(std::mem::size_of::<MemoryChannelDeviceHandle>(), 56);
        assert_eq!(std::mem::size_of::<Ll8Packet>(), 8);
        assert_eq!(std::mem::size_of::<Ll16Packet>(), 16);
        for l in LAYOUTS {
            assert!(l.fields.windows(2).all(|w| w[0].1 < w[1].1), "{} fields out of order", l.name);
            assert!(l.fields.iter().all(|f| f.1 < l.size), "{} field past its end", l.name);
        }
        for code in 1..=5 {
            assert_eq!(DeviceError::from_code(code).map(|e| e as u32), Some(code));
        }
        assert_eq!(DeviceError::from_code(0), None);
    }
}
