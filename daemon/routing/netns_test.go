package routing

// The real-kernel tests build small networks of namespaces: an underlay
// namespace holding one bridge per subnet (and, with two subnets, a router
// namespace joining them), "nodes" attached to a bridge by a veth, and
// "pods" wired into a node exactly as the CNI plugin wires them
// (plugin.SetupPod and plugin.SetupHost: a /32 and /128, link-local
// gateways, a proto-80 route on the node). Nothing touches the host's own
// namespace; t.Cleanup removes every namespace, and with them every link.

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	v1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/internal/netnstest"
	"github.com/tabbynet/tabby/internal/testnet"
	"github.com/tabbynet/tabby/internal/tier"
	"github.com/tabbynet/tabby/plugin"
)

func needRoot(t *testing.T) {
	t.Helper()
	tier.Root(t, "a real-kernel test: it creates network namespaces")
}

// lab is an underlay of one or two subnets, 192.168.S.0/24 and fd00:S::/64
// on bridges brS, whose router (when there are two) is .1 and ::1.
type lab struct {
	t     *testing.T
	net   *netnstest.Net
	nodes []*node
}

func newLab(t *testing.T, subnets int) *lab {
	t.Helper()
	needRoot(t)
	var bridges []string
	for s := 1; s <= subnets; s++ {
		bridges = append(bridges, fmt.Sprintf("br%d", s))
	}
	l := &lab{t: t, net: netnstest.NewNet(t, bridges...)}
	if subnets > 1 {
		router := netnstest.New(t, "router")
		for s := 1; s <= subnets; s++ {
			err := l.net.Plug(router, fmt.Sprintf("eth%d", s), fmt.Sprintf("router-%d", s), fmt.Sprintf("br%d", s),
				fmt.Sprintf("192.168.%d.1/24", s), fmt.Sprintf("fd00:%d::1/64", s))
			if err != nil {
				t.Fatal(err)
			}
		}
		router.Sysctl("net/ipv4/ip_forward", "1", "net/ipv6/conf/all/forwarding", "1")
	}
	return l
}

// node is a namespace standing for a Kubernetes node, with its routing
// identity, one IPv4 and one IPv6 block, and an Applier.
type node struct {
	name    string
	ns      *netnstest.NS
	info    NodeInfo
	blocks  []netip.Prefix
	applier *Applier
}

// addNode attaches node number i (1-based) to subnet s (see attach); its
// blocks are 10.244.i.0/26 and fd00:10:244:0:i::/122, its VXLAN address
// 10.244.i.1 and its IPIP address 10.244.i.2.
func (l *lab) addNode(i, s int) *node {
	l.t.Helper()
	n := &node{name: fmt.Sprintf("node%d", i), applier: NewApplier(Options{Log: testLogger(l.t)})}
	n.ns, n.info.IPv4, n.info.IPv6 = l.attach(n.name, s, 10+i)
	n.info.Name = n.name
	n.info.VXLANMAC = DefaultVXLANMAC(n.name)
	n.info.VXLANAddress = addr(fmt.Sprintf("10.244.%d.1", i))
	n.info.IPIPAddress = addr(fmt.Sprintf("10.244.%d.2", i))
	n.blocks = prefixes(fmt.Sprintf("10.244.%d.0/26", i), fmt.Sprintf("fd00:10:244:0:%d::/122", i))
	l.nodes = append(l.nodes, n)
	return n
}

// attach makes a namespace whose eth0 is a port of subnet s's bridge and
// holds 192.168.s.h/24 and fd00:s::h/64 (h in decimal), with default
// routes via the subnet's .1 and ::1: every real node has one, and proxy
// ARP for the pods' gateway 169.254.1.1 needs a route to it. Without a
// router it leads to the bridge, where unknown destinations die.
func (l *lab) attach(name string, s, h int) (*netnstest.NS, netip.Prefix, netip.Prefix) {
	l.t.Helper()
	v4, v6 := pfx(fmt.Sprintf("192.168.%d.%d/24", s, h)), pfx(fmt.Sprintf("fd00:%d::%d/64", s, h))
	n := l.net.Node(name, name, fmt.Sprintf("br%d", s), v4.String(), v6.String())
	n.IP("route add default via 192.168.%d.1", s)
	n.IP("-6 route add default via fd00:%d::1", s)
	return n, v4, v6
}

// inputs are what tabbyd would hand Desired on n: every other node is a
// peer and advertises its blocks via its node addresses.
func (l *lab) inputs(n *node, pools ...v1.IPPool) Inputs {
	in := Inputs{Node: n.info, Pools: pools, Blocks: n.blocks}
	for _, o := range l.nodes {
		if o == n {
			continue
		}
		in.Peers = append(in.Peers, o.info)
		for _, b := range o.blocks {
			nh := o.info.IPv4.Addr()
			if b.Addr().Is6() {
				nh = o.info.IPv6.Addr()
			}
			in.Learned = append(in.Learned, LearnedRoute{Prefix: b, NextHop: nh})
		}
	}
	return in
}

// applyAll applies every node's desired state and fails on errors.
func (l *lab) applyAll(pools ...v1.IPPool) {
	l.t.Helper()
	for _, n := range l.nodes {
		n.apply(l.t, Desired(l.inputs(n, pools...)))
	}
}

// apply runs the node's Applier in its namespace, failing on errors.
func (n *node) apply(t *testing.T, s State) Stats {
	t.Helper()
	st, err := n.tryApply(s)
	if err != nil {
		t.Fatalf("%s: Apply: %v", n.name, err)
	}
	return st
}

func (n *node) tryApply(s State) (Stats, error) {
	var st Stats
	var err error
	if derr := n.ns.Run(func() error { st, err = n.applier.Apply(s); return nil }); derr != nil {
		return st, derr
	}
	return st, err
}

// pod is a pod namespace wired into a node by the CNI plugin's code.
type pod struct {
	ns     *netnstest.NS
	v4, v6 netip.Addr
}

// addPod wires a pod holding the j-th address of each of the node's blocks.
func (n *node) addPod(t *testing.T, j int) *pod {
	t.Helper()
	p := &pod{ns: netnstest.New(t, fmt.Sprintf("%s-pod%d", n.name, j)), v4: n.blocks[0].Addr(), v6: n.blocks[1].Addr()}
	for range j {
		p.v4, p.v6 = p.v4.Next(), p.v6.Next()
	}
	w := &plugin.Wiring{
		HostVeth: fmt.Sprintf("tab%s-%d", n.name, j), IfName: "eth0", Alias: "test", MTU: 1400,
		IPs: []net.IPNet{*ipNet(netip.PrefixFrom(p.v4, 32)), *ipNet(netip.PrefixFrom(p.v6, 128))},
	}
	n.ns.Must(func() error {
		if _, _, err := plugin.SetupPod(p.ns, w); err != nil {
			return err
		}
		return plugin.SetupHost(w)
	})
	return p
}

// ping checks that from reaches dst.
func ping(t *testing.T, from *pod, dst netip.Addr) {
	t.Helper()
	if err := testnet.Ping(from.ns, dst.AsSlice()); err != nil {
		t.Fatalf("ping %s -> %s: %v", from.v4, dst, err)
	}
}

// snapshot is what an Apply could change in a node, as text.
func snapshot(t *testing.T, n *netnstest.NS) string {
	t.Helper()
	var b strings.Builder
	for _, c := range [][]string{
		{"ip", "-d", "link", "show"},
		{"ip", "addr", "show"},
		{"ip", "route", "show", "table", "all"},
		{"ip", "-6", "route", "show", "table", "all"},
		{"ip", "neigh", "show", "nud", "permanent"},
		{"ip", "-6", "neigh", "show", "nud", "permanent"},
		{"bridge", "fdb", "show"},
		{"iptables", "-t", "nat", "-S"},
		{"ip6tables", "-t", "nat", "-S"},
		{"ipset", "save"},
	} {
		fmt.Fprintf(&b, "$ %s\n%s", strings.Join(c, " "), n.Exec(c[0], c[1:]...))
	}
	return b.String()
}

// ourRoutes lists the node's RouteProtocol routes as `ip route` prints them.
func ourRoutes(t *testing.T, n *netnstest.NS) string {
	t.Helper()
	var ours []string
	for _, fam := range []string{"-4", "-6"} {
		for _, l := range strings.Split(n.Exec("ip", fam, "route", "show", "table", "main"), "\n") {
			if strings.Contains(l, "proto 81") {
				ours = append(ours, l)
			}
		}
	}
	return strings.Join(ours, "\n")
}

// vxlanTx is the number of packets tabby.vxlan sent.
func vxlanTx(t *testing.T, n *node) uint64 {
	t.Helper()
	var tx uint64
	n.ns.Must(func() error {
		l, err := netlink.LinkByName(VXLANDevice)
		if err != nil {
			return err
		}
		tx = l.Attrs().Statistics.TxPackets
		return nil
	})
	return tx
}

// testLogger logs into the test's output.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

// sameSnapshot fails the test when after differs from before, showing the
// lines that differ.
func sameSnapshot(t *testing.T, what, before, after string) {
	t.Helper()
	if before == after {
		return
	}
	b, a := strings.Split(before, "\n"), strings.Split(after, "\n")
	var diff []string
	for _, l := range b {
		if !slices.Contains(a, l) {
			diff = append(diff, "- "+l)
		}
	}
	for _, l := range a {
		if !slices.Contains(b, l) {
			diff = append(diff, "+ "+l)
		}
	}
	t.Errorf("%s changed the kernel:\n%s", what, strings.Join(diff, "\n"))
}
