//! The `typed` scenario: every safe typed device call on cudarc buffers (`CudaSlice`s and views)
//! against the host reference, out of place and in place; the calls on a second stream with
//! no synchronization but cudarc's events between them and the buffers' other uses; the
//! point-to-point calls and groups; and length errors, which must launch nothing (the next call
//! still agrees on every rank).

use std::sync::Arc;

use collectives::{Element, ReduceOp};
use comm_core::{Error, Result};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr, ValidAsZeroBits};
use weave_tests::matrix::{compare, fill, input, reference};

use super::{Gpu, cuda, gpu};

/// An element type the typed scenario moves through cudarc buffers.
trait Typed: Element + DeviceRepr + ValidAsZeroBits {}
impl<T: Element + DeviceRepr + ValidAsZeroBits> Typed for T {}

pub(super) fn typed() -> Result<String> {
    let g = gpu()?;
    let mut checked = 0;
    for count in [1usize, 7, 4095, 50_000, (1 << 20) + 3] {
        checked += collectives_of::<f32>(&g, count, ReduceOp::Sum)?;
    }
    checked += collectives_of::<i32>(&g, 4095, ReduceOp::Max)?;
    checked += collectives_of::<f64>(&g, 50_000, ReduceOp::Min)?;
    checked += collectives_of::<u8>(&g, 333, ReduceOp::Max)?;
    checked += collectives_of::<f32>(&g, 1000, ReduceOp::Avg)?;
    checked += point_to_point(&g, 300_001)?;
    checked += point_to_point(&g, 0)?;
    checked += ordered_by_events(&g)?;
    checked += length_errors(&g)?;
    Ok(format!("{checked} typed device calls checked"))
}

/// A buffer holding `v` (callers never upload nothing: a zero-byte allocation may fail).
fn up<T: Typed>(g: &Gpu, v: &[T]) -> Result<CudaSlice<T>> {
    g.stream.clone_htod(v).map_err(cuda("upload"))
}

/// `len` zeros (at least one element: empty buffers are views of these).
fn zeros<T: Typed>(g: &Gpu, len: usize) -> Result<CudaSlice<T>> {
    g.stream.alloc_zeros(len.max(1)).map_err(cuda("alloc"))
}

/// Waits for the stream, checks the GPU path, and downloads `buf`.
fn down<T: Typed>(g: &Gpu, buf: &impl DevicePtr<T>) -> Result<Vec<T>> {
    g.sync()?;
    g.stream.clone_dtoh(buf).map_err(cuda("download"))
}

/// Every collective of the typed API on `count` elements (per block) of `T` with `op`.
fn collectives_of<T: Typed>(g: &Gpu, count: usize, op: ReduceOp) -> Result<usize> {
    let (me, n, s) = (g.comm.rank(), g.comm.world_size(), &g.stream);
    let d = T::DTYPE;
    let tag = |c: &str| format!("{c} {} {} count {count} on {n} ranks (rank {me})", d.name(), op.name());
    let all = |i: usize| reference::<T>(op, (0..n).map(|r| input(d, op, r, i)));
    let own = |r: usize, i: usize| T::from_f64(input(d, op, r, i)).to_f64();
    let mine = |len: usize| up(g, &fill::<T>(d, op, me, len));

    let send = mine(count)?;
    let mut recv = zeros::<T>(g, count)?;
    g.comm.all_reduce_device(&send, &mut recv, op, s)?;
    compare(&tag("all_reduce_device"), &down(g, &recv)?, all)?;
    let mut buf = mine(count)?;
    g.comm.all_reduce_device_in_place(&mut buf, op, s)?;
    compare(&tag("all_reduce_device_in_place"), &down(g, &buf)?, all)?;

    let send = mine(n * count)?;
    let mut recv = zeros::<T>(g, count)?;
    g.comm.reduce_scatter_device(&send, &mut recv, op, s)?;
    compare(&tag("reduce_scatter_device"), &down(g, &recv)?, |i| all(me * count + i))?;
    let mut buf = mine(n * count)?;
    g.comm.reduce_scatter_device_in_place(&mut buf, op, s)?;
    let whole = down(g, &buf)?;
    compare(&tag("reduce_scatter_device_in_place"), &whole[me * count..(me + 1) * count], |i| all(me * count + i))?;

    // Reduce to a moving root; the other ranks pass a one-element recv, and keep their input.
    let root = count % n;
    let send = mine(count)?;
    let mut recv = zeros::<T>(g, if me == root { count } else { 1 })?;
    g.comm.reduce_device(&send, &mut recv, op, root, s)?;
    if me == root {
        compare(&tag("reduce_device"), &down(g, &recv)?, all)?;
    }
    compare(&tag("reduce_device leaves send"), &down(g, &send)?, |i| own(me, i))?;
    let mut buf = mine(count)?;
    g.comm.reduce_device_in_place(&mut buf, op, root, s)?;
    let got = down(g, &buf)?;
    if me == root {
        compare(&tag("reduce_device_in_place"), &got, all)?;
    } else {
        compare(&tag("reduce_device_in_place on a non-root"), &got, |i| own(me, i))?;
    }

    let send = mine(count)?;
    let mut recv = zeros::<T>(g, n * count)?;
    g.comm.all_gather_device(&send, &mut recv, s)?;
    compare(&tag("all_gather_device"), &down(g, &recv)?, |j| own(j / count, j % count))?;
    let mut staged = vec![T::default(); n * count];
    staged[me * count..(me + 1) * count].copy_from_slice(&fill::<T>(d, op, me, count));
    let mut buf = up(g, &staged)?;
    g.comm.all_gather_device_in_place(&mut buf, s)?;
    compare(&tag("all_gather_device_in_place"), &down(g, &buf)?, |j| own(j / count, j % count))?;

    // Broadcast from a moving root; the other ranks pass a one-element send.
    let root = (count / 2) % n;
    let send = if me == root { mine(count)? } else { zeros::<T>(g, 1)? };
    let mut recv = zeros::<T>(g, count)?;
    g.comm.broadcast_device(&send, &mut recv, root, s)?;
    compare(&tag("broadcast_device"), &down(g, &recv)?, |i| own(root, i))?;
    let mut buf = if me == root { mine(count)? } else { zeros::<T>(g, count)? };
    g.comm.broadcast_device_in_place(&mut buf, root, s)?;
    compare(&tag("broadcast_device_in_place"), &down(g, &buf)?, |i| own(root, i))?;

    let send = mine(n * count)?;
    let mut recv = zeros::<T>(g, n * count)?;
    g.comm.all_to_all_device(&send, &mut recv, s)?;
    let exchanged = |j: usize| own(j / count, me * count + j % count);
    compare(&tag("all_to_all_device"), &down(g, &recv)?, exchanged)?;
    let mut buf = mine(n * count)?;
    g.comm.all_to_all_device_in_place(&mut buf, s)?;
    compare(&tag("all_to_all_device_in_place"), &down(g, &buf)?, exchanged)?;

    Ok(12 + all_to_allv::<T>(g, count, &tag)?)
}

/// all_to_allv_device (host counts) and all_to_allv_device_counts (device arrays) on uneven
/// blocks with gaps between them.
fn all_to_allv<T: Typed>(g: &Gpu, count: usize, tag: &dyn Fn(&str) -> String) -> Result<usize> {
    let (me, n) = (g.comm.rank(), g.comm.world_size());
    let d = T::DTYPE;
    let split =
        |p: usize, q: usize| if (p + q + count).is_multiple_of(3) { 0 } else { count / (1 + (p + 2 * q) % 3) + 1 };
    let displs = |counts: &[usize]| -> Vec<usize> {
        counts.iter().scan(0, |at, c| Some(std::mem::replace(at, *at + c + 1))).collect()
    };
    let send_counts: Vec<usize> = (0..n).map(|q| split(me, q)).collect();
    let recv_counts: Vec<usize> = (0..n).map(|p| split(p, me)).collect();
    let (sd, rd) = (displs(&send_counts), displs(&recv_counts));
    let send = up(g, &fill::<T>(d, ReduceOp::Sum, me, sd[n - 1] + send_counts[n - 1] + 1))?;
    let recv_len = rd[n - 1] + recv_counts[n - 1] + 1;
    let check = |what: &str, got: &[T]| -> Result<()> {
        for p in 0..n {
            let theirs = displs(&(0..n).map(|q| split(p, q)).collect::<Vec<_>>());
            let block = &got[rd[p]..rd[p] + recv_counts[p]];
            compare(&tag(&format!("{what} from {p}")), block, |i| {
                T::from_f64(input(d, ReduceOp::Sum, p, theirs[me] + i)).to_f64()
            })?;
        }
        Ok(())
    };
    let mut recv = zeros::<T>(g, recv_len)?;
    g.comm.all_to_allv_device(&send, &send_counts, &sd, &mut recv, &recv_counts, &rd, &g.stream)?;
    check("all_to_allv_device", &down(g, &recv)?)?;
    let words = |v: &[usize]| up(g, &v.iter().map(|&x| x as u64).collect::<Vec<u64>>());
    let arrays = [words(&send_counts)?, words(&sd)?, words(&recv_counts)?, words(&rd)?];
    let longest = (0..n).flat_map(|p| (0..n).map(move |q| (p, q))).map(|(p, q)| split(p, q)).max().unwrap_or(0);
    let mut recv = zeros::<T>(g, recv_len)?;
    // SAFETY: the arrays describe blocks inside `send` and `recv` with disjoint receive blocks
    // (the host-count call above checked the same layout).
    unsafe {
        g.comm.all_to_allv_device_counts(
            &send,
            &mut recv,
            [&arrays[0], &arrays[1], &arrays[2], &arrays[3]],
            longest,
            &g.stream,
        )?
    };
    check("all_to_allv_device_counts", &down(g, &recv)?)?;
    Ok(2)
}

/// A ring shift through views of larger buffers (one group step), a group of n − 1 steps
/// (step k: send to rank + k, receive from rank − k), then rank 0 sending to every rank with
/// `send_device` / `recv_device`.
fn point_to_point(g: &Gpu, count: usize) -> Result<usize> {
    let (me, n) = (g.comm.rank(), g.comm.world_size());
    let value = |from: usize, to: usize, i: usize| ((from * 31 + to * 7) * 1_000_003 + i) as i32;
    let tag = |c: &str| format!("{c} of {count} i32 on {n} ranks (rank {me})");
    // Ring shift between the middle thirds of two buffers; the outer thirds must stay zero.
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let mut staged = vec![0i32; 3 * count + 1];
    staged[count..2 * count].iter_mut().enumerate().for_each(|(i, v)| *v = value(me, next, i));
    let big = up(g, &staged)?;
    let mut out = zeros::<i32>(g, 3 * count + 1)?;
    {
        let from = big.slice(count..2 * count);
        let mut into = out.slice_mut(count..2 * count);
        let mut group = g.comm.device_group(&g.stream);
        group.send(&from, next).recv(&mut into, prev);
        group.run()?;
    }
    let want = |j: usize| if (count..2 * count).contains(&j) { f64::from(value(prev, me, j - count)) } else { 0.0 };
    compare(&tag("ring shift through views"), &down(g, &out)?, want)?;
    // n − 1 steps, each a send and the receive it waits for (views of `count` elements).
    let message = |to: usize| up(g, &(0..count.max(1)).map(|i| value(me, to, i)).collect::<Vec<_>>());
    let sends: Vec<CudaSlice<i32>> = (1..n).map(|k| message((me + k) % n)).collect::<Result<_>>()?;
    let mut recvs: Vec<CudaSlice<i32>> = (1..n).map(|_| zeros::<i32>(g, count)).collect::<Result<_>>()?;
    {
        let send_views: Vec<_> = sends.iter().map(|b| b.slice(0..count)).collect();
        let mut recv_views: Vec<_> = recvs.iter_mut().map(|b| b.slice_mut(0..count)).collect();
        let mut group = g.comm.device_group(&g.stream);
        for (k, (send, recv)) in send_views.iter().zip(recv_views.iter_mut()).enumerate() {
            group.send(send, (me + k + 1) % n).recv(recv, (me + n - k - 1) % n);
        }
        group.run()?;
    }
    for (k, recv) in recvs.iter().enumerate() {
        let from = (me + n - k - 1) % n;
        compare(&tag(&format!("group step {k}")), &down(g, recv)?[..count], |i| f64::from(value(from, me, i)))?;
    }
    // Rank 0 to every other rank, one call each (the buffer dropped at once: cudarc frees it
    // after the send, in stream order).
    if me == 0 {
        for q in 1..n {
            let buf = up(g, &(0..count.max(1)).map(|i| value(0, q, i)).collect::<Vec<_>>())?;
            g.comm.send_device(&buf.slice(0..count), q, &g.stream)?;
        }
        g.sync()?;
    } else {
        let mut buf = zeros::<i32>(g, count)?;
        g.comm.recv_device(&mut buf.slice_mut(0..count), 0, &g.stream)?;
        compare(&tag("send_device / recv_device"), &down(g, &buf)?[..count], |i| f64::from(value(0, me, i)))?;
    }
    Ok(n + 1)
}

/// Calls on a second stream with nothing but cudarc's events between them and the first
/// stream's uploads, overwrites and downloads: the guards must record the collective into the
/// buffers' events after its launch, or these reads and writes race with it.
fn ordered_by_events(g: &Gpu) -> Result<usize> {
    let (me, n) = (g.comm.rank(), g.comm.world_size());
    let ctx = g.comm.gpu_context().ok_or_else(|| Error::Unsupported("no GPU context".into()))?;
    let other: Arc<CudaStream> = ctx.new_stream().map_err(cuda("second stream"))?;
    let count = 16 << 20;
    let sum = |i: usize| (0..n).map(|r| ((r + i) % 13) as f64).sum::<f64>();
    let mine: Vec<f32> = (0..count).map(|i| ((me + i) % 13) as f32).collect();
    let mut send = up(g, &mine)?;
    let mut recv = zeros::<f32>(g, count)?;
    for round in 0..3 {
        g.comm.all_reduce_device(&send, &mut recv, ReduceOp::Sum, &other)?;
        // The overwrite waits for the collective's read of `send` (its read event) …
        g.stream.memcpy_htod(&vec![-1.0f32; count], &mut send).map_err(cuda("overwrite send"))?;
        // … and this download for its write of `recv`; `other` is synchronized only after.
        let got = g.stream.clone_dtoh(&recv).map_err(cuda("download"))?;
        other.synchronize().map_err(cuda("synchronize the second stream"))?;
        g.comm.check_gpu()?;
        compare(&format!("all_reduce_device on a second stream, round {round} (rank {me})"), &got, sum)?;
        g.stream.memcpy_htod(&mine, &mut send).map_err(cuda("restore send"))?;
    }
    let mut buf = up(g, &mine)?;
    g.comm.all_reduce_device_in_place(&mut buf, ReduceOp::Sum, &other)?;
    let got = g.stream.clone_dtoh(&buf).map_err(cuda("download"))?;
    other.synchronize().map_err(cuda("synchronize the second stream"))?;
    g.comm.check_gpu()?;
    compare(&format!("all_reduce_device_in_place on a second stream (rank {me})"), &got, sum)?;
    Ok(4)
}

/// Every rank makes the same mistakes: each call must fail with InvalidArgument naming it, launch
/// nothing, and leave the communicator in step (the next all-reduce is checked).
fn length_errors(g: &Gpu) -> Result<usize> {
    let (me, n, s) = (g.comm.rank(), g.comm.world_size(), &g.stream);
    let expect = |call: &str, r: Result<()>| match r {
        Err(Error::InvalidArgument(m)) if m.contains(call) => Ok(()),
        Err(e) => Err(Error::protocol(format!("{call} with bad arguments: expected InvalidArgument, got {e}"))),
        Ok(()) => Err(Error::protocol(format!("{call} with bad arguments succeeded"))),
    };
    let ten = zeros::<f32>(g, 10)?;
    let mut eleven = zeros::<f32>(g, 11)?;
    expect("all_reduce_device", g.comm.all_reduce_device(&ten, &mut eleven, ReduceOp::Sum, s))?;
    expect("all_gather_device", g.comm.all_gather_device(&ten, &mut eleven, s))?;
    expect(
        "reduce_scatter_device",
        g.comm.reduce_scatter_device(&eleven, &mut zeros::<f32>(g, 10)?, ReduceOp::Sum, s),
    )?;
    expect("reduce_scatter_device_in_place", g.comm.reduce_scatter_device_in_place(&mut eleven, ReduceOp::Sum, s))?;
    expect("all_to_all_device", g.comm.all_to_all_device(&ten, &mut eleven, s))?;
    expect("broadcast_device_in_place", g.comm.broadcast_device_in_place(&mut eleven, n, s))?;
    // Only the root checks recv's length (the others would launch): they pass a bad root.
    let root = if me == 0 { 0 } else { n };
    expect("reduce_device", g.comm.reduce_device(&ten, &mut eleven, ReduceOp::Sum, root, s))?;
    let (counts, displs) = (vec![1; n + 1], vec![0; n + 1]);
    expect("all_to_allv_device", g.comm.all_to_allv_device(&ten, &counts, &displs, &mut eleven, &counts, &displs, s))?;
    let mut group = g.comm.device_group(s);
    group.send(&ten, (me + 1) % n).recv(&mut eleven, me);
    expect("device group", group.run())?;
    let mut buf = up(g, &vec![1.0f32 + me as f32; 1000])?;
    g.comm.all_reduce_device_in_place(&mut buf, ReduceOp::Sum, s)?;
    compare("all_reduce_device after the errors", &down(g, &buf)?, |_| (n * (n + 1) / 2) as f64)?;
    Ok(10)
}
