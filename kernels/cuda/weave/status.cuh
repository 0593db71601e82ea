// weave/status.cuh: bounded spinning and error reporting.
//
// Every device spin in weave goes through spin_until: it gives up after
// DeviceStatusHandle::timeout_cycles clock64() cycles, and every SPIN_CHECK_PERIOD iterations
// it reads the host-visible abort word (the host asks the kernel to stop) and the error word
// (another thread already gave up, so this one stops too instead of waiting out its budget).
// A spin that gives up stores a DeviceError code into *error with a system-scope release
// store, unless a code is already there, and returns false; the caller then returns early.
//
// A handle whose `error` is 0 cannot report: its spins still give up and return false. A
// `timeout_cycles` of 0 gives up after the first failed re-check. The host must clear the
// error word before reusing it: a non-zero word makes every spin return false at its first
// periodic check.
#ifndef WEAVE_STATUS_CUH
#define WEAVE_STATUS_CUH

#include "weave/atomics.cuh"
#include "weave/handles.cuh"
#include "weave/types.cuh"

namespace weave {

// Iterations between two reads of the host-visible abort and error words.
constexpr uint32_t SPIN_CHECK_PERIOD = 1024;

// The code in the error word now (0 when none, or when the handle has no error word).
WEAVE_DEVICE uint32_t status_error(const DeviceStatusHandle& status) {
  if (status.error == 0) return DeviceError::None;
  return atomic_load_relaxed_sys(as_ptr<const uint32_t>(status.error));
}

// True when the host asked the kernel to stop.
WEAVE_DEVICE bool abort_requested(const DeviceStatusHandle& status) {
  return status.abort != 0 && atomic_load_relaxed_sys(as_ptr<const uint32_t>(status.abort)) != 0;
}

// Stores `code` into the error word (system-scope release) unless a code is already there.
// Tells the host that this launch's device call has started on the GPU (block 0, thread 0;
// collective kernels call it first, after waiting for their predecessor): the host reads how
// far its GPU got, and a verdict names a GPU kept busy by work queued before the call.
WEAVE_DEVICE void report_started(const DeviceStatusHandle& status) {
  if (status.progress == 0 || blockIdx.x != 0 || threadIdx.x != 0) return;
  atomic_store_relaxed_sys(as_ptr<uint64_t>(status.progress), status.call);
}

WEAVE_DEVICE void report_error(const DeviceStatusHandle& status, uint32_t code) {
  if (status.error == 0) return;
  uint32_t* word = as_ptr<uint32_t>(status.error);
  if (atomic_load_relaxed_sys(word) == DeviceError::None) atomic_store_release_sys(word, code);
}

// Spins until cond() returns true (then returns true), or gives up (reports `code`, or
// Aborted when the host asked to stop, and returns false). See the file comment.
template <typename Cond>
WEAVE_DEVICE bool spin_until(Cond cond, const DeviceStatusHandle& status, uint32_t code) {
  if (cond()) return true;
  const int64_t start = clock64();
  for (uint32_t i = 1;; ++i) {
    if (cond()) return true;
    if (static_cast<uint64_t>(clock64() - start) > status.timeout_cycles) {
      report_error(status, code);
      return false;
    }
    if (i % SPIN_CHECK_PERIOD == 0) {
      if (abort_requested(status)) {
        report_error(status, DeviceError::Aborted);
        return false;
      }
      if (status_error(status) != DeviceError::None) return false;
    }
  }
}

}  // namespace weave

#endif  // WEAVE_STATUS_CUH
