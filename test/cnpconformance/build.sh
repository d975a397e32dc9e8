#!/usr/bin/env bash
# Builds the ClusterNetworkPolicy conformance suite of
# sigs.k8s.io/network-policy-api v0.3.0 (go test -c of its conformance/
# package in this module) from the Go module proxy, and prints the folder
# that holds it as cnp-conformance.test, next to the module's experimental
# ClusterNetworkPolicy CRD (clusternetworkpolicies.yaml). Cached by content like the other
# builds (<cache>/cnp-conformance/<key>, see hack/lib/buildcache.sh). A cold
# build takes about 3 minutes on 2 cores and makes a 48 MB binary.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export PATH="/usr/local/go/bin:$PATH"
source "$root/hack/lib/buildcache.sh"
key="$(content_key "$here/go.mod" "$here/go.sum" "$here/tools.go" "$here/build.sh")"
out="$(cache_root)/cnp-conformance/$key"
bin=cnp-conformance.test
complete() { [[ -x "$out/$bin" && -s "$out/clusternetworkpolicies.yaml" ]]; }
cache_claim "$out"
cd "$here"
export GOFLAGS=-mod=mod CGO_ENABLED=0
echo "building the ClusterNetworkPolicy conformance suite (network-policy-api v0.3.0) into $out (cold: about 3 minutes)" >&2
step "$bin" go test -c -trimpath -ldflags "-s -w" -o "$out.tmp/$bin" sigs.k8s.io/network-policy-api/conformance
moddir="$(go list -m -f '{{.Dir}}' sigs.k8s.io/network-policy-api)"
cp "$moddir/config/crd/experimental/policy.networking.k8s.io_clusternetworkpolicies.yaml" "$out.tmp/clusternetworkpolicies.yaml"
rm -rf "$out"
mv "$out.tmp" "$out"
echo "$out"
