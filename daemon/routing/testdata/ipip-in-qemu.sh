#!/usr/bin/env bash
# Runs daemon/routing's real-kernel tests under a kernel that has ipip, for
# machines whose own kernel lacks it (TestApplyIPIP skips there).
#
#   daemon/routing/testdata/ipip-in-qemu.sh ['-test.run pattern']   # default TestApplyIPIP
#
# It boots Debian's linux-image-amd64 (downloaded with apt-get download on
# first use) under qemu-system-x86_64 with TCG, from an initramfs holding
# static busybox, the ip and ping binaries with their libraries, the ipip,
# veth and bridge modules, and a CGO_ENABLED=0 test binary of this package.
# The init script runs the tests, prints "RESULT rc=N" and powers off; the
# script exits with the tests' status. Needs qemu-system-x86,
# busybox-static and cpio (apt-get install them); it takes about a minute.
set -euo pipefail
pattern=${1:-TestApplyIPIP}
here=$(cd "$(dirname "$0")/.." && pwd)
W=${TABBY_QEMU_DIR:-${TMPDIR:-/tmp}/tabby-ipip-qemu}
for tool in qemu-system-x86_64 busybox cpio apt-get; do
  command -v $tool >/dev/null || { echo "ipip-in-qemu: $tool is missing (apt-get install qemu-system-x86 busybox-static cpio)" >&2; exit 2; }
done
mkdir -p "$W"
if ! ls "$W"/k/boot/vmlinuz-* >/dev/null 2>&1; then
  pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
  (cd "$W" && apt-get download "$pkg" && dpkg-deb -x "$pkg"_*.deb k)
fi
K=$(ls -d "$W"/k/lib/modules/*)
R=$W/root
rm -rf "$R" && mkdir -p "$R"/{bin,usr/sbin,usr/bin,proc,sys,dev,run,tmp,var,lib/modules,lib64,lib/x86_64-linux-gnu}
ln -s /run "$R"/var/run
cp "$(command -v busybox)" "$R"/bin/busybox
for m in net/ipv4/tunnel4 net/ipv4/ip_tunnel net/ipv4/ipip net/llc/llc net/802/stp net/bridge/bridge drivers/net/veth; do
  cp "$K/kernel/$m.ko" "$R"/lib/modules/
done
for b in /usr/sbin/ip /usr/bin/ping; do
  cp "$b" "$R$b"
  for l in $(ldd "$b" | grep -o '/lib[^ ]*'); do cp -L "$l" "$R$l"; done
done
(cd "$here" && CGO_ENABLED=0 go test -c -o "$R"/routing.test .)
echo "$pattern" >"$R"/pattern
cat >"$R"/init <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mount -t tmpfs run /run; mount -t tmpfs tmp /tmp
for m in tunnel4 ip_tunnel ipip llc stp bridge veth; do insmod /lib/modules/$m.ko; done
/routing.test -test.run "$(cat /pattern)" -test.v -test.count=1 >/dev/console 2>&1
echo "RESULT rc=$?" >/dev/console
poweroff -f
INIT
chmod +x "$R"/init
(cd "$R" && find . | cpio -o -H newc 2>/dev/null | gzip -1) >"$W"/initrd.gz
log=$W/console.log
timeout 900 qemu-system-x86_64 -accel tcg -m 1024 -smp 2 -nographic -no-reboot \
  -kernel "$(ls "$W"/k/boot/vmlinuz-*)" -initrd "$W"/initrd.gz \
  -append "console=ttyS0 quiet panic=-1 rdinit=/init" | tr -d '\r' | tee "$log"
grep -q '^RESULT rc=0' "$log"
