#!/bin/sh
# build-cni-plugins.sh OUTDIR: builds the reference CNI plugins that tabby's
# image ships next to its own (loopback, which the container runtime runs
# for every pod sandbox, and portmap, which the conflist chains for
# hostPort) from github.com/containernetworking/plugins at the version
# go.mod pins, static, into OUTDIR. They print that version when run
# without CNI_COMMAND ("CNI loopback plugin v1.9.1"), which is how
# install-cni tells them from older or newer ones on a node.
#
# Used by the Makefile and deploy/Dockerfile; prints nothing but errors.
set -eu
if [ $# -ne 1 ] || [ -z "$1" ]; then
	echo "usage: $0 OUTDIR" >&2
	exit 2
fi
mkdir -p "$1"
out=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
module=github.com/containernetworking/plugins
version=$(go list -m -f '{{.Version}}' "$module")
if [ -z "$version" ]; then
	echo "$0: go.mod does not pin $module" >&2
	exit 1
fi
CGO_ENABLED=0 go build -trimpath \
	-ldflags "-s -w -X $module/pkg/utils/buildversion.BuildVersion=$version" \
	-o "$out/" "$module/plugins/main/loopback" "$module/plugins/meta/portmap"
