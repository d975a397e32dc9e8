package bgp

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/tabbynet/tabby/internal/netnstest"
	"github.com/tabbynet/tabby/internal/tier"
)

// A lab for real BGP sessions: network namespaces on a bridge of a
// netnstest underlay, so nothing touches the host's namespace. Node i has
// eth0 with 10.77.0.i/24; every test's namespaces are removed when it
// ends, also when it fails.

type lab struct {
	t   *testing.T
	net *netnstest.Net
	// dualStack gives nodes made from now on fd00:77::i/64 too.
	dualStack bool
}

// labNode is a network namespace on the lab's bridge.
type labNode struct {
	ns    *netnstest.NS
	addr  netip.Prefix
	addr6 netip.Prefix // zero unless the lab is dual-stack
}

// needRoot skips tests that need root, namespaces and the named programs.
func needRoot(t *testing.T, programs ...string) {
	t.Helper()
	if testing.Short() {
		t.Skip("short mode: skipping tests with network namespaces")
	}
	tier.Root(t, "to create network namespaces", append([]string{"ip", "nsenter"}, programs...)...)
}

// newLab makes the underlay and its bridge; nodes come with node().
func newLab(t *testing.T) *lab {
	t.Helper()
	return &lab{t: t, net: netnstest.NewNet(t, "br0")}
}

// node makes node i: a namespace with eth0 (10.77.0.i/24) on the bridge.
func (l *lab) node(i int) *labNode {
	l.t.Helper()
	n := &labNode{addr: netip.MustParsePrefix(fmt.Sprintf("10.77.0.%d/24", i))}
	addrs := []string{n.addr.String()}
	if l.dualStack {
		n.addr6 = netip.MustParsePrefix(fmt.Sprintf("fd00:77::%d/64", i))
		addrs = append(addrs, n.addr6.String())
	}
	n.ns = l.net.Node(fmt.Sprintf("n%d", i), fmt.Sprintf("v%d", i), "br0", addrs...)
	return n
}

// bgpNode is the lab node as DesiredPeers sees it.
func (n *labNode) bgpNode(name string, labels ...string) Node {
	bn := Node{Name: name, Labels: map[string]string{}, IPv4: n.addr, IPv6: n.addr6}
	for i := 0; i+1 < len(labels); i += 2 {
		bn.Labels[labels[i]] = labels[i+1]
	}
	return bn
}
