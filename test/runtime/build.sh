#!/usr/bin/env bash
# Builds the container runtime and cluster DNS of tabby's lab nodes from the
# Go module proxy, and prints the folder that holds them:
#   containerd, containerd-shim-runc-v2, ctr   containerd v2 (CRI plugin
#                                              included), module ./containerd
#   coredns                                    CoreDNS, module ./coredns
# runc is Debian's (hack/install-deps.sh installs it). The folder is
# <cache>/runtime/<key> (see hack/lib/buildcache.sh): shared by every checkout
# with the same sources. A cold build takes about 3 minutes on 2 cores.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export PATH="/usr/local/go/bin:$PATH"
source "$root/hack/lib/buildcache.sh"
key="$(content_key "$here/build.sh" "$here"/containerd/{go.mod,go.sum,tools.go} "$here"/coredns/{go.mod,go.sum,main.go})"
out="$(cache_root)/runtime/$key"
bins=(containerd containerd-shim-runc-v2 ctr coredns)
complete() {
  for b in "${bins[@]}"; do [[ -x "$out/$b" ]] || return 1; done
}
cache_claim "$out"
export GOFLAGS=-mod=mod CGO_ENABLED=0
echo "building containerd and CoreDNS into $out (cold: about 3 minutes)" >&2
cd "$here/containerd"
v="$(go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)"
ld="-s -w -X github.com/containerd/containerd/v2/version.Version=$v -X github.com/containerd/containerd/v2/version.Revision=module-proxy"
for c in containerd containerd-shim-runc-v2 ctr; do
  step "$c $v" go build -trimpath -tags "no_btrfs no_devmapper no_zfs" -ldflags "$ld" -o "$out.tmp/$c" "github.com/containerd/containerd/v2/cmd/$c"
done
cd "$here/coredns"
step "coredns $(go list -m -f '{{.Version}}' github.com/coredns/coredns)" go build -trimpath -ldflags "-s -w" -o "$out.tmp/coredns" .
rm -rf "$out"
mv "$out.tmp" "$out"
echo "$out"
