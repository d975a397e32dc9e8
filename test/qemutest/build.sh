#!/usr/bin/env bash
# Builds what tabby's tests boot under qemu, for the machines whose own
# kernel has no ipip module, and prints the folder that holds it:
#   vmlinux     Debian's linux-image-amd64 kernel (apt-get download and
#               dpkg-deb -x: never installed on this machine), uncompressed
#   base.cpio   the initramfs every run shares: static busybox, the real
#               ip, iptables (nft), ipset and ping with the libraries ldd
#               lists and iptables' extensions, the kernel's network modules
#               with a modules.dep (depmod -b) so that busybox's modprobe
#               loads what iptables, ipset and ip ask for, and /init
# A run appends its own archive (the test binary, tabby's programs,
# /guest.json, /guest.args) and boots it; /init runs /guest.test and powers
# off.
# The folder is <cache>/qemu/<key>: the cache is $TABBY_CACHE_DIR or
# ${XDG_CACHE_HOME:-$HOME/.cache}/tabby, the key a hash of this script and
# of the versions of the Debian packages it takes files from.
# Needs qemu-system-x86, busybox-static, cpio, iptables, ipset, iproute2,
# iputils-ping and kmod (make deps installs them), and apt's lists (the
# first time: apt-get update).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export PATH="/usr/local/go/bin:/usr/sbin:/sbin:$PATH"
source "$root/hack/lib/buildcache.sh"

for tool in busybox cpio apt-get dpkg-deb depmod kmod xz ip iptables ipset ping; do
  command -v "$tool" >/dev/null || {
    echo "qemu build: $tool is missing (make deps, or apt-get install qemu-system-x86 busybox-static cpio iptables ipset iproute2 iputils-ping kmod)" >&2
    exit 2
  }
done
kernel_package() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}'; }
kpkg=$(kernel_package)
if [[ -z $kpkg && $(id -u) == 0 ]]; then
  echo "qemu build: apt knows no linux-image-amd64 yet: apt-get update" >&2
  apt-get update -qq >&2
  kpkg=$(kernel_package)
fi
[[ -n $kpkg ]] || { echo "qemu build: apt knows no linux-image-amd64: run apt-get update (as root)" >&2; exit 2; }
kver=$(apt-cache policy "$kpkg" | awk '/Candidate:/{print $2}')
versions() {
  echo "$kpkg $kver"
  dpkg-query -W -f='${Package} ${Version}\n' busybox-static iptables ipset iproute2 iputils-ping libc6
}
key=$({ sha256sum <"$0"; versions; } | sha256sum | cut -c1-16)
out="$(cache_root)/qemu/$key"
complete() { [[ -s $out/vmlinux && -s $out/base.cpio ]]; }
cache_claim "$out"
cd "$out.tmp"
echo "building the qemu kernel and initramfs into $out ($kpkg $kver)" >&2
# As root, not _apt: apt cannot hand this folder to its sandbox user.
step "apt-get download $kpkg" apt-get download -q -o APT::Sandbox::User=root "$kpkg" >&2
deb=$(ls "$kpkg"_*.deb)
step "dpkg-deb -x $deb" dpkg-deb -x "$deb" k
rm -f "$deb"
release=$(ls k/lib/modules)
# qemu boots the ELF kernel inside the bzImage directly (PVH): under TCG
# that saves the ten seconds the XZ decompressor takes.
off=$(LC_ALL=C grep -obUaP -m1 '\xfd7zXZ\x00' k/boot/vmlinuz-"$release" | cut -d: -f1 || true)
off=${off%%$'\n'*}
[[ -n $off ]] || { echo "qemu build: k/boot/vmlinuz-$release holds no XZ-compressed kernel" >&2; exit 1; }
xz -dc --single-stream <(tail -c +$((off + 1)) k/boot/vmlinuz-"$release") >vmlinux

R=$PWD/root
mkdir -p "$R"/{bin,sbin,usr/sbin,usr/bin,proc,sys,dev,run,tmp,var,etc,lib64,lib/x86_64-linux-gnu}
mkdir -p "$R/usr/lib/x86_64-linux-gnu"
ln -s /run "$R"/var/run
cp "$(command -v busybox)" "$R"/bin/busybox
# The network modules (and what they use from lib/ and crypto/), with their
# dependencies worked out here, for the guest's modprobe.
M=$R/lib/modules/$release
mkdir -p "$M/kernel/drivers/net/ethernet/intel" "$M/kernel/arch/x86"
cp -r k/lib/modules/"$release"/kernel/{net,lib,crypto} "$M/kernel/"
cp -r k/lib/modules/"$release"/kernel/arch/x86/crypto "$M/kernel/arch/x86/"
cp -r k/lib/modules/"$release"/kernel/drivers/net/ethernet/intel/e1000 "$M/kernel/drivers/net/ethernet/intel/"
cp k/lib/modules/"$release"/kernel/drivers/net/veth.ko "$M/kernel/drivers/net/"
cp k/lib/modules/"$release"/modules.{order,builtin,builtin.modinfo} "$M/"
step "depmod -b" depmod -b "$R" "$release"
# The real programs (busybox's ip cannot make veth or ipip links) with
# their libraries, and iptables' extensions, which it loads by name.
copy_with_libs() {
  local b=$1
  mkdir -p "$R$(dirname "$b")"
  cp -L "$b" "$R$b"
  for l in $(ldd "$b" | grep -o '/lib[^ ]*'); do
    mkdir -p "$R$(dirname "$l")"
    cp -L "$l" "$R$l"
  done
}
xt=$(readlink -f "$(command -v xtables-nft-multi)")
kmod=$(readlink -f "$(command -v kmod)")
for b in "$(readlink -f "$(command -v ip)")" "$xt" "$(readlink -f "$(command -v ipset)")" "$(readlink -f "$(command -v ping)")" "$kmod"; do
  copy_with_libs "$b"
done
# kmod's modprobe, not busybox's: it resolves the aliases (net-pf-16-proto-12
# and the like) that the kernel and iptables ask for.
for t in modprobe insmod rmmod lsmod; do ln -sf "$kmod" "$R/sbin/$t"; done
cp -r /usr/lib/x86_64-linux-gnu/xtables "$R/usr/lib/x86_64-linux-gnu/"
for l in /usr/lib/x86_64-linux-gnu/xtables/*.so; do
  for d in $(ldd "$l" | grep -o '/lib[^ ]*'); do
    mkdir -p "$R$(dirname "$d")"
    cp -L "$d" "$R$d"
  done
done
for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
  ln -sf "$xt" "$R/usr/sbin/$t"
  ln -sf "$xt" "$R/usr/sbin/${t/tables/tables-nft}"
done
[[ $(readlink -f "$(command -v ip)") == /usr/sbin/ip ]] || ln -sf "$(readlink -f "$(command -v ip)")" "$R/usr/sbin/ip"
echo 'root:x:0:0:root:/root:/bin/sh' >"$R/etc/passwd"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$R/etc/hosts"
cat >"$R/init" <<'INIT'
#!/bin/busybox sh
# tabby's qemu guest (busybox's sh runs its own applets first, so the\n# real programs are called by path): mounts, modules, the NIC on qemu's user network
# (10.0.2.15/24; no default route, so the guest reaches nothing but
# qemu's 10.0.2.0/24, where 10.0.2.2 is the host's loopback), then the
# test binary a run appended (with the flags in /guest.args, if any); its
# status is the last line.
/bin/busybox --install -s /bin
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mount -t tmpfs run /run; mount -t tmpfs tmp /tmp; mkdir -p /root /var/lib
echo /sbin/modprobe >/proc/sys/kernel/modprobe
for m in e1000 veth bridge ipip; do /sbin/modprobe $m || echo "GUEST modprobe $m failed"; done
/usr/sbin/ip link set lo up
/usr/sbin/ip link set eth0 up && /usr/sbin/ip addr add 10.0.2.15/24 dev eth0
echo "GUEST kernel $(uname -r) up after $(cut -d' ' -f1 /proc/uptime)s"
TABBY_QEMU_GUEST=/guest.json /guest.test -test.v $(cat /guest.args 2>/dev/null) >/dev/console 2>&1
echo "RESULT rc=$?" >/dev/console
poweroff -f
INIT
chmod +x "$R/init"
# Not compressed: unpacking is then a copy, where gunzip under TCG takes
# seconds; a run appends its archive to this one.
(cd "$R" && find . | cpio -o -H newc --quiet) >base.cpio
rm -rf k "$R"
cd /
rm -rf "$out"
mv "$out.tmp" "$out"
echo "$out"
