//! RDMA write bandwidth and latency through weave's IB connection, in the shape of perftest's
//! `ib_write_bw` and `ib_write_lat`, so the two can be compared on one device
//! (`transport-ib/vm/bench.sh` runs both in the SoftRoCE guest).
//!
//! Two backends in one process, on the default port (`WEAVE_IB_HCA` picks another):
//! - **bandwidth**: rank 0 writes `iters` messages of each size into rank 1's memory, then
//!   flushes; MB/s = bytes / time (10^6 bytes, as perftest prints).
//! - **latency**: ping-pong; each side writes a message and raises a flag in the other's memory
//!   (`write_and_sync`, as a channel link posts a message), then waits for the flag of the
//!   answer in its own memory;
//!   latency = round trip / 2, the median over `iters` (perftest's `t_typical`).
//!
//! usage: write_bench [bw|lat] [SIZE ...]   (sizes in bytes; default 2 B .. 1 MiB ×4 for bw,
//! 2 B .. 4 KiB ×4 for lat). Prints one line per size: `bw SIZE MBPS` or `lat SIZE USEC`, and
//! for `lat` the median time of the posting call on stderr. `WEAVE_BENCH_WAIT=spin` (default),
//! `yield` or `backoff` picks how `lat` waits; `WEAVE_BENCH_FLAG=none` makes it poll plain writes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use comm_core::connection::{CheckedWrite, Connection};
use comm_core::memory::{MemoryKind, RegisteredMemory};
use comm_core::transport::{PeerExport, TransportBackend, TransportContext};
use transport_ib::{IbBackend, port_choice_from_env, transport};

fn context(rank: usize) -> TransportContext {
    comm_core::testing::context(rank, "ibbench", Duration::from_secs(60))
}

/// `owner`'s region of `len` bytes: as `owner` sees it, and as `viewer` names it.
fn region(
    owner: &IbBackend,
    owner_rank: usize,
    viewer: &IbBackend,
    len: usize,
) -> (RegisteredMemory, RegisteredMemory) {
    let r = owner.allocate(len, MemoryKind::Host).expect("allocate");
    let payload = owner.export(&r).expect("export").expect("an ib region");
    let local =
        RegisteredMemory::new_local(comm_core::testing::descriptor(owner_rank, len), r, transport()).expect("local");
    let ep = owner.local_endpoint().expect("endpoint");
    let export = PeerExport { peer: owner_rank, peer_endpoint: &ep, payload: &payload, len, kind: MemoryKind::Host };
    let imported = viewer.import(export).expect("import");
    (
        local,
        RegisteredMemory::new_imported(comm_core::testing::descriptor(owner_rank, len), imported, transport())
            .expect("imported"),
    )
}

fn sizes(args: &[String], default: &[usize]) -> Vec<usize> {
    let given: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    if given.is_empty() { default.to_vec() } else { given }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map_or("bw", String::as_str).to_string();
    let choice = port_choice_from_env().expect("WEAVE_IB_HCA");
    let a = IbBackend::open(&context(0), &choice).expect("open rank 0");
    let b = IbBackend::open(&context(1), &choice).expect("open rank 1");
    let ab = a.connect(1, &b.local_endpoint().unwrap()).expect("connect 0->1");
    let ba = b.connect(0, &a.local_endpoint().unwrap()).expect("connect 1->0");
    let clock = Clock::calibrated();
    match mode.as_str() {
        "bw" => {
            let all: Vec<usize> = (1..=20).step_by(2).map(|s| 1usize << s).collect();
            for size in sizes(&args[1..], &all) {
                let (_dst_local, dst) = region(&b, 1, &a, size);
                let (src, _) = region(&a, 0, &b, size);
                let iters = (64 << 20) / size.clamp(4096, 64 << 20);
                let iters = iters.clamp(100, 5000);
                ab.write(&dst, 0, &src, 0, size).unwrap();
                ab.flush().unwrap();
                let t = Instant::now();
                for _ in 0..iters {
                    ab.write(&dst, 0, &src, 0, size).unwrap();
                }
                ab.flush().unwrap();
                let secs = t.elapsed().as_secs_f64();
                println!("bw {size} {:.2}", (size * iters) as f64 / secs / 1e6);
            }
        }
        "lat" => {
            let all: Vec<usize> = (1..=12).step_by(2).map(|s| 1usize << s).collect();
            for size in sizes(&args[1..], &all) {
                let len = size + 64;
                let (b_local, b_remote) = region(&b, 1, &a, len);
                let (a_local, a_remote) = region(&a, 0, &b, len);
                let (a_src, _) = region(&a, 0, &b, len);
                let (b_src, _) = region(&b, 1, &a, len);
                let (warmup, iters) = (200u64, 2000u64);
                // SAFETY: offset 0 of each local region is an 8-byte aligned word that only the
                // peer's flags change (stored atomically by this process); read atomically.
                let flag = |m: &RegisteredMemory, at: usize| unsafe { &*(m.as_ptr().add(at) as *const AtomicU64) };
                // WEAVE_BENCH_FLAG=none: plain writes whose first word is the sequence number,
                // polled by the peer (perftest's way; no flag, not ordered in general: a
                // diagnostic of the harness, not how weave posts).
                let raw = std::env::var("WEAVE_BENCH_FLAG").is_ok_and(|v| v == "none") && size >= 8;
                let at = if raw { 64 } else { 0 };
                let (a_flag, b_flag) = (flag(&a_local, at), flag(&b_local, at));
                let send = |conn: &dyn Connection, dst: &RegisteredMemory, src: &RegisteredMemory, i: u64| {
                    if raw {
                        // SAFETY: offset 64 of the private source region, 8-byte aligned; its
                        // previous write completed before the peer answered it.
                        unsafe { (src.as_ptr().add(64) as *mut u64).write_volatile(i) };
                        conn.write(dst, 64, src, 64, size).unwrap();
                    } else {
                        let w = CheckedWrite::new(dst, 64, src, 64, size).unwrap();
                        conn.write_and_sync(w, 0, i).unwrap();
                    }
                };
                // Spins without pause as perftest does (WEAVE_BENCH_WAIT=spin, the default), or
                // yields on every turn (`yield`), or waits as weave's own waits do (`backoff`:
                // spin briefly, then yield, then nap). Every turn makes the connection's receive
                // progress (that is what stores the peer's flag).
                let policy = std::env::var("WEAVE_BENCH_WAIT").unwrap_or_else(|_| "spin".into());
                // The 60 s bound is checked every 4096 turns: the guest's clock is an emulated
                // HPET, so reading it is a system call, longer than a turn.
                // WEAVE_BENCH_PROGRESS=off (with WEAVE_BENCH_FLAG=none only): no receive progress
                // while waiting, to tell its cost from the posting call's.
                let progress = !(raw && std::env::var("WEAVE_BENCH_PROGRESS").is_ok_and(|v| v == "off"));
                let wait = |from: &dyn Connection, f: &AtomicU64, want: u64| {
                    let deadline = Instant::now() + Duration::from_secs(60);
                    let mut backoff = comm_core::spin::Backoff::new();
                    for turn in 0u64.. {
                        if progress {
                            from.progress().expect("receive progress");
                        }
                        if f.load(Ordering::Acquire) >= want {
                            return;
                        }
                        assert!(turn % 4096 != 4095 || Instant::now() < deadline, "no answer in 60 s");
                        match policy.as_str() {
                            "spin" => std::hint::spin_loop(),
                            "yield" => std::thread::yield_now(),
                            _ => backoff.snooze(),
                        }
                    }
                };
                let mut rtts = Vec::with_capacity(iters as usize);
                let mut posts = Vec::with_capacity(iters as usize);
                std::thread::scope(|s| {
                    s.spawn(|| {
                        for i in 1..=warmup + iters {
                            wait(ba.as_ref(), b_flag, i);
                            send(ba.as_ref(), &a_remote, &b_src, i);
                        }
                        ba.flush().unwrap();
                    });
                    for i in 1..=warmup + iters {
                        let t = clock.now();
                        send(ab.as_ref(), &b_remote, &a_src, i);
                        let posted = clock.now();
                        wait(ab.as_ref(), a_flag, i);
                        if i > warmup {
                            rtts.push(clock.micros(t, clock.now()));
                            posts.push(clock.micros(t, posted));
                        }
                    }
                    ab.flush().unwrap();
                });
                rtts.sort_by(f64::total_cmp);
                posts.sort_by(f64::total_cmp);
                println!("lat {size} {:.2}", rtts[rtts.len() / 2] / 2.0);
                eprintln!("post {size} {:.2} (median µs of the write_and_sync call)", posts[posts.len() / 2]);
            }
        }
        other => {
            eprintln!("write_bench: unknown mode {other:?}; use bw or lat");
            std::process::exit(2);
        }
    }
}

/// The time stamps of the latency loop: the time-stamp counter where there is one (as perftest
/// takes them: the guest's system clock is an emulated HPET, read through a system call that
/// costs more than the hop), calibrated against the system clock; the system clock elsewhere.
struct Clock {
    #[cfg_attr(target_arch = "x86_64", allow(dead_code))]
    start: Instant,
    /// Counter ticks per µs (0: no counter, use `start`).
    ticks_per_us: f64,
}

impl Clock {
    fn calibrated() -> Self {
        let start = Instant::now();
        let mut clock = Clock { start, ticks_per_us: 0.0 };
        if cfg!(target_arch = "x86_64") {
            let (t0, c0) = (Instant::now(), clock.now());
            std::thread::sleep(Duration::from_millis(200));
            let (t1, c1) = (Instant::now(), clock.now());
            clock.ticks_per_us = (c1 - c0) as f64 / (t1 - t0).as_secs_f64() / 1e6;
        }
        clock
    }

    /// A time stamp: counter ticks, or ns since `start`.
    fn now(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: rdtsc has no preconditions on x86-64.
        return unsafe { std::arch::x86_64::_rdtsc() };
        #[cfg(not(target_arch = "x86_64"))]
        return self.start.elapsed().as_nanos() as u64;
    }

    /// µs from `a` to `b`.
    fn micros(&self, a: u64, b: u64) -> f64 {
        let ticks = b.wrapping_sub(a) as f64;
        if self.ticks_per_us > 0.0 { ticks / self.ticks_per_us } else { ticks / 1e3 }
    }
}
