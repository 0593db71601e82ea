// Test kernels for the weave device primitives. Compiled on every CI run (PTX for sm_90) and
// launched by kernels/tests/gpu_primitives.rs where a GPU exists. Addresses come in as u64 so
// the host can pass any device address (offset, unaligned) without typed-pointer arguments.

using namespace weave;

// ---- copies ---------------------------------------------------------------------------------

// copy() of `bytes` bytes from src to dst by every thread of the grid.
extern "C" __global__ void weave_test_copy(uint64_t dst, uint64_t src, uint64_t bytes) {
  const uint32_t thread = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t nthreads = gridDim.x * blockDim.x;
  copy(as_ptr<void>(dst), as_ptr<const void>(src), bytes, thread, nthreads);
}

// MemoryChannel::put (get when `use_get`), by every thread of the grid.
extern "C" __global__ void weave_test_channel_copy(MemoryChannelDeviceHandle handle, uint64_t remote_offset,
                                                   uint64_t local_offset, uint64_t bytes, uint32_t use_get) {
  const MemoryChannel ch(handle);
  const uint32_t thread = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t nthreads = gridDim.x * blockDim.x;
  if (use_get != 0) {
    ch.get(remote_offset, local_offset, bytes, thread, nthreads);
  } else {
    ch.put(remote_offset, local_offset, bytes, thread, nthreads);
  }
}

// ---- LL packets: block 0 sends, block 1 receives ----------------------------------------------

template <typename P>
__device__ void packets_round_trip(uint64_t out, uint64_t in, uint64_t bytes, uint64_t packets, uint32_t flag,
                                   const DeviceStatusHandle& status, uint64_t result) {
  if (blockIdx.x == 0) {
    put_packets<P>(as_ptr<P>(packets), as_ptr<const void>(in), bytes, threadIdx.x, blockDim.x, flag);
  } else if (blockIdx.x == 1) {
    const bool ok = unpack_packets<P>(as_ptr<void>(out), as_ptr<const P>(packets), bytes, threadIdx.x, blockDim.x,
                                      flag, status);
    if (!ok) atomic_add_relaxed_sys(as_ptr<uint64_t>(result), 1);
  }
}

// LL16 round trip between two blocks through the packet buffer; *result counts failed threads.
extern "C" __global__ void weave_test_ll16(uint64_t out, uint64_t in, uint64_t bytes, uint64_t packets, uint32_t flag,
                                           DeviceStatusHandle status, uint64_t result) {
  packets_round_trip<LL16Packet>(out, in, bytes, packets, flag, status, result);
}

// LL8 round trip between two blocks through the packet buffer; *result counts failed threads.
extern "C" __global__ void weave_test_ll8(uint64_t out, uint64_t in, uint64_t bytes, uint64_t packets, uint32_t flag,
                                          DeviceStatusHandle status, uint64_t result) {
  packets_round_trip<LL8Packet>(out, in, bytes, packets, flag, status, result);
}

// MemoryChannel::put_packets from block 0 and unpack_packets in block 1 (one channel whose
// remote and local packet buffers are the same memory; src is the source for block 0 and
// the destination is src + dst_offset for block 1).
extern "C" __global__ void weave_test_channel_packets(MemoryChannelDeviceHandle handle, uint64_t dst_offset,
                                                      uint64_t bytes, uint32_t flag, DeviceStatusHandle status,
                                                      uint64_t result) {
  const MemoryChannel ch(handle);
  if (blockIdx.x == 0) {
    ch.put_packets<LL16Packet>(0, 0, bytes, threadIdx.x, blockDim.x, flag);
  } else if (blockIdx.x == 1) {
    if (!ch.unpack_packets<LL16Packet>(0, dst_offset, bytes, threadIdx.x, blockDim.x, flag, status)) {
      atomic_add_relaxed_sys(as_ptr<uint64_t>(result), 1);
    }
  }
}

// ---- semaphores: ping-pong between block 0 and block 1 ------------------------------------------

// Block 0 (thread 0) writes round r into data[0] and signals through `a`; block 1 waits on `b`,
// checks data[0], writes data[1] = r and signals back; block 0 waits and checks data[1].
// result[0] counts data mismatches, result[1] failed waits.
extern "C" __global__ void weave_test_semaphore(DeviceSemaphoreHandle a, DeviceSemaphoreHandle b, uint64_t data,
                                                uint32_t rounds, DeviceStatusHandle status, uint64_t result) {
  if (threadIdx.x != 0) return;
  volatile uint64_t* d = as_ptr<volatile uint64_t>(data);
  uint64_t* r = as_ptr<uint64_t>(result);
  for (uint32_t round = 1; round <= rounds; ++round) {
    if (blockIdx.x == 0) {
      d[0] = round;
      signal(a);
      if (!wait(a, status)) {
        atomic_add_relaxed_sys(r + 1, 1);
        return;
      }
      if (d[1] != round) atomic_add_relaxed_sys(r, 1);
    } else if (blockIdx.x == 1) {
      if (!wait(b, status)) {
        atomic_add_relaxed_sys(r + 1, 1);
        return;
      }
      if (d[0] != round) atomic_add_relaxed_sys(r, 1);
      d[1] = round;
      signal(b);
    }
  }
}

// poll() before and after a signal: result[0] = poll before (expect 0), result[1] = poll after
// (expect 1), result[2] = poll again (expect 0).
extern "C" __global__ void weave_test_semaphore_poll(DeviceSemaphoreHandle self_loop, uint64_t result) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  uint64_t* r = as_ptr<uint64_t>(result);
  r[0] = poll(self_loop) ? 1 : 0;
  signal(self_loop);
  r[1] = poll(self_loop) ? 1 : 0;
  r[2] = poll(self_loop) ? 1 : 0;
}

// ---- bounded waits that must give up ---------------------------------------------------------

// kind 0: semaphore wait nobody signals; 1: LL16 read nobody writes; 2: LL8 read nobody writes.
// *result = 1 when the wait returned false (the error word says why).
extern "C" __global__ void weave_test_timeout(uint32_t kind, DeviceSemaphoreHandle sem, uint64_t packets,
                                              DeviceStatusHandle status, uint64_t result) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  bool ok = true;
  if (kind == 0) {
    ok = wait(sem, status);
  } else if (kind == 1) {
    uint64_t v;
    ok = read_ll16(as_ptr<const LL16Packet>(packets), 7, status, &v);
  } else {
    uint32_t v;
    ok = read_ll8(as_ptr<const LL8Packet>(packets), 7, status, &v);
  }
  *as_ptr<uint64_t>(result) = ok ? 0 : 1;
}

// ---- FIFO and port channel ------------------------------------------------------------------

// Thread i < count pushes DATA trigger {size i, src (1, 16 i), dst (2, 32 i), semaphore 3};
// seqs[i] = its sequence number, or ~0 when the push failed.
extern "C" __global__ void weave_test_fifo_push(FifoDeviceHandle fifo, uint32_t count, DeviceStatusHandle status,
                                                uint64_t seqs) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  Trigger t;
  uint64_t seq = ~0ull;
  const TriggerFields f{TriggerType::Data, i, 1, 16ull * i, 2, 32ull * i, 3};
  if (make_trigger(f, status, &t) && push(fifo, t, status, &seq)) {
    as_ptr<uint64_t>(seqs)[i] = seq;
  } else {
    as_ptr<uint64_t>(seqs)[i] = ~0ull;
  }
}

// Encodes `count` TriggerFields from `fields` (7 u64 each: type, size, src_memory, src_offset,
// dst_memory, dst_offset, semaphore) into out[2 i], out[2 i + 1] with make_trigger; a field that
// does not fit gives {~0, ~0} (and BadArgument in the error word).
extern "C" __global__ void weave_test_trigger_encode(uint64_t fields, uint32_t count, DeviceStatusHandle status,
                                                     uint64_t out) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const uint64_t* f = as_ptr<const uint64_t>(fields) + 7 * i;
  const TriggerFields tf{static_cast<uint32_t>(f[0]), f[1], static_cast<uint32_t>(f[2]), f[3],
                         static_cast<uint32_t>(f[4]), f[5], static_cast<uint32_t>(f[6])};
  Trigger t{~0ull, ~0ull};
  make_trigger(tf, status, &t);
  as_ptr<uint64_t>(out)[2 * i] = t.w0;
  as_ptr<uint64_t>(out)[2 * i + 1] = t.w1;
}

// One thread: put_with_signal(dst_offset, src_offset, bytes), then flush (waits until the host
// popped the flush trigger), then wait() for a signal the host gives by bumping the inbound
// token. result[0] = 1 when all returned true.
extern "C" __global__ void weave_test_port_channel(PortChannelDeviceHandle handle, uint64_t dst_offset,
                                                   uint64_t src_offset, uint64_t bytes, DeviceStatusHandle status,
                                                   uint64_t result) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  const PortChannel ch(handle);
  const bool ok = ch.put_with_signal(dst_offset, src_offset, bytes, status) && ch.flush(status) && ch.wait(status);
  *as_ptr<uint64_t>(result) = ok ? 1 : 0;
}

// ---- 16-bit floats ----------------------------------------------------------------------------

// Converts and adds: for each i < count, with a = in[2 i], b = in[2 i + 1] (f32):
// out[6 i + 0] = f16 bits of a, [1] = bf16 bits of a, [2] = f16 bits of f16(a) + f16(b),
// [3] = bf16 bits of bf16(a) + bf16(b), [4] = bits of f32(f16(a)), [5] = bits of f32(bf16(a)).
extern "C" __global__ void weave_test_dtype(uint64_t in, uint32_t count, uint64_t out) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const float a = as_ptr<const float>(in)[2 * i];
  const float b = as_ptr<const float>(in)[2 * i + 1];
  uint32_t* o = as_ptr<uint32_t>(out) + 6 * i;
  const half_t ha = half_from_float(a), hb = half_from_float(b);
  const bf16_t ba = bf16_from_float(a), bb = bf16_from_float(b);
  o[0] = ha.bits;
  o[1] = ba.bits;
  o[2] = Sum::apply(ha, hb).bits;
  o[3] = Sum::apply(ba, bb).bits;
  o[4] = __float_as_uint(to_float(ha));
  o[5] = __float_as_uint(to_float(ba));
}

// Element-wise sums over 16-byte vectors: out = a + b for `vectors` vectors of `kind`
// (0 = f16, 1 = bf16, 2 = f32, 3 = i32 wrapping, 4 = u8 wrapping).
extern "C" __global__ void weave_test_reduce_vec(uint64_t a, uint64_t b, uint64_t out, uint32_t vectors,
                                                 uint32_t kind) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= vectors) return;
  const uint4 x = as_ptr<const uint4>(a)[i];
  const uint4 y = as_ptr<const uint4>(b)[i];
  uint4 r;
  switch (kind) {
    case 0: r = reduce_vec16<Sum, half_t>(x, y); break;
    case 1: r = reduce_vec16<Sum, bf16_t>(x, y); break;
    case 2: r = reduce_vec16<Sum, float>(x, y); break;
    case 3: r = reduce_vec16<Sum, int32_t>(x, y); break;
    default: r = reduce_vec16<Sum, uint8_t>(x, y); break;
  }
  as_ptr<uint4>(out)[i] = r;
}
