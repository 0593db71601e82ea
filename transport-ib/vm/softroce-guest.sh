#!/bin/bash
# Runs DIR/test.sh inside a QEMU guest that has a real verbs device (SoftRoCE: rdma_rxe on a
# dummy netdev), and exits with the script's status.
#
#   softroce-guest.sh DIR            one guest, 2 vCPUs, rxe0 on dummy0 (10.77.0.1)
#
# DIR is shared read-only with the guest at /host (9p). Binaries built on this machine run there:
# the initramfs carries this machine's glibc and libibverbs with the rxe provider. The guest
# kernel is Debian 12's generic one (it has CONFIG_RDMA_RXE=m), unpacked, never installed. QEMU
# runs in software emulation (no KVM here), so the guest is slow: correctness, not speed.
#
# Work files live in $WEAVE_IB_VM_DIR (default target/ib-vm): the kernel and the initramfs are
# built once and reused. $WEAVE_IB_VM_TIMEOUT bounds the guest (default 600 s), $WEAVE_IB_VM_MEMORY
# sizes it (default 4G).
set -euo pipefail

DIR=${1:?usage: softroce-guest.sh DIR (with DIR/test.sh)}
DIR=$(cd "$DIR" && pwd)
[ -f "$DIR/test.sh" ] || { echo "softroce-guest: $DIR/test.sh does not exist" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=${WEAVE_IB_VM_DIR:-$HERE/../../target/ib-vm}
mkdir -p "$WORK"; WORK=$(cd "$WORK" && pwd)
TIMEOUT=${WEAVE_IB_VM_TIMEOUT:-600}
MEMORY=${WEAVE_IB_VM_MEMORY:-4G}

need=()
for p in qemu-system-x86 busybox-static rdma-core ibverbs-providers ibverbs-utils perftest cpio kmod dash iproute2; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "softroce-guest: installing ${need[*]}" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
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
  for m in crc32_generic crc32_pclmul rdma_rxe rdma_ucm dummy 9p 9pnet_virtio virtio_pci; do
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
for m in virtio_pci 9pnet_virtio 9p dummy crc32_generic crc32_pclmul rdma_rxe rdma_ucm; do modprobe $m; done
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 host /host
ip link set lo up; ip link add dummy0 type dummy; ip addr add 10.77.0.1/24 dev dummy0; ip link set dummy0 up
rdma link add rxe0 type rxe netdev dummy0
ulimit -l unlimited
echo "=== guest ready: $(ibv_devinfo -l 2>&1 | tr '\n' ' ')"
cd /host && sh /host/test.sh
echo "=== TEST_EXIT=$?"
poweroff -f
INIT
  chmod +x "$R/init"
  (cd "$R" && find . | cpio -o -H newc --quiet | gzip -1 > "$INITRD.tmp") && mv "$INITRD.tmp" "$INITRD"
fi

LOG=$WORK/guest.log
set +e
timeout "$TIMEOUT" qemu-system-x86_64 -accel tcg,thread=multi -cpu max -smp 2 -m "$MEMORY" -nographic -no-reboot \
  -kernel "$KROOT/boot/vmlinuz-$KVER" -initrd "$INITRD" -nic none \
  -append "console=ttyS0 quiet panic=-1" \
  -virtfs local,path="$DIR",mount_tag=host,security_model=none,readonly=on \
  </dev/null >"$LOG" 2>&1
qemu=$?
set -e
tr -d '\r' <"$LOG" | sed -n '/^=== guest ready/,$p'
status=$(tr -d '\r' <"$LOG" | sed -n 's/^=== TEST_EXIT=\([0-9]*\)$/\1/p' | tail -1)
if [ -z "$status" ]; then
  echo "softroce-guest: the guest gave no exit status (qemu exited $qemu; log: $LOG)" >&2
  tail -20 "$LOG" >&2
  exit 99
fi
exit "$status"
