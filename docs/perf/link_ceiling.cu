// link_ceiling: how many bytes per second one GPU can push to its peers while every GPU of the
// host does the same — the ceiling of any collective that moves its bytes over those links.
//
// A study tool for docs/perf-log/gpu.md ("Link ceiling"), not part of the library: one process
// drives every visible GPU with peer access enabled (no weave code involved), so nothing but the
// links and the way the bytes are moved is measured. Build and run on the GPU machine (CUDA
// toolkit needed):
//
//   nvcc -O3 -arch=sm_90 -o link_ceiling docs/perf/link_ceiling.cu && ./link_ceiling [GPUS] [MIB]
//
// GPUS defaults to every visible GPU, MIB (bytes each GPU sends, in MiB) to 1024. Each line is
// the slowest GPU's time over 10 rounds after 3 warm-up rounds, and the bytes each GPU sent per
// second ("egress"). Patterns:
//   sm stores, one pair      GPU 0 writes to GPU 1, nobody else sends
//   sm stores, all pairs     every GPU writes MIB / GPUS to every peer (block b to peer b mod p)
//   sm stores, ring          every GPU writes MIB * (GPUS - 1) / GPUS to its successor only
//   sm loads, all pairs      every GPU reads MIB / GPUS from every peer
//   copy engine, all pairs   cudaMemcpyPeerAsync of MIB / GPUS to every peer, one stream
//   copy engine, ring        one cudaMemcpyPeerAsync to the successor
//   copy engine F% + sm      F% of every peer's bytes by copy engine (a stream per peer), the
//                            rest by SM stores at the same time
//   zero-copy all-reduce     the pull-based all-reduce: rank r reads its shard from every rank's
//                            input, sums, and stores the sum into every rank's output (f32);
//                            "egress" is its bus bandwidth, 2 (n - 1) / n * bytes / time
// An all-reduce without in-switch reduction sends at least 2 (n - 1) / n of the message from
// every GPU, so its bus bandwidth cannot pass the best egress below.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(call)                                                                          \
  do {                                                                                       \
    cudaError_t err_ = (call);                                                               \
    if (err_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

constexpr int MAX_GPUS = 8;

// Up to MAX_GPUS device pointers, by value.
struct Targets {
  float4* at[MAX_GPUS];
};

// Block b copies its grid-stride part of src[0, n) to targets.at[b % ways] (the blocks are split
// evenly over the targets), with 16-byte loads and stores.
__global__ void spread_copy(Targets targets, const float4* src, size_t n, int ways) {
  const int target = blockIdx.x % ways;
  const size_t blocks = gridDim.x / ways, b = blockIdx.x / ways;
  float4* dst = targets.at[target];
  for (size_t i = b * blockDim.x + threadIdx.x; i < n; i += blocks * blockDim.x) dst[i] = src[i];
}

// Block b copies its grid-stride part of sources.at[s][0, n) to dst[s n, (s + 1) n), s = b % ways.
__global__ void gather_copy(Targets sources, float4* dst, size_t n, int ways) {
  const int source = blockIdx.x % ways;
  const size_t blocks = gridDim.x / ways, b = blockIdx.x / ways;
  const float4* src = sources.at[source];
  float4* out = dst + source * n;
  for (size_t i = b * blockDim.x + threadIdx.x; i < n; i += blocks * blockDim.x) out[i] = src[i];
}

__device__ float4 add(float4 x, float4 y) { return make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w); }

// Pull-based zero-copy all-reduce of n float4 per rank: rank `rank` sums shard `rank` of every
// rank's input (inputs.at[q] as this GPU sees it) and stores the sum into every rank's output.
__global__ void zero_copy_all_reduce(Targets inputs, Targets outputs, size_t n, int world, int rank) {
  const size_t shard = n / world, begin = shard * rank, end = begin + shard;
  for (size_t i = begin + blockIdx.x * blockDim.x + threadIdx.x; i < end; i += size_t(gridDim.x) * blockDim.x) {
    float4 acc = inputs.at[rank][i];
    for (int k = 1; k < world; ++k) acc = add(acc, inputs.at[(rank + k) % world][i]);
    for (int k = 0; k < world; ++k) outputs.at[(rank + k) % world][i] = acc;
  }
}

int main(int argc, char** argv) {
  int gpus = 0;
  CHECK(cudaGetDeviceCount(&gpus));
  if (argc > 1) gpus = std::atoi(argv[1]);
  const size_t mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1024;
  if (gpus < 2 || gpus > MAX_GPUS || mib == 0) {
    std::fprintf(stderr, "usage: link_ceiling [GPUS 2..%d] [MIB > 0] (needs at least 2 visible GPUs)\n", MAX_GPUS);
    return 2;
  }
  const int peers = gpus - 1;
  const size_t bytes = mib << 20;
  const size_t per_peer = bytes / gpus / 4096 * 4096;  // what each GPU sends each peer (all pairs)
  std::vector<float4*> input(gpus), output(gpus), scratch(gpus);
  std::vector<cudaStream_t> stream(gpus);
  std::vector<std::vector<cudaStream_t>> side(gpus, std::vector<cudaStream_t>(peers));
  std::vector<cudaEvent_t> start(gpus), stop(gpus), fork(gpus);
  std::vector<std::vector<cudaEvent_t>> join(gpus, std::vector<cudaEvent_t>(peers));
  int sms = 0;
  for (int d = 0; d < gpus; ++d) {
    CHECK(cudaSetDevice(d));
    for (int q = 0; q < gpus; ++q) {
      int can = 0;
      CHECK(cudaDeviceCanAccessPeer(&can, d, q));
      if (q != d && !can) {
        std::fprintf(stderr, "GPU %d cannot access GPU %d directly: no peer link to measure\n", d, q);
        return 1;
      }
      if (q != d) CHECK(cudaDeviceEnablePeerAccess(q, 0));
    }
    CHECK(cudaMalloc(&input[d], bytes));
    CHECK(cudaMalloc(&output[d], bytes));
    CHECK(cudaMalloc(&scratch[d], bytes));
    CHECK(cudaMemset(input[d], 0, bytes));
    CHECK(cudaStreamCreateWithFlags(&stream[d], cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&start[d]));
    CHECK(cudaEventCreate(&stop[d]));
    CHECK(cudaEventCreateWithFlags(&fork[d], cudaEventDisableTiming));
    for (int k = 0; k < peers; ++k) {
      CHECK(cudaStreamCreateWithFlags(&side[d][k], cudaStreamNonBlocking));
      CHECK(cudaEventCreateWithFlags(&join[d][k], cudaEventDisableTiming));
    }
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d));
  }
  std::printf("%d GPUs, %d SMs each, %zu MiB per GPU\n", gpus, sms, mib);
  std::printf("%-44s %10s %14s\n", "pattern", "time us", "egress GB/s");

  // Times `launch(d)` on every GPU; `sent` is the bytes one GPU sends per round.
  auto measure = [&](const char* name, double sent, auto launch) {
    const int warmup = 3, rounds = 10;
    for (int r = 0; r < warmup; ++r) {
      for (int d = 0; d < gpus; ++d) {
        CHECK(cudaSetDevice(d));
        launch(d);
      }
    }
    for (int d = 0; d < gpus; ++d) {
      CHECK(cudaSetDevice(d));
      CHECK(cudaDeviceSynchronize());
      CHECK(cudaEventRecord(start[d], stream[d]));
    }
    for (int r = 0; r < rounds; ++r) {
      for (int d = 0; d < gpus; ++d) {
        CHECK(cudaSetDevice(d));
        launch(d);
      }
    }
    float slowest = 0;
    for (int d = 0; d < gpus; ++d) {
      CHECK(cudaSetDevice(d));
      CHECK(cudaEventRecord(stop[d], stream[d]));
    }
    for (int d = 0; d < gpus; ++d) {
      CHECK(cudaEventSynchronize(stop[d]));
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, start[d], stop[d]));
      if (ms > slowest) slowest = ms;
    }
    const double us = slowest * 1000.0 / rounds;
    std::printf("%-44s %10.1f %14.1f\n", name, us, sent / us / 1e3);
    std::fflush(stdout);
  };
  auto to_peer = [&](int d, int k, size_t offset) { return scratch[(d + k) % gpus] + offset / 16; };
  // What d sends to its peers (d + 1, ..., d + peers), as SM stores (bytes [sm_from, per_peer)
  // of every peer's part) on the main stream.
  auto sm_stores = [&](int d, size_t sm_from, int grid, int threads) {
    Targets t{};
    for (int k = 1; k < gpus; ++k) t.at[k - 1] = to_peer(d, k, size_t(d) * per_peer + sm_from);
    const int g = grid / peers * peers;
    spread_copy<<<g, threads, 0, stream[d]>>>(t, input[d] + sm_from / 16, (per_peer - sm_from) / 16, peers);
    CHECK(cudaGetLastError());
  };
  char name[96];
  const double all_pairs = double(per_peer) * peers;

  for (int threads : {512, 1024}) {
    std::snprintf(name, sizeof name, "sm stores, one pair (%d x %d)", sms, threads);
    measure(name, all_pairs, [&](int d) {
      if (d != 0) return;
      Targets t{};
      t.at[0] = scratch[1];
      spread_copy<<<sms, threads, 0, stream[d]>>>(t, input[0], per_peer * peers / 16, 1);
      CHECK(cudaGetLastError());
    });
  }
  for (int grid : {sms, 2 * sms}) {
    for (int threads : {512, 1024}) {
      std::snprintf(name, sizeof name, "sm stores, all pairs (%d x %d)", grid, threads);
      measure(name, all_pairs, [&](int d) { sm_stores(d, 0, grid, threads); });
      std::snprintf(name, sizeof name, "sm stores, ring (%d x %d)", grid, threads);
      measure(name, all_pairs, [&](int d) {
        Targets t{};
        t.at[0] = to_peer(d, 1, 0);
        spread_copy<<<grid, threads, 0, stream[d]>>>(t, input[d], per_peer * peers / 16, 1);
        CHECK(cudaGetLastError());
      });
      std::snprintf(name, sizeof name, "sm loads, all pairs (%d x %d)", grid, threads);
      measure(name, all_pairs, [&](int d) {
        Targets t{};
        for (int k = 1; k < gpus; ++k) t.at[k - 1] = input[(d + k) % gpus];
        gather_copy<<<grid / peers * peers, threads, 0, stream[d]>>>(t, scratch[d], per_peer / 16, peers);
        CHECK(cudaGetLastError());
      });
    }
  }
  measure("copy engine, all pairs", all_pairs, [&](int d) {
    for (int k = 1; k < gpus; ++k) {
      CHECK(cudaMemcpyPeerAsync(to_peer(d, k, size_t(d) * per_peer), (d + k) % gpus, input[d], d, per_peer, stream[d]));
    }
  });
  measure("copy engine, ring", all_pairs, [&](int d) {
    CHECK(cudaMemcpyPeerAsync(to_peer(d, 1, 0), (d + 1) % gpus, input[d], d, per_peer * peers, stream[d]));
  });
  for (int percent : {90, 70, 50}) {
    std::snprintf(name, sizeof name, "copy engine %d%% + sm stores (%d x 1024)", percent, sms);
    const size_t by_engine = per_peer * percent / 100 / 4096 * 4096;
    measure(name, all_pairs, [&](int d) {
      CHECK(cudaEventRecord(fork[d], stream[d]));
      for (int k = 1; k < gpus; ++k) {
        cudaStream_t s = side[d][k - 1];
        CHECK(cudaStreamWaitEvent(s, fork[d], 0));
        CHECK(cudaMemcpyPeerAsync(to_peer(d, k, size_t(d) * per_peer), (d + k) % gpus, input[d], d, by_engine, s));
        CHECK(cudaEventRecord(join[d][k - 1], s));
      }
      sm_stores(d, by_engine, sms, 1024);
      for (int k = 0; k < peers; ++k) CHECK(cudaStreamWaitEvent(stream[d], join[d][k], 0));
    });
  }
  for (int grid : {sms, 4 * sms}) {
    std::snprintf(name, sizeof name, "zero-copy all-reduce, busbw (%d x 512)", grid);
    const size_t n = bytes / 16 / gpus * gpus;
    measure(name, 2.0 * peers / gpus * double(n) * 16, [&](int d) {
      Targets in{}, out{};
      for (int q = 0; q < gpus; ++q) {
        in.at[q] = input[q];
        out.at[q] = output[q];
      }
      zero_copy_all_reduce<<<grid, 512, 0, stream[d]>>>(in, out, n, gpus, d);
      CHECK(cudaGetLastError());
    });
  }
  return 0;
}
