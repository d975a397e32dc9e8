package testnet

import (
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
)

// TB is what NewNS needs of a testing.TB: tabbyctl links this package,
// and a shipped program must not link package testing.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Errorf(format string, args ...any)
	Cleanup(func())
}

// NewNS makes a network namespace that is closed and removed, with all
// it holds (links, iptables of both backends, ipsets), when the test ends.
func NewNS(t TB) ns.NetNS {
	t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("creating a namespace: %v", err)
	}
	t.Cleanup(func() {
		if err := closeNS(n); err != nil {
			t.Errorf("removing namespace %s: %v", n.Path(), err)
		}
	})
	return n
}
