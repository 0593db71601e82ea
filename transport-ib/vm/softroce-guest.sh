#!/bin/bash
# Runs DIR/test.sh inside a QEMU guest that has a real verbs device (SoftRoCE: rdma_rxe on a
# dummy netdev), and exits with the script's status.
#
#   softroce-guest.sh DIR            one guest, 2 vCPUs, rxe0 on dummy0 (10.77.0.1)
#   softroce-guest.sh --pair DIR     two guests, 1 vCPU each, joined by a virtual wire (UDP on
#                                    127.0.0.1); rxe0 on eth0: 10.77.0.1 (guest 0), 10.77.0.2
#                                    (guest 1); DIR/test.sh runs in both and finds its guest
#                                    number in $WEAVE_GUEST; the status is the worse of the two
#
# DIR is shared read-only with the guest at /host (9p). Binaries built on this machine run there:
# the initramfs carries this machine's glibc and libibverbs with the rxe provider. The guest
# kernel is Debian 12's generic one (it has CONFIG_RDMA_RXE=m), unpacked, never installed. QEMU
# runs in software emulation (no KVM here), so the guest is slow: correctness, not speed.
#
# Work files live in $WEAVE_IB_VM_DIR (default target/ib-vm): the kernel and the initramfs are
# built once and reused. $WEAVE_IB_VM_TIMEOUT bounds the guest (default 1200 s: on a 2-core host
# the full run — transport-ib's tests twice, the 2- and 4-rank matrices and kills — took 600 s
# and more of emulated time, the 4-rank part alone 430 s), $WEAVE_IB_VM_MEMORY sizes it (default 4G).
set -euo pipefail

PAIR=0
if [ "${1:-}" = --pair ]; then PAIR=1; shift; fi
DIR=${1:?usage: softroce-guest.sh [--pair] DIR (with DIR/test.sh)}
DIR=$(cd "$DIR" && pwd)
[ -f "$DIR/test.sh" ] || { echo "softroce-guest: $DIR/test.sh does not exist" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=${WEAVE_IB_VM_DIR:-$HERE/../../target/ib-vm}
mkdir -p "$WORK"; WORK=$(cd "$WORK" && pwd)
TIMEOUT=${WEAVE_IB_VM_TIMEOUT:-1200}
MEMORY=${WEAVE_IB_VM_MEMORY:-4G}

# The packages are provided by `cargo xtask ib-vm` / `cargo xtask test` (xtask's prerequisites).
need=()
for p in qemu-system-x86 busybox-static rdma-core ibverbs-providers ibverbs-utils perftest cpio kmod dash iproute2; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "softroce-guest: missing Debian packages: ${need[*]} (cargo xtask ib-vm installs them as root)" >&2
  exit 2
fi

# The kernel: Debian 12's generic flavour, unpacked.
KROOT=$WORK/kernel
if [ ! -e "$KROOT/.unpacked" ]; then
  apt-get update -qq
  pkg=$(apt-cache depends linux-image-amd64 | sed -n 's/.*Depends: \(linux-image-[0-9][^ ]*\).*/\1/p' | head -1)
  rm -rf "$KROOT" "$WORK"/linux-image-*.deb
  (cd "$WORK" && apt-get download -q "$pkg" >/dev/null 2>&1)
  dpkg -x "$WORK"/linux-image-*.deb "$KROOT"
  depmod -b "$KROOT" "$(ls "$KROOT/lib/modules")"
  rm -f "$WORK"/linux-image-*.deb
  touch "$KROOT/.unpacked"
fi
KVER=$(ls "$KROOT/lib/modules" | head -1)

# The initramfs: busybox, dash, kmod, iproute2, rdma-core's tools, the rxe module and its
# dependencies, and every library those need. Rebuilt when this script changes.
INITRD=$WORK/initramfs.cpio.gz
if [ ! -s "$INITRD" ] || [ "$0" -nt "$INITRD" ]; then
  R=$WORK/root
  rm -rf "$R"
  mkdir -p "$R"/{bin,sbin,etc/libibverbs.d,proc,sys,dev,tmp,host,lib64,usr/lib/x86_64-linux-gnu/libibverbs}
  cp /usr/bin/busybox "$R/bin/"
  for applet in $(busybox --list); do [ -e "$R/bin/$applet" ] || ln -s busybox "$R/bin/$applet"; done
  for m in crc32_generic crc32_pclmul rdma_rxe rdma_ucm dummy 9p 9pnet_virtio virtio_pci virtio_net; do
    modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
  done | sort -u | while read -r ko; do
    rel=${ko#"$KROOT"/lib/modules/$KVER/}
    mkdir -p "$R/lib/modules/$KVER/$(dirname "$rel")"
    cp "$ko" "$R/lib/modules/$KVER/$rel"
  done
  depmod -b "$R" "$KVER"
  tools="/usr/bin/ibv_devinfo /usr/bin/ib_write_bw /usr/bin/ib_write_lat /usr/bin/rdma /usr/sbin/ip"
  libs="/usr/lib/x86_64-linux-gnu/libgcc_s.so.1 /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so"
  for t in $tools; do rm -f "$R/bin/${t##*/}"; cp -L "$t" "$R/bin/"; done
  rm -f "$R/bin/sh"; cp /bin/dash "$R/bin/sh"   # busybox's shell would run its own `ip`
  cp /bin/kmod "$R/sbin/"; for x in modprobe insmod; do ln -sf kmod "$R/sbin/$x"; done
  for l in $libs; do cp -L "$l" "$R$l"; done
  cp /etc/libibverbs.d/rxe.driver "$R/etc/libibverbs.d/"
  for f in $tools $libs /bin/dash /bin/kmod; do ldd "$f" | grep -o '/[^ ]*'; done | sort -u | while read -r so; do
    case "$so" in
      /lib64/*) cp -L "$so" "$R/lib64/" ;;
      *) cp -L "$so" "$R/usr/lib/x86_64-linux-gnu/" ;;
    esac
  done
  ln -s ../usr/lib/x86_64-linux-gnu "$R/lib/x86_64-linux-gnu" 2>/dev/null || { mkdir -p "$R/lib"; ln -s ../usr/lib/x86_64-linux-gnu "$R/lib/x86_64-linux-gnu"; }
  cat > "$R/init" <<'INIT'
#!/bin/sh
export PATH=/sbin:/bin HOME=/tmp
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev; mount -t tmpfs tmp /tmp
mkdir -p /dev/shm; mount -t tmpfs shm /dev/shm
for m in virtio_pci virtio_net 9pnet_virtio 9p dummy crc32_generic crc32_pclmul rdma_rxe rdma_ucm; do modprobe $m; done
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 host /host
arg() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
export WEAVE_GUEST=$(arg weave_guest)
NETDEV=$(arg weave_netdev)
ip link set lo up
[ "$NETDEV" = dummy0 ] && ip link add dummy0 type dummy
ip addr add "$(arg weave_ip)" dev "$NETDEV"; ip link set "$NETDEV" up
rdma link add rxe0 type rxe netdev "$NETDEV"
ulimit -l unlimited
echo "=== guest ready: $(ibv_devinfo -l 2>&1 | tr '\n' ' ')"
cd /host && sh /host/test.sh
s=$?
# The kernel's side of a failure (rxe's messages, a stalled NIC) goes with it.
[ $s -ne 0 ] && { echo "=== kernel messages:"; dmesg | tail -40; }
echo "=== TEST_EXIT=$s"
poweroff -f
INIT
  chmod +x "$R/init"
  (cd "$R" && find . | cpio -o -H newc --quiet | gzip -1 > "$INITRD.tmp") && mv "$INITRD.tmp" "$INITRD"
fi

# guest NAME KERNEL-ARGS QEMU-ARGS...: boots one guest, its console in $WORK/NAME.log.
guest() {
  local name=$1 args=$2
  shift 2
  timeout "$TIMEOUT" qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m "$MEMORY" -nographic -no-reboot \
    -kernel "$KROOT/boot/vmlinuz-$KVER" -initrd "$INITRD" \
    -append "console=ttyS0 quiet panic=-1 $args" \
    -virtfs local,path="$DIR",mount_tag=host,security_model=none,readonly=on \
    "$@" </dev/null >"$WORK/$name.log" 2>&1
}
# status NAME: the guest's test status, or nothing.
status() { tr -d '\r' <"$WORK/$1.log" | sed -n 's/^=== TEST_EXIT=\([0-9]*\)$/\1/p' | tail -1; }
# report NAME: the guest's output after it came up, and its status (99 when it gave none).
report() {
  tr -d '\r' <"$WORK/$1.log" | sed -n '/=== guest ready/,$p' | sed "s/^/[$1] /"
  local s
  s=$(status "$1")
  if [ -z "$s" ]; then
    echo "softroce-guest: guest $1 gave no exit status (log: $WORK/$1.log)" >&2
    tail -20 "$WORK/$1.log" >&2
    return 99
  fi
  return "$s"
}

set +e
if [ $PAIR = 0 ]; then
  guest guest "weave_guest=0 weave_netdev=dummy0 weave_ip=10.77.0.1/24" -smp 2 -nic none
  report guest
  exit $?
fi
port=$((20000 + $$ % 20000))
wire() { # wire LOCAL-PORT REMOTE-PORT MAC-BYTE
  echo "-netdev dgram,id=n0,local.type=inet,local.host=127.0.0.1,local.port=$1,remote.type=inet,remote.host=127.0.0.1,remote.port=$2 -device virtio-net-pci,netdev=n0,mac=52:54:00:00:77:$3"
}
# pair: boots both guests, reports them; its status is the worse guest's.
pair() {
  # shellcheck disable=SC2046
  guest guest0 "weave_guest=0 weave_netdev=eth0 weave_ip=10.77.0.1/24" -smp 1 $(wire $port $((port + 1)) 01) & g0=$!
  # shellcheck disable=SC2046
  guest guest1 "weave_guest=1 weave_netdev=eth0 weave_ip=10.77.0.2/24" -smp 1 $(wire $((port + 1)) $port 02) & g1=$!
  wait $g0; wait $g1
  report guest0; s0=$?
  report guest1; s1=$?
  [ $s0 -ge $s1 ] && return $s0
  return $s1
}
pair; s=$?
# The emulated NIC of a guest sometimes stops sending on a loaded 2-core host ("NETDEV
# WATCHDOG: transmit queue 0 timed out", sessions 12-14): the emulator's fault, after which
# the ranks time out. Such a run is booted once more; any other failure stands.
if [ $s -ne 0 ] && cat "$WORK/guest0.log" "$WORK/guest1.log" | grep -q "NETDEV WATCHDOG"; then
  echo "softroce-guest: a guest's virtual NIC stalled (NETDEV WATCHDOG in its log): booting the pair once more" >&2
  port=$((port + 2))
  pair; s=$?
fi
exit $s
