"""The SGLang pattern on weave's libnccl, through ctypes as SGLang's pynccl binds it.

Run with torchrun (2 ranks; they may share one GPU), LD_PRELOAD naming libnccl.so.2 or
WEAVE_NCCL_LIB its path:

    torchrun --nproc-per-node 2 windows_check.py OUT_DIR

Two communicators over the same ranks (two unique ids, handed out over gloo), each with its own
symmetric-memory pool (a torch CUDA tensor) registered with ncclCommWindowRegister
(NCCL_WIN_COLL_SYMMETRIC); pool A is also registered with communicator B (a block reused across
groups, SGLang's bug: each group must use its own window on it). 1,000 all-reduces, the two
communicators' calls in flight at once on two streams, in and out of place, sizes 1 element to
1 MiB, each checked exactly. Then: a window deregistered with the wrong communicator is
ncclInvalidArgument. Registered buffers (ncclCommRegister, local on each rank, at offsets that
differ between ranks, on a third communicator): 300 all-reduces exact with no workspace area made
(the zero-copy check), the wrong communicator's ncclCommDeregister refused, and after
deregistering calls copy and are exact. A splitShare family (ncclCommInitRankConfig with
splitShare = 1, then ncclCommSplit keeping every rank in order): the split's calls grow the
parent's memory (one communicator), 400 all-reduces alternating parent and split on two streams
in flight at once are exact, a split reordering the ranks has memory of its own, and the split
works on after its parent and the stream of the parent's last call are destroyed.
ncclCommMemStats, ncclCommSuspend and ncclCommResume (a call while suspended fails, calls after
resume are exact); ncclGroupSimulateEnd on a group of device all-reduces (an estimate above 0,
nothing run); and the GPU memory this process uses (nvidia-smi) after communicator init, after
an 8-byte all-reduce and after a 256 MiB one. A stream destroyed once its call is done is never
touched by the communicator's next call on another stream. A group of one communicator's calls
on two streams waits for both streams' earlier work, and both streams wait for the group. A
group over two communicators on one stream runs exactly (their work reaches the stream in one
order on every rank). One process drives two ranks (ncclCommInitAll): their splits made in
one group, then grouped all-reduces on them exact, the current device unchanged. A graph's
run of an all-reduce and an eager all-reduce of one communicator on two streams, launched
together, are both exact (ordered as NCCL orders them). Last,
nothing left behind: ten rounds of a communicator made, used (window, registered buffer,
copying calls) and destroyed (the last five without deregistering first) leave the memory
outside torch's allocator where the first round left it. Writes OUT_DIR/windows-rank<r>.json and prints "windows: ..." lines; exits non-zero on
any failure.
"""

import ctypes
import json
import os
import subprocess
import sys

import torch
import torch.distributed as dist

NCCL_FLOAT32 = 7
NCCL_SUM, NCCL_MAX = 0, 2
NCCL_WIN_COLL_SYMMETRIC = 1
NCCL_SUSPEND_MEM = 1
STATS = {"suspend": 0, "suspended": 1, "persist": 2, "total": 3}
NCCL_INVALID_ARGUMENT = 4


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


class SimInfo(ctypes.Structure):
    """ncclSimInfo_t as NCCL_SIM_INFO_INITIALIZER sets it up."""
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("estimatedTime", ctypes.c_float)]


SIM_INFO_MAGIC = 0x74685283
API_MAGIC = 0xcafebeef
CONFIG_UNDEF_INT = -2147483648


class Config(ctypes.Structure):
    """ncclConfig_t (2.28/2.29)."""
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("blocking", ctypes.c_int), ("cgaClusterSize", ctypes.c_int), ("minCTAs", ctypes.c_int),
                ("maxCTAs", ctypes.c_int), ("netName", ctypes.c_char_p), ("splitShare", ctypes.c_int),
                ("trafficClass", ctypes.c_int), ("commName", ctypes.c_char_p), ("collnetEnable", ctypes.c_int),
                ("CTAPolicy", ctypes.c_int), ("shrinkShare", ctypes.c_int), ("nvlsCTAs", ctypes.c_int),
                ("nChannelsPerNetPeer", ctypes.c_int), ("nvlinkCentricSched", ctypes.c_int)]


def config(**fields):
    """A config as NCCL_CONFIG_INITIALIZER leaves it, with `fields` set."""
    c = Config()
    c.size, c.magic, c.version = ctypes.sizeof(Config), API_MAGIC, 22902
    for name, kind in Config._fields_[3:]:
        if kind is ctypes.c_int:
            setattr(c, name, CONFIG_UNDEF_INT)
    for name, value in fields.items():
        setattr(c, name, value)
    return c


def load():
    path = os.environ.get("WEAVE_NCCL_LIB", "libnccl.so.2")
    lib = ctypes.CDLL(path)
    lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
    lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_void_p, ctypes.c_void_p]
    lib.ncclCommWindowRegister.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                           ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
    lib.ncclCommWindowDeregister.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.ncclCommRegister.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                     ctypes.POINTER(ctypes.c_void_p)]
    lib.ncclCommDeregister.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.ncclCommMemStats.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)]
    lib.ncclCommSuspend.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.ncclCommResume.argtypes = [ctypes.c_void_p]
    lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]
    lib.ncclCommInitRankConfig.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int,
                                           ctypes.POINTER(Config)]
    lib.ncclCommSplit.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                                  ctypes.POINTER(Config)]
    lib.ncclGroupSimulateEnd.argtypes = [ctypes.POINTER(SimInfo)]
    lib.ncclCommInitAll.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    lib.ncclCommUserRank.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    lib.ncclGetErrorString.restype = ctypes.c_char_p
    lib.ncclGetLastError.restype = ctypes.c_char_p
    lib.ncclGetLastError.argtypes = [ctypes.c_void_p]
    return lib


def check(lib, rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: {lib.ncclGetErrorString(rc).decode()} ({rc}): {lib.ncclGetLastError(None).decode()}")


def process_gpu_mib():
    """This process's GPU memory as nvidia-smi reports it (MiB), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for row in out.splitlines():
        parts = [p.strip() for p in row.split(",")]
        if len(parts) == 2 and parts[0] == str(os.getpid()):
            return int(parts[1])
    return None


def cu(rc, what):
    """Raises unless a CUDA driver call (libcuda, for streams the checks make and destroy
    themselves) returned CUDA_SUCCESS."""
    if rc != 0:
        raise RuntimeError(f"{what}: CUresult {rc}")


def new_comm(lib, rank, world, cfg=None):
    uid = UniqueId()
    if rank == 0:
        check(lib, lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
    box = [bytes(uid.internal)]
    dist.broadcast_object_list(box, src=0)
    ctypes.memmove(uid.internal, box[0], 128)
    comm = ctypes.c_void_p()
    if cfg is None:
        check(lib, lib.ncclCommInitRank(ctypes.byref(comm), world, uid, rank), "ncclCommInitRank")
    else:
        check(lib, lib.ncclCommInitRankConfig(ctypes.byref(comm), world, uid, rank, ctypes.byref(cfg)),
              "ncclCommInitRankConfig")
    return comm


def stat(lib, comm, name):
    v = ctypes.c_uint64()
    check(lib, lib.ncclCommMemStats(comm, STATS[name], ctypes.byref(v)), f"ncclCommMemStats({name})")
    return v.value


def expected(call, world, count, op):
    i = torch.arange(count, dtype=torch.int64)
    vals = torch.stack([((i * 7 + call * 3 + r * 5) % 13) for r in range(world)]).to(torch.float32)
    return vals.sum(0) if op == NCCL_SUM else vals.max(0).values


def registered(lib, rank, world, wrong_comm, report):
    """ncclCommRegister on a communicator of its own: see the module doc."""
    comm = new_comm(lib, rank, world)
    created = stat(lib, comm, "total")
    buf_elems = 2 << 20
    buf = torch.zeros(buf_elems, dtype=torch.float32, device="cuda")
    handle = ctypes.c_void_p()
    check(lib, lib.ncclCommRegister(comm, buf.data_ptr(), buf_elems * 4, ctypes.byref(handle)), "ncclCommRegister")
    stream = torch.cuda.current_stream()
    counts = [1, 5, 1000, 4096, 16383, 65536, 100003, 262144]
    start = 64 + rank * 1024  # a different offset on every rank

    def all_reduce(seed, count, in_place, comm_used):
        send = buf[start:start + count]
        recv = send if in_place else buf[start + (1 << 20): start + (1 << 20) + count]
        op = NCCL_MAX if seed % 2 else NCCL_SUM
        i = torch.arange(count, device="cuda", dtype=torch.int64)
        send.copy_(((i * 7 + seed * 3 + rank * 5) % 13).to(torch.float32))
        check(lib, lib.ncclAllReduce(send.data_ptr(), recv.data_ptr(), count, NCCL_FLOAT32, op, comm_used,
                                     stream.cuda_stream), "ncclAllReduce on a registered buffer")
        stream.synchronize()
        want = expected(seed, world, count, op)
        got = recv.cpu()
        if not torch.equal(got, want):
            bad = int((got != want).nonzero()[0])
            raise RuntimeError(f"registered all-reduce #{seed} of {count} f32: element {bad} is {got[bad]}, "
                               f"not {want[bad]}")

    for call in range(300):
        all_reduce(call, counts[call % len(counts)], call % 3 == 0, comm)
    report["registered_calls_exact"] = 300
    after = stat(lib, comm, "total")
    report["registered_stats_total"] = [created, after]
    if after != created:
        raise RuntimeError(f"all-reduces on registered buffers made workspace areas: {created} -> {after} B")
    rc = lib.ncclCommDeregister(wrong_comm, handle)
    if rc != NCCL_INVALID_ARGUMENT:
        raise RuntimeError(f"deregistering with another communicator gave {rc}, not ncclInvalidArgument")
    check(lib, lib.ncclCommDeregister(comm, handle), "ncclCommDeregister")
    all_reduce(7, 262144, False, comm)
    report["registered_stats_total_after_deregister_and_1MiB"] = stat(lib, comm, "total")
    if report["registered_stats_total_after_deregister_and_1MiB"] <= created:
        raise RuntimeError("after ncclCommDeregister a 1 MiB all-reduce made no workspace area (did it copy?)")
    check(lib, lib.ncclCommDestroy(comm), "ncclCommDestroy")


def family(lib, rank, world, report):
    """A splitShare family: see the module doc."""
    parent = new_comm(lib, rank, world, config(splitShare=1))

    def split(key):
        child = ctypes.c_void_p()
        check(lib, lib.ncclCommSplit(parent, 0, key, ctypes.byref(child), None), "ncclCommSplit")
        return child

    child, reordered = split(rank), split(-rank)
    created = stat(lib, parent, "total")
    elems = 1 << 20
    bufs = [torch.zeros(2 * elems, dtype=torch.float32, device="cuda") for _ in range(2)]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    counts = [1, 7, 1000, 4096, 16383, 65536, 100003, 262144]

    def all_reduce(comm, lane, seed, count, stream=None):
        buf, stream = bufs[lane], stream or streams[lane]
        op = NCCL_MAX if seed % 2 else NCCL_SUM
        send, recv = buf[:count], buf[elems:elems + count]
        with torch.cuda.stream(stream):
            i = torch.arange(count, device="cuda", dtype=torch.int64)
            send.copy_(((i * 7 + seed * 3 + rank * 5) % 13).to(torch.float32))
            check(lib, lib.ncclAllReduce(send.data_ptr(), recv.data_ptr(), count, NCCL_FLOAT32, op, comm,
                                         stream.cuda_stream), "ncclAllReduce in a splitShare family")
        return stream, recv, seed, count, op

    def verify(pending):
        for stream, recv, seed, count, op in pending:
            stream.synchronize()
            want, got = expected(seed, world, count, op), recv.cpu()
            if not torch.equal(got, want):
                bad = int((got != want).nonzero()[0])
                raise RuntimeError(f"family all-reduce #{seed} of {count} f32: element {bad} is {got[bad]}, "
                                   f"not {want[bad]}")

    # The split's 1 MiB call makes workspace areas: the parent holds them too (one communicator).
    verify([all_reduce(child, 1, 1, 262144)])
    shared = (stat(lib, parent, "total"), stat(lib, child, "total"))
    report["family_stats_total"] = {"created": created, "parent": shared[0], "split": shared[1]}
    if shared[0] != shared[1] or shared[0] <= created:
        raise RuntimeError(f"the split's calls did not grow its parent's memory: {report['family_stats_total']}")
    # Parent and split in flight at once on two streams, 400 calls.
    for call in range(200):
        count = counts[call % len(counts)]
        verify([all_reduce(parent, 0, 2 * call, count), all_reduce(child, 1, 2 * call + 1, count)])
    report["family_calls_exact"] = 400
    # A split that reorders the ranks is a communicator of its own.
    family_total = stat(lib, parent, "total")
    verify([all_reduce(reordered, 0, 3, 262144)])
    report["family_reordered_total"] = stat(lib, reordered, "total")
    if stat(lib, parent, "total") != family_total:
        raise RuntimeError("a call of the reordered split grew the family's memory")
    # The split outlives its parent, and the stream of the parent's last call: once that call is
    # done the program may destroy its stream (NCCL never looks at it again), and the split's next
    # call, on another stream, must not wait for it.
    cuda = ctypes.CDLL("libcuda.so.1")
    temp = ctypes.c_void_p()
    cu(cuda.cuStreamCreate(ctypes.byref(temp), 0), "cuStreamCreate")
    verify([all_reduce(parent, 0, 4, 65536, torch.cuda.ExternalStream(temp.value))])
    check(lib, lib.ncclCommDestroy(parent), "ncclCommDestroy(parent of a family)")
    cu(cuda.cuStreamDestroy_v2(temp), "cuStreamDestroy")
    verify([all_reduce(child, 1, 5, 100003)])
    for comm in (child, reordered):
        check(lib, lib.ncclCommDestroy(comm), "ncclCommDestroy")
    report["family_split_after_parent"] = "exact"


def destroyed_streams(lib, rank, world, report):
    """A stream destroyed once its call is done (legal in NCCL): a communicator's next call, on
    another stream, must not touch it. Twenty rounds of: stream A made, an all-reduce on it,
    synchronized; stream B made (so its handle differs from A's); A destroyed; an all-reduce on
    B, exact; B destroyed."""
    cuda = ctypes.CDLL("libcuda.so.1")
    comm = new_comm(lib, rank, world)
    buf = torch.zeros(2 << 16, dtype=torch.float32, device="cuda")
    count = 1 << 16

    for round_ in range(20):
        streams = [ctypes.c_void_p(), ctypes.c_void_p()]
        cu(cuda.cuStreamCreate(ctypes.byref(streams[0]), 0), "cuStreamCreate")
        for i, stream in enumerate(streams):
            if i == 1:
                cu(cuda.cuStreamCreate(ctypes.byref(stream), 0), "cuStreamCreate")
                cu(cuda.cuStreamDestroy_v2(streams[0]), "cuStreamDestroy")
            buf[:count].fill_(float(rank + round_ + i))
            torch.cuda.synchronize()
            check(lib, lib.ncclAllReduce(buf.data_ptr(), buf[count:].data_ptr(), count, NCCL_FLOAT32, NCCL_SUM, comm,
                                         stream), "all-reduce on a fresh stream")
            cu(cuda.cuStreamSynchronize(stream), "cuStreamSynchronize")
            want = float(sum(r + round_ + i for r in range(world)))
            if not bool((buf[count:] == want).all()):
                raise RuntimeError(f"all-reduce on a fresh stream (round {round_}, stream {i}) is wrong")
        cu(cuda.cuStreamDestroy_v2(streams[1]), "cuStreamDestroy")
    check(lib, lib.ncclCommDestroy(comm), "ncclCommDestroy (destroyed streams)")
    report["destroyed_streams_calls_exact"] = 40


def group_on_two_streams(lib, rank, world, report):
    """One group of a communicator's calls on two streams: the group waits for the work each
    stream had before it, and each stream waits for the whole group. Twenty rounds of: inputs
    filled on their own streams (no device-wide synchronization), a group of two 16 MiB
    all-reduces, one per stream, then both results compared exactly on one of the two streams
    alone (each in turn)."""
    comm = new_comm(lib, rank, world)
    count = 4 << 20
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    bufs = [torch.zeros(2 * count, dtype=torch.float32, device="cuda") for _ in streams]
    torch.cuda.synchronize()
    for round_ in range(20):
        for lane, (stream, buf) in enumerate(zip(streams, bufs)):
            with torch.cuda.stream(stream):
                buf[:count].fill_(float(rank + round_ + 10 * lane))
                buf[count:].fill_(-1.0)
        check(lib, lib.ncclGroupStart(), "ncclGroupStart (two streams)")
        for stream, buf in zip(streams, bufs):
            check(lib, lib.ncclAllReduce(buf.data_ptr(), buf[count:].data_ptr(), count, NCCL_FLOAT32, NCCL_SUM, comm,
                                         stream.cuda_stream), "all-reduce in a group on two streams")
        check(lib, lib.ncclGroupEnd(), "ncclGroupEnd (two streams)")
        # The comparisons run on the one stream (torch's default stream would wait for both).
        with torch.cuda.stream(streams[round_ % 2]):
            exact = [bool((buf[count:] == float(sum(r + round_ + 10 * lane for r in range(world)))).all())
                     for lane, buf in enumerate(bufs)]
        for lane, ok in enumerate(exact):
            if not ok:
                raise RuntimeError(f"group on two streams, round {round_}: the result on stream {lane} is wrong "
                                   f"after synchronizing stream {round_ % 2} alone")
    torch.cuda.synchronize()
    check(lib, lib.ncclCommDestroy(comm), "ncclCommDestroy (group on two streams)")
    report["group_on_two_streams_calls_exact"] = 40


def group_over_two_communicators_on_one_stream(lib, rank, world, report):
    """One group over two communicators whose calls share one stream: their work must reach the
    stream in the same order on every rank (else each rank's first kernel waits for a peer's
    kernel queued behind the other communicator's). Thirty rounds of a group of three 4 MiB
    all-reduces (A, B, A) on one stream, each result exact."""
    comms = [new_comm(lib, rank, world), new_comm(lib, rank, world)]
    count = 1 << 20
    stream = torch.cuda.Stream()
    bufs = [torch.zeros(count, dtype=torch.float32, device="cuda") for _ in range(3)]
    for round_ in range(30):
        with torch.cuda.stream(stream):
            for i, buf in enumerate(bufs):
                buf.fill_(float(rank + round_ + 100 * i))
        check(lib, lib.ncclGroupStart(), "ncclGroupStart (two communicators, one stream)")
        for i, buf in enumerate(bufs):
            check(lib, lib.ncclAllReduce(buf.data_ptr(), buf.data_ptr(), count, NCCL_FLOAT32, NCCL_SUM, comms[i % 2],
                                         stream.cuda_stream), "all-reduce in a group over two communicators")
        check(lib, lib.ncclGroupEnd(), "ncclGroupEnd (two communicators, one stream)")
        stream.synchronize()
        for i, buf in enumerate(bufs):
            if not bool((buf == float(sum(r + round_ + 100 * i for r in range(world)))).all()):
                raise RuntimeError(f"group over two communicators on one stream, round {round_}: call {i} is wrong")
    for comm in comms:
        check(lib, lib.ncclCommDestroy(comm), "ncclCommDestroy (two communicators, one stream)")
    report["group_over_two_communicators_calls_exact"] = 90


def one_process_two_ranks(lib, report):
    """One process driving two ranks from one thread (ncclCommInitAll; two GPUs where there are,
    else both on this one), as a program driving several GPUs does: one group splitting both
    ranks' communicators (keys that reverse the ranks; made at the group's end, where making the
    first at once would wait for the second), then ten groups of an in-place all-reduce per rank
    on the splits, each rank on a stream of its device, exact; the caller's current device is the
    same after every call."""
    here = torch.cuda.current_device()
    devs = [here, (here + 1) % torch.cuda.device_count()]
    comms = (ctypes.c_void_p * 2)()
    check(lib, lib.ncclCommInitAll(comms, 2, (ctypes.c_int * 2)(*devs)), "ncclCommInitAll")
    splits = [ctypes.c_void_p(), ctypes.c_void_p()]
    check(lib, lib.ncclGroupStart(), "ncclGroupStart (splits of two ranks)")
    for r in range(2):
        check(lib, lib.ncclCommSplit(comms[r], 0, 1 - r, ctypes.byref(splits[r]), None), "ncclCommSplit in a group")
    check(lib, lib.ncclGroupEnd(), "ncclGroupEnd (splits of two ranks)")
    ranks = []
    for split in splits:
        me = ctypes.c_int(-1)
        check(lib, lib.ncclCommUserRank(split, ctypes.byref(me)), "ncclCommUserRank")
        ranks.append(me.value)
    if ranks != [1, 0]:
        raise RuntimeError(f"the splits made in one group have ranks {ranks}, not [1, 0]")
    count = 1 << 18
    bufs = [torch.full((count,), float(r + 1), device=f"cuda:{devs[r]}") for r in range(2)]
    streams = [torch.cuda.Stream(device=devs[r]) for r in range(2)]
    for d in devs:
        torch.cuda.synchronize(d)
    for round_ in range(10):
        check(lib, lib.ncclGroupStart(), "ncclGroupStart (two ranks)")
        for r in range(2):
            check(lib, lib.ncclAllReduce(bufs[r].data_ptr(), bufs[r].data_ptr(), count, NCCL_FLOAT32, NCCL_SUM,
                                         splits[r], streams[r].cuda_stream), "all-reduce of one process's two ranks")
        check(lib, lib.ncclGroupEnd(), "ncclGroupEnd (two ranks)")
        if torch.cuda.current_device() != here:
            raise RuntimeError(f"the current device is {torch.cuda.current_device()} after a group, not {here}")
        for r in range(2):
            streams[r].synchronize()
            if not bool((bufs[r] == 3.0 * 2 ** round_).all()):
                raise RuntimeError(f"one process's two ranks, round {round_}: rank {r}'s all-reduce is wrong")
    for c in list(splits) + [comms[0], comms[1]]:
        check(lib, lib.ncclCommDestroy(c), "ncclCommDestroy (one process's two ranks)")
    if torch.cuda.current_device() != here:
        raise RuntimeError(f"the current device is {torch.cuda.current_device()} after destroy, not {here}")
    report["one_process_two_ranks_devices"] = devs
    report["one_process_two_ranks_calls_exact"] = 20


def graph_and_eager_calls(lib, rank, world, report):
    """A communicator's calls captured into a CUDA graph and its eager calls, on two streams,
    must not overlap (they share the communicator's buffers): each run of the graph waits for the
    eager calls before its launch, and eager calls wait for the runs before them, as NCCL orders
    them. An in-place all-reduce captured on stream G; twenty rounds of: the graph replayed on G,
    at once an eager all-reduce on stream S (no synchronization between them), both results exact
    (the graph's buffer multiplies by the world size each run)."""
    comm = new_comm(lib, rank, world)
    count = 1 << 18
    x = torch.ones(count, dtype=torch.float32, device="cuda")
    y = torch.zeros(count, dtype=torch.float32, device="cuda")
    g_stream, s_stream = torch.cuda.Stream(), torch.cuda.Stream()
    # One eager call of each size first: the communicator's first call of a size sets things up.
    with torch.cuda.stream(g_stream):
        check(lib, lib.ncclAllReduce(y.data_ptr(), y.data_ptr(), count, NCCL_FLOAT32, NCCL_SUM, comm,
                                     g_stream.cuda_stream), "warm-up all-reduce")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=g_stream):
        check(lib, lib.ncclAllReduce(x.data_ptr(), x.data_ptr(), count, NCCL_FLOAT32, NCCL_SUM, comm,
                                     torch.cuda.current_stream().cuda_stream), "all-reduce captured into a graph")
    torch.cuda.synchronize()
    x.fill_(1.0)
    torch.cuda.synchronize()
    for round_ in range(20):
        with torch.cuda.stream(g_stream):
            graph.replay()
        with torch.cuda.stream(s_stream):
            y.fill_(float(rank + round_))
            check(lib, lib.ncclAllReduce(y.data_ptr(), y.data_ptr(), count, NCCL_FLOAT32, NCCL_SUM, comm,
                                         s_stream.cuda_stream), "eager all-reduce beside a graph's run")
        torch.cuda.synchronize()
        want_y = float(sum(r + round_ for r in range(world)))
        if not bool((x == float(world ** (round_ + 1))).all()) or not bool((y == want_y).all()):
            raise RuntimeError(f"graph and eager calls, round {round_}: graph result {x[0].item()} (want "
                               f"{world ** (round_ + 1)}), eager result {y[0].item()} (want {want_y})")
    del graph
    check(lib, lib.ncclCommDestroy(comm), "ncclCommDestroy (graph and eager calls)")
    report["graph_and_eager_calls_exact"] = 40


def outside_torch_mib():
    """The GPU memory this process holds beyond what torch's caching allocator reserved (MiB), or
    None: the driver's, the loaded kernels' and the communicators'."""
    total = process_gpu_mib()
    return None if total is None else total - torch.cuda.memory_reserved() // (1 << 20)


def lifecycle(lib, rank, world, report):
    """Nothing left behind: ten rounds of a communicator made, used (a window, a registered
    buffer, a copying 1 MiB all-reduce that makes workspace areas, an 8-byte one) and destroyed,
    the last five without deregistering the window and the buffer first (destroy drops them, as
    NCCL's does); the memory outside torch's allocator after the last round is where it was
    after the first."""
    elems = 1 << 20
    buf = torch.zeros(2 * elems, dtype=torch.float32, device="cuda")
    other = torch.zeros(elems, dtype=torch.float32, device="cuda")
    stream = torch.cuda.current_stream()

    def all_reduce(comm, count, what):
        check(lib, lib.ncclAllReduce(buf.data_ptr(), buf[elems:].data_ptr(), count, NCCL_FLOAT32, NCCL_SUM, comm,
                                     stream.cuda_stream), what)

    seen = []
    for round_ in range(10):
        left_registered = round_ >= 5
        buf.fill_(1.0)
        comm = new_comm(lib, rank, world)
        window = ctypes.c_void_p()
        check(lib, lib.ncclCommWindowRegister(comm, buf.data_ptr(), buf.numel() * 4, ctypes.byref(window),
                                              NCCL_WIN_COLL_SYMMETRIC), "ncclCommWindowRegister (lifecycle)")
        all_reduce(comm, 4096, "windowed all-reduce (lifecycle)")
        torch.cuda.synchronize()
        handle = ctypes.c_void_p()
        if left_registered:
            check(lib, lib.ncclCommRegister(comm, other.data_ptr(), other.numel() * 4, ctypes.byref(handle)),
                  "ncclCommRegister (lifecycle, left registered)")
        else:
            check(lib, lib.ncclCommWindowDeregister(comm, window), "ncclCommWindowDeregister (lifecycle)")
            check(lib, lib.ncclCommRegister(comm, buf.data_ptr(), buf.numel() * 4, ctypes.byref(handle)),
                  "ncclCommRegister (lifecycle)")
            all_reduce(comm, 4096, "registered all-reduce (lifecycle)")
            torch.cuda.synchronize()
            check(lib, lib.ncclCommDeregister(comm, handle), "ncclCommDeregister (lifecycle)")
        all_reduce(comm, 262144, "1 MiB all-reduce (lifecycle)")
        all_reduce(comm, 2, "8-byte all-reduce (lifecycle)")
        torch.cuda.synchronize()
        if not bool((buf[elems:elems + 262144] == world).all()):
            raise RuntimeError("an all-reduce of the lifecycle check is wrong")
        check(lib, lib.ncclCommDestroy(comm), "ncclCommDestroy (lifecycle)")
        torch.cuda.synchronize()
        dist.barrier()
        seen.append(outside_torch_mib())
    report["lifecycle_outside_torch_mib"] = seen
    # A communicator's control area alone is 14 MiB: one left behind a round would show.
    if None not in seen and seen[-1] - seen[0] > 4:
        raise RuntimeError(f"destroyed communicators left GPU memory behind: {seen} MiB outside torch after "
                           "each of ten rounds")


def main(out_dir):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    torch.zeros(1, device="cuda")
    lib = load()
    report = {"rank": rank, "world": world}
    before = process_gpu_mib()
    comm_a = new_comm(lib, rank, world)
    comm_b = new_comm(lib, rank, world)
    torch.cuda.synchronize()
    report["gpu_mib_after_two_inits"] = None if before is None else process_gpu_mib() - before
    report["stats_a_created"] = {k: stat(lib, comm_a, k) for k in STATS}

    pool_bytes = 16 << 20
    pools = {"a": torch.zeros(pool_bytes // 4, dtype=torch.float32, device="cuda"),
             "b": torch.zeros(pool_bytes // 4, dtype=torch.float32, device="cuda")}
    windows = {}
    for name, comm, pool in [("a", comm_a, "a"), ("b", comm_b, "b"), ("a_in_b", comm_b, "a")]:
        w = ctypes.c_void_p()
        check(lib, lib.ncclCommWindowRegister(comm, pools[pool].data_ptr(), pool_bytes, ctypes.byref(w),
                                              NCCL_WIN_COLL_SYMMETRIC), f"ncclCommWindowRegister({name})")
        windows[name] = w
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    counts = [1, 7, 1000, 4096, 16383, 65536, 100003, 262144]
    calls = 0
    # Lanes: (communicator, pool, stream, offset in the pool in elements). Communicator B also
    # works in pool A's upper half through its own window on it.
    lanes = [(comm_a, pools["a"], streams[0], 0), (comm_b, pools["b"], streams[1], 0),
             (comm_b, pools["a"], streams[1], pool_bytes // 8)]
    for call in range(334):
        count = counts[call % len(counts)]
        in_place = call % 3 == 0
        pending = []
        for lane_index, (comm, pool, stream, base) in enumerate(lanes):
            if calls >= 1000:
                break
            seed = call * 3 + lane_index
            op = NCCL_MAX if seed % 2 else NCCL_SUM
            send = pool[base:base + count]
            recv = send if in_place else pool[base + pool_bytes // 16: base + pool_bytes // 16 + count]
            with torch.cuda.stream(stream):
                i = torch.arange(count, device="cuda", dtype=torch.int64)
                send.copy_(((i * 7 + seed * 3 + rank * 5) % 13).to(torch.float32))
                check(lib, lib.ncclAllReduce(send.data_ptr(), recv.data_ptr(), count, NCCL_FLOAT32, op, comm,
                                             stream.cuda_stream), "ncclAllReduce")
            pending.append((stream, recv, seed, count, op))
            calls += 1
        for stream, recv, seed, count, op in pending:
            stream.synchronize()
            want = expected(seed, world, count, op)
            got = recv.cpu()
            if not torch.equal(got, want):
                bad = int((got != want).nonzero()[0])
                raise RuntimeError(f"all-reduce #{seed} of {count} f32: element {bad} is {got[bad]}, not {want[bad]}")
    report["windowed_calls_exact"] = calls
    report["stats_a_after_calls"] = {k: stat(lib, comm_a, k) for k in STATS}
    # In place on the windows, nothing passed through the workspace: no area beyond the control
    # area was made (copying kernels would have made the LL128 or pipelined slots for 1 MiB).
    if report["stats_a_after_calls"]["total"] != report["stats_a_created"]["total"]:
        raise RuntimeError(f"windowed all-reduces made workspace areas: {report['stats_a_created']} -> "
                           f"{report['stats_a_after_calls']}")

    # A window deregistered with the wrong communicator.
    rc = lib.ncclCommWindowDeregister(comm_a, windows["b"])
    if rc != NCCL_INVALID_ARGUMENT:
        raise RuntimeError(f"deregistering communicator B's window with A gave {rc}, not ncclInvalidArgument")
    for name, comm in [("a", comm_a), ("b", comm_b), ("a_in_b", comm_b)]:
        check(lib, lib.ncclCommWindowDeregister(comm, windows[name]), f"ncclCommWindowDeregister({name})")

    registered(lib, rank, world, comm_a, report)
    family(lib, rank, world, report)

    # Memory: an 8-byte all-reduce, then 256 MiB; suspend and resume.
    stream = torch.cuda.current_stream()
    small = torch.ones(2, device="cuda")
    check(lib, lib.ncclAllReduce(small.data_ptr(), small.data_ptr(), 2, NCCL_FLOAT32, NCCL_SUM, comm_a,
                                 stream.cuda_stream), "8-byte all-reduce")
    torch.cuda.synchronize()
    report["stats_a_after_8B"] = {k: stat(lib, comm_a, k) for k in STATS}
    report["gpu_mib_after_8B"] = None if before is None else process_gpu_mib() - before
    big = torch.ones(64 << 20, device="cuda")

    def all_reduce_256mib(what):
        big.fill_(1.0)
        check(lib, lib.ncclAllReduce(big.data_ptr(), big.data_ptr(), big.numel(), NCCL_FLOAT32, NCCL_SUM, comm_a,
                                     stream.cuda_stream), what)
        torch.cuda.synchronize()
        if not bool((big == world).all()):
            raise RuntimeError(f"the {what} is wrong")

    all_reduce_256mib("256 MiB all-reduce")
    report["stats_a_after_256MiB"] = {k: stat(lib, comm_a, k) for k in STATS}
    check(lib, lib.ncclCommSuspend(comm_a, NCCL_SUSPEND_MEM), "ncclCommSuspend")
    report["stats_a_suspended"] = {k: stat(lib, comm_a, k) for k in STATS}
    rc = lib.ncclAllReduce(small.data_ptr(), small.data_ptr(), 2, NCCL_FLOAT32, NCCL_SUM, comm_a, stream.cuda_stream)
    if rc == 0:
        raise RuntimeError("an all-reduce on a suspended communicator was accepted")
    check(lib, lib.ncclCommResume(comm_a), "ncclCommResume")
    all_reduce_256mib("256 MiB all-reduce after resume")
    report["stats_a_resumed_after_256MiB"] = {k: stat(lib, comm_a, k) for k in STATS}

    # ncclGroupSimulateEnd: an estimate for the group's device calls, which do not run.
    small.fill_(5.0)
    torch.cuda.synchronize()
    sim = SimInfo(ctypes.sizeof(SimInfo), SIM_INFO_MAGIC, 22902, -1.0)
    check(lib, lib.ncclGroupStart(), "ncclGroupStart")
    check(lib, lib.ncclAllReduce(small.data_ptr(), small.data_ptr(), 2, NCCL_FLOAT32, NCCL_SUM, comm_a,
                                 stream.cuda_stream), "all-reduce in a simulated group")
    check(lib, lib.ncclAllReduce(big.data_ptr(), big.data_ptr(), big.numel(), NCCL_FLOAT32, NCCL_SUM, comm_a,
                                 stream.cuda_stream), "256 MiB all-reduce in a simulated group")
    check(lib, lib.ncclGroupSimulateEnd(ctypes.byref(sim)), "ncclGroupSimulateEnd")
    torch.cuda.synchronize()
    if not sim.estimatedTime > 0 or not bool((small == 5.0).all()):
        raise RuntimeError(f"ncclGroupSimulateEnd: estimate {sim.estimatedTime} us, small buffer {small.tolist()} "
                           "(the calls must not run)")
    report["simulated_group_us"] = sim.estimatedTime
    for comm in (comm_a, comm_b):
        check(lib, lib.ncclCommDestroy(comm), "ncclCommDestroy")
    destroyed_streams(lib, rank, world, report)
    group_on_two_streams(lib, rank, world, report)
    group_over_two_communicators_on_one_stream(lib, rank, world, report)
    one_process_two_ranks(lib, report)
    graph_and_eager_calls(lib, rank, world, report)
    lifecycle(lib, rank, world, report)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"windows-rank{rank}.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"windows: rank {rank}: {json.dumps(report)}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/weave-windows")
