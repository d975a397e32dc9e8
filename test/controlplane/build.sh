#!/usr/bin/env bash
# Builds the Kubernetes programs tabby's tests and lab run, from the Go module
# proxy, and prints the folder that holds them:
#   etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl
#                       the control plane
#   kubelet, kube-proxy the lab's nodes
#   agnhost             the program of Kubernetes' e2e test pods (2.59)
#   pause               the pod sandbox (build/pause/linux/pause.c, static)
# The folder is <cache>/k8s/<key>: the cache is $TABBY_CACHE_DIR or
# ${XDG_CACHE_HOME:-$HOME/.cache}/tabby, the key a hash of this module's files
# and the Go version, so every checkout with the same sources shares one
# build. A cold build takes about 6 minutes on 2 cores; with Go's build cache
# warm, about 1.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export PATH="/usr/local/go/bin:$PATH"
source "$root/hack/lib/buildcache.sh"
k8s=v1.35.4
pause=3.10.1
key="$(content_key "$here/go.mod" "$here/go.sum" "$here/tools.go" "$here/build.sh")"
out="$(cache_root)/k8s/$key"
bins=(etcd kube-apiserver kube-scheduler kube-controller-manager kubectl kubelet kube-proxy agnhost pause)
complete() {
  for b in "${bins[@]}"; do [[ -x "$out/$b" ]] || return 1; done
}
cache_claim "$out"
cd "$here"
ld="-s -w -X k8s.io/component-base/version.gitVersion=$k8s -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=35 -X k8s.io/client-go/pkg/version.gitVersion=$k8s -X k8s.io/component-base/version.gitTreeState=clean"
export GOFLAGS=-mod=mod CGO_ENABLED=0
echo "building Kubernetes $k8s programs into $out (cold: about 6 minutes; with Go's build cache warm: about 1)" >&2
step "etcd" go build -trimpath -ldflags "-s -w" -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3
for c in kube-apiserver kube-scheduler kube-controller-manager kubectl kubelet kube-proxy; do
  step "$c" go build -trimpath -ldflags "$ld" -o "$out.tmp/$c" "k8s.io/kubernetes/cmd/$c"
done
src="$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
step "agnhost $(cat "$src/test/images/agnhost/VERSION")" go build -trimpath \
  -ldflags "-s -w -X main.Version=$(cat "$src/test/images/agnhost/VERSION")" -o "$out.tmp/agnhost" k8s.io/kubernetes/test/images/agnhost
step "pause $pause" gcc -Os -Wall -Werror -static -DVERSION="v$pause" -o "$out.tmp/pause" "$src/build/pause/linux/pause.c"
strip "$out.tmp/pause"
rm -rf "$out"
mv "$out.tmp" "$out"
echo "$out"
