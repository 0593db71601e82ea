#!/bin/sh
# Guest side of the collectives-over-IB run (softroce-guest.sh runs it as test.sh from a
# directory holding collectives-worker built with the feature `ib`): the host correctness
# matrix with 2 and 4 ranks on rxe0, shared memory and TCP off (WEAVE_TRANSPORTS=ib), so every
# byte moves by RDMA; then a rank SIGKILLed mid all-reduce (`channel-kill`), whose survivors
# must report it lost (PeerLost: rxe lets writes to a vanished queue pair go unanswered, so
# this is the bootstrap's liveness at work) well inside WEAVE_TIMEOUT; then an unmatched send
# (`p2p-mismatch channel`), which the receiver must find at the pair's next exchange; then rank
# 1 SIGKILLed in a loop of checked calls (`survive 5/1`): the survivors revoke, agree, shrink —
# carrying the queue pairs over, renumbered — and run 100 checked calls. A scenario `NAME:ARG`
# runs `collectives-worker NAME ARG`. Ranks find each other through the
# torchrun variables on the guest's loopback.
SCENARIOS=${SCENARIOS:-"matrix channel-kill p2p-mismatch:channel survive:5/1"}
WORLDS=${WORLDS:-"2 4"}
fail=0
port=29500
for n in $WORLDS; do
  for scenario in $SCENARIOS; do
    name=${scenario%%:*}
    arg=${scenario#*:}
    [ "$arg" = "$scenario" ] && arg=""
    port=$((port + 1))
    pids=""
    r=0
    while [ $r -lt "$n" ]; do
      RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        WEAVE_TRANSPORTS=ib WEAVE_TIMEOUT=${WEAVE_TIMEOUT:-120} ./collectives-worker "$name" $arg > "/tmp/$name-$n-$r.log" 2>&1 &
      pids="$pids $!"
      r=$((r + 1))
    done
    ok=0
    r=0
    for p in $pids; do
      wait "$p"
      rc=$?
      case "$scenario" in
        *kill*) if [ $r = $((n - 1)) ]; then [ $rc = 137 ] || ok=1; else
            [ $rc = 0 ] && grep -q "was lost" "/tmp/$name-$n-$r.log" || ok=1; fi ;;
        survive:*) if [ $r = "${arg#*/}" ]; then [ $rc = 137 ] || ok=1; else
            [ $rc = 0 ] && grep -q "transports carried over" "/tmp/$name-$n-$r.log" || ok=1; fi ;;
        *) [ $rc = 0 ] || ok=1 ;;
      esac
      r=$((r + 1))
    done
    if [ $ok = 0 ]; then
      echo "PASS $scenario, $n ranks over ib: $(grep '^OK' /tmp/$name-$n-0.log | cut -c1-300)"
    else
      fail=1
      echo "FAIL $scenario, $n ranks over ib:"
      tail -3 /tmp/$name-$n-*.log
    fi
  done
done
exit $fail
