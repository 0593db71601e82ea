// The logarithmic channel algorithms (kernels/cuda/channel_log.cu, included unchanged) run on
// the host: every rank a thread standing for a block of one thread, each link a queue of at most
// SLOTS messages (the credits of channel.cu), every message's length checked at the receiver as
// channel.cu's `receive` does. Checks every algorithm's results, in place and out of place, for
// worlds of 2 to 17 ranks, several counts and roots, sum and average, and two payload sizes
// (so steps take several messages and Bruck's packed blocks straddle messages); all-reduce
// results must be bit-identical on every rank. Built and run by kernels/tests/channel_log_on_the_host.rs.
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <deque>
#include <mutex>
#include <atomic>
#include <chrono>
#include <thread>
#include <cmath>

#define WEAVE_DEVICE inline
#define WEAVE_CHANNEL_STEP inline
#define __clz(x) __builtin_clz(x)
// A block of one thread: the link steps and copies of this file are whole-block operations.

namespace weave {
constexpr uint32_t CHANNEL_NO_PEER = 0xffffffffu;
constexpr uint32_t OP_AVG = 4;
template <typename T> T* as_ptr(uint64_t a) { return reinterpret_cast<T*>(a); }
struct ChannelArgs { uint64_t send, recv, count, scratch; uint32_t rank, world, root, op; };
struct Sum { template <typename T> static T apply(T a, T b) { return a + b; } };

static uint64_t PAYLOAD = 64;
constexpr uint32_t SLOTS = 4;
struct Pair {
  std::mutex m;
  std::deque<std::vector<char>> q; uint32_t inflight = 0;
  std::vector<char> staging;
};
static std::vector<Pair*> pairs; static uint32_t W;
static Pair& pair(uint32_t from, uint32_t to) { return *pairs[from * W + to]; }
static std::atomic<bool> failed{false};

namespace chan {
struct Shared { int unused; };
inline uint64_t message_bytes(const ChannelArgs&, uint32_t) { return PAYLOAD; }
inline char* outbox(const ChannelArgs& a, uint32_t peer, Shared*) {
  if (peer >= a.world) { failed = true; return nullptr; }
  Pair& p = pair(a.rank, peer);
  std::unique_lock<std::mutex> l(p.m);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (p.inflight >= SLOTS && std::chrono::steady_clock::now() < deadline) {
    l.unlock(); std::this_thread::sleep_for(std::chrono::microseconds(50)); l.lock();
  }
  if (p.inflight >= SLOTS) { fprintf(stderr, "rank %u: no credit to %u\n", a.rank, peer); failed = true; return nullptr; }
  p.staging.assign(PAYLOAD, 0);
  return p.staging.data();
}
inline bool post(const ChannelArgs& a, uint32_t peer, uint64_t bytes, Shared*) {
  Pair& p = pair(a.rank, peer);
  std::lock_guard<std::mutex> l(p.m);
  if (bytes > PAYLOAD) { failed = true; return false; }
  std::vector<char> m(8 + bytes);
  memcpy(m.data(), &bytes, 8);
  memcpy(m.data() + 8, p.staging.data(), bytes);
  p.q.push_back(std::move(m));
  p.inflight++;
  return true;
}
inline const char* receive(const ChannelArgs& a, uint32_t peer, uint64_t bytes, Shared*) {
  if (peer >= a.world) { failed = true; return nullptr; }
  Pair& p = pair(peer, a.rank);
  std::unique_lock<std::mutex> l(p.m);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (p.q.empty() && std::chrono::steady_clock::now() < deadline) {
    l.unlock(); std::this_thread::sleep_for(std::chrono::microseconds(50)); l.lock();
  }
  if (p.q.empty()) {
    fprintf(stderr, "rank %u: timeout waiting for %u\n", a.rank, peer); failed = true; return nullptr;
  }
  if (p.q.front().size() != 8 + bytes) {
    fprintf(stderr, "rank %u: message from %u has %zu bytes, expected %llu\n", a.rank, peer, p.q.front().size() - 8, (unsigned long long)bytes);
    failed = true; return nullptr;
  }
  return p.q.front().data() + 8;
}
inline bool release(const ChannelArgs& a, uint32_t peer, Shared*) {
  Pair& p = pair(peer, a.rank);
  std::lock_guard<std::mutex> l(p.m);
  p.q.pop_front(); p.inflight--;
  return true;
}
inline uint64_t pieces(uint64_t elems, uint64_t chunk) { const uint64_t p = (elems + chunk - 1) / chunk; return p == 0 ? 1 : p; }
inline bool piece(uint64_t c, uint64_t elems, uint64_t chunk, uint64_t* first, uint64_t* len) {
  if (c >= pieces(elems, chunk)) return false;
  const uint64_t at = c * chunk < elems ? c * chunk : elems;
  *first = at; *len = elems - at < chunk ? elems - at : chunk; return true;
}
// channel.cu's `move`: the ranges must be identical or disjoint (a block-wide copy of
// overlapping ranges would race), which is checked here.
inline void move(void* dst, const void* src, uint64_t bytes) {
  if (dst == src || bytes == 0) return;
  const char *d = static_cast<const char*>(dst), *s = static_cast<const char*>(src);
  if (d < s + bytes && s < d + bytes) { fprintf(stderr, "move between overlapping ranges\n"); failed = true; return; }
  memcpy(dst, src, bytes);
}
template <typename Op, typename T>
void combine(T* dst, T* out, const T* const* srcs, uint32_t nsrc, uint64_t elems, uint32_t avg) {
  for (uint64_t i = 0; i < elems; ++i) {
    T acc = srcs[0][i];
    for (uint32_t s = 1; s < nsrc; ++s) acc = Op::apply(acc, srcs[s][i]);
    if (avg) acc = acc / T(avg);
    dst[i] = acc; if (out) out[i] = acc;
  }
}
}  // namespace chan
}  // namespace weave

#include "channel_log.cu"  // -I kernels/cuda

using namespace weave;
typedef double T;
static T value(uint32_t r, uint64_t i) { return double((r * 131 + i * 7) % 1000) + 0.25 * r; }

static char label[200];
template <typename F>
static void run(uint32_t n, F body) {
  W = n;
  for (auto* p : pairs) delete p;
  pairs.clear();
  for (uint32_t i = 0; i < n * n; ++i) pairs.push_back(new Pair());
  std::vector<std::thread> ts;
  for (uint32_t r = 0; r < n; ++r) ts.emplace_back([&, r] { body(r); });
  for (auto& t : ts) t.join();
  for (auto* p : pairs) if (!p->q.empty()) { fprintf(stderr, "leftover messages after %s\n", label); failed = true; }
}

static int errors = 0;
#define CHECK(c, ...) do { if (!(c)) { if (errors++ < 20) { fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } } while (0)

int main() {
  const uint64_t counts[] = {0, 1, 5, 37};
  for (uint64_t payload : {64ull, 24ull}) {
  PAYLOAD = payload;
  for (uint32_t n = 2; n <= 17; ++n) {
    for (uint64_t count : counts) {
      for (int inplace = 0; inplace < 2; ++inplace) {
        for (uint32_t op : {0u, OP_AVG}) {
          // all-reduce: doubling and halving
          for (int algo = 0; algo < 2; ++algo) {
            std::vector<std::vector<T>> send(n), recv(n);
            for (uint32_t r = 0; r < n; ++r) { send[r].resize(count); for (uint64_t i = 0; i < count; ++i) send[r][i] = value(r, i); recv[r].assign(count, -1); }
            snprintf(label, sizeof label, "%s n=%u count=%llu", algo ? "halving" : "doubling", n, (unsigned long long)count);
            run(n, [&](uint32_t r) {
              ChannelArgs a{(uint64_t)send[r].data(), inplace ? (uint64_t)send[r].data() : (uint64_t)recv[r].data(), count, 0, r, n, 0, op};
              chan::Shared sh;
              if (algo == 0) chan::doubling<Sum, T>(a, &sh); else chan::halving<Sum, T>(a, true, &sh);
            });
            for (uint32_t r = 0; r < n; ++r) for (uint64_t i = 0; i < count; ++i) {
              T exp = 0; for (uint32_t q = 0; q < n; ++q) exp += value(q, i); if (op == OP_AVG) exp /= n;
              T got = inplace ? send[r][i] : recv[r][i];
              CHECK(std::fabs(got - exp) <= 1e-9 * std::fabs(exp) + 1e-12, "%s n=%u count=%llu inplace=%d op=%u rank %u elem %llu: %g vs %g", algo ? "halving" : "doubling", n, (unsigned long long)count, inplace, op, r, (unsigned long long)i, got, exp);
              T r0 = inplace ? send[0][i] : recv[0][i];
              CHECK(memcmp(&got, &r0, sizeof(T)) == 0, "%s n=%u bits differ rank %u", algo ? "halving" : "doubling", n, r);
            }
          }
          // reduce-scatter by halving
          {
            std::vector<std::vector<T>> send(n), recv(n), scratch(n);
            for (uint32_t r = 0; r < n; ++r) { send[r].resize(n * count); for (uint64_t i = 0; i < n * count; ++i) send[r][i] = value(r, i); recv[r].assign(count, -1); scratch[r].assign(n * count, -7); }
            snprintf(label, sizeof label, "rs n=%u count=%llu", n, (unsigned long long)count);
            run(n, [&](uint32_t r) {
              uint64_t rv = inplace ? (uint64_t)(send[r].data() + r * count) : (uint64_t)recv[r].data();
              ChannelArgs a{(uint64_t)send[r].data(), rv, count, (uint64_t)scratch[r].data(), r, n, 0, op};
              chan::Shared sh; chan::halving<Sum, T>(a, false, &sh);
            });
            for (uint32_t r = 0; r < n; ++r) for (uint64_t i = 0; i < count; ++i) {
              T exp = 0; for (uint32_t q = 0; q < n; ++q) exp += value(q, r * count + i); if (op == OP_AVG) exp /= n;
              T got = inplace ? send[r][r * count + i] : recv[r][i];
              CHECK(std::fabs(got - exp) <= 1e-9 * std::fabs(exp) + 1e-12, "rs n=%u count=%llu inplace=%d op=%u rank %u elem %llu: %g vs %g", n, (unsigned long long)count, inplace, op, r, (unsigned long long)i, got, exp);
            }
          }
          // reduce by tree, several roots (in place or not)
          for (uint32_t root : {0u, n / 2, n - 1}) {
            std::vector<std::vector<T>> send(n), recv(n), scratch(n);
            for (uint32_t r = 0; r < n; ++r) { send[r].resize(count); for (uint64_t i = 0; i < count; ++i) send[r][i] = value(r, i); recv[r].assign(count, -1); scratch[r].assign(count, -7); }
            snprintf(label, sizeof label, "tree reduce n=%u count=%llu root=%u", n, (unsigned long long)count, root);
            run(n, [&](uint32_t r) {
              ChannelArgs a{(uint64_t)send[r].data(), inplace ? (uint64_t)send[r].data() : (uint64_t)recv[r].data(), count, (uint64_t)scratch[r].data(), r, n, root, op};
              chan::Shared sh; chan::tree_reduce<Sum, T>(a, &sh);
            });
            for (uint64_t i = 0; i < count; ++i) {
              T exp = 0; for (uint32_t q = 0; q < n; ++q) exp += value(q, i); if (op == OP_AVG) exp /= n;
              T got = inplace ? send[root][i] : recv[root][i];
              CHECK(std::fabs(got - exp) <= 1e-9 * std::fabs(exp) + 1e-12, "tree reduce n=%u root=%u count=%llu: %g vs %g", n, root, (unsigned long long)count, got, exp);
            }
          }
        }
        // bytes: all-gather, all-to-all, broadcast
        {
          std::vector<std::vector<uint8_t>> buf(n), recv(n), scratch(n);
          auto byte = [](uint32_t r, uint64_t i) { return uint8_t((r * 37 + i * 11 + 3) & 0xff); };
          for (uint32_t r = 0; r < n; ++r) {
            recv[r].assign(n * count, 0xee); scratch[r].assign(n * count, 0xdd); buf[r].resize(count);
            for (uint64_t i = 0; i < count; ++i) buf[r][i] = byte(r, i);
            if (inplace) for (uint64_t i = 0; i < count; ++i) recv[r][r * count + i] = byte(r, i);
          }
          snprintf(label, sizeof label, "all-gather n=%u count=%llu", n, (unsigned long long)count);
          run(n, [&](uint32_t r) {
            uint64_t s = inplace ? (uint64_t)(recv[r].data() + r * count) : (uint64_t)buf[r].data();
            ChannelArgs a{s, (uint64_t)recv[r].data(), count, (uint64_t)scratch[r].data(), r, n, 0, 0};
            chan::Shared sh; chan::bruck_all_gather(a, &sh);
          });
          for (uint32_t r = 0; r < n; ++r) for (uint32_t q = 0; q < n; ++q) for (uint64_t i = 0; i < count; ++i)
            CHECK(recv[r][q * count + i] == byte(q, i), "all-gather n=%u count=%llu inplace=%d rank %u block %u", n, (unsigned long long)count, inplace, r, q);
        }
        {
          std::vector<std::vector<uint8_t>> send(n), recv(n), scratch(n);
          auto byte = [](uint32_t from, uint32_t to, uint64_t i) { return uint8_t((from * 37 + to * 101 + i * 11 + 3) & 0xff); };
          for (uint32_t r = 0; r < n; ++r) {
            send[r].resize(n * count); recv[r].assign(n * count, 0xee); scratch[r].assign(n * count, 0xdd);
            for (uint32_t q = 0; q < n; ++q) for (uint64_t i = 0; i < count; ++i) send[r][q * count + i] = byte(r, q, i);
          }
          snprintf(label, sizeof label, "all-to-all n=%u count=%llu", n, (unsigned long long)count);
          run(n, [&](uint32_t r) {
            uint64_t rv = inplace ? (uint64_t)send[r].data() : (uint64_t)recv[r].data();
            ChannelArgs a{(uint64_t)send[r].data(), rv, count, (uint64_t)scratch[r].data(), r, n, 0, 0};
            chan::Shared sh; chan::bruck_all_to_all(a, &sh);
          });
          for (uint32_t r = 0; r < n; ++r) for (uint32_t q = 0; q < n; ++q) for (uint64_t i = 0; i < count; ++i) {
            uint8_t got = inplace ? send[r][q * count + i] : recv[r][q * count + i];
            CHECK(got == byte(q, r, i), "all-to-all n=%u count=%llu inplace=%d rank %u from %u", n, (unsigned long long)count, inplace, r, q);
          }
        }
        for (uint32_t root : {0u, n / 2, n - 1}) {
          std::vector<std::vector<uint8_t>> buf(n), recv(n);
          auto byte = [](uint64_t i) { return uint8_t((i * 13 + 5) & 0xff); };
          for (uint32_t r = 0; r < n; ++r) { buf[r].assign(count, 0); recv[r].assign(count, 0xee); }
          for (uint64_t i = 0; i < count; ++i) buf[root][i] = byte(i);
          snprintf(label, sizeof label, "broadcast n=%u count=%llu root=%u", n, (unsigned long long)count, root);
          run(n, [&](uint32_t r) {
            ChannelArgs a{(uint64_t)buf[r].data(), inplace ? (uint64_t)buf[r].data() : (uint64_t)recv[r].data(), count, 0, r, n, root, 0};
            chan::Shared sh; chan::tree_broadcast(a, &sh);
          });
          for (uint32_t r = 0; r < n; ++r) for (uint64_t i = 0; i < count; ++i) {
            uint8_t got = inplace ? buf[r][i] : recv[r][i];
            CHECK(got == byte(i), "broadcast n=%u root=%u count=%llu rank %u", n, root, (unsigned long long)count, r);
          }
        }
      }
    }
  }
  }
  printf("%s: %d wrong results%s\n", errors || failed ? "FAIL" : "OK", errors, failed ? ", and a link protocol failure" : "");
  return errors || failed;
}
