package bgp

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tabbynet/tabby/internal/tier"
)

// A lab for real BGP sessions: network namespaces on a bridge that lives in
// a namespace of its own, so nothing touches the host's namespace. Node i
// has eth0 with 10.77.0.i/24; every test's namespaces have names of their
// own and are removed when it ends, also when it fails.

const labSubnet = "10.77.0.0/24"

var labSeq atomic.Int32

type lab struct {
	t      *testing.T
	prefix string
	bridge string // namespace holding the bridge
	// dualStack gives nodes made from now on fd00:77::i/64 too.
	dualStack bool
}

// labNode is a network namespace on the lab's bridge.
type labNode struct {
	ns    string
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

// newLab makes the bridge namespace; nodes come with node().
func newLab(t *testing.T) *lab {
	t.Helper()
	l := &lab{t: t, prefix: fmt.Sprintf("tbgp-%d-%d", os.Getpid(), labSeq.Add(1))}
	l.bridge = l.prefix + "-br"
	l.addNS(l.bridge)
	l.ip("-n", l.bridge, "link", "add", "br0", "type", "bridge")
	l.ip("-n", l.bridge, "link", "set", "br0", "up")
	return l
}

// addNS creates a namespace and registers its removal.
func (l *lab) addNS(name string) {
	l.ip("netns", "add", name)
	l.t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			l.t.Errorf("removing namespace %s: %v: %s", name, err, out)
		}
	})
	l.ip("-n", name, "link", "set", "lo", "up")
}

// node makes node i: a namespace with eth0 (10.77.0.i/24) on the bridge.
func (l *lab) node(i int) *labNode {
	n := &labNode{ns: fmt.Sprintf("%s-n%d", l.prefix, i), addr: netip.MustParsePrefix(fmt.Sprintf("10.77.0.%d/24", i))}
	l.addNS(n.ns)
	veth := fmt.Sprintf("v%d", i)
	l.ip("-n", l.bridge, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", n.ns)
	l.ip("-n", l.bridge, "link", "set", veth, "master", "br0", "up")
	l.ip("-n", n.ns, "addr", "add", n.addr.String(), "dev", "eth0")
	if l.dualStack {
		n.addr6 = netip.MustParsePrefix(fmt.Sprintf("fd00:77::%d/64", i))
		l.ip("-n", n.ns, "addr", "add", n.addr6.String(), "dev", "eth0", "nodad")
	}
	l.ip("-n", n.ns, "link", "set", "eth0", "up")
	return n
}

func (l *lab) ip(args ...string) {
	l.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		l.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// bgpNode is the lab node as DesiredPeers sees it.
func (n *labNode) bgpNode(name string, labels ...string) Node {
	bn := Node{Name: name, Labels: map[string]string{}, IPv4: n.addr, IPv6: n.addr6}
	for i := 0; i+1 < len(labels); i += 2 {
		bn.Labels[labels[i]] = labels[i+1]
	}
	return bn
}
