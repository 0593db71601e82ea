// weave all-reduce over windows (appended to collectives.cu, whose helpers it uses): every
// rank's input, and in the two-shot form its output, lies in a window of the communicator —
// user memory every peer mapped when the ranks registered it together — at the same offset on
// every rank. The kernel reads the peers' inputs in place and, two-shot, writes the peers'
// outputs in place: no byte passes through the workspace.
//
// GpuCollectiveArgs: win_send[r] / win_recv[r] are rank r's input / output as mapped here (this
// rank's own at a.rank); aux[0] is the form: 0 one-shot (each rank reads every input whole and
// writes its own output), 1 two-shot (rank r reduces the r-th share of every input and writes it
// into every rank's output).
//
// Registered buffers (aux[1] = WINDOWED_PUBLISHED): each rank registered its buffers alone, so
// only it knows where its peers map them, and the offsets differ between ranks. win_send[q] /
// win_recv[q] are then this rank's input / output as rank q maps them; before the entry phase
// the kernel writes them into rank q's control area ([512 + 32 * rank]: stamp, input, output),
// stamped with the entry phase's value, and after it reads every rank's entry from its own. An
// entry with another stamp means that rank ran another kernel for this call (it did not pass
// registered buffers, as every rank must when one does): CallMismatch, never a read of stale
// addresses.
//
// Two flag phases of the flag-based family (collectives.cu): the entry phase, after which every
// rank's input is complete (each rank's stream ordered its writes before its kernel) and no rank
// still reads an output of an earlier call; the exit phase, after which every rank finished
// reading inputs and writing outputs (so a rank's next work may change its buffers). Sources are
// combined in rank order on every rank, so every rank's result has the same bits.

namespace weave {
namespace coll {

constexpr uint64_t WINDOWED_TWO_SHOT = 1;
constexpr uint64_t WINDOWED_PUBLISHED = 1;
constexpr uint64_t PUBLISHED_OFFSET = 512;
constexpr uint64_t PUBLISHED_STRIDE = 32;
static_assert(PUBLISHED_OFFSET + 8 * PUBLISHED_STRIDE <= PACKET_EPOCHS_OFFSET, "published addresses overlap");

// Every rank's input and output as mapped here: from the arguments (windows) or from the
// entries the ranks published for this call (registered buffers; false on a mismatch).
WEAVE_DEVICE bool windowed_addresses(const GpuCollectiveArgs& a, uint64_t stamp, uint64_t* sends, uint64_t* recvs) {
  if (a.aux[1] != WINDOWED_PUBLISHED) {
    for (uint32_t r = 0; r < a.world; ++r) {
      sends[r] = a.win_send[r];
      recvs[r] = a.win_recv[r];
    }
    return true;
  }
  __shared__ int ok;
  if (threadIdx.x == 0) ok = 1;
  __syncthreads();
  if (threadIdx.x < a.world) {
    const volatile uint64_t* entry =
        as_ptr<const volatile uint64_t>(a.peers[a.rank] + PUBLISHED_OFFSET + uint64_t(threadIdx.x) * PUBLISHED_STRIDE);
    if (entry[0] != stamp) ok = 0;
    sends[threadIdx.x] = entry[1];
    recvs[threadIdx.x] = entry[2];
  }
  __syncthreads();
  if (!ok && global_thread() == 0) report_error(a.status, DeviceError::CallMismatch);
  return ok != 0;
}

template <typename Op, typename T>
WEAVE_DEVICE void all_reduce_windowed(const GpuCollectiveArgs& a) {
  const uint64_t epoch = *epoch_ptr(a);
  uint32_t index = 0;
  const uint32_t t = global_thread(), nt = global_threads();
  const uint32_t avg = a.op == OP_AVG ? a.world : 0;
  if (a.aux[1] == WINDOWED_PUBLISHED && blockIdx.x == 0 && threadIdx.x < a.world) {
    // This rank's buffers as rank q maps them, into q's control area, before the phase's
    // release; the stamp is the value the entry phase publishes.
    uint64_t* entry = as_ptr<uint64_t>(a.peers[threadIdx.x] + PUBLISHED_OFFSET + uint64_t(a.rank) * PUBLISHED_STRIDE);
    entry[1] = a.win_send[threadIdx.x];
    entry[2] = a.win_recv[threadIdx.x];
    entry[0] = epoch + 1;
  }
  if (!phase(a, epoch, index)) return;
  __shared__ uint64_t sends[8], recvs[8];
  if (!windowed_addresses(a, epoch + 1, sends, recvs)) return;
  uint64_t begin = 0, end = a.count;
  if (a.aux[0] == WINDOWED_TWO_SHOT) {
    // Shares of a multiple of 16 elements (so every share starts aligned as the buffers are).
    const uint64_t share = ((a.count + a.world - 1) / a.world + 15) / 16 * 16;
    begin = share * a.rank < a.count ? share * a.rank : a.count;
    end = begin + share < a.count ? begin + share : a.count;
  }
  const T* srcs[8];
  T* outs[8];
  uint32_t nout = 0;
  for (uint32_t r = 0; r < a.world; ++r) {
    srcs[r] = as_ptr<const T>(sends[r]) + begin;
    if (a.aux[0] == WINDOWED_TWO_SHOT && r != a.rank) outs[nout++] = as_ptr<T>(recvs[r]) + begin;
  }
  if (end > begin) reduce_to<Op, T>(as_ptr<T>(a.recv) + begin, outs, nout, srcs, a.world, end - begin, avg, t, nt);
  if (!phase(a, epoch, index)) return;
  finish(a, epoch, index, index);
}

WEAVE_REDUCING_BODY(AllReduceWindowed, all_reduce_windowed<Op, T>)

}  // namespace coll
}  // namespace weave
