#!/usr/bin/env bash
# Checks weave's libnccl.so.2 on a GPU host, from the directory holding it (the gpu bundle's
# nccl/ folder: libnccl.so.2, torch_check.py, this script). Prints one
# "PASS|FAIL|SKIP <program>" line per program and exits non-zero if any failed.
#
#   ./run-gpu-checks.sh                 # symbols, torch (weave vs NCCL), dead peer, nccl-tests
#   OUT=/some/dir ./run-gpu-checks.sh   # logs go to $OUT (default /tmp/weave-nccl-checks)
#   PARTS="torch" ./run-gpu-checks.sh   # only some parts: symbols torch nodes windows nccl-tests
#   MODES="eager" ./run-gpu-checks.sh   # nccl-tests modes (default "eager graph")
#
# With two or more GPUs every program runs on weave and on NCCL, one GPU per rank. With one GPU
# the two ranks share it (weave allows that; NCCL refuses two ranks on one GPU): the torch
# script's reference is the same script on gloo (CPU tensors), and nccl-tests runs on weave
# only, as two MPI processes both on GPU 0 (NCCL_TESTS_DEVICE=0); the NCCL lines say SKIP.
#
# nccl-tests: built here from source when NCCL_TESTS_SRC (default ./nccl-tests) holds it
# (nvcc needed; `make MPI=0` with 2+ GPUs, `make MPI=1` with mpicc's MPI with one), for
# NVCC_GENCODE (default: this GPU's architecture), then every binary runs 8 B..1 GiB with -c 1
# (eager, then -G 1 graph), printing one line each. NCCL_TESTS_ARGS adds arguments (e.g.
# "-n 5 -w 1" for fewer iterations); NCCL_TESTS_ONLY="all_reduce ..." runs only those binaries. Env: WEAVE_TIMEOUT bounds weave's waits (the dead-peer
# check uses WEAVE_TIMEOUT=20s). Weave runs set NCCL_DEBUG=INFO and must show weave::nccl's
# init line (proof the preload took effect).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
# Kernels compiled where the bundle was built (cargo xtask gpu-bundle --kernel-cache).
if [ -f "$HERE/../kernel-cache.sh" ]; then . "$HERE/../kernel-cache.sh"; fi
LIB="$HERE/libnccl.so.2"
OUT=${OUT:-/tmp/weave-nccl-checks}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
TORCHRUN=${TORCHRUN:-torchrun}
failed=0
PARTS=${PARTS:-symbols torch nodes windows nccl-tests}
MODES=${MODES:-eager graph}
part() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
line() { echo "$1 $2${3:+ ($3)}"; echo "$1 $2${3:+ ($3)}" >>"$OUT/summary.txt"; [ "$1" = FAIL ] && failed=$((failed + 1)); return 0; }
: >"$OUT/summary.txt"

# 1. The library itself.
if [ ! -f "$LIB" ]; then echo "no $LIB: run from the bundle's nccl/ folder"; exit 2; fi
if part symbols; then
missing=""
for s in ncclAllGather ncclAllReduce ncclAlltoAll ncclBcast ncclBroadcast ncclCommAbort ncclCommCount \
  ncclCommCuDevice ncclCommDeregister ncclCommDestroy ncclCommFinalize ncclCommGetAsyncError ncclCommInitAll \
  ncclCommInitRank ncclCommInitRankConfig ncclCommInitRankScalable ncclCommRegister ncclCommShrink ncclCommSplit \
  ncclCommUserRank ncclCommWindowDeregister ncclCommWindowRegister ncclDevCommCreate ncclDevCommDestroy ncclGather \
  ncclGetErrorString ncclGetLastError ncclGetUniqueId ncclGetVersion ncclGroupEnd ncclGroupSimulateEnd \
  ncclGroupStart ncclMemAlloc ncclMemFree ncclRecv ncclRedOpCreatePreMulSum ncclRedOpDestroy ncclReduce \
  ncclReduceScatter ncclScatter ncclSend ncclCommMemStats ncclCommSuspend ncclCommResume; do
  nm -D --defined-only "$LIB" | awk '{print $3}' | grep -qx "$s" || missing="$missing $s"
done
if [ -z "$missing" ] && readelf -d "$LIB" | grep -q 'SONAME.*\[libnccl.so.2\]'; then line PASS symbols-and-soname
else line FAIL symbols-and-soname "missing:$missing"; fi
fi

# 2. torch.distributed: the same script on NCCL (gloo with one GPU) and on weave, results compared.
NPROC=2
if [ "$GPUS" -ge 2 ]; then
  reference=nccl; ref_args=""; subset=""
else
  reference=gloo; ref_args="--gloo"; subset="--reference-subset"
fi
has_torch() { $PY -c "import torch, sys; sys.exit(0 if torch.cuda.device_count() >= 1 else 1)" 2>/dev/null; }
if ! part torch; then :
elif ! has_torch; then
  line SKIP torch "needs python3 with torch and a GPU"
else
  timeout 600 $TORCHRUN --nproc-per-node $NPROC "$HERE/torch_check.py" $ref_args "$OUT/$reference" \
    >"$OUT/torch-$reference.log" 2>&1
  rc_n=$?
  NCCL_DEBUG=INFO LD_PRELOAD="$LIB" timeout 600 $TORCHRUN --nproc-per-node $NPROC "$HERE/torch_check.py" "$OUT/weave" \
    >"$OUT/torch-weave.log" 2>&1
  rc_w=$?
  [ $rc_n -eq 0 ] && line PASS torch-on-$reference || line FAIL torch-on-$reference "exit $rc_n, $OUT/torch-$reference.log"
  grep -q "weave::nccl" "$OUT/torch-weave.log" || { rc_w=99; echo "weave's library was not loaded" >>"$OUT/torch-weave.log"; }
  [ $rc_w -eq 0 ] && line PASS torch-on-weave || line FAIL torch-on-weave "exit $rc_w, $OUT/torch-weave.log"
  if [ $rc_n -eq 0 ] && [ $rc_w -eq 0 ]; then
    if $PY "$HERE/torch_check.py" --compare "$OUT/weave" "$OUT/$reference" $subset >"$OUT/torch-compare.log" 2>&1; then
      line PASS torch-weave-equals-$reference "$(grep -c '^pass' "$OUT/torch-compare.log") results equal, $(grep -c '^skip' "$OUT/torch-compare.log") not in the reference"
    else line FAIL torch-weave-equals-$reference "$(grep -c FAIL "$OUT/torch-compare.log") differ, $OUT/torch-compare.log"; fi
  else line FAIL torch-weave-equals-$reference "a run failed"; fi
  # A dead peer gives an error, not a hang (the whole job must end well inside 180 s).
  start=$SECONDS
  WEAVE_TIMEOUT=20s NCCL_DEBUG=WARN LD_PRELOAD="$LIB" timeout 180 $TORCHRUN --nproc-per-node 2 \
    "$HERE/torch_check.py" --kill-peer >"$OUT/torch-kill-peer.log" 2>&1
  rc=$?
  took=$((SECONDS - start))
  if [ $rc -ne 124 ] && grep -q "rank 0 got an error\|Watchdog\|ncclRemoteError\|remote process exited" "$OUT/torch-kill-peer.log"; then
    line PASS torch-dead-peer-errors "${took}s"
  else line FAIL torch-dead-peer-errors "exit $rc after ${took}s, $OUT/torch-kill-peer.log"; fi
  # A live peer 75 s late (a checkpoint) is waited for, not failed: WEAVE_TIMEOUT unset, libnccl
  # waits up to 30 minutes, where weave's own default is one minute.
  start=$SECONDS
  env -u WEAVE_TIMEOUT NCCL_DEBUG=WARN LD_PRELOAD="$LIB" timeout 240 $TORCHRUN --nproc-per-node 2 \
    "$HERE/torch_check.py" --late-peer 75 >"$OUT/torch-late-peer.log" 2>&1
  rc=$?
  took=$((SECONDS - start))
  if [ $rc -eq 0 ] && [ "$(grep -o "all_reduce exact" "$OUT/torch-late-peer.log" | wc -l)" -eq 2 ]; then
    line PASS torch-late-peer-waited "${took}s: $(grep -m1 'rank 0 waited' "$OUT/torch-late-peer.log" | cut -c1-120)"
  else line FAIL torch-late-peer-waited "exit $rc after ${took}s, $OUT/torch-late-peer.log"; fi
  # The MoE mistake (all_to_all_single with split sizes the ranks disagree on), then correct
  # calls: an error must come (raised, or the watchdog's abort with weave's mismatch error) and
  # no call may return wrong data.
  start=$SECONDS
  WEAVE_TIMEOUT=10s NCCL_DEBUG=WARN LD_PRELOAD="$LIB" timeout 180 $TORCHRUN --nproc-per-node 2 \
    "$HERE/torch_check.py" --mismatched-splits >"$OUT/torch-mismatch.log" 2>&1
  took=$((SECONDS - start))
  if ! grep -q "WRONG DATA\|no error raised" "$OUT/torch-mismatch.log" && grep -q "mismatch on the GPU\|point-to-point mismatch" "$OUT/torch-mismatch.log"; then
    line PASS torch-mismatched-splits-error "${took}s: $(grep -m1 'got an error' "$OUT/torch-mismatch.log" | cut -c1-160)"
  else line FAIL torch-mismatched-splits-error "after ${took}s, $OUT/torch-mismatch.log"; fi
  # torch.distributed.shrink_group after a rank died (three ranks; ncclCommShrink on weave), with
  # each flag; the survivors must all-reduce exactly on the new group.
  for flags in SHRINK_DEFAULT SHRINK_ABORT; do
    start=$SECONDS
    WEAVE_TIMEOUT=10s NCCL_DEBUG=WARN LD_PRELOAD="$LIB" timeout 180 $TORCHRUN --nproc-per-node 3 \
      "$HERE/torch_check.py" --shrink $flags >"$OUT/torch-shrink-$flags.log" 2>&1
    took=$((SECONDS - start))
    # Counted as occurrences: the two survivors' lines may share a line of the log.
    if [ "$(grep -o "all_reduce exact" "$OUT/torch-shrink-$flags.log" | wc -l)" -eq 2 ]; then
      line PASS torch-shrink-group-$flags "${took}s: $(grep -m1 'torch_check shrink' "$OUT/torch-shrink-$flags.log")"
    else line FAIL torch-shrink-group-$flags "after ${took}s, $OUT/torch-shrink-$flags.log"; fi
  done
fi

# 3. Device buffers across nodes: the torch script on weave with its two ranks in two nodes of
# this host made of network namespaces (`xtask multinode`, from the bundle: no shared memory or
# CUDA IPC between the nodes, so TCP carries the device calls), compared with the reference.
XTASK=${XTASK:-$HERE/../xtask}
if ! part nodes; then :
elif ! has_torch; then
  line SKIP torch-across-nodes "needs python3 with torch and a GPU"
elif [ ! -x "$XTASK" ]; then
  line SKIP torch-across-nodes "no xtask binary at $XTASK (set XTASK)"
else
  if [ ! -f "$OUT/$reference.rank0.pt" ]; then
    timeout 600 $TORCHRUN --nproc-per-node $NPROC "$HERE/torch_check.py" $ref_args "$OUT/$reference" \
      >"$OUT/torch-$reference.log" 2>&1
  fi
  start=$SECONDS
  timeout 600 "$XTASK" multinode --nodes 2 --ranks-per-node 1 -- \
    env NCCL_DEBUG=INFO LD_PRELOAD="$LIB" $PY "$HERE/torch_check.py" "$OUT/weave-nodes" >"$OUT/torch-nodes.log" 2>&1
  rc=$?
  took=$((SECONDS - start))
  if [ $rc -ne 0 ]; then line FAIL torch-across-nodes "exit $rc after ${took}s, $OUT/torch-nodes.log"
  elif ! grep -q "as network namespaces" "$OUT/torch-nodes.log"; then
    line FAIL torch-across-nodes "the nodes were not network namespaces, $OUT/torch-nodes.log"
  elif ! grep -q "direct GPU kernels off (some GPUs are on other nodes" "$OUT/torch-nodes.log"; then
    line FAIL torch-across-nodes "the ranks did not see each other as on other nodes, $OUT/torch-nodes.log"
  elif $PY "$HERE/torch_check.py" --compare "$OUT/weave-nodes" "$OUT/$reference" $subset >"$OUT/torch-nodes-compare.log" 2>&1; then
    line PASS torch-across-nodes "${took}s, 2 namespace nodes x 1 rank: $(grep -c '^pass' "$OUT/torch-nodes-compare.log") results equal to $reference"
  else line FAIL torch-across-nodes "$(grep -c FAIL "$OUT/torch-nodes-compare.log") differ, $OUT/torch-nodes-compare.log"; fi
fi

# 4. Symmetric windows, the SGLang pattern (windows_check.py: two communicators, a window pool
# each, 1,000 all-reduces on two streams at once, exact), registered buffers, a splitShare
# family (its split logged as sharing the parent), GPU memory, suspend and resume, and five
# communicators made, used and destroyed leaving no GPU memory behind.
if ! part windows; then :
elif ! has_torch; then
  line SKIP windows "needs python3 with torch and a GPU"
else
  # A wait that should never be long fails in a minute rather than holding the run.
  WEAVE_TIMEOUT=${WEAVE_TIMEOUT:-60s} NCCL_DEBUG=INFO WEAVE_NCCL_LIB="$LIB" LD_PRELOAD="$LIB" timeout 600 \
    $TORCHRUN --nproc-per-node $NPROC "$HERE/windows_check.py" "$OUT/windows" >"$OUT/windows.log" 2>&1
  rc=$?
  grep -q "weave::nccl" "$OUT/windows.log" || { rc=99; echo "weave's library was not loaded" >>"$OUT/windows.log"; }
  grep -q "shares its parent's communicator" "$OUT/windows.log" ||
    { [ $rc -ne 0 ] || rc=98; echo "no split was logged as sharing its parent" >>"$OUT/windows.log"; }
  [ $rc -eq 0 ] && line PASS windows-sglang-pattern "$(grep -c '^windows: rank' "$OUT/windows.log") ranks" \
    || line FAIL windows-sglang-pattern "exit $rc, $OUT/windows.log"
fi

# 5. nccl-tests, when its source is here.
SRC=${NCCL_TESTS_SRC:-$HERE/nccl-tests}
if ! part nccl-tests; then :
elif [ ! -f "$SRC/Makefile" ]; then
  line SKIP nccl-tests "no source in $SRC (set NCCL_TESTS_SRC)"
elif ! command -v nvcc >/dev/null 2>&1; then
  line SKIP nccl-tests "no nvcc"
elif [ "$GPUS" -lt 2 ] && ! command -v mpicc >/dev/null 2>&1; then
  line SKIP nccl-tests "one GPU and no mpicc: two ranks on one GPU need nccl-tests' MPI build"
else
  BUILD="$OUT/nccl-tests-build"
  rm -rf "$BUILD" && cp -r "$SRC" "$BUILD"
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')
  GENCODE=${NVCC_GENCODE:-${cc:+-gencode=arch=compute_$cc,code=sm_$cc}}
  if [ "$GPUS" -ge 2 ]; then
    mpi_make="MPI=0"
    # One process, one thread per GPU; NCCL as the baseline.
    launch() { timeout 600 "$@" -g 2; }
    libs="weave nccl"
  else
    mpi_home=$(dirname "$(mpicc --showme:incdirs | tr ' ' '\n' | grep -m1 include)")
    mpi_make="MPI=1 MPI_HOME=$mpi_home"
    # Two MPI processes, both on GPU 0 (NCCL refuses that, so weave only).
    export WEAVE_TIMEOUT=${WEAVE_TIMEOUT:-60s}
    launch() {
      timeout 600 mpirun --allow-run-as-root --oversubscribe -np 2 -x NCCL_TESTS_DEVICE=0 -x NCCL_DEBUG \
        -x LD_LIBRARY_PATH -x WEAVE_TIMEOUT "$@" -g 1
    }
    libs="weave"
  fi
  if make -C "$BUILD" -j 16 $mpi_make NCCL_HOME="${NCCL_HOME:-/usr}" ${GENCODE:+NVCC_GENCODE="$GENCODE"} \
    >"$OUT/nccl-tests-make.log" 2>&1; then
    line PASS nccl-tests-build "$mpi_make"
    for t in ${NCCL_TESTS_ONLY:-all_reduce all_gather reduce_scatter broadcast reduce alltoall sendrecv scatter gather hypercube}; do
      bin="$BUILD/build/${t}_perf"
      [ -x "$bin" ] || { line FAIL "nccl-tests-$t" "no $bin"; continue; }
      for mode in $MODES; do
        extra=""; [ $mode = graph ] && extra="-G 1"
        for lib in $libs; do
          log="$OUT/nccl-tests-$t-$mode-$lib.log"
          if [ $lib = weave ]; then
            NCCL_DEBUG=INFO LD_LIBRARY_PATH="$HERE:${LD_LIBRARY_PATH:-}" \
              launch "$bin" -b 8 -e 1G -f 2 -c 1 $extra ${NCCL_TESTS_ARGS:-} >"$log" 2>&1
          else
            NCCL_DEBUG=WARN launch "$bin" -b 8 -e 1G -f 2 -c 1 $extra ${NCCL_TESTS_ARGS:-} >"$log" 2>&1
          fi
          rc=$?
          if [ $lib = weave ] && ! grep -q "weave::nccl" "$log"; then
            line FAIL "nccl-tests-$t-$mode-$lib" "weave's library was not loaded, $log"
          elif [ $rc -eq 0 ] && grep -q "Out of bounds values : 0 OK" "$log"; then
            line PASS "nccl-tests-$t-$mode-$lib" "$(grep 'Avg bus bandwidth' "$log" | sed 's/.*: *//') GB/s avg busbw"
          else line FAIL "nccl-tests-$t-$mode-$lib" "exit $rc, $log"; fi
        done
        [ "$GPUS" -ge 2 ] || line SKIP "nccl-tests-$t-$mode-nccl" "NCCL refuses two ranks on one GPU"
      done
    done
  else line FAIL nccl-tests-build "$OUT/nccl-tests-make.log"; fi
fi

echo "weave libnccl checks: $failed failed (details in $OUT)"
[ $failed -eq 0 ]
