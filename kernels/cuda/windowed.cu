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
// Two flag phases of the flag-based family (collectives.cu): the entry phase, after which every
// rank's input is complete (each rank's stream ordered its writes before its kernel) and no rank
// still reads an output of an earlier call; the exit phase, after which every rank finished
// reading inputs and writing outputs (so a rank's next work may change its buffers). Sources are
// combined in rank order on every rank, so every rank's result has the same bits.

namespace weave {
namespace coll {

constexpr uint64_t WINDOWED_TWO_SHOT = 1;

template <typename Op, typename T>
WEAVE_DEVICE void all_reduce_windowed(const GpuCollectiveArgs& a) {
  const uint64_t epoch = *epoch_ptr(a);
  uint32_t index = 0;
  const uint32_t t = global_thread(), nt = global_threads();
  const uint32_t avg = a.op == OP_AVG ? a.world : 0;
  if (!phase(a, epoch, index)) return;
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
    srcs[r] = as_ptr<const T>(a.win_send[r]) + begin;
    if (a.aux[0] == WINDOWED_TWO_SHOT && r != a.rank) outs[nout++] = as_ptr<T>(a.win_recv[r]) + begin;
  }
  if (end > begin) reduce_to<Op, T>(as_ptr<T>(a.recv) + begin, outs, nout, srcs, a.world, end - begin, avg, t, nt);
  if (!phase(a, epoch, index)) return;
  finish(a, epoch, index, index);
}

WEAVE_REDUCING_BODY(AllReduceWindowed, all_reduce_windowed<Op, T>)

}  // namespace coll
}  // namespace weave
