#!/usr/bin/env bash
# Installs the Debian packages tabby's tests and lab use, when missing:
# the kernel tools tabby drives (iptables, ipset, iproute2), the peers it is
# tested against (bird2, the reference CNI plugins, iperf3), iputils-ping,
# graphviz (its dot reads what tabbyctl bgp graph prints), and what the
# IPIP test under qemu boots (qemu-system-x86, busybox-static, cpio, xz-utils).
set -euo pipefail
pkgs=(iptables ipset iproute2 containernetworking-plugins bird2 iperf3 iputils-ping procps kmod runc containerd util-linux graphviz qemu-system-x86 busybox-static cpio xz-utils)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) != 0 ]]; then
    echo "install-deps: missing Debian packages ${missing[*]}; run as root (or apt-get install them)" >&2
    exit 1
  fi
  echo "install-deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! command -v go >/dev/null; then
  echo "install-deps: Go is not on PATH (expected at /usr/local/go/bin)" >&2
  exit 1
fi
