package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/contract"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/internal/testnet"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/plugin"
)

// podLink describes the pod's interface as the kernel sees it.
type podLink struct {
	mtu    int
	up     bool
	addrs  []string
	routes []netlink.Route
}

func inspectPod(t *testing.T, p *testnet.Pod) podLink {
	t.Helper()
	var out podLink
	err := p.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(p.IfName)
		if err != nil {
			return err
		}
		out.mtu = l.Attrs().MTU
		out.up = l.Attrs().Flags&net.FlagUp != 0
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if a.IP.IsLinkLocalUnicast() {
				continue
			}
			out.addrs = append(out.addrs, a.IPNet.String())
		}
		out.routes, err = netlink.RouteList(l, netlink.FAMILY_ALL)
		return err
	})
	if err != nil {
		t.Fatalf("inspecting the pod: %v", err)
	}
	return out
}

func hasRoute(routes []netlink.Route, dst string, gw net.IP, scope netlink.Scope) bool {
	for _, r := range routes {
		d := "default"
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones != 0 {
				d = r.Dst.String()
			}
		}
		if d != dst {
			continue
		}
		if gw != nil && !r.Gw.Equal(gw) {
			continue
		}
		if gw == nil && r.Scope != scope {
			continue
		}
		return true
	}
	return false
}

// TestCNIAddCheckDel: ADD gives the pod its address, routes and MTU (the
// uplink's less VXLAN's 50), the host end its alias, proxy ARP and route;
// CHECK passes; DEL removes the veth, route and allocation; DEL again
// succeeds, as does DEL after the namespace is gone.
func TestCNIAddCheckDel(t *testing.T) {
	n := newNode(t)
	pool := n.addPool(t, 4, func(p *tabbyv1.IPPool) { p.Spec.VXLANMode = tabbyv1.EncapAlways })
	_, poolNet, _ := net.ParseCIDR(pool.Spec.CIDR)
	list := conflist(t, "1.1.0", n.TabbyConf(nil))
	pod := newPod(t, n, "web-0", nil)

	res := n.mustAdd(t, list, pod)
	if len(res.IPs) != 1 {
		t.Fatalf("want one address, got %v", res.IPs)
	}
	ipc := res.IPs[0]
	if ones, _ := ipc.Address.Mask.Size(); ones != 32 || !poolNet.Contains(ipc.Address.IP) {
		t.Errorf("address %s: want a /32 from pool %s", ipc.Address.String(), pool.Spec.CIDR)
	}
	if !ipc.Gateway.Equal(plugin.GatewayV4) {
		t.Errorf("gateway %s, want %s", ipc.Gateway, plugin.GatewayV4)
	}
	wantVeth := contract.HostVethName(contract.PodID{Namespace: "default", Name: "web-0"}, pod.ContainerID, "eth0")
	if len(res.Interfaces) != 2 || res.Interfaces[0].Name != wantVeth || res.Interfaces[1].Name != "eth0" || res.Interfaces[1].Sandbox != pod.NS.Path() {
		t.Errorf("interfaces %+v, want [%s, eth0 in %s]", res.Interfaces, wantVeth, pod.NS.Path())
	}
	if ipc.Interface == nil || *ipc.Interface != 1 {
		t.Errorf("the address must point at the pod interface (1)")
	}

	pl := inspectPod(t, pod)
	wantMTU := uplinkMTU - plugin.OverheadVXLAN
	if pl.mtu != wantMTU || !pl.up {
		t.Errorf("pod eth0: mtu %d up %v, want mtu %d and up", pl.mtu, pl.up, wantMTU)
	}
	if len(pl.addrs) != 1 || pl.addrs[0] != ipc.Address.String() {
		t.Errorf("pod addresses %v, want [%s]", pl.addrs, ipc.Address.String())
	}
	if !hasRoute(pl.routes, "169.254.1.1/32", nil, netlink.SCOPE_LINK) {
		t.Errorf("pod lacks 169.254.1.1 dev eth0 scope link: %v", pl.routes)
	}
	if !hasRoute(pl.routes, "default", plugin.GatewayV4, 0) {
		t.Errorf("pod lacks default via 169.254.1.1: %v", pl.routes)
	}

	veths := n.hostVeths(t)
	hv, ok := veths[wantVeth]
	if !ok {
		t.Fatalf("no host veth %s in the node (have %v)", wantVeth, veths)
	}
	if hv.Attrs().MTU != wantMTU || hv.Attrs().Alias != plugin.VethAlias(plugin.Attachment{Network: networkName, ContainerID: pod.ContainerID, IfName: "eth0"}) {
		t.Errorf("host veth: mtu %d alias %q", hv.Attrs().MTU, hv.Attrs().Alias)
	}
	for name, want := range map[string]string{
		"net/ipv4/ip_forward":                         "1",
		"net/ipv4/conf/" + wantVeth + "/proxy_arp":    "1",
		"net/ipv4/neigh/" + wantVeth + "/proxy_delay": "0",
		"net/ipv4/conf/" + wantVeth + "/forwarding":   "1",
	} {
		if got, err := testnet.ReadSysctl(n.NS, name); err != nil || got != want {
			t.Errorf("node sysctl %s = %s (%v), want %s", name, got, err, want)
		}
	}
	routes := n.tabbyRoutes(t)
	r, ok := routes[ipc.Address.String()]
	if !ok || r.LinkIndex != hv.Attrs().Index || r.Scope != netlink.SCOPE_LINK {
		t.Errorf("node route to %s: %+v (found %v), want dev %s scope link proto %d", ipc.Address.String(), r, ok, wantVeth, plugin.RouteProtocol)
	}
	if held := n.heldIPs(t, pod); len(held) != 1 || held[0] != ipc.Address.IP.String() {
		t.Errorf("IPAM holds %v for the pod, want [%s]", held, ipc.Address.IP)
	}

	if err := n.Check(ctxT(t), list, pod, nil); err != nil {
		t.Errorf("CHECK after ADD: %v", err)
	}

	if err := n.Del(ctxT(t), list, pod, nil); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if _, ok := n.hostVeths(t)[wantVeth]; ok {
		t.Error("the host veth survived DEL")
	}
	if _, ok := n.tabbyRoutes(t)[ipc.Address.String()]; ok {
		t.Error("the node route survived DEL")
	}
	if held := n.heldIPs(t, pod); len(held) != 0 {
		t.Errorf("IPAM still holds %v after DEL", held)
	}
	err := pod.NS.Do(func(ns.NetNS) error {
		_, err := netlink.LinkByName("eth0")
		return err
	})
	if err == nil {
		t.Error("the pod's eth0 survived DEL")
	}
	if err := n.Del(ctxT(t), list, pod, nil); err != nil {
		t.Errorf("second DEL: %v", err)
	}

	// DEL when the pod's namespace is already gone.
	gone := newPod(t, n, "", nil)
	res = n.mustAdd(t, list, gone)
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.Del(ctxT(t), list, gone, nil); err != nil {
		t.Errorf("DEL after the netns was removed: %v", err)
	}
	if held := n.heldIPs(t, gone); len(held) != 0 {
		t.Errorf("IPAM still holds %v after DEL of a pod whose netns was gone", held)
	}
	if _, ok := n.tabbyRoutes(t)[res.IPs[0].Address.String()]; ok {
		t.Error("the node route survived DEL of a pod whose netns was gone")
	}
}

// TestCNIPodsPing: two pods on one node reach each other and the node.
func TestCNIPodsPing(t *testing.T) {
	n := newNode(t)
	n.addPool(t, 4, nil)
	list := conflist(t, "1.1.0", n.TabbyConf(nil))
	a, b := newPod(t, n, "ping-a", nil), newPod(t, n, "", nil)
	ra, rb := n.mustAdd(t, list, a), n.mustAdd(t, list, b)
	ipA, ipB := testnet.ResultIPs(ra, false)[0], testnet.ResultIPs(rb, false)[0]
	for _, c := range []struct {
		name string
		from ns.NetNS
		to   net.IP
	}{
		{"a to b", a.NS, ipB},
		{"b to a", b.NS, ipA},
		{"a to node", a.NS, n.IPv4},
		{"node to b", n.NS, ipB},
	} {
		if err := testnet.Ping(c.from, c.to); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// TestCNINoDefaultRoute: on a node without a default route (air-gapped,
// or routes only to specific networks) two pods still reach each other
// over IPv4 and IPv6. Proxy ARP answers for 169.254.1.1 only while the
// node has a route to it; the pod's permanent neighbour entries for its
// gateways, pointing at the host veth's MAC, do not depend on the node's
// routes. CHECK verifies the entries and the host veth's MAC.
func TestCNINoDefaultRoute(t *testing.T) {
	n := newNode(t)
	n.addPool(t, 4, nil)
	n.addPool(t, 6, nil)
	err := n.Do(func() error {
		for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			routes, err := netlink.RouteList(nil, family)
			if err != nil {
				return err
			}
			for _, r := range routes {
				if r.Dst == nil || r.Dst.IP.IsUnspecified() {
					if err := netlink.RouteDel(&r); err != nil {
						return fmt.Errorf("deleting the default route %s: %w", r, err)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	list := conflist(t, "1.1.0", n.TabbyConf(map[string]any{"assignIPv4": true, "assignIPv6": true}))
	a, b := newPod(t, n, "noroute-a", nil), newPod(t, n, "", nil)
	ra, rb := n.mustAdd(t, list, a), n.mustAdd(t, list, b)
	if ra.Interfaces[0].Mac != plugin.HostVethMAC.String() {
		t.Errorf("the result gives the host veth MAC %s, want %s", ra.Interfaces[0].Mac, plugin.HostVethMAC)
	}
	err = a.NS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(a.IfName)
		if err != nil {
			return err
		}
		neighs, err := netlink.NeighList(l.Attrs().Index, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, gw := range []net.IP{plugin.GatewayV4, plugin.GatewayV6} {
			found := false
			for _, nb := range neighs {
				found = found || (nb.IP.Equal(gw) && nb.State == netlink.NUD_PERMANENT && nb.HardwareAddr.String() == plugin.HostVethMAC.String())
			}
			if !found {
				t.Errorf("the pod has no permanent neighbour entry %s lladdr %s: %v", gw, plugin.HostVethMAC, neighs)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		from ns.NetNS
		to   net.IP
	}{
		{"a to b (v4)", a.NS, testnet.ResultIPs(rb, false)[0]},
		{"b to a (v4)", b.NS, testnet.ResultIPs(ra, false)[0]},
		{"a to b (v6)", a.NS, testnet.ResultIPs(rb, true)[0]},
		{"b to a (v6)", b.NS, testnet.ResultIPs(ra, true)[0]},
		{"a to node (v4)", a.NS, n.IPv4},
	} {
		if err := testnet.Ping(c.from, c.to); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	if err := n.Check(ctxT(t), list, a, nil); err != nil {
		t.Errorf("CHECK: %v", err)
	}
}

// TestCNIDualStack: with assignIPv6 a pod gets a /32 and a /128, IPv6
// routes via fe80::1, and pods reach each other and the node over both.
func TestCNIDualStack(t *testing.T) {
	n := newNode(t)
	n.addPool(t, 4, nil)
	pool6 := n.addPool(t, 6, nil)
	_, net6, _ := net.ParseCIDR(pool6.Spec.CIDR)
	list := conflist(t, "1.1.0", n.TabbyConf(map[string]any{"assignIPv4": true, "assignIPv6": true}))
	a, b := newPod(t, n, "", nil), newPod(t, n, "", nil)
	ra := n.mustAdd(t, list, a)
	rb := n.mustAdd(t, list, b)
	if len(testnet.ResultIPs(ra, false)) != 1 || len(testnet.ResultIPs(ra, true)) != 1 {
		t.Fatalf("want one IPv4 and one IPv6 address, got %v", ra.IPs)
	}
	for _, ipc := range ra.IPs {
		if ipc.Address.IP.To4() == nil {
			if ones, _ := ipc.Address.Mask.Size(); ones != 128 || !net6.Contains(ipc.Address.IP) || !ipc.Gateway.Equal(plugin.GatewayV6) {
				t.Errorf("IPv6 address %s gw %s: want a /128 of %s via fe80::1", ipc.Address.String(), ipc.Gateway, pool6.Spec.CIDR)
			}
		}
	}
	pl := inspectPod(t, a)
	if !hasRoute(pl.routes, "default", plugin.GatewayV6, 0) {
		t.Errorf("pod lacks default via fe80::1: %v", pl.routes)
	}
	if err := n.Check(ctxT(t), list, a, nil); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	for _, c := range []struct {
		name string
		from ns.NetNS
		to   net.IP
	}{
		{"a to b (v6)", a.NS, testnet.ResultIPs(rb, true)[0]},
		{"b to a (v6)", b.NS, testnet.ResultIPs(ra, true)[0]},
		{"a to node (v6)", a.NS, n.IPv6},
		{"a to b (v4)", a.NS, testnet.ResultIPs(rb, false)[0]},
	} {
		if err := testnet.Ping(c.from, c.to); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	if err := n.Del(ctxT(t), list, a, nil); err != nil {
		t.Fatal(err)
	}
	if held := n.heldIPs(t, a); len(held) != 0 {
		t.Errorf("IPAM still holds %v after DEL", held)
	}
}

// TestCNIPodAnnotations: a pod's tabby.io/ipAddrs annotation picks its address.
func TestCNIPodAnnotations(t *testing.T) {
	n := newNode(t)
	pool := n.addPool(t, 4, nil)
	_, pn, _ := net.ParseCIDR(pool.Spec.CIDR)
	want := make(net.IP, 4)
	copy(want, pn.IP.To4())
	want[3] = 77
	list := conflist(t, "1.1.0", n.TabbyConf(nil))
	pod := newPod(t, n, "fixed-ip", map[string]string{tabbyv1.AnnotationIPAddrs: fmt.Sprintf(`[%q]`, want.String())})
	res := n.mustAdd(t, list, pod)
	if got := testnet.ResultIPs(res, false); len(got) != 1 || !got[0].Equal(want) {
		t.Errorf("pod got %v, want %s from its annotation", got, want)
	}
}

// TestCNICheckFails: CHECK fails with a clear message when the pod's
// address is removed from its interface, or released in IPAM.
func TestCNICheckFails(t *testing.T) {
	n := newNode(t)
	n.addPool(t, 4, nil)
	list := conflist(t, "1.1.0", n.TabbyConf(nil))
	// onPod and onHost run f on the pod end and on the host veth.
	onPod := func(pod *testnet.Pod, f func(netlink.Link) error) error {
		return pod.NS.Do(func(ns.NetNS) error { return onLink("eth0", f) })
	}
	onHost := func(res *current.Result, f func(netlink.Link) error) error {
		return n.Do(func() error { return onLink(res.Interfaces[0].Name, f) })
	}
	addr := func(res *current.Result) *net.IPNet { return &res.IPs[0].Address }
	for _, tc := range []struct {
		name   string
		damage func(*testnet.Pod, *current.Result) error
		want   func(*current.Result) string
	}{{
		name: "address removed from the pod",
		damage: func(pod *testnet.Pod, res *current.Result) error {
			return onPod(pod, func(l netlink.Link) error { return netlink.AddrDel(l, &netlink.Addr{IPNet: addr(res)}) })
		},
		want: func(res *current.Result) string { return "lacks its address " + addr(res).String() },
	}, {
		name: "address released in IPAM",
		damage: func(pod *testnet.Pod, _ *current.Result) error {
			return n.ipam.ReleaseHandle(context.Background(), pod.HandleID(), n.Name)
		},
		want: func(res *current.Result) string { return "IPAM no longer holds " + addr(res).IP.String() },
	}, {
		name: "gateway neighbour entry removed",
		damage: func(pod *testnet.Pod, _ *current.Result) error {
			return onPod(pod, func(l netlink.Link) error {
				return netlink.NeighDel(&netlink.Neigh{LinkIndex: l.Attrs().Index, Family: netlink.FAMILY_V4, IP: plugin.GatewayV4})
			})
		},
		want: func(*current.Result) string { return "lacks its permanent neighbour entry 169.254.1.1" },
	}, {
		name: "pod's default route removed",
		damage: func(pod *testnet.Pod, _ *current.Result) error {
			return onPod(pod, func(l netlink.Link) error {
				return netlink.RouteDel(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Gw: plugin.GatewayV4})
			})
		},
		want: func(*current.Result) string { return "the pod lacks its route default via 169.254.1.1 dev eth0 onlink" },
	}, {
		name: "host route removed",
		damage: func(_ *testnet.Pod, res *current.Result) error {
			return onHost(res, func(l netlink.Link) error {
				return netlink.RouteDel(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: addr(res), Scope: netlink.SCOPE_LINK})
			})
		},
		want: func(res *current.Result) string {
			return "the node lacks the route " + addr(res).String() + " dev " + res.Interfaces[0].Name + " proto 80 scope link"
		},
	}, {
		name: "host veth MAC changed",
		damage: func(_ *testnet.Pod, res *current.Result) error {
			return onHost(res, func(l netlink.Link) error {
				return netlink.LinkSetHardwareAddr(l, net.HardwareAddr{0x02, 0, 0, 0, 0, 1})
			})
		},
		want: func(*current.Result) string { return "has MAC 02:00:00:00:00:01" },
	}, {
		name: "host veth deleted",
		damage: func(_ *testnet.Pod, res *current.Result) error {
			return onHost(res, netlink.LinkDel)
		},
		want: func(*current.Result) string { return "no interface eth0" },
	}} {
		t.Run(tc.name, func(t *testing.T) {
			pod := newPod(t, n, "", nil)
			res := n.mustAdd(t, list, pod)
			if err := tc.damage(pod, res); err != nil {
				t.Fatal(err)
			}
			want := tc.want(res)
			if err := n.Check(ctxT(t), list, pod, nil); err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("CHECK: %v, want an error saying %q", err, want)
			}
		})
	}
}

// onLink runs f on the link named name in the current namespace.
func onLink(name string, f func(netlink.Link) error) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	return f(l)
}

// TestCNIParallelAdds: 50 ADDs at once on one node get 50 different
// addresses, and 50 DELs free them all.
func TestCNIParallelAdds(t *testing.T) {
	const pods = 50
	n := newNode(t)
	n.addPool(t, 4, nil)
	list := conflist(t, "1.1.0", n.TabbyConf(nil))
	ps := make([]*testnet.Pod, pods)
	for i := range ps {
		ps[i] = newPod(t, n, "", nil)
	}
	seen := addAllAtOnce(t, n, list, ps)
	if len(seen) != pods {
		t.Errorf("%d distinct addresses, want %d", len(seen), pods)
	}
	if got := len(n.hostVeths(t)); got != pods {
		t.Errorf("%d host veths, want %d", got, pods)
	}
	if got := len(n.nodeHandles(t)); got != pods {
		t.Errorf("%d handles on the node, want %d", got, pods)
	}
	delAllAtOnce(t, n, list, ps)
}

// addAllAtOnce ADDs every pod concurrently and returns the addresses they
// got (address -> pod index), failing the test on an error or an address
// handed out twice.
func addAllAtOnce(t *testing.T, n *testNode, list *libcni.NetworkConfigList, ps []*testnet.Pod) map[string]int {
	t.Helper()
	results := make([]*current.Result, len(ps))
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for i := range ps {
		wg.Go(func() { results[i], errs[i] = n.Add(ctxT(t), list, ps[i], nil) })
	}
	wg.Wait()
	seen := map[string]int{}
	for i, err := range errs {
		if err != nil {
			t.Errorf("ADD %d: %v", i, err)
			continue
		}
		ip := results[i].IPs[0].Address.IP.String()
		if j, dup := seen[ip]; dup {
			t.Errorf("pods %d and %d both got %s", j, i, ip)
		}
		seen[ip] = i
	}
	return seen
}

// delAllAtOnce DELs every pod concurrently and checks that no handle and no
// host veth is left on the node.
func delAllAtOnce(t *testing.T, n *testNode, list *libcni.NetworkConfigList, ps []*testnet.Pod) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range ps {
		wg.Go(func() {
			if err := n.Del(ctxT(t), list, ps[i], nil); err != nil {
				t.Errorf("DEL %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if hs := n.nodeHandles(t); len(hs) != 0 {
		t.Errorf("handles left after DEL: %v", hs)
	}
	if vs := n.hostVeths(t); len(vs) != 0 {
		t.Errorf("host veths left after DEL: %d", len(vs))
	}
}

// TestCNIGC: GC deletes the veths and releases the addresses of attachments
// not listed, and leaves the listed ones working.
func TestCNIGC(t *testing.T) {
	n := newNode(t)
	n.addPool(t, 4, nil)
	list := conflist(t, "1.1.0", n.TabbyConf(nil))
	keep, drop1, drop2 := newPod(t, n, "gc-keep", nil), newPod(t, n, "", nil), newPod(t, n, "gc-drop", nil)
	rk := n.mustAdd(t, list, keep)
	r1 := n.mustAdd(t, list, drop1)
	r2 := n.mustAdd(t, list, drop2)
	// An allocation without any veth, as a crashed ADD might leave.
	orphan := &testnet.Pod{ContainerID: testnet.RandomID(), IfName: "eth0"}
	if _, err := n.ipam.Assign(context.Background(), ipamRequest(n, orphan)); err != nil {
		t.Fatalf("assigning an orphan address: %v", err)
	}

	if err := n.GC(ctxT(t), list, keep); err != nil {
		t.Fatalf("GC: %v", err)
	}
	veths := n.hostVeths(t)
	if _, ok := veths[rk.Interfaces[0].Name]; !ok {
		t.Error("GC deleted the listed attachment's veth")
	}
	for _, r := range []*current.Result{r1, r2} {
		if _, ok := veths[r.Interfaces[0].Name]; ok {
			t.Errorf("GC left the veth %s of an unlisted attachment", r.Interfaces[0].Name)
		}
	}
	if hs := n.nodeHandles(t); len(hs) != 1 || hs[0] != keep.HandleID() {
		t.Errorf("handles after GC: %v, want only %s", hs, keep.HandleID())
	}
	if err := n.Check(ctxT(t), list, keep, nil); err != nil {
		t.Errorf("CHECK of the kept pod after GC: %v", err)
	}
}

// TestCNIStatus: STATUS passes with a usable pool, fails when no pool serves
// the node and while the API server is stopped.
func TestCNIStatus(t *testing.T) {
	n := newNode(t)
	list := conflist(t, "1.1.0", n.TabbyConf(nil))
	err := n.Status(ctxT(t), list)
	if err == nil || !strings.Contains(err.Error(), "no usable IP pool for node "+n.Name) {
		t.Errorf("STATUS without a pool: %v", err)
	} else if e := cniError(t, err); e.Code != plugin.ErrPluginNotAvailable {
		t.Errorf("STATUS without a pool: code %d, want %d", e.Code, plugin.ErrPluginNotAvailable)
	}
	n.addPool(t, 4, nil)
	if err := n.Status(ctxT(t), list); err != nil {
		t.Errorf("STATUS with a pool: %v", err)
	}
	v6 := conflist(t, "1.1.0", n.TabbyConf(map[string]any{"assignIPv6": true}))
	if err := n.Status(ctxT(t), v6); err == nil || !strings.Contains(err.Error(), "no usable IPv6 pool") {
		t.Errorf("STATUS with IPv6 on and no IPv6 pool: %v", err)
	}

	c := clustertest.Cluster(t)
	c.StopAPIServer()
	t.Cleanup(func() {
		if err := c.StartAPIServer(context.Background()); err != nil {
			t.Errorf("restarting the API server: %v", err)
		}
	})
	err = n.Status(ctxT(t), list)
	if err == nil || !strings.Contains(err.Error(), "cannot be reached") {
		t.Errorf("STATUS with the API server stopped: %v", err)
	} else if e := cniError(t, err); e.Code != plugin.ErrPluginNotAvailable {
		t.Errorf("STATUS with the API server stopped: code %d", e.Code)
	}
	if err := c.StartAPIServer(context.Background()); err != nil {
		t.Fatalf("restarting the API server: %v", err)
	}
	if err := n.Status(ctxT(t), list); err != nil {
		t.Errorf("STATUS after the API server came back: %v", err)
	}
}

// TestCNIMalformedConfig: a bad config gets a CNI error with a message
// saying what to fix, and nothing is allocated or wired.
func TestCNIMalformedConfig(t *testing.T) {
	n := newNode(t)
	n.addPool(t, 4, nil)
	for _, tc := range []struct {
		name  string
		patch func(map[string]any)
		code  uint
		msg   string
	}{
		{"mtu is a string", func(c map[string]any) { c["mtu"] = "big" }, types.ErrDecodingFailure, "mtu"},
		{"mtu out of range", func(c map[string]any) { c["mtu"] = 100000 }, types.ErrInvalidNetworkConfig, "mtu 100000 is out of range"},
		{"no family", func(c map[string]any) {
			c["ipam"] = map[string]any{"type": "tabby-ipam", "assignIPv4": false, "assignIPv6": false}
		}, types.ErrInvalidNetworkConfig, "both false"},
		{"bad log level", func(c map[string]any) { c["logLevel"] = "chatty" }, types.ErrInvalidNetworkConfig, "logLevel"},
		{"bad timeout", func(c map[string]any) { c["timeout"] = "forever" }, types.ErrInvalidNetworkConfig, "timeout"},
		{"no ipam type", func(c map[string]any) { c["ipam"] = map[string]any{} }, types.ErrInvalidNetworkConfig, "ipam"},
		{"bad node name", func(c map[string]any) { c["nodename"] = "Not_A_Node" }, types.ErrInvalidNetworkConfig, "nodename"},
		{"unknown pool", func(c map[string]any) {
			c["ipam"] = map[string]any{"type": "tabby-ipam", "ipv4Pools": []string{"no-such-pool"}}
		}, 0, "no-such-pool"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conf := n.TabbyConf(nil)
			tc.patch(conf)
			list := conflist(t, "1.1.0", conf)
			pod := newPod(t, n, "", nil)
			_, err := n.Add(ctxT(t), list, pod, nil)
			if err == nil {
				t.Fatal("ADD succeeded")
			}
			e := cniError(t, err)
			if (tc.code != 0 && e.Code != tc.code) || !strings.Contains(e.Msg, tc.msg) {
				t.Errorf("got code %d %q, want code %d and a message naming %q", e.Code, e.Msg, tc.code, tc.msg)
			}
			if held := n.heldIPs(t, pod); len(held) != 0 {
				t.Errorf("IPAM holds %v after a failed ADD", held)
			}
			if vs := n.hostVeths(t); len(vs) != 0 {
				t.Errorf("host veths left: %d", len(vs))
			}
		})
	}
	if hs := n.nodeHandles(t); len(hs) != 0 {
		t.Errorf("handles left: %v", hs)
	}
}

// TestCNIAddFailureLeavesNothing: an ADD that fails after IPAM (the pod
// already has an eth0) releases the address and leaves no veth or route.
func TestCNIAddFailureLeavesNothing(t *testing.T) {
	n := newNode(t)
	n.addPool(t, 4, nil)
	list := conflist(t, "1.1.0", n.TabbyConf(nil))
	pod := newPod(t, n, "", nil)
	err := pod.NS.Do(func(ns.NetNS) error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0-peer"})
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Add(ctxT(t), list, pod, nil); err == nil {
		t.Fatal("ADD succeeded although the pod already has an eth0")
	}
	if held := n.heldIPs(t, pod); len(held) != 0 {
		t.Errorf("IPAM holds %v after the failed ADD", held)
	}
	if vs := n.hostVeths(t); len(vs) != 0 {
		t.Errorf("host veths left: %v", vs)
	}
	if rs := n.tabbyRoutes(t); len(rs) != 0 {
		t.Errorf("routes left: %v", rs)
	}
	// The pod's own eth0 was not touched.
	err = pod.NS.Do(func(ns.NetNS) error {
		if _, err := netlink.LinkByName("eth0-peer"); err != nil {
			return fmt.Errorf("the pod's own veth pair is gone: %w", err)
		}
		return nil
	})
	if err != nil {
		t.Errorf("the pod's own eth0: %v", err)
	}
}

// TestCNIDirectHandleWritten: with no tabbyd, the plugin writes the IPAM
// handle while it wires the pod (plugin/direct), and the write is done
// when ADD returns: the handle object holds the pod's address.
func TestCNIDirectHandleWritten(t *testing.T) {
	n := newNode(t)
	n.addPool(t, 4, nil)
	list := conflist(t, "1.1.0", n.TabbyConf(nil))
	pod := newPod(t, n, "direct-handle", nil)
	res := n.mustAdd(t, list, pod)
	h, err := n.DS.IPAMHandles.Get(context.Background(), ipam.HandleObjectName(pod.HandleID()), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the handle object right after ADD: %v", err)
	}
	held := 0
	for _, c := range h.Spec.Block {
		held += c
	}
	if h.Spec.HandleID != pod.HandleID() || held != len(res.IPs) {
		t.Errorf("handle %s holds %v, want %d address(es) of handle %s", h.Name, h.Spec.Block, len(res.IPs), pod.HandleID())
	}
}

// TestCNIStaleSandbox: a new sandbox of the same pod replaces the old
// sandbox's veth (same name), and the old sandbox's DEL leaves the new one
// alone.
func TestCNIStaleSandbox(t *testing.T) {
	n := newNode(t)
	n.addPool(t, 4, nil)
	list := conflist(t, "1.1.0", n.TabbyConf(nil))
	old := newPod(t, n, "restarted", nil)
	ro := n.mustAdd(t, list, old)
	fresh := newPod(t, n, "restarted", nil)
	rf := n.mustAdd(t, list, fresh)
	if ro.Interfaces[0].Name != rf.Interfaces[0].Name {
		t.Fatalf("host veth names differ across sandboxes: %s, %s", ro.Interfaces[0].Name, rf.Interfaces[0].Name)
	}
	if err := n.Del(ctxT(t), list, old, nil); err != nil {
		t.Fatalf("DEL of the old sandbox: %v", err)
	}
	if err := n.Check(ctxT(t), list, fresh, nil); err != nil {
		t.Errorf("CHECK of the new sandbox after the old one's DEL: %v", err)
	}
	if err := testnet.Ping(fresh.NS, n.IPv4); err != nil {
		t.Errorf("new sandbox to node: %v", err)
	}
}

// TestCNIVersions: VERSION lists 0.3.0 to 1.1.0 and ADD answers in the
// version the config asks for.
func TestCNIVersions(t *testing.T) {
	n := newNode(t)
	n.addPool(t, 4, nil)
	for _, bin := range []string{"tabby", "tabby-ipam"} {
		var got []string
		err := n.Do(func() error {
			vi, err := n.CNI.GetVersionInfo(ctxT(t), bin)
			if err == nil {
				got = vi.SupportedVersions()
			}
			return err
		})
		if err != nil {
			t.Fatalf("VERSION of %s: %v", bin, err)
		}
		if strings.Join(got, ",") != "0.3.0,0.3.1,0.4.0,1.0.0,1.1.0" {
			t.Errorf("%s supports %v", bin, got)
		}
	}
	for _, v := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			list := conflist(t, v, n.TabbyConf(nil))
			pod := newPod(t, n, "", nil)
			var r types.Result
			err := n.Do(func() (err error) {
				r, err = n.CNI.AddNetworkList(ctxT(t), list, pod.RuntimeConf(nil))
				return err
			})
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if r.Version() != v {
				t.Errorf("result version %s, want %s", r.Version(), v)
			}
			res, err := current.NewResultFromResult(r)
			if err != nil || len(res.IPs) != 1 {
				t.Errorf("result %v: %v", r, err)
			}
			if v != "0.3.0" && v != "0.3.1" {
				if err := n.Check(ctxT(t), list, pod, nil); err != nil {
					t.Errorf("CHECK: %v", err)
				}
			}
			if err := n.Del(ctxT(t), list, pod, nil); err != nil {
				t.Errorf("DEL: %v", err)
			}
			if held := n.heldIPs(t, pod); len(held) != 0 {
				t.Errorf("IPAM holds %v after DEL", held)
			}
		})
	}
}

// TestCNILogFile: with logLevel set, the plugin binaries log to logFile
// (its folder made, the file 0600), not to stderr.
func TestCNILogFile(t *testing.T) {
	n := newNode(t)
	n.addPool(t, 4, nil)
	logFile := filepath.Join(n.Dir, "log", "tabby", "cni.log")
	conf := n.TabbyConf(nil)
	conf["logLevel"] = "info"
	conf["logFile"] = logFile
	list := conflist(t, "1.1.0", conf)
	pod := newPod(t, n, "logged", nil)
	n.mustAdd(t, list, pod)
	if err := n.Del(ctxT(t), list, pod, nil); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", logFile, fi.Mode().Perm())
	}
	b, _ := os.ReadFile(logFile)
	if !strings.Contains(string(b), "msg=added plugin=tabby") || !strings.Contains(string(b), "container="+pod.ContainerID+" pod=default/logged") {
		t.Errorf("%s lacks the ADD of %s:\n%s", logFile, pod.ContainerID, b)
	}
}
