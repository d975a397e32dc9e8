#!/usr/bin/env bash
# Builds Kubernetes' end-to-end suite, e2e.test v1.35.4, from the Go module
# proxy (go test -c k8s.io/kubernetes/test/e2e in this module), and prints
# the folder that holds it. Cached by content like the other builds
# (<cache>/e2e/<key>, see hack/lib/buildcache.sh). A cold build takes about
# 5 minutes on 2 cores once the control plane is built (they share most
# packages), and makes a 100 MB binary.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export PATH="/usr/local/go/bin:$PATH"
source "$root/hack/lib/buildcache.sh"
k8s=v1.35.4
key="$(content_key "$here/go.mod" "$here/go.sum" "$here/tools.go" "$here/build.sh")"
out="$(cache_root)/e2e/$key"
complete() { [[ -x "$out/e2e.test" ]]; }
cache_claim "$out"
cd "$here"
ld="-s -w -X k8s.io/component-base/version.gitVersion=$k8s -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=35 -X k8s.io/client-go/pkg/version.gitVersion=$k8s -X k8s.io/component-base/version.gitTreeState=clean"
export GOFLAGS=-mod=mod CGO_ENABLED=0
echo "building Kubernetes' e2e.test $k8s into $out (cold: about 5 minutes)" >&2
step "e2e.test" go test -c -trimpath -ldflags "$ld" -o "$out.tmp/e2e.test" k8s.io/kubernetes/test/e2e
rm -rf "$out"
mv "$out.tmp" "$out"
echo "$out"
