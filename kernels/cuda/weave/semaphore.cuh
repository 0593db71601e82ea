// weave/semaphore.cuh: device-to-device semaphores (DeviceSemaphoreHandle).
//
// Counters are monotonic u64s, never reset. signal() adds 1 to the peer's inbound counter with
// release ordering at system scope, so everything this thread wrote before (to peer memory too)
// is visible to the peer once its wait() returns. wait() takes the next expected value from
// the local expected counter (device-scope atomic, so concurrent waiters of one GPU each take
// their own signal, and the count persists across launches and graph replays) and spins,
// bounded, until an acquire load of the inbound counter reaches it.
//
// Ordering within a block is the caller's job: when many threads put() and one signals,
// __syncthreads() before the signal.
#ifndef WEAVE_SEMAPHORE_CUH
#define WEAVE_SEMAPHORE_CUH

#include "weave/atomics.cuh"
#include "weave/handles.cuh"
#include "weave/status.cuh"
#include "weave/types.cuh"

namespace weave {

// Adds 1 to the peer's inbound counter, release, system scope.
WEAVE_DEVICE void signal(const DeviceSemaphoreHandle& s) {
  atomic_add_release_sys(as_ptr<uint64_t>(s.remote_inbound), 1);
}

// Adds 1 to the peer's inbound counter without ordering earlier accesses (for pure
// synchronization points that carry no data).
WEAVE_DEVICE void relaxed_signal(const DeviceSemaphoreHandle& s) {
  atomic_add_relaxed_sys(as_ptr<uint64_t>(s.remote_inbound), 1);
}

// The counter pair behind every wait: `inbound_addr`, the address of the counter the peer
// bumps, and `expected_addr`, the address of this side's count of signals taken. Port channels
// keep the same pair as tokens, so they wait and poll through these too.

// Takes the next signal: expected = atomicAdd(expected_addr, 1) + 1 (device scope), then a
// bounded spin until an acquire load at inbound_addr is >= expected. False (SemaphoreTimeout or
// Aborted reported) when it gave up.
WEAVE_DEVICE bool wait_counter(uint64_t inbound_addr, uint64_t expected_addr, const DeviceStatusHandle& status) {
  const uint64_t expected = atomic_fetch_add_relaxed_gpu(as_ptr<uint64_t>(expected_addr), 1) + 1;
  const uint64_t* inbound = as_ptr<const uint64_t>(inbound_addr);
  return spin_until([&] { return atomic_load_acquire_sys(inbound) >= expected; }, status,
                    DeviceError::SemaphoreTimeout);
}

// Consumes the next signal if it has arrived (bumps expected, acquire ordering) and returns
// true; otherwise returns false and changes nothing.
WEAVE_DEVICE bool poll_counter(uint64_t inbound_addr, uint64_t expected_addr) {
  uint64_t* expected = as_ptr<uint64_t>(expected_addr);
  const uint64_t next = atomic_load_relaxed_gpu(expected) + 1;
  if (atomic_load_acquire_sys(as_ptr<const uint64_t>(inbound_addr)) < next) return false;
  atomic_store_relaxed_gpu(expected, next);
  return true;
}

// Waits for the next signal: expected = atomicAdd(expected_inbound, 1) + 1 (device scope), then
// a bounded spin until an acquire load of inbound is >= expected. False (SemaphoreTimeout or
// Aborted reported) when it gave up; the semaphore is then out of step and must not be reused.
WEAVE_DEVICE bool wait(const DeviceSemaphoreHandle& s, const DeviceStatusHandle& status) {
  return wait_counter(s.inbound, s.expected_inbound, status);
}

// Like wait(), but the inbound load is relaxed: for synchronization points that guard no data.
WEAVE_DEVICE bool relaxed_wait(const DeviceSemaphoreHandle& s, const DeviceStatusHandle& status) {
  const uint64_t expected = atomic_fetch_add_relaxed_gpu(as_ptr<uint64_t>(s.expected_inbound), 1) + 1;
  const uint64_t* inbound = as_ptr<const uint64_t>(s.inbound);
  return spin_until([&] { return atomic_load_relaxed_sys(inbound) >= expected; }, status,
                    DeviceError::SemaphoreTimeout);
}

// Non-blocking: if the next signal has arrived, consumes it (bumps expected) and returns true
// (with acquire ordering); otherwise returns false and changes nothing. One thread at a time
// per semaphore: poll() must not race with wait() or poll() on the same handle.
WEAVE_DEVICE bool poll(const DeviceSemaphoreHandle& s) { return poll_counter(s.inbound, s.expected_inbound); }

}  // namespace weave

#endif  // WEAVE_SEMAPHORE_CUH
