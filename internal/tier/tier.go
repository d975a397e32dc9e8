// Package tier is how a test says what it needs beyond plain Go. A pure
// test (objects in, objects out) needs nothing and calls nothing here; a
// test that needs root (network namespaces, the kernel's routes and
// iptables, a real control plane) starts with
//
//	tier.Root(t, "to create network namespaces")
//
// and a test that needs the control plane asks clustertest for it, which
// calls Root first. As non-root such tests skip, loudly and with the
// reason, so `go test ./...` runs every pure test anywhere; as root they
// run, and whatever they need that is missing fails them: on a machine set
// up for them (make deps, .ci/run) a missing piece is a bug, not a skip.
package tier

import (
	"os"
	"os/exec"
	"testing"
)

// SkipPrefix starts every skip message of a test that needs root, so a
// log of a non-root run shows at a glance what did not run.
const SkipPrefix = "SKIPPING: needs root: "

// Root skips tb loudly unless the test runs as root; why says what the
// test does with root. As root, each program must be on PATH, or tb
// fails naming it.
func Root(tb testing.TB, why string, programs ...string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip(SkipPrefix + why + " (run the tests as root, for example sudo -E go test)")
	}
	for _, p := range programs {
		if _, err := exec.LookPath(p); err != nil {
			tb.Fatalf("this test needs the program %s on PATH: install it (make deps installs every program the tests use)", p)
		}
	}
}
