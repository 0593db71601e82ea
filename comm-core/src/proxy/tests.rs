use super::test_support::*;
use super::*;
use crate::fifo::TriggerFields;
use crate::port_channel::PortChannel;
use std::time::Instant;

fn trigger(side: &Side, kind: TriggerType, size: u64, src_offset: u64, dst_offset: u64) -> Trigger {
    Trigger::new(TriggerFields {
        kind,
        size,
        src_memory: side.src_id,
        src_offset,
        dst_memory: side.dst_id,
        dst_offset,
        semaphore: side.semaphore_id,
    })
    .unwrap()
}

/// What the GPU channel links use: a semaphore whose inbound side a kernel waits on.
#[test]
fn signal_only_semaphores_signal_through_the_proxy_and_refuse_host_waits() {
    use crate::semaphore::Token;
    let [a, b] = pair(64);
    let connection = Arc::clone(a.semaphore.connection());
    let remote = a.semaphore.remote_token().clone();
    let abort = Arc::new(AtomicBool::new(false));
    let only = HostSemaphore::signal_only(Arc::clone(&connection), remote.clone(), TIMEOUT, Arc::clone(&abort));
    let only = Arc::new(only.unwrap());
    assert!(only.inbound_token().is_none());
    assert!(matches!(only.wait(), Err(Error::Unsupported(_))), "a host wait must be refused");
    assert!(!only.poll());
    assert_eq!(only.received(), 0);
    let misaligned = Token { memory: remote.memory.clone(), offset: 4 };
    assert!(HostSemaphore::signal_only(Arc::clone(&connection), misaligned, TIMEOUT, Arc::clone(&abort)).is_err());
    let outside = Token { memory: remote.memory, offset: 64 };
    assert!(HostSemaphore::signal_only(connection, outside, TIMEOUT, abort).is_err());
    let id = a.proxy.add_semaphore(only).unwrap();
    a.proxy.start(|| Ok(())).unwrap();
    let channel = PortChannel::new(&a.proxy, id, a.dst_id, a.src_id).unwrap();
    channel.signal().unwrap();
    channel.signal().unwrap();
    channel.flush().unwrap();
    b.semaphore.wait().unwrap();
    b.semaphore.wait().unwrap();
    assert_eq!(b.semaphore.received(), 2, "two signals, counted at the peer");
}

#[test]
fn executes_data_flag_sync_then_pops() {
    let [a, b] = pair(4096);
    let abort = AtomicBool::new(false);
    a.data.write_bytes(100, b"hello proxy").unwrap();
    let kind = TriggerType::DATA | TriggerType::FLAG | TriggerType::SYNC;
    let ticket = a.proxy.fifo().push(trigger(&a, kind, 11, 100, 7), &test_ctx(&abort)).unwrap();
    a.proxy.start(|| Ok(())).unwrap();
    assert!(a.proxy.is_running());
    a.proxy.fifo().wait_processed(ticket, &test_ctx(&abort)).unwrap();
    b.semaphore.wait().unwrap();
    let mut out = [0u8; 11];
    b.data.read_bytes(7, &mut out).unwrap();
    assert_eq!(&out, b"hello proxy");
    assert!(a.proxy.error().is_none());
    a.proxy.stop();
    assert!(!a.proxy.is_running());
    assert!(a.proxy.thread_id().is_none());
}

#[test]
fn bad_trigger_is_recorded_and_later_triggers_are_popped_not_run() {
    let [a, b] = pair(4096);
    let abort = AtomicBool::new(false);
    a.proxy.start(|| Ok(())).unwrap();
    let fifo = a.proxy.fifo();
    let bad =
        Trigger::new(TriggerFields { kind: TriggerType::FLAG, semaphore: SemaphoreId(5), ..TriggerFields::default() })
            .unwrap();
    fifo.push(bad, &test_ctx(&abort)).unwrap();
    let ticket = fifo.push(trigger(&a, TriggerType::FLAG, 0, 0, 0), &test_ctx(&abort)).unwrap();
    fifo.wait_processed(ticket, &test_ctx(&abort)).unwrap();
    let e = a.proxy.error();
    assert!(matches!(&e, Some(Error::InvalidArgument(m)) if m.contains("semaphore id 5")), "{e:?}");
    assert_eq!(b.semaphore.received(), 0, "the valid trigger after the failure must not run");
    assert!(a.proxy.is_running(), "a failed proxy keeps popping");
    // An unknown memory id in a DATA trigger fails the same way (first error stays).
    let bad_mem =
        Trigger::new(TriggerFields { kind: TriggerType::DATA, dst_memory: MemoryId(9), ..TriggerFields::default() })
            .unwrap();
    let ticket = fifo.push(bad_mem, &test_ctx(&abort)).unwrap();
    fifo.wait_processed(ticket, &test_ctx(&abort)).unwrap();
    assert!(matches!(a.proxy.error(), Some(Error::InvalidArgument(m)) if m.contains("semaphore id 5")));
}

#[test]
fn tables_grow_after_start_and_are_bounded() {
    let [a, b] = pair(4096);
    let abort = AtomicBool::new(false);
    a.proxy.start(|| Ok(())).unwrap();
    // A second id for the same semaphore, added while running, is usable at once.
    let late = a.proxy.add_semaphore(Arc::clone(&a.semaphore)).unwrap();
    assert_eq!(late, SemaphoreId(1));
    let t =
        Trigger::new(TriggerFields { kind: TriggerType::FLAG, semaphore: late, ..TriggerFields::default() }).unwrap();
    let ticket = a.proxy.fifo().push(t, &test_ctx(&abort)).unwrap();
    a.proxy.fifo().wait_processed(ticket, &test_ctx(&abort)).unwrap();
    assert_eq!(b.semaphore.received(), 1);
    assert!(a.proxy.error().is_none());
    while a.proxy.add_memory(a.data.clone()).is_ok() {}
    assert!(matches!(a.proxy.add_memory(a.data.clone()), Err(Error::InvalidArgument(_))));
    assert!(a.proxy.memory(MemoryId(MAX_MEMORIES as u32 - 1)).is_ok());
    assert!(a.proxy.memory(MemoryId(MAX_MEMORIES as u32)).is_err());
    assert!(a.proxy.semaphore(SemaphoreId(2)).is_err());
}

#[test]
fn start_twice_or_after_stop_is_refused() {
    let [a, _b] = pair(64);
    a.proxy.start(|| Ok(())).unwrap();
    assert!(matches!(a.proxy.start(|| Ok(())), Err(Error::InvalidArgument(_))));
    a.proxy.stop();
    a.proxy.stop();
    assert!(matches!(a.proxy.start(|| Ok(())), Err(Error::InvalidArgument(_))));
}

#[test]
fn idle_proxy_sleeps_and_wakes() {
    let [a, b] = pair(64);
    let abort = AtomicBool::new(false);
    a.proxy.start(|| Ok(())).unwrap();
    std::thread::sleep(Duration::from_millis(20)); // long enough to reach the sleeping stage
    let start = Instant::now();
    let ticket = a.proxy.fifo().push(trigger(&a, TriggerType::FLAG, 0, 0, 0), &test_ctx(&abort)).unwrap();
    a.proxy.fifo().wait_processed(ticket, &test_ctx(&abort)).unwrap();
    assert_eq!(b.semaphore.received(), 1);
    assert!(start.elapsed() < Duration::from_millis(500), "{:?}", start.elapsed());
}

#[test]
fn drop_joins_with_triggers_pending() {
    let [a, b] = pair(64);
    let abort = AtomicBool::new(false);
    for _ in 0..100 {
        a.proxy.fifo().push(trigger(&a, TriggerType::FLAG, 0, 0, 0), &test_ctx(&abort)).unwrap();
    }
    drop_while_starting(a.proxy);
    assert!(b.semaphore.received() < 100, "a stopped proxy does not drain the FIFO");
}
