#!/bin/sh
# Guest side of the IB micro bench (run by softroce-guest.sh from a directory holding this
# script as test.sh and the write_bench example): perftest's ib_write_bw / ib_write_lat and
# weave's connection on the same rxe0, then one line per size with the ratio.
#   bandwidth ratio = weave / perftest (higher is better); latency ratio = weave / perftest
#   (lower is better).
A=10.77.0.1
BW_SIZES=${BW_SIZES-"4096 65536 1048576"}
LAT_SIZES=${LAT_SIZES-"8 64 4096"}
pt() { # pt TOOL ARGS...: the server in the background, the client against it
  "$@" >/tmp/server.out 2>&1 & s=$!
  sleep 1
  "$@" $A >/tmp/client.out 2>&1 || { cat /tmp/client.out; }
  wait $s
  cat /tmp/client.out
}
: > /tmp/results
for s in $BW_SIZES; do
  pt ib_write_bw -d rxe0 -x 1 -s "$s" -n 500 -F | awk -v s="$s" '$1 == s { print "perftest bw", s, $4 }' >> /tmp/results
done
for s in $LAT_SIZES; do
  pt ib_write_lat -d rxe0 -x 1 -s "$s" -n 1000 -F | awk -v s="$s" '$1 == s { print "perftest lat", s, $5 }' >> /tmp/results
done
if [ -n "$BW_SIZES" ]; then ./write_bench bw $BW_SIZES | sed 's/^/weave /' >> /tmp/results || exit 1; fi
if [ -n "$LAT_SIZES" ]; then ./write_bench lat $LAT_SIZES | sed 's/^/weave /' >> /tmp/results || exit 1; fi
cat /tmp/results
awk '
  { v[$1 " " $2 " " $3] = $4 }
  END {
    n = 0
    for (k in v) {
      split(k, p, " ")
      if (p[1] != "weave") continue
      pt = v["perftest " p[2] " " p[3]]
      if (pt == "" || pt == 0) { print "no perftest figure for", p[2], p[3]; bad = 1; continue }
      unit = (p[2] == "bw") ? "MB/s" : "us"
      printf "ratio %s %s bytes: weave %s %s, perftest %s %s, weave/perftest %.2f\n", p[2], p[3], v[k], unit, pt, unit, v[k] / pt
      n++
    }
    if (n == 0) { print "no figures"; exit 1 }
    exit bad
  }' /tmp/results | sort -k2,2 -k3,3n
