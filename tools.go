//go:build tools

// Package tabby records, for go mod tidy, the programs that tabby's image
// builds from this module's pinned dependencies rather than its own code:
// the reference CNI plugins loopback (the container runtime runs it for
// every pod sandbox) and portmap (the conflist chains it for hostPort).
// hack/build-cni-plugins.sh builds them; the build tag keeps this file out
// of every ordinary build.
package tabby

import (
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/containernetworking/plugins/plugins/meta/portmap"
)
