//! Tests that need a verbs device: ignored on machines without one (they would prove nothing
//! there); `cargo xtask ib-vm` runs them with `--ignored` inside a SoftRoCE guest.

use super::*;

/// Polls `cq` until `want` completions arrived, all successful, or ten seconds passed; returns
/// them.
fn complete(cq: &CompletionQueue, want: usize) -> Vec<ffi::ibv_wc> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut got = Vec::new();
    let mut wcs = [empty_completion(); 8];
    while got.len() < want {
        let n = cq.poll(&mut wcs).unwrap();
        for wc in &wcs[..n] {
            assert!(wc.is_valid(), "completion {} failed: {:?}", wc.wr_id(), wc.error());
            got.push(*wc);
        }
        assert!(std::time::Instant::now() < deadline, "{} of {want} completions after 10 s", got.len());
    }
    got
}

/// Two queue pairs on one port joined to each other, with their send and receive queues.
struct Joined {
    a: QueuePair,
    b: QueuePair,
    sends: Arc<CompletionQueue>,
    b_receives: Arc<CompletionQueue>,
    channel: Arc<CompletionChannel>,
    pd: Arc<ProtectionDomain>,
}

fn joined() -> Joined {
    let port = Port::open(&PortChoice::default()).unwrap();
    let pd = ProtectionDomain::new(&port).unwrap();
    let channel = CompletionChannel::new(&port).unwrap();
    let sends = CompletionQueue::new(&port, 64).unwrap();
    let a_receives = CompletionQueue::new(&port, 16).unwrap();
    let b_receives = CompletionQueue::with_channel(&port, 16, &channel, 42).unwrap();
    let a = QueuePair::new(&pd, &sends, &a_receives, 16, 4, 0x1234).unwrap();
    let b = QueuePair::new(&pd, &sends, &b_receives, 16, 4, 0x5678).unwrap();
    a.connect(&b.address()).unwrap();
    b.connect(&a.address()).unwrap();
    Joined { a, b, sends, b_receives, channel, pd }
}

#[test]
#[ignore = "needs an RDMA device: cargo xtask ib-vm runs it"]
fn two_queue_pairs_write_and_add_into_each_others_memory() {
    // `b` bound (not `..`): the peer queue pair must live until the requests complete.
    let Joined { a, b: _b, sends, pd, .. } = joined();
    let len = (1 << 20) + 13;
    let src: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    let mut dst = vec![0u8; len + 8];
    let mut old = [0u64; 1];
    // SAFETY: the vectors outlive the registrations (dropped at the end of the test, after
    // every request completed).
    let (rs, rd, ro) = unsafe {
        (
            Registration::new(&pd, src.as_ptr().cast_mut(), len).unwrap(),
            Registration::new(&pd, dst.as_mut_ptr(), len + 8).unwrap(),
            Registration::new(&pd, old.as_mut_ptr().cast(), 8).unwrap(),
        )
    };
    // An 8-byte aligned word inside the written range (atomics need the alignment).
    let word = (dst.as_ptr() as u64 + 4096).next_multiple_of(8);
    let write = WorkRequest {
        wr_id: 1,
        op: Operation::Write,
        local: src.as_ptr(),
        len: len as u32,
        lkey: rs.lkey(),
        remote: dst.as_ptr() as u64,
        rkey: rd.rkey(),
        signaled: true,
    };
    let add = WorkRequest {
        wr_id: 2,
        op: Operation::FetchAdd(5),
        local: old.as_ptr().cast(),
        len: 8,
        lkey: ro.lkey(),
        remote: word,
        rkey: rd.rkey(),
        signaled: true,
    };
    // SAFETY: every buffer is registered and lives until the completions below.
    unsafe {
        a.post(write).unwrap();
        a.post(add).unwrap();
    }
    complete(&sends, 2);
    let at = (word - dst.as_ptr() as u64) as usize;
    let before = u64::from_le_bytes(src[at..at + 8].try_into().unwrap());
    assert_eq!(old[0], before, "fetch-and-add returns the word the write left");
    let mut expect = src.clone();
    expect[at..at + 8].copy_from_slice(&before.wrapping_add(5).to_le_bytes());
    assert!(dst[..len] == expect[..len], "the written bytes differ");
}

#[test]
#[ignore = "needs an RDMA device: cargo xtask ib-vm runs it"]
fn immediates_and_sends_complete_receives_in_order_and_wake_the_channel() {
    let Joined { a, b, sends, b_receives, channel, pd } = joined();
    let src: Vec<u8> = (0..100u8).collect();
    let mut dst = vec![0u8; 128];
    let mut inbox = vec![0u8; 4 * 32];
    // SAFETY: the vectors outlive the registrations and every request below completes first.
    let (rs, rd, ri) = unsafe {
        (
            Registration::new(&pd, src.as_ptr().cast_mut(), src.len()).unwrap(),
            Registration::new(&pd, dst.as_mut_ptr(), dst.len()).unwrap(),
            Registration::new(&pd, inbox.as_mut_ptr(), inbox.len()).unwrap(),
        )
    };
    let base = inbox.as_mut_ptr();
    let receives: Vec<ReceiveRequest> = (0..4)
        .map(|i| ReceiveRequest {
            wr_id: i,
            // SAFETY: inside `inbox` (4 buffers of 32 bytes).
            local: unsafe { base.add(32 * i as usize) },
            len: 32,
            lkey: ri.lkey(),
        })
        .collect();
    // SAFETY: the buffers are registered and live until the queue pair is gone.
    unsafe { b.post_receives(&receives).unwrap() };
    b_receives.arm().unwrap();
    let base = WorkRequest {
        wr_id: 0,
        op: Operation::Write,
        local: src.as_ptr(),
        len: 0,
        lkey: rs.lkey(),
        remote: dst.as_ptr() as u64,
        rkey: rd.rkey(),
        signaled: true,
    };
    let chain = [
        // 100 bytes with an immediate (inline where the queue pair allows it)...
        WorkRequest { wr_id: 1, op: Operation::WriteWithImm(0xdead_beef), len: 100, ..base },
        // ... a 24-byte send (a flag record's size) ...
        WorkRequest { wr_id: 2, op: Operation::Send, len: 24, ..base },
        // ... and an immediate with no bytes at all.
        WorkRequest { wr_id: 3, op: Operation::WriteWithImm(7), len: 0, ..base },
    ];
    // SAFETY: as above; the remote range lies inside `dst`.
    unsafe { a.post_chain(&chain).unwrap() };
    complete(&sends, 3);
    assert!(channel.wait(std::time::Duration::from_secs(10)).unwrap(), "no event on the channel");
    assert_eq!(channel.take_event().unwrap(), Some(42), "the event names the queue's context");
    assert_eq!(channel.take_event().unwrap(), None, "one event per arming");
    let got = complete(&b_receives, 3);
    assert_eq!(got.iter().map(|wc| wc.wr_id()).collect::<Vec<_>>(), [0, 1, 2], "receives complete in order");
    assert_eq!(got[0].opcode(), ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM);
    assert_eq!(got[0].imm_data().map(u32::from_be), Some(0xdead_beef));
    assert_eq!(got[1].opcode(), ffi::ibv_wc_opcode::IBV_WC_RECV);
    assert_eq!(got[1].len(), 24);
    assert_eq!(got[2].imm_data().map(u32::from_be), Some(7));
    assert_eq!(&dst[..100], &src[..], "the write with immediate placed its bytes");
    assert_eq!(&inbox[32..56], &src[..24], "the send landed in the second receive's buffer");
    println!("inline bytes of this queue pair: {}", a.max_inline());
}

#[test]
#[ignore = "needs an RDMA device: cargo xtask ib-vm runs it"]
fn device_registrations_the_device_cannot_make_are_unsupported() {
    let port = Port::open(&PortChoice::default()).unwrap();
    let pd = ProtectionDomain::new(&port).unwrap();
    // No GPU here: an address nothing is mapped at stands for device memory the kernel cannot
    // resolve without nvidia_peermem.
    // SAFETY: a registration that fails touches no memory; one that succeeded would be dropped
    // at once.
    let e = unsafe { Registration::device_pointer(&pd, 0x1000, 4096) }.err().expect("registered unmapped memory");
    assert!(matches!(&e, Error::Unsupported(m) if m.contains("nvidia_peermem")), "{e}");
    // A descriptor that is no dmabuf: SoftRoCE registers no dmabufs at all (unsupported); a
    // device that does refuses this one.
    let not_a_dmabuf = std::fs::File::open("/dev/null").unwrap();
    use std::os::fd::AsFd;
    // SAFETY: as above.
    let e = unsafe { Registration::dmabuf(&pd, not_a_dmabuf.as_fd(), 0, 4096, 0x10000) }
        .err()
        .expect("registered /dev/null");
    if port.device().starts_with("rxe") {
        assert!(matches!(&e, Error::Unsupported(m) if m.contains("dmabuf")), "{e}");
    }
}
