"""torch.distributed check for weave's libnccl.so.2 (run by nccl/run-gpu-checks.sh).

Launched with `torchrun --nproc-per-node 2 torch_check.py OUTFILE`: runs every call below on
the NCCL backend and saves the results (rank 0 and rank 1 each write OUTFILE.rank<r>.pt).
run-gpu-checks.sh runs it once under LD_PRELOAD=libnccl.so.2 (weave) and once without (NCCL)
and compares the two with `torch_check.py --compare A B`: integer and max/min results
bitwise, float sums within tolerance. Exit status 0 when every call returned.

`torch_check.py --gloo OUTFILE` runs the same calls on CPU tensors over gloo: the reference on a
host with one GPU, where NCCL refuses two ranks. Calls gloo lacks (premul sum, avg, some dtypes)
are left out of its results, and `--compare A B --reference-subset` checks every call the
reference has (and fails if it has fewer than half of A's).
"""
import os
import sys
import time

import torch
import torch.distributed as dist


def run(out, gloo=False):
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    if gloo:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        # Ranks share the GPUs when there are fewer (weave allows it; NCCL refuses two ranks per GPU).
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
        dev = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl", device_id=dev)
    res = {}
    lacking = []

    def attempt(name, call):
        """Runs one call; on gloo a call it does not support is left out (and named)."""
        if not gloo:
            call()
            return
        try:
            call()
        except (RuntimeError, ValueError, NotImplementedError) as e:
            lacking.append(f"{name}: {str(e).splitlines()[0][:80]}")
    g = torch.Generator(device="cpu").manual_seed(1234 + rank)

    def rand(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype).to(dev)

    for name, op in [("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG), ("max", dist.ReduceOp.MAX)]:
        for dt in [torch.float32, torch.bfloat16, torch.float16]:
            t = rand(4099, dtype=dt)

            def reduce_one(t=t, op=op, key=f"all_reduce_{name}_{dt}"):
                dist.all_reduce(t, op=op)
                res[key] = t.cpu()

            attempt(f"all_reduce {name} {dt}", reduce_one)
        ti = torch.arange(1000, device=dev, dtype=torch.int64) * (rank + 1)
        if name != "avg":
            dist.all_reduce(ti, op=op)
            res[f"all_reduce_{name}_int64"] = ti.cpu()
    big = rand(1 << 22)
    dist.all_reduce(big)
    res["all_reduce_sum_16MiB"] = big.cpu()
    empty = torch.empty(0, device=dev)
    dist.all_reduce(empty)
    res["all_reduce_empty"] = empty.cpu()
    # premul sum (used by FSDP / gradient scaling): a float scalar per rank.
    t = rand(1000)
    make_premul = getattr(dist, "_make_nccl_premul_sum", None)
    if make_premul is not None and not gloo:
        dist.all_reduce(t, op=make_premul(0.5 + rank))
        res["all_reduce_premul_sum"] = t.cpu()

    src = rand(1000)
    ag = torch.empty(world * 1000, device=dev)
    dist.all_gather_into_tensor(ag, src)
    res["all_gather_into_tensor"] = ag.cpu()

    rs_in = rand(world * 1000)
    rs = torch.empty(1000, device=dev)

    def reduce_scatter():
        dist.reduce_scatter_tensor(rs, rs_in)
        res["reduce_scatter_tensor"] = rs.cpu()

    attempt("reduce_scatter_tensor", reduce_scatter)

    b = rand(3000) if rank == 1 else torch.zeros(3000, device=dev)
    dist.broadcast(b, src=1)
    res["broadcast"] = b.cpu()

    a2a_in = rand(world * 500)
    a2a = torch.empty(world * 500, device=dev)
    dist.all_to_all_single(a2a, a2a_in)
    res["all_to_all_single_even"] = a2a.cpu()
    # uneven: rank r sends (q + 1) * (r + 1) * 10 elements to rank q
    send_splits = [(q + 1) * (rank + 1) * 10 for q in range(world)]
    recv_splits = [(rank + 1) * (p + 1) * 10 for p in range(world)]
    u_in = rand(sum(send_splits))
    u_out = torch.empty(sum(recv_splits), device=dev)
    dist.all_to_all_single(u_out, u_in, output_split_sizes=recv_splits, input_split_sizes=send_splits)
    res["all_to_all_single_uneven"] = u_out.cpu()

    peer = (rank + 1) % world
    prev = (rank - 1) % world
    s1, s2 = rand(777), rand(12345)
    r1, r2 = torch.empty(777, device=dev), torch.empty(12345, device=dev)
    ops = [
        dist.P2POp(dist.isend, s1, peer),
        dist.P2POp(dist.irecv, r1, prev),
        dist.P2POp(dist.irecv, r2, prev),
        dist.P2POp(dist.isend, s2, peer),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    res["batch_isend_irecv_a"] = r1.cpu()
    res["batch_isend_irecv_b"] = r2.cpu()

    dist.barrier()
    sub = dist.new_group([0, 1])
    t = torch.full((100,), float(rank + 1), device=dev)
    dist.all_reduce(t, group=sub)
    res["new_group_all_reduce"] = t.cpu()
    only0 = dist.new_group([0])
    if rank == 0:
        t = torch.full((10,), 3.0, device=dev)
        dist.all_reduce(t, group=only0)
        res["new_group_single_rank"] = t.cpu()
    dist.barrier()
    if not gloo:
        torch.cuda.synchronize()
    dist.destroy_process_group()
    torch.save(res, f"{out}.rank{rank}.pt")
    for what in lacking:
        print(f"torch_check rank {rank}: gloo lacks {what}")
    print(f"torch_check rank {rank}: {len(res)} results saved")


def nccl_rank(elements):
    """Joins the NCCL group on this rank's GPU and runs one warm-up all-reduce of `elements`;
    returns (rank, device, the warm-up tensor)."""
    rank = int(os.environ["RANK"])
    # Ranks share the GPUs when there are fewer (weave allows it; NCCL refuses two ranks per GPU).
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", device_id=dev)
    t = torch.ones(elements, device=dev)
    dist.all_reduce(t)
    torch.cuda.synchronize()
    return rank, dev, t


def kill_peer():
    """Rank 1 dies after init; rank 0's all_reduce must fail (not hang): the caller times it."""
    rank, dev, t = nccl_rank(1 << 20)
    if rank == 1:
        os.kill(os.getpid(), 9)
    try:
        for _ in range(100):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        work = dist.all_reduce(t, async_op=True)
        work.wait()
        torch.cuda.synchronize()
        print("torch_check kill-peer: rank 0 saw no error")
        sys.exit(1)
    except Exception as e:  # noqa: BLE001 - any error is the expected outcome
        print(f"torch_check kill-peer: rank 0 got an error: {type(e).__name__}: {e}")
        sys.exit(0)


def late_peer(seconds):
    """Rank 1 comes `seconds` late to an all_reduce (as a rank saving a checkpoint would); rank 0
    waits in it. With WEAVE_TIMEOUT unset the result must be exact: the caller makes `seconds`
    longer than weave's own one-minute default."""
    rank, dev, t = nccl_rank(1 << 20)
    if rank == 1:
        time.sleep(seconds)
    t.fill_(rank + 1.0)
    start = time.monotonic()
    dist.all_reduce(t)
    torch.cuda.synchronize()
    waited = time.monotonic() - start
    exact = bool((t == 3.0).all())
    print(f"torch_check late-peer: rank {rank} waited {waited:.1f} s, all_reduce {'exact' if exact else 'WRONG'}")
    dist.destroy_process_group()
    sys.exit(0 if exact else 1)


def shrink(flags_name):
    """torch.distributed.shrink_group on three ranks, as PyTorch's own test does it: after a
    warm-up the last rank leaves (it aborts or destroys its group and exits; torchrun would stop
    every worker if one were killed); the survivors shrink it away (SHRINK_DEFAULT or
    SHRINK_ABORT), check an all-reduce of their old ranks on the new group, and destroy it. Exit
    0 on the survivors when the new group answered exactly."""
    from torch.distributed import distributed_c10d as c10d
    world = int(os.environ["WORLD_SIZE"])
    rank, dev, _ = nccl_rank(1 << 16)
    flags = getattr(c10d, flags_name)
    if rank == world - 1:
        if flags_name == "SHRINK_ABORT" and hasattr(c10d, "_abort_process_group"):
            c10d._abort_process_group()
        else:
            dist.destroy_process_group()
        print(f"torch_check shrink {flags_name}: rank {rank} left")
        sys.exit(0)
    started = __import__("time").monotonic()
    group = dist.shrink_group([world - 1], shrink_flags=flags)
    took = __import__("time").monotonic() - started
    mine = torch.full((1000,), float(rank), device=dev)
    dist.all_reduce(mine, group=group)
    torch.cuda.synchronize()
    want = float(sum(range(world - 1)))
    ok = bool(torch.all(mine == want)) and dist.get_world_size(group) == world - 1
    print(f"torch_check shrink {flags_name}: rank {rank} -> {dist.get_rank(group)} of "
          f"{dist.get_world_size(group)} in {took:.2f}s, all_reduce {'exact' if ok else 'WRONG'}")
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


def mismatched_splits():
    """The mistake every MoE user makes once, on two ranks: all_to_all_single with split sizes
    the ranks disagree on — rank 1 sends 36 elements to rank 0, whose splits expect none —
    then two correct uneven all-to-alls. Some call must fail (raise, or the watchdog's abort
    with weave's mismatch error), and the data of a call that a later call followed without
    error must be exact: never wrong data."""
    rank, dev, _ = nccl_rank(16)

    def exchange(in_splits, out_splits, label):
        inp = torch.cat([torch.arange(n, dtype=torch.float32, device=dev) + 100 * rank + 10 * p
                         for p, n in enumerate(in_splits)])
        out = torch.full((sum(out_splits),), -1.0, device=dev)
        dist.all_to_all_single(out, inp, out_splits, in_splits)
        torch.cuda.synchronize()
        # Device errors are asynchronous (as in NCCL): a kernel that found a mismatch fails the
        # next call, so the data is judged only once a later call went through.
        probe = torch.ones(1, device=dev)
        dist.all_reduce(probe)
        torch.cuda.synchronize()
        want = torch.cat([torch.arange(n, dtype=torch.float32, device=dev) + 100 * p + 10 * rank
                          for p, n in enumerate(out_splits)])
        if not torch.equal(out, want):
            print(f"torch_check mismatch: WRONG DATA on rank {rank} in {label}: {out.tolist()} != {want.tolist()}")
            sys.exit(1)

    try:
        # Rank 0 sends 4 to itself, none to rank 1, expects 4 from itself and none from rank 1;
        # rank 1 sends 36 to rank 0 (the mistake) and 4 to itself.
        if rank == 0:
            dist.all_to_all_single(torch.empty(4, device=dev), torch.zeros(4, device=dev), [4, 0], [4, 0])
        else:
            dist.all_to_all_single(torch.empty(4, device=dev), torch.ones(40, device=dev), [0, 4], [36, 4])
        torch.cuda.synchronize()
        exchange([2, 3] if rank == 0 else [5, 1], [2, 5] if rank == 0 else [3, 1], "the first correct call")
        exchange([1, 6] if rank == 0 else [2, 2], [1, 2] if rank == 0 else [6, 2], "the second correct call")
    except Exception as e:  # noqa: BLE001 - an error is the expected outcome
        print(f"torch_check mismatch: rank {rank} got an error: {type(e).__name__}: {e}")
        sys.exit(0)
    print(f"torch_check mismatch: rank {rank}: no error raised")
    sys.exit(1)


def compare(a, b, reference_subset=False):
    """Compares run A with reference run B; with `reference_subset`, B may lack calls of A."""
    bad = 0
    for rank in (0, 1):
        x = torch.load(f"{a}.rank{rank}.pt")
        y = torch.load(f"{b}.rank{rank}.pt")
        if reference_subset and 2 * len(set(x) & set(y)) < len(x):
            print(f"FAIL rank {rank}: the reference has only {len(set(x) & set(y))} of {len(x)} calls")
            bad += 1
        for k in sorted(set(x) | set(y)):
            if reference_subset and k in x and k not in y:
                print(f"skip rank {rank} {k}: not in the reference")
                continue
            if k not in x or k not in y:
                print(f"FAIL rank {rank} {k}: missing in one run")
                bad += 1
                continue
            u, v = x[k], y[k]
            exact = (not u.is_floating_point()) or "_max_" in k or "gather" in k or "broadcast" in k \
                or "to_all" in k or "isend" in k
            if u.shape != v.shape or u.dtype != v.dtype:
                ok = False
            elif exact:
                ok = torch.equal(u, v)
            else:
                tol = 1e-2 if u.dtype in (torch.float16, torch.bfloat16) else 1e-5
                ok = torch.allclose(u.float(), v.float(), rtol=tol, atol=tol)
            print(f"{'pass' if ok else 'FAIL'} rank {rank} {k}")
            bad += 0 if ok else 1
    print(f"torch_check compare: {'PASS' if bad == 0 else f'FAIL ({bad} differ)'}")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "--kill-peer":
        kill_peer()
    if len(sys.argv) == 3 and sys.argv[1] == "--late-peer":
        late_peer(float(sys.argv[2]))
    if len(sys.argv) == 2 and sys.argv[1] == "--mismatched-splits":
        mismatched_splits()
    if len(sys.argv) == 3 and sys.argv[1] == "--shrink":
        shrink(sys.argv[2])
    if len(sys.argv) in (4, 5) and sys.argv[1] == "--compare":
        sys.exit(compare(sys.argv[2], sys.argv[3], reference_subset=sys.argv[4:] == ["--reference-subset"]))
    if len(sys.argv) == 3 and sys.argv[1] == "--gloo":
        run(sys.argv[2], gloo=True)
        sys.exit(0)
    run(sys.argv[1] if len(sys.argv) > 1 else "/tmp/torch_check")
