package routing

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	v1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/internal/testnet"
)

func dualStack(vxlan v1.EncapMode) []v1.IPPool {
	return []v1.IPPool{
		ippool("v4", "10.244.0.0/16", "", vxlan, false),
		ippool("v6", "fd00:10:244::/56", "", vxlan, false),
	}
}

// checkVXLANDevice checks tabby.vxlan on n as the design wants it.
func checkVXLANDevice(t *testing.T, n *node) {
	t.Helper()
	n.ns.Must(func() error {
		l, err := netlink.LinkByName(VXLANDevice)
		if err != nil {
			return err
		}
		v, ok := l.(*netlink.Vxlan)
		if !ok {
			return fmt.Errorf("%s is a %s", VXLANDevice, l.Type())
		}
		if v.VxlanId != VXLANVNI || v.Port != VXLANPort || v.Learning || !v.SrcAddr.Equal(n.info.IPv4.Addr().AsSlice()) ||
			v.MTU != 1500-VXLANOverhead || v.HardwareAddr.String() != n.info.VXLANMAC.String() || v.Flags&net.FlagUp == 0 {
			t.Errorf("%s on %s: vni %d port %d learning %v local %s mtu %d mac %s flags %v; want vni %d port %d no learning local %s mtu %d mac %s up",
				VXLANDevice, n.name, v.VxlanId, v.Port, v.Learning, v.SrcAddr, v.MTU, v.HardwareAddr, v.Flags,
				VXLANVNI, VXLANPort, n.info.IPv4.Addr(), 1500-VXLANOverhead, n.info.VXLANMAC)
		}
		return nil
	})
	if v, err := testnet.ReadSysctl(n.ns, "net/ipv4/conf/"+VXLANDevice+"/rp_filter"); err != nil || v != "2" {
		t.Errorf("rp_filter of %s on %s = %q, %v; want 2 (loose)", VXLANDevice, n.name, v, err)
	}
}

// Two nodes on one subnet with VXLAN Always: pods reach each other in both
// families through tabby.vxlan (its counters rise), a second Apply changes
// nothing, drift is repaired, and switching the pools to Never removes the
// device and routes natively.
func TestApplyVXLAN(t *testing.T) {
	l := newLab(t, 1)
	n1, n2 := l.addNode(1, 1), l.addNode(2, 1)
	p1, p2 := n1.addPod(t, 10), n2.addPod(t, 10)
	pools := dualStack(v1.EncapAlways)
	l.applyAll(pools...)

	checkVXLANDevice(t, n1)
	checkVXLANDevice(t, n2)
	ll2 := LinkLocalFromMAC(n2.info.VXLANMAC)
	mustContain(t, "node1's addresses on "+VXLANDevice, n1.ns.Exec("ip", "addr", "show", "dev", VXLANDevice),
		"inet 10.244.1.1/32", "inet6 "+LinkLocalFromMAC(n1.info.VXLANMAC).String()+"/64")
	mustContain(t, "node1's FDB", n1.ns.Exec("bridge", "fdb", "show", "dev", VXLANDevice),
		n2.info.VXLANMAC.String()+" dst 192.168.1.12 self permanent")
	mustContain(t, "node1's neighbours", n1.ns.Exec("ip", "neigh", "show", "dev", VXLANDevice)+n1.ns.Exec("ip", "-6", "neigh", "show", "dev", VXLANDevice),
		"10.244.2.1 lladdr "+n2.info.VXLANMAC.String()+" PERMANENT", ll2.String()+" lladdr "+n2.info.VXLANMAC.String()+" PERMANENT")
	mustContain(t, "node1's tabby routes", ourRoutes(t, n1.ns),
		"10.244.2.0/26 via 10.244.2.1 dev tabby.vxlan proto 81 onlink",
		"fd00:10:244:0:2::/122 via "+ll2.String()+" dev tabby.vxlan proto 81")

	tx1, tx2 := vxlanTx(t, n1), vxlanTx(t, n2)
	for _, c := range [][2]*pod{{p1, p2}, {p2, p1}} {
		ping(t, c[0], c[1].v4)
		ping(t, c[0], c[1].v6)
	}
	if a, b := vxlanTx(t, n1), vxlanTx(t, n2); a < tx1+2 || b < tx2+2 {
		t.Errorf("%s sent %d packets on node1 and %d on node2 during the pings; want at least 2 each", VXLANDevice, a-tx1, b-tx2)
	}

	// Again: nothing changes.
	s1 := Desired(l.inputs(n1, pools...))
	before := snapshot(t, n1.ns)
	if st := n1.apply(t, s1); st.Changed() != 0 {
		t.Errorf("second Apply changed %d things: %+v", st.Changed(), st)
	}
	sameSnapshot(t, "the second Apply", before, snapshot(t, n1.ns))

	// Drift: the device's MTU, a stale FDB entry and neighbour, a changed
	// neighbour. One Apply repairs it all.
	const stale = "02:00:00:00:00:99"
	n1.ns.IP("link set %s mtu 1300", VXLANDevice)
	n1.ns.IP("neigh add 10.244.99.1 lladdr %s dev %s nud permanent", stale, VXLANDevice)
	n1.ns.IP("neigh replace 10.244.2.1 lladdr %s dev %s nud permanent", stale, VXLANDevice)
	n1.ns.Exec("bridge", "fdb", "add", stale, "dev", VXLANDevice, "dst", "192.168.1.99", "self", "permanent")
	st := n1.apply(t, s1)
	if st.Links != (Counts{Updated: 1}) || st.FDB != (Counts{Removed: 1, Unchanged: 1}) || st.Neighbors != (Counts{Removed: 1, Updated: 1, Unchanged: 1}) {
		t.Errorf("repairing drift: links %+v, FDB %+v, neighbours %+v", st.Links, st.FDB, st.Neighbors)
	}
	sameSnapshot(t, "drift and its repair", before, snapshot(t, n1.ns))

	// A device with the right name but the wrong VNI and learning on is
	// recreated (and the routes through it come back).
	n1.ns.IP("link del %s", VXLANDevice)
	n1.ns.IP("link add %s type vxlan id 7 dstport %d learning", VXLANDevice, VXLANPort)
	st = n1.apply(t, s1)
	if st.Links != (Counts{Added: 1, Removed: 1}) || st.Routes.Added != 2 {
		t.Errorf("recreating the device: links %+v, routes %+v", st.Links, st.Routes)
	}
	checkVXLANDevice(t, n1)
	ping(t, p1, p2.v4)
	ping(t, p1, p2.v6)

	// VXLAN off: the device goes, routes are native, pods still talk.
	l.applyAll(dualStackNever...)
	for _, n := range l.nodes {
		if out := n.ns.Exec("ip", "-br", "link", "show", "type", "vxlan"); strings.TrimSpace(out) != "" {
			t.Errorf("%s still has a VXLAN device: %s", n.name, out)
		}
	}
	mustContain(t, "node1's tabby routes", ourRoutes(t, n1.ns), "10.244.2.0/26 via 192.168.1.12 dev eth0 proto 81")
	ping(t, p1, p2.v4)
	ping(t, p2, p1.v6)
}

// Two subnets joined by a router, VXLAN CrossSubnet: traffic between the
// nodes of one subnet is native (the VXLAN counters stand still), traffic
// across the router is encapsulated (they rise).
func TestApplyVXLANCrossSubnet(t *testing.T) {
	l := newLab(t, 2)
	a, b, c := l.addNode(1, 1), l.addNode(2, 1), l.addNode(3, 2)
	pa, pb, pc := a.addPod(t, 10), b.addPod(t, 10), c.addPod(t, 10)
	l.applyAll(dualStack(v1.EncapCrossSubnet)...)

	llc := LinkLocalFromMAC(c.info.VXLANMAC)
	routes := ourRoutes(t, a.ns)
	mustContain(t, "node1's tabby routes", routes,
		"10.244.2.0/26 via 192.168.1.12 dev eth0 proto 81",
		"10.244.3.0/26 via 10.244.3.1 dev tabby.vxlan proto 81 onlink",
		"fd00:10:244:0:2::/122 via fd00:1::12 dev eth0 proto 81",
		"fd00:10:244:0:3::/122 via "+llc.String()+" dev tabby.vxlan proto 81")

	txa, txb := vxlanTx(t, a), vxlanTx(t, b)
	for _, dst := range []*pod{pb} {
		ping(t, pa, dst.v4)
		ping(t, pa, dst.v6)
	}
	if x, y := vxlanTx(t, a), vxlanTx(t, b); x != txa || y != txb {
		t.Errorf("same-subnet pings went through %s: node1 sent %d, node2 %d packets on it", VXLANDevice, x-txa, y-txb)
	}
	txc := vxlanTx(t, c)
	for _, p := range []*pod{pa, pb} {
		ping(t, p, pc.v4)
		ping(t, p, pc.v6)
		ping(t, pc, p.v4)
	}
	if x, z := vxlanTx(t, a), vxlanTx(t, c); x < txa+2 || z < txc+4 {
		t.Errorf("cross-subnet pings: node1 sent %d and node3 %d packets through %s; want at least 2 and 4", x-txa, z-txc, VXLANDevice)
	}
}
