//! One-way latency of small messages over loopback TCP: a plain socket ping-pong (what an MPI
//! library's TCP path does: one `write`, a spinning non-blocking `recv`) against weave's
//! connection (`write_and_sync` of a message and its flag, the receiver spinning on the flag
//! with `progress`), and against weave's connection as a channel link uses it (each side also
//! returns a credit with `update_lazily` before it answers: the credit rides in the same
//! `writev` as the answer), so the cost of each piece shows.
//!
//! usage: latency [ITERS] [SIZE ...]   (default 20000 round trips of 8, 64, 512 and 4096 bytes).
//! Prints `MODE SIZE USEC` per line: half the median round trip. `WEAVE_TCP_SOCKETS` sets the
//! sockets per connection, as for the collectives.
//!
//! Launched as two ranks (`RANK` and `MASTER_ADDR` set, as `cargo xtask multinode -N 2 -n 1`
//! sets them), it runs plain sockets between the two processes instead — across the nodes'
//! network: an exchange (both write, then both read, as one call of a two-rank all-reduce;
//! rank 0 prints `raw-exchange-across SIZE USEC`, the median exchange), the same exchange over
//! a socket per direction (`raw-exchange-split-across`), and the ping-pong (`raw-across SIZE
//! USEC`, half the median round trip).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use comm_core::connection::{CheckedWrite, Connection};
use comm_core::memory::RegisteredMemory;
use comm_core::testing::{patterned_source, region_of};
use comm_core::transport::TransportBackend;
use transport_tcp::{TcpBackend, TcpConfig};

/// Half the median of `rtts`, in microseconds.
fn one_way_us(mut rtts: Vec<Duration>) -> f64 {
    rtts.sort();
    rtts[rtts.len() / 2].as_secs_f64() * 1e6 / 2.0
}

/// Reads exactly `buf.len()` bytes, spinning on a non-blocking socket as a polling MPI does.
fn spin_read(s: &mut TcpStream, buf: &mut [u8]) {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => panic!("peer closed"),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => panic!("read: {e}"),
        }
    }
}

/// Times `iters` exchanges of `size` bytes: both sides write on `out`, then read the other's
/// message from `inp` (the same socket, or one that carries the other direction), as a
/// two-rank all-reduce does; each entry is one exchange as this side saw it.
fn exchange(out: &mut TcpStream, inp: &mut TcpStream, iters: usize, size: usize) -> Vec<Duration> {
    let mut message = vec![1u8; size];
    let mut buf = vec![0u8; size];
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        out.write_all(&message).expect("write");
        spin_read(inp, &mut buf);
        times.push(t.elapsed());
        message[0] = message[0].wrapping_add(1);
    }
    times
}

/// Times `iters` round trips of `size` bytes on `s`; the echoing side reads first and answers.
fn ping_pong(mut s: TcpStream, iters: usize, size: usize, echo: bool) -> Vec<Duration> {
    s.set_nodelay(true).expect("nodelay");
    s.set_nonblocking(true).expect("nonblocking");
    let mut buf = vec![1u8; size];
    let mut rtts = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        if echo {
            spin_read(&mut s, &mut buf);
            s.write_all(&buf).expect("write");
        } else {
            s.write_all(&buf).expect("write");
            spin_read(&mut s, &mut buf);
        }
        rtts.push(t.elapsed());
    }
    rtts
}

fn raw(iters: usize, size: usize) -> f64 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let echo = std::thread::spawn(move || ping_pong(listener.accept().expect("accept").0, iters, size, true));
    let rtts = ping_pong(TcpStream::connect(addr).expect("connect"), iters, size, false);
    echo.join().expect("echo thread");
    one_way_us(rtts)
}

fn backend(rank: usize) -> TcpBackend {
    let ctx = comm_core::testing::context(rank, "tcplat", Duration::from_secs(30));
    let mut config = TcpConfig::from_env().expect("WEAVE_TCP_SOCKETS");
    config.interface = Some("lo".into());
    TcpBackend::open(&ctx, config).expect("open")
}

/// One side of the ping-pong: its connection to the other side, its own region (where the
/// other side's messages and flags land) and its view of the other side's region.
struct Side {
    conn: Arc<dyn Connection>,
    mine: RegisteredMemory,
    theirs: RegisteredMemory,
    source: RegisteredMemory,
}

/// Flag offset (after the largest message) and credit offset in each region.
const FLAG: usize = 1 << 20;
const CREDIT: usize = FLAG + 64;

impl Side {
    /// Posts message `i`: `size` bytes and the flag `i` behind them.
    fn post(&self, i: u64, size: usize) {
        let write = CheckedWrite::new(&self.theirs, 0, &self.source, 0, size).expect("message range");
        self.conn.write_and_sync(write, FLAG, i).expect("post");
    }

    /// Waits for message `i` in this side's region, draining the peer's frames while it spins.
    fn wait(&self, i: u64) {
        comm_core::deferred::send_all();
        while self.mine.load_u64(FLAG).expect("flag") < i {
            self.conn.progress().expect("progress");
        }
    }
}

fn weave(iters: usize, size: usize, credits: bool) -> f64 {
    let (a, b) = (backend(0), backend(1));
    let region_len = CREDIT + 64;
    let (a_mine, b_view) = region_of(&a, 0, &b, region_len).expect("region of rank 0");
    let (b_mine, a_view) = region_of(&b, 1, &a, region_len).expect("region of rank 1");
    let side_a = Side {
        conn: a.connect(1, &b.local_endpoint().expect("endpoint")).expect("connect 0->1"),
        mine: a_mine,
        theirs: a_view,
        source: patterned_source(&a, size.max(8), 1).expect("source"),
    };
    let side_b = Side {
        conn: b.connect(0, &a.local_endpoint().expect("endpoint")).expect("connect 1->0"),
        mine: b_mine,
        theirs: b_view,
        source: patterned_source(&b, size.max(8), 2).expect("source"),
    };
    let echo = std::thread::spawn(move || {
        for i in 1..=iters as u64 {
            side_b.wait(i);
            if credits {
                side_b.conn.update_lazily(&side_b.theirs, CREDIT, i).expect("credit");
            }
            side_b.post(i, size);
        }
        side_b
    });
    let mut rtts = Vec::with_capacity(iters);
    for i in 1..=iters as u64 {
        let t = Instant::now();
        if credits && i > 1 {
            side_a.conn.update_lazily(&side_a.theirs, CREDIT, i - 1).expect("credit");
        }
        side_a.post(i, size);
        side_a.wait(i);
        rtts.push(t.elapsed());
    }
    let _side_b = echo.join().expect("echo thread");
    drop((a, b));
    one_way_us(rtts)
}

/// The plain ping-pong between two processes: rank 0 listens on `MASTER_ADDR`, port
/// `MASTER_PORT + 7`, and times round trips; rank 1 connects and echoes.
fn raw_across(rank: usize, master: &str, iters: usize, size: usize) {
    let port: u16 = std::env::var("MASTER_PORT").ok().and_then(|p| p.parse().ok()).unwrap_or(29500) + 7;
    // Two sockets between the ranks: the first carries both directions, the second and the
    // first one direction each (as a transport with a socket per direction has them).
    let mut sockets: Vec<TcpStream> = if rank == 0 {
        let listener = TcpListener::bind((master, port)).expect("bind");
        (0..2).map(|_| listener.accept().expect("accept").0).collect()
    } else {
        let started = Instant::now();
        let mut v = Vec::new();
        while v.len() < 2 {
            match TcpStream::connect((master, port)) {
                Ok(s) => v.push(s),
                Err(_) if started.elapsed() < Duration::from_secs(20) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => panic!("connect: {e}"),
            }
        }
        v
    };
    for s in &sockets {
        s.set_nodelay(true).expect("nodelay");
        s.set_nonblocking(true).expect("nonblocking");
    }
    let mut both = sockets.remove(0);
    let mut other = sockets.remove(0);
    let mut times = exchange(&mut both.try_clone().expect("clone"), &mut both, iters, size);
    let mut split = if rank == 0 {
        exchange(&mut both.try_clone().expect("clone"), &mut other, iters, size)
    } else {
        exchange(&mut other, &mut both, iters, size)
    };
    let rtts = ping_pong(both, iters, size, rank != 0);
    if rank == 0 {
        println!("raw-across {size} {:.2}", one_way_us(rtts));
        // An exchange's median, not halved: what one call of a two-rank all-reduce could take.
        println!("raw-exchange-across {size} {:.2}", 2.0 * one_way_us(std::mem::take(&mut times)));
        println!("raw-exchange-split-across {size} {:.2}", 2.0 * one_way_us(std::mem::take(&mut split)));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let iters = args.first().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let mut sizes: Vec<usize> = args.iter().skip(1).filter_map(|a| a.parse().ok()).collect();
    if sizes.is_empty() {
        sizes = vec![8, 64, 512, 4096];
    }
    if let (Some(rank), Ok(master)) =
        (std::env::var("RANK").ok().and_then(|r| r.parse::<usize>().ok()), std::env::var("MASTER_ADDR"))
    {
        for &size in &sizes {
            raw_across(rank, &master, iters, size);
        }
        return;
    }
    for &size in &sizes {
        println!("raw {size} {:.2}", raw(iters, size));
        println!("weave {size} {:.2}", weave(iters, size, false));
        println!("weave+credit {size} {:.2}", weave(iters, size, true));
    }
}
