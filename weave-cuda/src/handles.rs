//! Builders of the `#[repr(C)]` handles kernels receive ([`DeviceSemaphoreHandle`],
//! [`MemoryChannelDeviceHandle`]) from registered device memory: every address is checked to
//! lie in a [`DeviceRegion`] of the right rank, mapped for one device, and aligned.

use comm_core::device::{DeviceSemaphoreHandle, MemoryChannelDeviceHandle};
use comm_core::error::{Error, Result};
use comm_core::memory::RegisteredMemory;

use crate::region::DeviceRegion;

/// Which rank a memory must belong to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Local,
    Remote,
}

struct Checked {
    addr: u64,
    device: u32,
    owner: usize,
}

/// The device address of `m + offset`, after checking that `m` is device memory mapped by
/// a GPU transport, owned by the right side, with `need` bytes at `offset` and the address a
/// multiple of `align`.
fn check(m: &RegisteredMemory, offset: usize, need: usize, align: u64, side: Side, what: &str) -> Result<Checked> {
    m.check_range(offset, need).map_err(|e| Error::invalid(format!("{what}: {e}")))?;
    let Some(region) = DeviceRegion::of(m) else {
        return Err(Error::invalid(format!(
            "{what}: {:?} (rank {}, {:?}) is not device memory mapped by a GPU transport",
            m.label(),
            m.owner(),
            m.kind()
        )));
    };
    match (side, m.is_local()) {
        (Side::Local, false) => {
            return Err(Error::invalid(format!(
                "{what} must be this rank's own memory; {:?} belongs to rank {}",
                m.label(),
                m.owner()
            )));
        }
        (Side::Remote, true) => {
            return Err(Error::invalid(format!(
                "{what} must be the peer's memory imported here; {:?} is this rank's own",
                m.label()
            )));
        }
        _ => {}
    }
    // offset + need <= len (checked above) and regions are at most 2^48 bytes: no overflow.
    let addr = region.device_ptr() + offset as u64;
    if !addr.is_multiple_of(align) {
        return Err(Error::invalid(format!(
            "{what}: offset {offset} in {:?} gives address {addr:#x}, not {align}-byte aligned",
            m.label()
        )));
    }
    Ok(Checked { addr, device: region.mapped_device(), owner: m.owner() })
}

fn same_device(parts: &[(&Checked, &str)]) -> Result<()> {
    if let Some(((first, first_what), rest)) = parts.split_first() {
        for (c, what) in rest {
            if c.device != first.device {
                return Err(Error::invalid(format!(
                    "{what} is mapped for device {}, {first_what} for device {}: one handle serves one GPU",
                    c.device, first.device
                )));
            }
        }
    }
    Ok(())
}

/// Builds the device semaphore between this GPU and one peer GPU from registered device memory
/// (each part a memory and a byte offset):
/// - `inbound`: this rank's `u64` counter that the peer adds to;
/// - `remote_inbound`: the peer's inbound counter, imported here;
/// - `expected`: this rank's `u64` count of signals waited for.
///
/// Every word must be 8 bytes inside its registration, 8-byte aligned, device memory mapped by
/// a GPU transport for one and the same device, and owned by the side named above; anything
/// else is [`Error::InvalidArgument`].
pub fn device_semaphore(
    inbound: (&RegisteredMemory, usize),
    remote_inbound: (&RegisteredMemory, usize),
    expected: (&RegisteredMemory, usize),
) -> Result<DeviceSemaphoreHandle> {
    let i = check(inbound.0, inbound.1, 8, 8, Side::Local, "semaphore inbound counter")?;
    let r = check(remote_inbound.0, remote_inbound.1, 8, 8, Side::Remote, "semaphore remote inbound counter")?;
    let e = check(expected.0, expected.1, 8, 8, Side::Local, "semaphore expected counter")?;
    same_device(&[(&i, "the inbound counter"), (&r, "the remote inbound counter"), (&e, "the expected counter")])?;
    if i.addr == e.addr {
        return Err(Error::invalid("semaphore inbound and expected counters are the same word"));
    }
    Ok(DeviceSemaphoreHandle { inbound: i.addr, remote_inbound: r.addr, expected_inbound: e.addr })
}

/// The LL packet buffers of a memory channel: where this rank writes packets (the peer's
/// buffer, imported here) and where the peer's packets arrive (this rank's own buffer). Each is
/// a memory and a byte offset; the addresses must be 16-byte aligned (LL16 packets).
#[derive(Debug, Clone, Copy)]
pub struct PacketBuffers<'a> {
    /// The peer's packet buffer, imported here.
    pub remote: (&'a RegisteredMemory, usize),
    /// This rank's packet buffer.
    pub local: (&'a RegisteredMemory, usize),
}

/// Builds a memory channel's device handle: `semaphore` (from [`device_semaphore`]), `dst` the
/// peer's memory imported here, `src` this rank's memory (each a memory and a byte offset, the
/// offset at most the registration's length), and optionally the packet buffers. Every memory
/// must be device memory mapped by a GPU transport for one device, on the side named; the
/// peer's memories must belong to one rank. Anything else is [`Error::InvalidArgument`].
pub fn memory_channel_handle(
    semaphore: DeviceSemaphoreHandle,
    dst: (&RegisteredMemory, usize),
    src: (&RegisteredMemory, usize),
    packets: Option<PacketBuffers<'_>>,
) -> Result<MemoryChannelDeviceHandle> {
    if semaphore.inbound == 0 || semaphore.remote_inbound == 0 || semaphore.expected_inbound == 0 {
        return Err(Error::invalid("memory channel semaphore has a null address; build it with device_semaphore"));
    }
    let d = check(dst.0, dst.1, 0, 1, Side::Remote, "memory channel destination")?;
    let s = check(src.0, src.1, 0, 1, Side::Local, "memory channel source")?;
    let mut parts = vec![(&d, "the destination"), (&s, "the source")];
    let (mut remote_packets, mut local_packets) = (0, 0);
    let checked_packets = match packets {
        Some(p) => {
            let rp = check(p.remote.0, p.remote.1, 0, 16, Side::Remote, "memory channel remote packet buffer")?;
            let lp = check(p.local.0, p.local.1, 0, 16, Side::Local, "memory channel local packet buffer")?;
            if rp.owner != d.owner {
                return Err(Error::invalid(format!(
                    "memory channel remote packet buffer belongs to rank {}, its destination to rank {}",
                    rp.owner, d.owner
                )));
            }
            remote_packets = rp.addr;
            local_packets = lp.addr;
            Some((rp, lp))
        }
        None => None,
    };
    if let Some((rp, lp)) = &checked_packets {
        parts.push((rp, "the remote packet buffer"));
        parts.push((lp, "the local packet buffer"));
    }
    same_device(&parts)?;
    Ok(MemoryChannelDeviceHandle { semaphore, dst: d.addr, src: s.addr, remote_packets, local_packets })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use comm_core::loopback::transport;
    use comm_core::memory::{HeapRegion, MemoryDescriptor, MemoryKind, MemoryRegion};

    fn heap(owner: usize, local: bool, kind: MemoryKind) -> RegisteredMemory {
        let region: Arc<dyn MemoryRegion> = Arc::new(HeapRegion::new(256).unwrap());
        let d = MemoryDescriptor::new(owner, 0, "m", kind, 256, vec![]);
        RegisteredMemory::new(d, region, transport(), local).unwrap()
    }

    #[test]
    fn host_memory_is_refused_everywhere() {
        for kind in [MemoryKind::Host, MemoryKind::Device(0)] {
            let local = heap(0, true, kind);
            let remote = heap(1, false, kind);
            let r = device_semaphore((&local, 0), (&remote, 0), (&local, 8));
            assert!(
                matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("not device memory mapped")),
                "{kind:?}: {r:?}"
            );
            let sem = DeviceSemaphoreHandle { inbound: 8, remote_inbound: 16, expected_inbound: 24 };
            let r = memory_channel_handle(sem, (&remote, 0), (&local, 0), None);
            assert!(matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("not device memory mapped")), "{r:?}");
            let p = PacketBuffers { remote: (&remote, 0), local: (&local, 0) };
            assert!(memory_channel_handle(sem, (&remote, 0), (&local, 0), Some(p)).is_err());
        }
    }

    #[test]
    fn ranges_and_alignment_are_checked_before_anything_else() {
        let local = heap(0, true, MemoryKind::Host);
        let remote = heap(1, false, MemoryKind::Host);
        for (off, needle) in [(249, "outside"), (256, "outside"), (usize::MAX, "outside")] {
            let r = device_semaphore((&local, off), (&remote, 0), (&local, 8));
            assert!(matches!(&r, Err(Error::InvalidArgument(m)) if m.contains(needle)), "{off}: {r:?}");
            // Every other word goes through the same check, range first.
            for (m, side) in [(&remote, Side::Remote), (&local, Side::Local)] {
                let r = check(m, off, 8, 8, side, "t");
                assert!(matches!(&r, Err(Error::InvalidArgument(m)) if m.contains(needle)), "{off}: {:?}", r.err());
            }
        }
        let sem = DeviceSemaphoreHandle { inbound: 8, remote_inbound: 16, expected_inbound: 24 };
        let r = memory_channel_handle(sem, (&remote, 257), (&local, 0), None);
        assert!(matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("outside")), "{r:?}");
        let r = check(&local, 300, 0, 1, Side::Local, "memory channel source");
        assert!(matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("outside")), "{:?}", r.err());
        let null = DeviceSemaphoreHandle::default();
        let r = memory_channel_handle(null, (&remote, 0), (&local, 0), None);
        assert!(matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("null")), "{r:?}");
    }

    #[test]
    fn check_orders_range_kind_side_and_alignment() {
        // The checks themselves, on a heap registration: range first, then the kind.
        let m = heap(0, true, MemoryKind::Host);
        assert!(check(&m, 250, 8, 8, Side::Local, "t").is_err());
        let e = check(&m, 0, 8, 8, Side::Local, "t").err().unwrap();
        assert!(e.to_string().contains("not device memory mapped"), "{e}");
        // Same-device check over already checked parts.
        let a = Checked { addr: 8, device: 0, owner: 1 };
        let b = Checked { addr: 16, device: 1, owner: 1 };
        assert!(same_device(&[(&a, "a"), (&a, "a2")]).is_ok());
        let e = same_device(&[(&a, "a"), (&b, "b")]).unwrap_err();
        assert!(e.to_string().contains("device 1"), "{e}");
    }
}
