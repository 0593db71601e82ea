#!/bin/sh
# Guest side of an A/B latency comparison: ROUNDS rounds (default 10) of ib_write_lat and of
# every `wb_*` in the current directory (each a write_bench build, or a script that runs one
# with its environment) at LAT_SIZES (default "8 64"), on rxe0 in one boot. The programs' order
# turns by one each round, so no build always runs first. Copy it next to the builds, with a
# test.sh that runs it, and boot with softroce-guest.sh DIR. Prints per program, size and round
#   R ROUND PROGRAM SIZE USEC   half round trip (perftest's t_typical, write_bench's median)
#   P ROUND PROGRAM SIZE USEC   write_bench's posting call (median)
A=10.77.0.1
ROUNDS=${ROUNDS:-10}
LAT_SIZES=${LAT_SIZES:-"8 64"}
PROGS="perftest $(ls wb_* | tr '\n' ' ')"
set -- $PROGS
N=$#
r=1
while [ "$r" -le "$ROUNDS" ]; do
  # This round's order: the list turned left by (r - 1) mod N.
  k=$(( (r - 1) % N )); head=""; tail=""; j=0
  for p in $PROGS; do
    if [ $j -lt $k ]; then tail="$tail $p"; else head="$head $p"; fi
    j=$((j + 1))
  done
  for p in $head $tail; do
    if [ "$p" = perftest ]; then
      for s in $LAT_SIZES; do
        ib_write_lat -d rxe0 -x 1 -s "$s" -n 1000 -F >/tmp/server.out 2>&1 & sp=$!
        sleep 1
        ib_write_lat -d rxe0 -x 1 -s "$s" -n 1000 -F $A >/tmp/client.out 2>&1
        wait $sp
        awk -v s="$s" -v r="$r" '$1 == s { print "R", r, "perftest", s, $5 }' /tmp/client.out
      done
    else
      ./"$p" lat $LAT_SIZES 2>/tmp/post.out | awk -v r="$r" -v p="$p" '{ print "R", r, p, $2, $3 }'
      awk -v r="$r" -v p="$p" '$1 == "post" { print "P", r, p, $2, $3 }' /tmp/post.out
    fi
  done
  r=$((r + 1))
done
