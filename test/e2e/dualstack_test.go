package e2e

// Dual-stack pods across nodes (issue 15): real tabbyd processes, one per
// node namespace, find both of their node's addresses themselves (no
// --node-ip), publish them, peer over BGP per family and route pods of an
// IPv4 and an IPv6 pool natively (BGP-learned routes via the other node's
// address of that family) and of a VXLAN IPv4 and IPv6 pool (IPv6 over the
// IPv4 VXLAN device, via link-local next hops). Pods are wired by the real
// plugin through libcni. First a full mesh, then with a route reflector
// (a node label): the same pods still reach each other over both families,
// by ICMP echo and TCP.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/daemon/nodestatus"
	"github.com/tabbynet/tabby/daemon/routing"
	"github.com/tabbynet/tabby/internal/netnstest"
	"github.com/tabbynet/tabby/internal/testnet"
)

// dsNode is a dual-stack node: its underlay addresses and tabbyd.
type dsNode struct {
	*testNode
	v4, v6 netip.Addr
	d      *testnet.Tabbyd
}

// newDSNode makes node i (1-based) of the test on the underlay u: eth0
// holds 10.78.0.1i/24 and fd00:78::1i/64 and the IPv4 default route, and
// the IPv6 one when v6Default (else tabbyd finds the IPv6 address on the
// interface of the IPv4 one).
func newDSNode(t *testing.T, u *netnstest.Net, label string, i int, v6Default bool) *dsNode {
	t.Helper()
	// No uplink: eth0 is the node's only NIC.
	n := newNodeWith(t, testnet.NodeOptions{Name: fmt.Sprintf("%s-node%d", label, i), UplinkAddrs: []string{},
		Labels: map[string]string{e2eNodeLabel: label}})
	v4 := netip.AddrFrom4([4]byte{10, 78, 0, byte(10 + i)})
	v6 := netip.MustParseAddr(fmt.Sprintf("fd00:78::%d", 10+i))
	if err := u.Plug(n.NS, "eth0", fmt.Sprintf("%sp%d", label, i), "br0", v4.String()+"/24", v6.String()+"/64"); err != nil {
		t.Fatal(err)
	}
	err := n.Do(func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		gws := []string{"10.78.0.1"}
		if v6Default {
			gws = append(gws, "fd00:78::1")
		}
		for _, gw := range gws {
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP(gw)}); err != nil {
				return fmt.Errorf("default route via %s: %w", gw, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Register(ctxT(t), v4, "tabbyd alone (dual-stack e2e)"); err != nil {
		t.Fatal(err)
	}
	dn := &dsNode{testNode: n, v4: v4, v6: v6}
	dn.d = dn.startTabbyd(t)
	return dn
}

// dsPool makes a pool for the test's nodes.
func dsPool(t *testing.T, ds *testNode, label, name, cidr string, vxlan bool) {
	t.Helper()
	p := &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: label + "-" + name}, Spec: tabbyv1.IPPoolSpec{CIDR: cidr,
		NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{e2eNodeLabel: label}}}}
	if vxlan {
		p.Spec.VXLANMode = tabbyv1.EncapAlways
	}
	if _, err := ds.DS.IPPools.Create(ctxT(t), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating IPPool %s: %v", p.Name, err)
	}
	t.Cleanup(func() { _ = ds.DS.IPPools.Delete(context.Background(), p.Name, metav1.DeleteOptions{}) })
}

// dsPod is a pod with an address of each family.
type dsPod struct {
	*testnet.Pod
	node   *dsNode
	v4, v6 net.IP
}

// addDSPod wires a pod on n with addresses from the pools named.
func addDSPod(t *testing.T, n *dsNode, name, pool4, pool6 string) *dsPod {
	t.Helper()
	a4, _ := json.Marshal([]string{pool4})
	a6, _ := json.Marshal([]string{pool6})
	p := newPod(t, n.testNode, name, map[string]string{tabbyv1.AnnotationIPv4Pools: string(a4), tabbyv1.AnnotationIPv6Pools: string(a6)})
	list := conflist(t, "1.1.0", n.TabbyConf(map[string]any{"assignIPv4": true, "assignIPv6": true}))
	res := n.mustAdd(t, list, p)
	t.Cleanup(func() { _ = n.Del(context.Background(), list, p, nil) })
	v4, v6 := testnet.ResultIPs(res, false), testnet.ResultIPs(res, true)
	if len(v4) != 1 || len(v6) != 1 {
		t.Fatalf("pod %s on %s: want an address of each family, got %v", name, n.Name, res.IPs)
	}
	t.Logf("pod %s on %s: %s %s", name, n.Name, v4[0], v6[0])
	return &dsPod{Pod: p, node: n, v4: v4[0], v6: v6[0]}
}

// kernelRoute is the most specific main-table route of n to dst.
type kernelRoute struct {
	dst, gw  string
	dev      string
	protocol netlink.RouteProtocol
}

func routeTo(n *dsNode, dst net.IP) (kernelRoute, error) {
	var best kernelRoute
	err := n.Do(func() error {
		family := netlink.FAMILY_V6
		if dst.To4() != nil {
			family = netlink.FAMILY_V4
		}
		routes, err := netlink.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		bestBits := -1
		for _, r := range routes {
			bits := 0
			if r.Dst != nil {
				if !r.Dst.Contains(dst) {
					continue
				}
				bits, _ = r.Dst.Mask.Size()
			}
			if bits <= bestBits {
				continue
			}
			l, err := netlink.LinkByIndex(r.LinkIndex)
			if err != nil {
				continue
			}
			bestBits = bits
			best = kernelRoute{dst: fmt.Sprint(r.Dst), gw: r.Gw.String(), dev: l.Attrs().Name, protocol: r.Protocol}
		}
		if bestBits < 0 {
			return fmt.Errorf("no route to %s", dst)
		}
		return nil
	})
	return best, err
}

// reach checks that from reaches to over both families, by ICMP echo
// (ping -6 for IPv6) and by TCP, waiting up to a minute for the routes.
func reach(t *testing.T, from, to *dsPod) {
	t.Helper()
	for _, dst := range []net.IP{to.v4, to.v6} {
		var err error
		for deadline := time.Now().Add(time.Minute); ; {
			if err = testnet.Ping(from.NS, dst); err == nil || time.Now().After(deadline) {
				break
			}
		}
		if err != nil {
			r, rerr := routeTo(from.node, dst)
			t.Errorf("%s on %s does not reach %s on %s: %v (route %+v %v)", from.v4, from.node.Name, dst, to.node.Name, err, r, rerr)
			continue
		}
		addr := net.JoinHostPort(dst.String(), "8080")
		reply := []byte("tabby over " + dst.String())
		stop, err := testnet.ServeTCP(to.NS, addr, reply)
		if err != nil {
			t.Fatal(err)
		}
		got, err := testnet.ReadTCP(from.NS, addr, 5*time.Second)
		stop()
		if err != nil || string(got) != string(reply) {
			t.Errorf("TCP from %s on %s to %s on %s: %q, %v", from.v4, from.node.Name, addr, to.node.Name, got, err)
		}
	}
}

// checkRoutes checks how from's node routes to to's addresses: natively
// via to's node's address of the family (a route tabby learned over BGP),
// or over tabby's VXLAN device (IPv6 via a link-local next hop).
func checkRoutes(t *testing.T, from, to *dsPod, vxlan bool) {
	t.Helper()
	for _, dst := range []net.IP{to.v4, to.v6} {
		r, err := routeTo(from.node, dst)
		if err != nil {
			t.Error(err)
			continue
		}
		v6 := dst.To4() == nil
		ok := r.protocol == routing.RouteProtocol
		switch {
		case !vxlan && !v6:
			ok = ok && r.dev == "eth0" && r.gw == to.node.v4.String()
		case !vxlan && v6:
			ok = ok && r.dev == "eth0" && r.gw == to.node.v6.String()
		case vxlan && !v6:
			ok = ok && r.dev == routing.VXLANDevice
		case vxlan && v6:
			ok = ok && r.dev == routing.VXLANDevice && strings.HasPrefix(r.gw, "fe80:")
		}
		t.Logf("%s routes %s: %s via %s dev %s proto %d", from.node.Name, dst, r.dst, r.gw, r.dev, r.protocol)
		if !ok {
			t.Errorf("%s routes %s as %+v; want tabby's route (protocol %d) %s", from.node.Name, dst, r, routing.RouteProtocol,
				map[bool]string{false: "natively via the other node's address of that family on eth0", true: "over " + routing.VXLANDevice}[vxlan])
		}
	}
}

// peersOf waits until n's tabbyd has exactly want as its Established
// sessions (address → type), and returns its status.
func peersOf(t *testing.T, n *dsNode, want map[string]string) *nodestatus.Status {
	t.Helper()
	hc := healthClient(n.testNode, 1)
	var st *nodestatus.Status
	var err error
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		st, err = nodestatus.Fetch(ctxT(t), hc, testnet.TabbydHealthAddr)
		if err == nil {
			got := map[string]string{}
			for _, p := range st.Peers {
				if p.State == "Established" {
					got[p.Address] = p.Type
				}
			}
			if len(got) == len(want) && len(st.Peers) == len(want) && func() bool {
				for a, ty := range want {
					if got[a] != ty {
						return false
					}
				}
				return true
			}() {
				return st
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's sessions: %+v (%v), want %v established; log:\n%s", n.Name, st, err, want, n.d.LogTail(20))
		}
	}
}

func TestDualStackAcrossNodes(t *testing.T) {
	label := fmt.Sprintf("ds%d", counter.Add(1))
	u := netnstest.NewNet(t, "br0")
	// node1 and node3 have both default routes; node2 only the IPv4 one.
	nodes := []*dsNode{newDSNode(t, u, label, 1, true), newDSNode(t, u, label, 2, false), newDSNode(t, u, label, 3, true)}
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	dsPool(t, n1.testNode, label, "v4", "10.87.0.0/16", false)
	dsPool(t, n1.testNode, label, "v6", "fd00:87::/56", false)
	dsPool(t, n1.testNode, label, "vx4", "10.88.0.0/16", true)
	dsPool(t, n1.testNode, label, "vx6", "fd00:88::/56", true)

	// Each tabbyd found and published both of its node's addresses.
	for _, n := range nodes {
		var got map[string]string
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			node, err := n.DS.Nodes.Get(ctxT(t), n.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			got = node.Annotations
			if got[tabbyv1.AnnotationNodeIPv4Address] == n.v4.String()+"/24" && got[tabbyv1.AnnotationNodeIPv6Address] == n.v6.String()+"/64" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s published %v, want %s/24 and %s/64", n.Name, got, n.v4, n.v6)
			}
		}
	}
	mesh := func(self *dsNode) map[string]string {
		want := map[string]string{}
		for _, n := range nodes {
			if n != self {
				want[n.v4.String()], want[n.v6.String()] = "node-mesh", "node-mesh"
			}
		}
		return want
	}
	st := peersOf(t, n1, mesh(n1))
	t.Logf("%s's sessions (full mesh, one per family):", n1.Name)
	var b strings.Builder
	st.Print(&b)
	t.Log("\n" + b.String())

	native := [2]*dsPod{addDSPod(t, n1, label+"-a", label+"-v4", label+"-v6"), addDSPod(t, n2, label+"-b", label+"-v4", label+"-v6")}
	overVXLAN := [2]*dsPod{addDSPod(t, n1, label+"-c", label+"-vx4", label+"-vx6"), addDSPod(t, n2, label+"-d", label+"-vx4", label+"-vx6")}
	check := func(phase string) {
		t.Run(phase, func(t *testing.T) {
			reach(t, native[0], native[1])
			reach(t, native[1], native[0])
			checkRoutes(t, native[0], native[1], false)
			checkRoutes(t, native[1], native[0], false)
			reach(t, overVXLAN[0], overVXLAN[1])
			reach(t, overVXLAN[1], overVXLAN[0])
			checkRoutes(t, overVXLAN[0], overVXLAN[1], true)
			checkRoutes(t, overVXLAN[1], overVXLAN[0], true)
		})
	}
	check("full mesh")

	// node3 becomes the route reflector: node1 and node2 keep only their
	// sessions with it, one per family, and learn each other's blocks
	// through it, next hops unchanged.
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:"true"}}}`, tabbyv1.LabelRouteReflector)
	if _, err := n3.DS.Nodes.Patch(ctxT(t), n3.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	rr := map[string]string{n3.v4.String(): "route-reflector", n3.v6.String(): "route-reflector"}
	for _, n := range []*dsNode{n1, n2} {
		st := peersOf(t, n, rr)
		if n == n1 {
			b.Reset()
			st.Print(&b)
			t.Logf("%s's sessions with the route reflector:\n%s", n1.Name, b.String())
		}
	}
	peersOf(t, n3, map[string]string{n1.v4.String(): "route-reflector-client", n1.v6.String(): "route-reflector-client",
		n2.v4.String(): "route-reflector-client", n2.v6.String(): "route-reflector-client"})
	check("route reflector")
}
