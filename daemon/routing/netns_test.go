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
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	v1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/internal/testnet"
	"github.com/tabbynet/tabby/internal/tier"
	"github.com/tabbynet/tabby/plugin"
)

func needRoot(t *testing.T) {
	t.Helper()
	tier.Root(t, "a real-kernel test: it creates network namespaces")
}

// newNS makes a namespace with lo up and without IPv6 duplicate address
// detection (addresses are usable at once and do not change state behind
// a test's back); it is removed when the test ends.
func newNS(t *testing.T) ns.NetNS {
	t.Helper()
	n := testnet.NewNS(t)
	setSysctls(t, n, "net/ipv6/conf/all/accept_dad", "0", "net/ipv6/conf/default/accept_dad", "0")
	ipIn(t, n, "link set lo up")
	return n
}

// in runs f inside namespace n, failing the test on error.
func in(t *testing.T, n ns.NetNS, f func() error) {
	t.Helper()
	if err := n.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
}

// setSysctls sets name/value pairs of /proc/sys inside n.
func setSysctls(t *testing.T, n ns.NetNS, kv ...string) {
	t.Helper()
	in(t, n, func() error {
		for i := 0; i+1 < len(kv); i += 2 {
			if err := os.WriteFile("/proc/sys/"+kv[i], []byte(kv[i+1]), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
}

// ipIn runs `ip -n <n> ARGS` (space-separated, printf-style) on namespace n.
func ipIn(t *testing.T, n ns.NetNS, format string, args ...any) string {
	t.Helper()
	argv := append([]string{"-n", filepath.Base(n.Path())}, strings.Fields(fmt.Sprintf(format, args...))...)
	out, err := exec.Command("ip", argv...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return string(out)
}

// plug makes a veth whose end dev is in n and whose other end, port, is
// a port of bridge in the lab's underlay; dev gets the addresses.
func (l *lab) plug(n ns.NetNS, dev, port, bridge string, addrs ...string) {
	t := l.t
	t.Helper()
	ipIn(t, n, "link add %s type veth peer name %s netns %s", dev, port, filepath.Base(l.underlay.Path()))
	ipIn(t, l.underlay, "link set %s master %s up", port, bridge)
	ipIn(t, n, "link set %s up", dev)
	for _, a := range addrs {
		ipIn(t, n, "addr add %s dev %s nodad", a, dev)
	}
}

// lab is an underlay of one or two subnets, 192.168.S.0/24 and fd00:S::/64
// on bridges brS, whose router (when there are two) is .1 and ::1.
type lab struct {
	t        *testing.T
	underlay ns.NetNS
	nodes    []*node
}

func newLab(t *testing.T, subnets int) *lab {
	t.Helper()
	needRoot(t)
	l := &lab{t: t, underlay: newNS(t)}
	for s := 1; s <= subnets; s++ {
		ipIn(t, l.underlay, "link add br%d up type bridge", s)
	}
	if subnets > 1 {
		router := newNS(t)
		for s := 1; s <= subnets; s++ {
			l.plug(router, fmt.Sprintf("eth%d", s), fmt.Sprintf("router-%d", s), fmt.Sprintf("br%d", s),
				fmt.Sprintf("192.168.%d.1/24", s), fmt.Sprintf("fd00:%d::1/64", s))
		}
		setSysctls(t, router, "net/ipv4/ip_forward", "1", "net/ipv6/conf/all/forwarding", "1")
	}
	return l
}

// node is a namespace standing for a Kubernetes node, with its routing
// identity, one IPv4 and one IPv6 block, and an Applier.
type node struct {
	name    string
	ns      ns.NetNS
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
func (l *lab) attach(name string, s, h int) (ns.NetNS, netip.Prefix, netip.Prefix) {
	l.t.Helper()
	n := newNS(l.t)
	v4, v6 := pfx(fmt.Sprintf("192.168.%d.%d/24", s, h)), pfx(fmt.Sprintf("fd00:%d::%d/64", s, h))
	l.plug(n, "eth0", name, fmt.Sprintf("br%d", s), v4.String(), v6.String())
	ipIn(l.t, n, "route add default via 192.168.%d.1", s)
	ipIn(l.t, n, "-6 route add default via fd00:%d::1", s)
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
	if derr := n.ns.Do(func(ns.NetNS) error { st, err = n.applier.Apply(s); return nil }); derr != nil {
		return st, derr
	}
	return st, err
}

// pod is a pod namespace wired into a node by the CNI plugin's code.
type pod struct {
	ns     ns.NetNS
	v4, v6 netip.Addr
}

// addPod wires a pod holding the j-th address of each of the node's blocks.
func (n *node) addPod(t *testing.T, j int) *pod {
	t.Helper()
	p := &pod{ns: newNS(t), v4: n.blocks[0].Addr(), v6: n.blocks[1].Addr()}
	for range j {
		p.v4, p.v6 = p.v4.Next(), p.v6.Next()
	}
	w := &plugin.Wiring{
		HostVeth: fmt.Sprintf("tab%s-%d", n.name, j), IfName: "eth0", Alias: "test", MTU: 1400,
		IPs: []net.IPNet{*ipNet(netip.PrefixFrom(p.v4, 32)), *ipNet(netip.PrefixFrom(p.v6, 128))},
	}
	in(t, n.ns, func() error {
		if _, _, err := plugin.SetupPod(p.ns, n.ns, w); err != nil {
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

// sh runs a command inside namespace n and returns its output.
func sh(t *testing.T, n ns.NetNS, name string, args ...string) string {
	t.Helper()
	var out []byte
	in(t, n, func() error {
		var err error
		out, err = exec.Command(name, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return nil
	})
	return string(out)
}

// snapshot is what an Apply could change in a node, as text.
func snapshot(t *testing.T, n ns.NetNS) string {
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
		fmt.Fprintf(&b, "$ %s\n%s", strings.Join(c, " "), sh(t, n, c[0], c[1:]...))
	}
	return b.String()
}

// ourRoutes lists the node's RouteProtocol routes as `ip route` prints them.
func ourRoutes(t *testing.T, n ns.NetNS) string {
	t.Helper()
	var ours []string
	for _, fam := range []string{"-4", "-6"} {
		for _, l := range strings.Split(sh(t, n, "ip", fam, "route", "show", "table", "main"), "\n") {
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
	in(t, n.ns, func() error {
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
