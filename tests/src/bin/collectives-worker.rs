//! One rank of a weave collectives test: `collectives-worker SCENARIO [ARG]`, launched N times
//! by the integration tests. Prints `OK SCENARIO …` and exits 0 on success; prints the error
//! and exits 1 otherwise.

use collectives::{Algorithm, Collective, Communicator, DataType, Family, ReduceOp};
use comm_core::{Error, Result};
use weave_tests::matrix::{MatrixSpec, run_matrix};
use weave_tests::worker;

fn main() {
    worker::run(|scenario, arg| match scenario {
        "matrix" => matrix(arg),
        "algorithms" => algorithms(),
        "stale-state" => stale_state(),
        "split" => split(),
        "mismatch" => mismatch(),
        "p2p" => Communicator::from_env().and_then(|c| p2p(&c)),
        "channel-kill" => channel_kill(arg),
        "nodes" => nodes(),
        "nodes-straddle" => nodes_straddle(arg),
        "node-kill" => node_kill(arg),
        "p2p-channel" => comm_core::bootstrap::from_env()
            .and_then(|b| {
                Communicator::builder(b).with_algorithm(Collective::SendRecv, Algorithm::ChannelDirect).build()
            })
            .and_then(|c| p2p(&c)),
        "shared" => shared(),
        "create" => create(arg),
        "survive" => weave_tests::survive::survive(arg),
        "stall" => weave_tests::stall::stall(arg),
        "p2p-mismatch" => weave_tests::p2p_mismatch::p2p_mismatch(arg),
        "join" => weave_tests::survive::join(arg),
        "hostile-target" => weave_tests::hostile::target(arg),
        "hostile-attack" => weave_tests::hostile::attack(arg),
        other => Err(worker::unknown_scenario(other)),
    })
}

/// Communicator creation, timed: the bootstrap (`from_env`), then an all-gather and a barrier on
/// it (every rank's figure then includes the last rank's arrival), then the communicator on it
/// and a barrier, then its drop. Prints milliseconds since the start at each step and the
/// bootstrap's links, for docs/perf-log/cpu-host.md ("Bootstrap at scale"). With `core`, the
/// communicator is only the primitives layer over the default transports (no host workspace).
fn create(which: &str) -> Result<String> {
    use comm_core::bootstrap::Bootstrap;
    let started = std::time::Instant::now();
    let bootstrap = comm_core::bootstrap::from_env()?;
    let joined = started.elapsed();
    let all = bootstrap.all_gather(&bootstrap.rank().to_le_bytes())?;
    if all.len() != bootstrap.world_size() || all.iter().enumerate().any(|(r, v)| v[..] != r.to_le_bytes()) {
        return Err(Error::protocol("bootstrap all_gather gave wrong contributions"));
    }
    bootstrap.barrier()?;
    let gathered = started.elapsed();
    let links = bootstrap.open_links();
    let ready = if which == "core" {
        let mut builder = comm_core::communicator::Communicator::builder(bootstrap);
        for transport in collectives::default_transports() {
            builder = builder.with_transport_arc(transport);
        }
        let comm = builder.build()?;
        comm.bootstrap().barrier()?;
        started.elapsed()
    } else {
        let comm = Communicator::builder(bootstrap).build()?;
        comm.core().bootstrap().barrier()?;
        started.elapsed()
    };
    let dropped = started.elapsed();
    Ok(format!(
        "bootstrap {} ms, all_gather and barrier {} ms, communicator ready {} ms, {links} bootstrap links, dropped {} ms",
        joined.as_millis(),
        gathered.as_millis(),
        ready.as_millis(),
        dropped.as_millis()
    ))
}

/// The correctness matrix with the algorithm table's own choices.
fn matrix(which: &str) -> Result<String> {
    let comm = if which == "channel" {
        Communicator::builder(comm_core::bootstrap::from_env()?).with_algorithm_family(Family::Channel).build()?
    } else {
        Communicator::from_env()?
    };
    let spec = match which {
        "long" => MatrixSpec::long(),
        // 16 and more ranks on a small machine: one large case (several ring rounds) instead of
        // two of 4 Mi elements, whose all-gather buffers alone would take gigabytes per job.
        "channel" => {
            MatrixSpec { large: Some(((1 << 20) + 5, vec![(DataType::F32, ReduceOp::Sum)])), ..MatrixSpec::ci() }
        }
        _ => MatrixSpec::ci(),
    };
    let checked = run_matrix(&comm, &spec)?;
    Ok(format!("{checked} collective calls checked"))
}

/// A smaller matrix with each algorithm forced, so every implementation runs at every size.
fn algorithms() -> Result<String> {
    use Collective::*;
    // The ring where the channel family has one, direct exchanges for the rest.
    let channel_ring: Vec<(Collective, Algorithm)> = Collective::ALL
        .iter()
        .map(|&c| match c {
            AllToAll | AllToAllv | SendRecv => (c, Algorithm::ChannelDirect),
            _ => (c, Algorithm::ChannelRing),
        })
        .collect();
    let channel_direct: Vec<(Collective, Algorithm)> =
        Collective::ALL.iter().map(|&c| (c, Algorithm::ChannelDirect)).collect();
    // The logarithmic algorithms of large worlds, forced at every world size.
    let logarithmic: &[(Collective, Algorithm)] = &[
        (AllReduce, Algorithm::ChannelDoubling),
        (AllGather, Algorithm::ChannelBruck),
        (ReduceScatter, Algorithm::ChannelHalving),
        (Broadcast, Algorithm::ChannelTree),
        (Reduce, Algorithm::ChannelTree),
        (AllToAll, Algorithm::ChannelBruck),
    ];
    let forced: [(&str, &[(Collective, Algorithm)]); 8] = [
        ("one_shot", &[(Collective::AllReduce, Algorithm::OneShot), (Collective::Reduce, Algorithm::OneShot)]),
        ("two_phase", &[(Collective::AllReduce, Algorithm::TwoPhase), (Collective::Reduce, Algorithm::TwoPhase)]),
        (
            "ring",
            &[
                (Collective::AllReduce, Algorithm::Ring),
                (Collective::AllGather, Algorithm::Ring),
                (Collective::ReduceScatter, Algorithm::Ring),
            ],
        ),
        ("channel_ring", &channel_ring),
        ("channel_direct", &channel_direct),
        ("channel_eager", &[(Broadcast, Algorithm::ChannelEager), (Reduce, Algorithm::ChannelEager)]),
        ("channel_doubling, channel_bruck, channel_halving (reduce-scatter), channel_tree", logarithmic),
        ("channel_halving (all-reduce)", &[(AllReduce, Algorithm::ChannelHalving)]),
    ];
    let spec = MatrixSpec {
        dtypes: vec![DataType::F32, DataType::I32, DataType::Bf16],
        ops: ReduceOp::ALL.to_vec(),
        counts: vec![0, 1, 7, 1023, 65536 + 3],
        large: Some(((1 << 20) + 5, vec![(DataType::F32, ReduceOp::Avg)])),
    };
    let mut total = 0;
    for (name, overrides) in forced {
        let mut b = Communicator::builder(comm_core::bootstrap::from_env()?);
        for &(c, a) in overrides {
            b = b.with_algorithm(c, a);
        }
        let comm = b.build()?;
        total += run_matrix(&comm, &spec).map_err(|e| Error::protocol(format!("with {name}: {e}")))?;
    }
    Ok(format!(
        "{total} calls checked with one_shot, two_phase, ring, channel_ring, channel_direct, channel_eager, \
         channel_doubling, channel_halving, channel_bruck and channel_tree forced"
    ))
}

/// 1,000 calls in a row with changing sizes and collectives, to catch stale state.
fn stale_state() -> Result<String> {
    let comm = Communicator::from_env()?;
    let (me, n) = (comm.rank(), comm.world_size());
    let mut x: u64 = 0x9e37_79b9;
    for call in 0..1000 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let count = ((x >> 33) % 70_000) as usize;
        let base = |r: usize, i: usize| ((r + i + call) % 97) as i64;
        match call % 3 {
            0 => {
                let send: Vec<i64> = (0..count).map(|i| base(me, i)).collect();
                let mut recv = vec![0i64; count];
                comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
                if let Some(i) = (0..count).find(|&i| recv[i] != (0..n).map(|r| base(r, i)).sum::<i64>()) {
                    return Err(Error::protocol(format!("call {call}: all_reduce element {i} wrong")));
                }
            }
            1 => {
                let send: Vec<i64> = (0..count).map(|i| base(me, i)).collect();
                let mut recv = vec![0i64; n * count];
                comm.all_gather(&send, &mut recv)?;
                if let Some(j) = (0..n * count).find(|&j| recv[j] != base(j / count, j % count)) {
                    return Err(Error::protocol(format!("call {call}: all_gather element {j} wrong")));
                }
            }
            _ => {
                let root = call % n;
                let mut buf: Vec<i64> =
                    if me == root { (0..count).map(|i| base(root, i)).collect() } else { vec![-1; count] };
                comm.broadcast_in_place(&mut buf, root)?;
                if let Some(i) = (0..count).find(|&i| buf[i] != base(root, i)) {
                    return Err(Error::protocol(format!("call {call}: broadcast element {i} wrong")));
                }
            }
        }
    }
    Ok("1000 calls with changing sizes verified".into())
}

/// Several communicators in one job and process: split by parity, nested split, and the same
/// buffer used with the parent and the child.
fn split() -> Result<String> {
    let comm = Communicator::from_env()?;
    let (me, n) = (comm.rank(), comm.world_size());
    let color = (me % 2) as u32;
    let sub = comm.split(Some(color), -(me as i64))?.ok_or_else(|| Error::protocol("split gave no communicator"))?;
    let members: Vec<usize> = (0..n).filter(|r| r % 2 == me % 2).rev().collect(); // key = -rank: reversed
    if sub.world_size() != members.len() || members[sub.rank()] != me {
        return Err(Error::protocol(format!("sub-communicator rank {} of {} is wrong", sub.rank(), sub.world_size())));
    }
    // The same buffer with both communicators, interleaved.
    let mut buf = vec![0.0f64; 1000];
    for round in 0..3 {
        buf.iter_mut().for_each(|v| *v = (me + round) as f64);
        sub.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
        let want: f64 = members.iter().map(|&r| (r + round) as f64).sum();
        if buf.iter().any(|&v| v != want) {
            return Err(Error::protocol(format!("sub all_reduce gave {} instead of {want}", buf[0])));
        }
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
        let parent_want: f64 = (0..n).map(|r| members_sum(r, n, round)).sum();
        if buf.iter().any(|&v| v != parent_want) {
            return Err(Error::protocol(format!("parent all_reduce gave {} instead of {parent_want}", buf[0])));
        }
    }
    // A nested split of the sub-communicator, and a rank opting out.
    let nested = sub.split(if sub.rank() == 0 && sub.world_size() > 1 { None } else { Some(7) }, 0)?;
    if let Some(nested) = &nested {
        let mut v = vec![1u8; 10];
        nested.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
        if v[0] as usize != nested.world_size() {
            return Err(Error::protocol("nested all_reduce wrong"));
        }
    }
    comm.all_reduce_in_place(&mut [0u8; 1], ReduceOp::Sum)?;
    Ok(format!("sub-communicator {} of {}, nested: {}", sub.rank(), sub.world_size(), nested.is_some()))
}

/// What rank `r` holds after the sub-communicator all-reduce of `round`.
fn members_sum(r: usize, n: usize, round: usize) -> f64 {
    (0..n).filter(|q| q % 2 == r % 2).map(|q| (q + round) as f64).sum()
}

/// Mismatched counts, roots and bad arguments on one rank fail on every rank, and the
/// communicator still works afterwards.
fn mismatch() -> Result<String> {
    let comm = Communicator::from_env()?;
    let (me, n) = (comm.rank(), comm.world_size());
    let mut seen = 0;
    let expect_invalid = |what: &str, r: Result<()>| -> Result<()> {
        match r {
            Err(Error::InvalidArgument(m)) => {
                if me == 0 {
                    eprintln!("{what}: {m}");
                }
                Ok(())
            }
            other => Err(Error::protocol(format!("{what}: expected InvalidArgument, got {other:?}"))),
        }
    };
    if n > 1 {
        let count = 100 + me; // differs between ranks
        let send = vec![1.0f32; count];
        let mut recv = vec![0.0f32; count];
        expect_invalid("different counts", comm.all_reduce(&send, &mut recv, ReduceOp::Sum))?;
        // Above the eager rows' sizes: a synchronized broadcast, where every rank hears of it
        // (small ones run eagerly; `eager_mismatch` checks those).
        let mut buf = vec![0u8; 64 << 10];
        expect_invalid("different roots", comm.broadcast_in_place(&mut buf, me % n))?;
        seen += 2;
    }
    // Rank 0 passes a receive buffer of the wrong length; everyone must fail.
    let send = vec![1i32; 10];
    let mut recv = vec![0i32; if me == 0 { 9 } else { 10 }];
    expect_invalid("bad length on rank 0", comm.all_reduce(&send, &mut recv, ReduceOp::Sum))?;
    seen += 1;
    let op = if me == 0 { ReduceOp::Max } else { ReduceOp::Sum };
    let mut buf = vec![1i32; 10];
    if n > 1 {
        expect_invalid("different ops", comm.all_reduce_in_place(&mut buf, op))?;
        seen += 1;
    }
    // Still usable.
    let mut ok = vec![1i64; 33];
    comm.all_reduce_in_place(&mut ok, ReduceOp::Sum)?;
    if ok.iter().any(|&v| v != n as i64) {
        return Err(Error::protocol("all_reduce after the errors is wrong"));
    }
    let mut bad = vec![0u8; 7];
    expect_invalid("all_gather_in_place not divisible", comm.all_gather_in_place(&mut bad))
        .or_else(|e| if 7 % n == 0 { Ok(()) } else { Err(e) })?;
    if n > 1 {
        seen += eager_mismatch(&expect_invalid)?;
    }
    Ok(format!("{seen} mismatches reported; communicator still usable"))
}

/// With `channel_eager` forced (as it runs by default for small calls), a mismatched count
/// fails on the receivers (the senders returned before anyone checked) and leaves every link
/// in step: the calls after it are right, small ones included.
fn eager_mismatch(expect_invalid: &dyn Fn(&str, Result<()>) -> Result<()>) -> Result<usize> {
    let comm = Communicator::builder(comm_core::bootstrap::from_env()?)
        .with_algorithm(Collective::Broadcast, Algorithm::ChannelEager)
        .with_algorithm(Collective::Reduce, Algorithm::ChannelEager)
        .build()?;
    let (me, n) = (comm.rank(), comm.world_size());
    // Rank 1's count differs, by more than one message's worth, so the streams differ in length.
    let count = if me == 1 { 3000 } else { 1000 };
    let mut buf = vec![7u32; count];
    let r = comm.broadcast_in_place(&mut buf, 0);
    if me == 0 {
        r?
    } else if me == 1 {
        expect_invalid("eager broadcast, rank 1's count", r)?
    } else {
        r?
    }
    let send = vec![1.0f64; count];
    let mut recv = vec![0.0f64; count];
    let r = comm.reduce(&send, &mut recv, ReduceOp::Sum, 0);
    if me == 0 {
        expect_invalid("eager reduce, rank 1's count", r)?
    } else {
        r?
    }
    for root in 0..n {
        let mut data: Vec<u64> = (0..5000).map(|i| if me == root { i * 3 + root as u64 } else { 0 }).collect();
        comm.broadcast_in_place(&mut data, root)?;
        if (0..5000).any(|i| data[i] != i as u64 * 3 + root as u64) {
            return Err(Error::protocol(format!("eager broadcast from {root} after the mismatches is wrong")));
        }
        let mut small = [if me == root { root as u8 + 40 } else { 0 }; 3];
        comm.broadcast_in_place(&mut small, root)?;
        if small != [root as u8 + 40; 3] {
            return Err(Error::protocol(format!("small eager broadcast from {root} after the mismatches is wrong")));
        }
        let mut sum = vec![0i32; 4097];
        comm.reduce(&vec![me as i32 + 1; 4097], &mut sum, ReduceOp::Sum, root)?;
        if me == root && sum.iter().any(|&v| v != (n * (n + 1) / 2) as i32) {
            return Err(Error::protocol(format!("eager reduce to {root} after the mismatches is wrong")));
        }
    }
    Ok(2)
}

/// Send/recv: a ring shift, a group exchanging large messages both ways, a send to self, and a
/// length mismatch.
fn p2p(comm: &Communicator) -> Result<String> {
    let (me, n) = (comm.rank(), comm.world_size());
    let next = (me + 1) % n;
    let prev = (me + n - 1) % n;
    for len in [0usize, 1, 4095, (1 << 20) + 3] {
        let out: Vec<u32> = (0..len).map(|i| (me * 1_000_003 + i) as u32).collect();
        let mut inp = vec![0u32; len];
        let mut g = comm.group();
        g.send(&out, next);
        g.recv(&mut inp, prev);
        g.run()?;
        if let Some(i) = (0..len).find(|&i| inp[i] != (prev * 1_000_003 + i) as u32) {
            return Err(Error::protocol(format!("ring shift of {len}: element {i} wrong")));
        }
    }
    // Every pair exchanges 3 MiB in both directions inside one group (sends listed first: a
    // sequential implementation would deadlock).
    let big = 3 << 20;
    let outs: Vec<Vec<u8>> = (0..n).map(|q| vec![(me * 16 + q) as u8; big]).collect();
    let mut ins: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; big]).collect();
    let mut g = comm.group();
    for (q, out) in outs.iter().enumerate().filter(|(q, _)| *q != me) {
        g.send(out, q);
    }
    for (p, inp) in ins.iter_mut().enumerate().filter(|(p, _)| *p != me) {
        g.recv(inp, p);
    }
    g.run()?;
    for (p, inp) in ins.iter().enumerate().filter(|(p, _)| *p != me) {
        if inp.iter().any(|&b| b != (p * 16 + me) as u8) {
            return Err(Error::protocol(format!("group exchange from rank {p} wrong")));
        }
    }
    // Send to self inside a group.
    let mine = vec![42u32; 10];
    let mut back = vec![0u32; 10];
    let mut g = comm.group();
    g.send(&mine, me);
    g.recv(&mut back, me);
    g.run()?;
    if back != mine {
        return Err(Error::protocol("send to self wrong"));
    }
    Ok(format!("p2p verified with {n} ranks"))
}

/// Zero-copy shared buffers: every rank (or only even ranks) passes sub-slices of a shared
/// buffer at odd offsets, across multi-step sizes, in place and out of place, with the
/// two-phase all-reduce forced (the one that reads shared inputs in place) and the default
/// table; also a shared buffer used with a second communicator (staged there).
fn shared() -> Result<String> {
    let forced = Communicator::builder(comm_core::bootstrap::from_env()?)
        .with_algorithm(Collective::AllReduce, Algorithm::TwoPhase)
        .build()?;
    let (me, n) = (forced.rank(), forced.world_size());
    let value = |r: usize, i: usize| ((r * 5 + i * 3) % 17) as f32;
    let mut checked = 0;
    for comm_shares in [true, me % 2 == 0] {
        for count in [1usize, 1000, (1 << 20) + 77, (3 << 20) + 5] {
            let offset = 13;
            let mut buf = forced.alloc_shared::<f32>(offset + 2 * count)?;
            let mut plain = vec![0.0f32; count];
            let want = |i: usize| (0..n).map(|r| value(r, i)).sum::<f32>();
            for i in 0..count {
                buf[offset + i] = value(me, i);
            }
            {
                let (input, rest) = buf[offset..].split_at_mut(count);
                if comm_shares {
                    forced.all_reduce(input, &mut rest[..count], ReduceOp::Sum)?;
                    if let Some(i) = (0..count).find(|&i| rest[i] != want(i)) {
                        return Err(Error::protocol(format!(
                            "shared all_reduce of {count}: element {i} is {}",
                            rest[i]
                        )));
                    }
                } else {
                    let input_copy = input.to_vec();
                    forced.all_reduce(&input_copy, &mut plain, ReduceOp::Sum)?;
                    if let Some(i) = (0..count).find(|&i| plain[i] != want(i)) {
                        return Err(Error::protocol(format!(
                            "plain all_reduce of {count}: element {i} is {}",
                            plain[i]
                        )));
                    }
                }
            }
            // In place on the shared buffer.
            for i in 0..count {
                buf[offset + i] = value(me, i);
            }
            forced.all_reduce_in_place(&mut buf[offset..offset + count], ReduceOp::Sum)?;
            if let Some(i) = (0..count).find(|&i| buf[offset + i] != want(i)) {
                return Err(Error::protocol(format!("shared in-place all_reduce of {count}: element {i} wrong")));
            }
            checked += 2;
        }
    }
    // The same shared buffer with another communicator (staged there) and the default table.
    let other = Communicator::from_env()?;
    let mut buf = forced.alloc_shared::<i32>(4096)?;
    buf.iter_mut().for_each(|v| *v = me as i32);
    other.all_reduce_in_place(&mut buf[..], ReduceOp::Max)?;
    if buf.iter().any(|&v| v != n as i32 - 1) {
        return Err(Error::protocol("shared buffer with a second communicator gave a wrong max"));
    }
    forced.all_reduce_in_place(&mut buf[..], ReduceOp::Sum)?;
    if buf.iter().any(|&v| v != (n as i32 - 1) * n as i32) {
        return Err(Error::protocol("shared buffer back on its own communicator gave a wrong sum"));
    }
    Ok(format!("{} shared-buffer all-reduces verified", checked + 2))
}

/// The channel family with a rank SIGKILLed in the middle of large all-reduces: every other
/// rank must get `PeerLost` or `Timeout` (never hang), and the job must leave no segment behind.
/// With `tcp`, every rank is a posed node of its own, so every link is a TCP connection.
fn channel_kill(over: &str) -> Result<String> {
    let bootstrap = comm_core::bootstrap::from_env()?;
    let mut config = comm_core::config::Config::from_env()?;
    if over == "tcp" {
        config.host_id = Some(format!("posed-node-{}", comm_core::bootstrap::Bootstrap::rank(&bootstrap)));
    }
    let comm = Communicator::builder(bootstrap)
        .with_config(config)
        .with_algorithm(Collective::AllReduce, Algorithm::ChannelRing)
        .build()?;
    let (me, n) = (comm.rank(), comm.world_size());
    let victim = n - 1;
    let send = vec![1.0f32; 16 << 20];
    let mut recv = vec![0.0f32; 16 << 20];
    comm.all_reduce(&send[..1024], &mut recv[..1024], ReduceOp::Sum)?; // links are up
    if me == victim {
        std::thread::sleep(std::time::Duration::from_millis(300)); // the others are mid-collective
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).map_err(|e| Error::errno("raise SIGKILL", e))?;
        return Err(Error::protocol("SIGKILL returned"));
    }
    let started = std::time::Instant::now();
    for _ in 0..10_000 {
        match comm.all_reduce(&send, &mut recv, ReduceOp::Sum) {
            Ok(()) => continue,
            Err(e @ (Error::PeerLost { .. } | Error::Timeout { .. })) => {
                return Ok(format!("all_reduce failed after {:?} as it should: {e}", started.elapsed()));
            }
            Err(e) => return Err(e),
        }
    }
    Err(Error::protocol("10,000 all-reduces went through with a killed peer"))
}

/// A job across nodes whose last rank SIGKILLs itself `arg` milliseconds into a loop of
/// collectives with the default plans (hierarchical ones across nodes of several ranks): every
/// other rank must fail with `PeerLost` or a timeout, and says how long after the kill.
fn node_kill(delay_ms: &str) -> Result<String> {
    let delay: u64 = delay_ms.parse().map_err(|_| Error::invalid(format!("node-kill: bad delay {delay_ms:?}")))?;
    let comm = Communicator::from_env()?;
    let (me, n) = (comm.rank(), comm.world_size());
    let send = vec![1.0f32; 1 << 20];
    let mut recv = vec![0.0f32; 1 << 20];
    let mut gathered = vec![0.0f32; 4096 * n];
    comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?; // every link and sub-communicator is up
    comm.core().bootstrap().barrier()?;
    let started = std::time::Instant::now();
    if me == n - 1 {
        std::thread::sleep(std::time::Duration::from_millis(delay));
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL).map_err(|e| Error::errno("raise SIGKILL", e))?;
        return Err(Error::protocol("SIGKILL returned"));
    }
    for i in 0.. {
        let r = match i % 3 {
            0 => comm.all_reduce(&send, &mut recv, ReduceOp::Sum),
            1 => comm.all_gather(&send[..4096], &mut gathered),
            _ => comm.broadcast_in_place(&mut recv[..1000], i % n),
        };
        match r {
            Ok(()) => continue,
            Err(e @ (Error::PeerLost { .. } | Error::Timeout { .. })) => {
                let after = started.elapsed().saturating_sub(std::time::Duration::from_millis(delay));
                return Ok(format!("failed {} ms after the kill: {e}", after.as_millis()));
            }
            Err(e) => return Err(e),
        }
    }
    Err(Error::protocol("the collectives loop ended"))
}

/// The correctness matrix on a job of posed nodes (`cargo xtask multinode`, or a launcher's
/// `posed_nodes`): checks that the communicator sees the nodes the launcher made — shared
/// memory inside a node, TCP across — then runs every collective through the channel family.
fn nodes() -> Result<String> {
    let comm = Communicator::from_env()?;
    let per_node: usize = std::env::var("LOCAL_WORLD_SIZE")
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| Error::invalid("LOCAL_WORLD_SIZE is not set"))?;
    let topo = comm.core().topology();
    let (nodes, n) = (topo.node_count(), comm.world_size());
    if nodes != n / per_node.max(1) || topo.all_direct() != (nodes == 1) {
        return Err(Error::protocol(format!("{n} ranks in {nodes} nodes, all direct: {}", topo.all_direct())));
    }
    let grid = nodes > 1 && per_node > 1;
    let large = comm.algorithm_for(Collective::AllReduce, 1 << 20)?;
    if grid != (large == Algorithm::Hierarchical) {
        return Err(Error::protocol(format!("{nodes} nodes of {per_node} ranks run a 1 MiB all_reduce with {large}")));
    }
    let spec = MatrixSpec { large: Some(((1 << 20) + 5, vec![(DataType::F32, ReduceOp::Sum)])), ..MatrixSpec::ci() };
    let mut checked = run_matrix(&comm, &spec)?;
    if grid {
        checked += hierarchical_everywhere(&spec, per_node)?;
    }
    let reach = |p: usize| topo.reach(p).and_then(|r| r.preferred()).map_or("-", |t| t.name());
    let peers: Vec<String> = (0..n).filter(|&p| p != comm.rank()).map(|p| format!("{p}:{}", reach(p))).collect();
    Ok(format!("{checked} calls checked on {nodes} nodes, 1 MiB all_reduce {large} (peers {})", peers.join(" ")))
}

/// Across nodes of several ranks: the matrix with the hierarchical algorithm forced at every
/// size, then mismatched counts (by one element, and by less than the ranks per node; between
/// nodes only) and an invalid root fail on every rank, and the communicator still works.
fn hierarchical_everywhere(spec: &MatrixSpec, per_node: usize) -> Result<usize> {
    use Collective::*;
    let mut b = Communicator::builder(comm_core::bootstrap::from_env()?);
    for c in [AllReduce, AllGather, ReduceScatter, Broadcast, Reduce] {
        b = b.with_algorithm(c, Algorithm::Hierarchical);
    }
    let comm = b.build()?;
    let (me, n) = (comm.rank(), comm.world_size());
    let mut checked = run_matrix(&comm, spec)?;
    let expect_invalid = |what: &str, r: Result<()>| match r {
        Err(Error::InvalidArgument(_)) => Ok(()),
        other => Err(Error::protocol(format!("hierarchical {what}: expected InvalidArgument, got {other:?}"))),
    };
    for extra in [me, me % 2] {
        let count = 100 + extra;
        let mut buf = vec![1.0f32; count];
        expect_invalid("all_reduce of different counts", comm.all_reduce_in_place(&mut buf, ReduceOp::Sum))?;
    }
    // Counts that agree inside each node: only rail steps see the mismatch.
    let node = me / per_node;
    let mut buf = vec![1i32; 100 + node];
    expect_invalid(
        "all_reduce of counts that differ between nodes",
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum),
    )?;
    let count = 10 + me % 2;
    let mut recv = vec![0u32; count * n];
    expect_invalid("all_gather of different counts", comm.all_gather(&vec![1u32; count], &mut recv))?;
    // A small broadcast runs eagerly in every step: the invalid rank fails, and the ranks its
    // steps receive from may or may not hear of it, but none waits.
    let mut buf = vec![0u8; 64];
    let root = if me == n - 1 { n } else { 0 };
    let r = comm.broadcast_in_place(&mut buf, root);
    if me == n - 1 {
        expect_invalid("broadcast from an invalid root on one rank", r)?;
    } else if let Err(e) = r
        && !matches!(e, Error::InvalidArgument(_))
    {
        return Err(Error::protocol(format!("hierarchical broadcast beside an invalid rank: {e}")));
    }
    let mut ok = vec![me as i64; 1000];
    comm.all_reduce_in_place(&mut ok, ReduceOp::Sum)?;
    if ok.iter().any(|&v| v != (n * (n - 1) / 2) as i64) {
        return Err(Error::protocol("hierarchical all_reduce after the mismatches is wrong"));
    }
    checked += 7;
    checked += one_rail_step_per_all_reduce(&comm)?;
    checked += one_rail_step_per_small_all_gather(&comm)?;
    checked += pipelined_all_reduces(&comm)?;
    Ok(checked)
}

/// A hierarchical call (`arg`: `all_reduce` or `all_gather`) small on node 0 and larger on the
/// other nodes, with counts chosen so that the last rail's counts agree: an all-reduce of
/// 16,383 floats on node 0 (just below 64 KiB: its last rail carries them all) and of
/// 16,383 × L elsewhere (shards of 16,383, no tail); an all-gather of 4,095 floats a rank on
/// node 0 (its last rail carries L × 4,095) and of L × 4,095 elsewhere. The rail steps' forms
/// differ, so node 0's ranks fail with the mismatch instead of a wrong result, and the other
/// nodes' ranks, whose other rails wait for node 0's ranks that skipped theirs, fail within
/// the timeout. No rank returns Ok.
fn nodes_straddle(arg: &str) -> Result<String> {
    let comm = Communicator::builder(comm_core::bootstrap::from_env()?)
        .with_algorithm(Collective::AllReduce, Algorithm::Hierarchical)
        .with_algorithm(Collective::AllGather, Algorithm::Hierarchical)
        .build()?;
    let grid = comm.core().topology().node_grid().ok_or_else(|| Error::protocol("no node grid"))?;
    let (me, n, per_node) = (comm.rank(), comm.world_size(), grid.ranks_per_node);
    let node = grid.node_of(me);
    let started = std::time::Instant::now();
    let r = match arg {
        "all_reduce" => {
            let mut buf = vec![1.0f32; if node == 0 { 16383 } else { 16383 * per_node }];
            comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
        }
        "all_gather" => {
            let count = if node == 0 { 4095 } else { 4095 * per_node };
            if (n * count * 4 < (64 << 10)) == (node == 0) {
                let mut recv = vec![0.0f32; n * count];
                comm.all_gather(&vec![1.0f32; count], &mut recv)
            } else {
                return Err(Error::protocol(format!("{count} floats a rank are not on the intended side of 64 KiB")));
            }
        }
        other => return Err(Error::invalid(format!("nodes-straddle takes all_reduce or all_gather, not {other:?}"))),
    };
    let took = started.elapsed();
    let limit = 3 * comm.core().config().timeout;
    let expected = match (&r, node) {
        (Err(Error::InvalidArgument(_)), 0) => true,
        (Err(Error::Timeout { .. } | Error::PeerLost { .. }), n) => n != 0,
        _ => false,
    };
    if !expected || took > limit {
        return Err(Error::protocol(format!(
            "rank {me} (node {node}): a small-and-larger {arg:?} ended after {took:?} with {r:?}"
        )));
    }
    Ok(format!("node {node}: {} after {took:?}", r.err().map_or(String::new(), |e| e.to_string())))
}

/// Every hierarchical all-reduce below the pipelined size, small or sharded, with a tail or
/// without, in place or not, crosses the network in one rail step and gets the right sum: a
/// sharded one runs four steps inside the node and one on every rail, a small one (below
/// 64 KiB) two inside the node and one on the last local rank's rail only.
fn one_rail_step_per_all_reduce(comm: &Communicator) -> Result<usize> {
    let (me, n) = (comm.rank(), comm.world_size());
    let grid = comm.core().topology().node_grid().ok_or_else(|| Error::protocol("no node grid"))?;
    let last_local = grid.local_of(me) == grid.ranks_per_node - 1;
    let want = |i: usize| (n * (n - 1) / 2 + n * (i % 5)) as i64;
    let mut checked = 0;
    for count in [1, 3, 7, 1023, (64 << 10) / 8 - 1, (64 << 10) / 8, (64 << 10) / 8 + 3, (1 << 19) + 1] {
        for in_place in [false, true] {
            let send: Vec<i64> = (0..count).map(|i| (me + i % 5) as i64).collect();
            let mut recv = vec![0i64; count];
            let before = comm.hierarchical_steps();
            if in_place {
                recv.copy_from_slice(&send);
                comm.all_reduce_in_place(&mut recv, ReduceOp::Sum)?;
            } else {
                comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
            }
            let (intra, rail) = comm.hierarchical_steps().ok_or_else(|| Error::protocol("no hierarchical steps"))?;
            let (intra0, rail0) = before.unwrap_or((0, 0));
            let want_steps = match (count * 8 < (64 << 10), last_local) {
                (false, _) => (4, 1),
                (true, true) => (2, 1),
                (true, false) => (2, 0),
            };
            if (intra - intra0, rail - rail0) != want_steps {
                return Err(Error::protocol(format!(
                    "hierarchical all_reduce of {count} i64 ran {} node and {} rail steps, not {} and {}",
                    intra - intra0,
                    rail - rail0,
                    want_steps.0,
                    want_steps.1
                )));
            }
            if let Some(i) = (0..count).find(|&i| recv[i] != want(i)) {
                return Err(Error::protocol(format!(
                    "hierarchical all_reduce of {count} i64 (in place: {in_place}): element {i} is {} not {}",
                    recv[i],
                    want(i)
                )));
            }
            checked += 1;
        }
    }
    Ok(checked)
}

/// Every hierarchical all-gather crosses the network in one rail step and gets every block in
/// rank order: below 64 KiB of output on the last local rank's rail only, between two steps
/// in the node; larger on every rail, before one step in the node.
fn one_rail_step_per_small_all_gather(comm: &Communicator) -> Result<usize> {
    let (me, n) = (comm.rank(), comm.world_size());
    let grid = comm.core().topology().node_grid().ok_or_else(|| Error::protocol("no node grid"))?;
    let last_local = grid.local_of(me) == grid.ranks_per_node - 1;
    let value = |r: usize, i: usize| (r * 1000 + i % 977) as i64;
    let mut checked = 0;
    for count in [1, 5, 8191 / n, (64 << 10) / 8 / n, (64 << 10) / 8 / n + 1, 20_000] {
        for in_place in [false, true] {
            let mine: Vec<i64> = (0..count).map(|i| value(me, i)).collect();
            let mut recv = vec![-1i64; n * count];
            let before = comm.hierarchical_steps().unwrap_or((0, 0));
            if in_place {
                recv[me * count..(me + 1) * count].copy_from_slice(&mine);
                comm.all_gather_in_place(&mut recv)?;
            } else {
                comm.all_gather(&mine, &mut recv)?;
            }
            let (intra, rail) = comm.hierarchical_steps().ok_or_else(|| Error::protocol("no hierarchical steps"))?;
            let want_steps = match (n * count * 8 < (64 << 10), last_local) {
                (false, _) => (1, 1),
                (true, true) => (2, 1),
                (true, false) => (2, 0),
            };
            if (intra - before.0, rail - before.1) != want_steps {
                return Err(Error::protocol(format!(
                    "hierarchical all_gather of {count} i64 a rank ran {} node and {} rail steps, not {} and {}",
                    intra - before.0,
                    rail - before.1,
                    want_steps.0,
                    want_steps.1
                )));
            }
            if let Some(i) = (0..n * count).find(|&i| recv[i] != value(i / count, i % count)) {
                return Err(Error::protocol(format!(
                    "hierarchical all_gather of {count} i64 a rank (in place: {in_place}): element {i} is {}",
                    recv[i]
                )));
            }
            checked += 1;
        }
    }
    Ok(checked)
}

/// All-reduces large enough to run in chunks (`hierarchy/pipeline.rs`): out of place and in
/// place, a sum and an average, a count with a tail past the ranks per node; then counts that
/// differ by one element fail on every rank, and the communicator still works.
fn pipelined_all_reduces(comm: &Communicator) -> Result<usize> {
    let (me, n) = (comm.rank(), comm.world_size());
    let count = (10 << 20) / 4 + 3;
    let input = |r: usize, i: usize| (r + 1) as f32 + (i % 7) as f32;
    let sum = |i: usize| (n * (n + 1) / 2) as f32 + (n * (i % 7)) as f32;
    let send: Vec<f32> = (0..count).map(|i| input(me, i)).collect();
    let mut recv = vec![0.0f32; count];
    comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
    if let Some(i) = (0..count).find(|&i| recv[i] != sum(i)) {
        return Err(Error::protocol(format!("pipelined all_reduce: element {i} is {} not {}", recv[i], sum(i))));
    }
    let mut buf = send.clone();
    comm.all_reduce_in_place(&mut buf, ReduceOp::Avg)?;
    if let Some(i) = (0..count).find(|&i| buf[i] != sum(i) / n as f32) {
        return Err(Error::protocol(format!(
            "pipelined in-place avg: element {i} is {} not {}",
            buf[i],
            sum(i) / n as f32
        )));
    }
    let mut uneven = vec![1.0f32; count + me % 2];
    match comm.all_reduce_in_place(&mut uneven, ReduceOp::Sum) {
        Err(Error::InvalidArgument(_)) => {}
        other => return Err(Error::protocol(format!("pipelined all_reduce of different counts: {other:?}"))),
    }
    comm.all_reduce(&send, &mut recv, ReduceOp::Sum)?;
    if recv[count - 1] != sum(count - 1) {
        return Err(Error::protocol("pipelined all_reduce after the mismatch is wrong"));
    }
    Ok(4)
}
