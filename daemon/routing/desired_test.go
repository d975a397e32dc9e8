package routing

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/tabbynet/tabby/api/v1"
)

// The cluster of the table: node1 (this node) and node2 share
// 192.168.1.0/24; node3 is in 192.168.2.0/24.
var (
	mac1, mac2, mac3 = mustMAC("02:00:00:00:00:01"), mustMAC("02:00:00:00:00:02"), mustMAC("02:00:00:00:00:03")

	node1 = NodeInfo{Name: "node1", IPv4: pfx("192.168.1.10/24"), IPv6: pfx("fd00:1::10/64"),
		VXLANMAC: mac1, VXLANAddress: addr("10.244.1.1"), IPIPAddress: addr("10.244.1.2")}
	node2 = NodeInfo{Name: "node2", IPv4: pfx("192.168.1.11/24"), IPv6: pfx("fd00:1::11/64"),
		VXLANMAC: mac2, VXLANAddress: addr("10.244.2.1"), IPIPAddress: addr("10.244.2.2")}
	node3 = NodeInfo{Name: "node3", IPv4: pfx("192.168.2.10/24"), IPv6: pfx("fd00:2::10/64"),
		VXLANMAC: mac3, VXLANAddress: addr("10.244.3.1"), IPIPAddress: addr("10.244.3.2")}

	// node1's blocks, and what node2 and node3 advertise.
	ownBlocks   = []string{"10.244.1.0/26", "fd00:10:244:0:1::/122"}
	peerLearned = []string{
		"10.244.2.0/26 via 192.168.1.11",
		"10.244.3.0/26 via 192.168.2.10",
	}
)

func mustMAC(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr  { return netip.MustParseAddr(s) }

func ippool(name, cidr string, ipip, vxlan v1.EncapMode, nat bool) v1.IPPool {
	return v1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.IPPoolSpec{CIDR: cidr, IPIPMode: ipip, VXLANMode: vxlan, NATOutgoing: nat}}
}

func learned(lines ...string) []LearnedRoute {
	var out []LearnedRoute
	for _, l := range lines {
		p, nh, _ := strings.Cut(l, " via ")
		out = append(out, LearnedRoute{Prefix: pfx(p), NextHop: addr(nh)})
	}
	return out
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, pfx(s))
	}
	return out
}

// render describes the parts of a State as lines a table can spell out.
func renderRoutes(s State) []string {
	var out []string
	for _, r := range s.Routes {
		out = append(out, r.String())
	}
	return out
}

func renderVXLAN(x *VXLAN) []string {
	if x == nil {
		return nil
	}
	out := []string{fmt.Sprintf("dev mac %s local %s mtu %d addrs %v", x.MAC, x.Local, x.MTU, x.Addresses)}
	for _, e := range x.FDB {
		out = append(out, fmt.Sprintf("fdb %s dst %s", e.MAC, e.Dst))
	}
	for _, n := range x.Neighbors {
		out = append(out, fmt.Sprintf("neigh %s lladdr %s", n.IP, n.MAC))
	}
	return out
}

func renderIPIP(t *IPIP) string {
	if t == nil {
		return ""
	}
	return fmt.Sprintf("tunl0 %v local %s", t.Address, t.Local)
}

func TestDesired(t *testing.T) {
	v4Never := ippool("v4", "10.244.0.0/16", "", "", false)
	v6Never := ippool("v6", "fd00:10:244::/56", "", "", false)
	blackholes := []string{"blackhole 10.244.1.0/26", "blackhole fd00:10:244:0:1::/122"}
	vxlanDev := "dev mac 02:00:00:00:00:01 local 192.168.1.10 mtu 0 addrs [10.244.1.1/32]"
	fdb := []string{"fdb 02:00:00:00:00:02 dst 192.168.1.11", "fdb 02:00:00:00:00:03 dst 192.168.2.10"}
	neigh := []string{"neigh 10.244.2.1 lladdr 02:00:00:00:00:02", "neigh 10.244.3.1 lladdr 02:00:00:00:00:03"}

	tests := []struct {
		name    string
		pools   []v1.IPPool
		learned []string
		edit    func(*Inputs)
		routes  []string
		vxlan   []string // nil: no device
		ipip    string   // "": no tunl0 state
		// warnings are substrings of State.Warnings, one each, in order.
		warnings []string
	}{
		{
			name:     "native: via the node on this subnet; the node off it is routed as the kernel allows, with a warning",
			pools:    []v1.IPPool{v4Never, v6Never},
			learned:  peerLearned,
			routes:   append(slices.Clone(blackholes[:1]), "10.244.2.0/26 via 192.168.1.11", "10.244.3.0/26 via 192.168.2.10", blackholes[1]),
			warnings: []string{"10.244.3.0/26 is routed natively via 192.168.2.10, which is not on this node's subnet 192.168.1.10/24"},
		},
		{
			name:    "IPIP Always: every peer through tunl0, onlink via the peer's node address",
			pools:   []v1.IPPool{ippool("v4", "10.244.0.0/16", v1.EncapAlways, "", false)},
			learned: peerLearned,
			routes:  append(slices.Clone(blackholes[:1]), "10.244.2.0/26 via 192.168.1.11 dev tunl0 onlink", "10.244.3.0/26 via 192.168.2.10 dev tunl0 onlink", blackholes[1]),
			ipip:    "tunl0 10.244.1.2/32 local 192.168.1.10",
		},
		{
			name:    "IPIP CrossSubnet: the same subnet natively, the other through tunl0",
			pools:   []v1.IPPool{ippool("v4", "10.244.0.0/16", v1.EncapCrossSubnet, "", false)},
			learned: peerLearned,
			routes:  append(slices.Clone(blackholes[:1]), "10.244.2.0/26 via 192.168.1.11", "10.244.3.0/26 via 192.168.2.10 dev tunl0 onlink", blackholes[1]),
			ipip:    "tunl0 10.244.1.2/32 local 192.168.1.10",
		},
		{
			name:    "IPIP without a tunnel address: tunl0 is still wanted, with no address",
			pools:   []v1.IPPool{ippool("v4", "10.244.0.0/16", v1.EncapAlways, "", false)},
			edit:    func(in *Inputs) { in.Node.IPIPAddress = netip.Addr{} },
			learned: peerLearned[:1],
			routes:  append(slices.Clone(blackholes[:1]), "10.244.2.0/26 via 192.168.1.11 dev tunl0 onlink", blackholes[1]),
			ipip:    "tunl0 invalid Prefix local 192.168.1.10",
		},
		{
			name:    "VXLAN Always: via the peers' tunnel addresses, with FDB and neighbour entries",
			pools:   []v1.IPPool{ippool("v4", "10.244.0.0/16", "", v1.EncapAlways, false)},
			learned: peerLearned,
			routes:  append(slices.Clone(blackholes[:1]), "10.244.2.0/26 via 10.244.2.1 dev tabby.vxlan onlink", "10.244.3.0/26 via 10.244.3.1 dev tabby.vxlan onlink", blackholes[1]),
			vxlan:   append(append([]string{vxlanDev}, fdb...), neigh...),
		},
		{
			name:    "VXLAN CrossSubnet: the same subnet natively, the other over tabby.vxlan",
			pools:   []v1.IPPool{ippool("v4", "10.244.0.0/16", "", v1.EncapCrossSubnet, false)},
			learned: peerLearned,
			routes:  append(slices.Clone(blackholes[:1]), "10.244.2.0/26 via 192.168.1.11", "10.244.3.0/26 via 10.244.3.1 dev tabby.vxlan onlink", blackholes[1]),
			vxlan:   append(append([]string{vxlanDev}, fdb...), neigh...),
		},
		{
			name:  "VXLAN: a peer that has not published its identity is not routed yet, and has no entries",
			pools: []v1.IPPool{ippool("v4", "10.244.0.0/16", "", v1.EncapAlways, false)},
			edit: func(in *Inputs) {
				in.Peers[1].VXLANMAC = nil              // node3: no MAC
				in.Peers[0].VXLANAddress = netip.Addr{} // node2: no tunnel address
			},
			learned: append(slices.Clone(peerLearned), "10.244.9.0/26 via 192.168.1.99"),
			routes:  blackholes,
			vxlan:   []string{vxlanDev, fdb[0]},
			warnings: []string{
				"10.244.2.0/26 via node node2 needs VXLAN, but node node2 has published no VXLAN tunnel address",
				"10.244.3.0/26 via node node3 needs VXLAN, but node node3 has published no usable VXLAN MAC",
				"10.244.9.0/26 via 192.168.1.99 needs VXLAN, but no node has the address 192.168.1.99",
			},
		},
		{
			name:  "VXLAN: no MAC given means the default MAC of the node's name; no tunnel address is warned about",
			pools: []v1.IPPool{ippool("v4", "10.244.0.0/16", "", v1.EncapAlways, false)},
			edit: func(in *Inputs) {
				in.Node.VXLANMAC = nil
				in.Node.VXLANAddress = netip.Addr{}
				in.Peers = nil
			},
			routes:   blackholes,
			vxlan:    []string{fmt.Sprintf("dev mac %s local 192.168.1.10 mtu 0 addrs []", DefaultVXLANMAC("node1"))},
			warnings: []string{"this node has no VXLAN tunnel address"},
		},
		{
			name:     "VXLAN without an IPv4 node address: no device, and its routes are not programmed",
			pools:    []v1.IPPool{ippool("v4", "10.244.0.0/16", "", v1.EncapAlways, false)},
			edit:     func(in *Inputs) { in.Node.IPv4 = netip.Prefix{} },
			learned:  peerLearned[:1],
			routes:   blackholes,
			warnings: []string{"VXLAN needs this node's IPv4 address", "10.244.2.0/26 via 192.168.1.11 needs VXLAN, which this node cannot run"},
		},
		{
			name:  "VXLAN: a peer with this node's MAC is left out",
			pools: []v1.IPPool{ippool("v4", "10.244.0.0/16", "", v1.EncapAlways, false)},
			edit: func(in *Inputs) {
				in.Peers[1].VXLANMAC = mac2
			},
			learned:  peerLearned,
			routes:   append(slices.Clone(blackholes[:1]), "10.244.2.0/26 via 10.244.2.1 dev tabby.vxlan onlink", blackholes[1]),
			vxlan:    []string{vxlanDev, fdb[0], neigh[0]},
			warnings: []string{"nodes node2 and node3 have the same VXLAN MAC 02:00:00:00:00:02", "10.244.3.0/26 via node node3 needs VXLAN"},
		},
		{
			name:     "IPv6 natively via the peers' IPv6 addresses",
			pools:    []v1.IPPool{v4Never, v6Never},
			learned:  []string{"fd00:10:244:0:2::/122 via fd00:1::11", "fd00:10:244:0:3::/122 via fd00:2::10"},
			routes:   append(slices.Clone(blackholes), "fd00:10:244:0:2::/122 via fd00:1::11", "fd00:10:244:0:3::/122 via fd00:2::10"),
			warnings: []string{"fd00:10:244:0:3::/122 is routed natively via fd00:2::10, which is not on this node's subnet fd00:1::10/64"},
		},
		{
			name:    "IPv6 over VXLAN (IPv4 underlay): via the peers' link-local addresses derived from their MACs",
			pools:   []v1.IPPool{v4Never, ippool("v6", "fd00:10:244::/56", "", v1.EncapCrossSubnet, false)},
			learned: []string{"fd00:10:244:0:2::/122 via fd00:1::11", "fd00:10:244:0:3::/122 via fd00:2::10"},
			routes:  append(slices.Clone(blackholes), "fd00:10:244:0:2::/122 via fd00:1::11", "fd00:10:244:0:3::/122 via fe80::ff:fe00:3 dev tabby.vxlan"),
			vxlan: append(append([]string{"dev mac 02:00:00:00:00:01 local 192.168.1.10 mtu 0 addrs [10.244.1.1/32 fe80::ff:fe00:1/64]"}, fdb...),
				neigh[0], neigh[1], "neigh fe80::ff:fe00:2 lladdr 02:00:00:00:00:02", "neigh fe80::ff:fe00:3 lladdr 02:00:00:00:00:03"),
		},
		{
			name:     "IPIP on an IPv6 pool: routed natively, with a warning",
			pools:    []v1.IPPool{v4Never, ippool("v6", "fd00:10:244::/56", v1.EncapAlways, "", false)},
			learned:  []string{"fd00:10:244:0:2::/122 via fd00:1::11"},
			routes:   append(slices.Clone(blackholes), "fd00:10:244:0:2::/122 via fd00:1::11"),
			warnings: []string{"pool v6: IPIP carries only IPv4"},
		},
		{
			name:    "routes outside every pool (an external peer's) are native via the next hop, even with encapsulating pools",
			pools:   []v1.IPPool{ippool("v4", "10.244.0.0/16", "", v1.EncapAlways, false)},
			learned: []string{"203.0.113.0/24 via 192.168.1.1", "0.0.0.0/0 via 192.168.1.1"},
			edit:    func(in *Inputs) { in.Peers = nil },
			routes:  []string{"0.0.0.0/0 via 192.168.1.1", "blackhole 10.244.1.0/26", "203.0.113.0/24 via 192.168.1.1", blackholes[1]},
			vxlan:   []string{vxlanDev},
		},
		{
			name:    "own blocks learned back and routes via this node are ignored; a borrowed /32 inside an own block goes to its node",
			pools:   []v1.IPPool{v4Never},
			learned: []string{"10.244.1.0/26 via 192.168.1.11", "10.244.7.0/26 via 192.168.1.10", "10.244.1.7/32 via 192.168.1.11", "fd00:10:244:0:7::/122 via fd00:1::10"},
			routes:  []string{"blackhole 10.244.1.0/26", "10.244.1.7/32 via 192.168.1.11", blackholes[1]},
		},
		{
			name:     "a prefix learned via two next hops uses the lower one, with a warning; duplicates are fine",
			pools:    []v1.IPPool{v4Never},
			learned:  []string{"10.244.2.0/26 via 192.168.1.12", "10.244.2.0/26 via 192.168.1.11", "10.244.2.0/26 via 192.168.1.11"},
			routes:   append(slices.Clone(blackholes[:1]), "10.244.2.0/26 via 192.168.1.11", blackholes[1]),
			warnings: []string{"10.244.2.0/26 is learned via both 192.168.1.11 and 192.168.1.12: 192.168.1.11 is used"},
		},
		{
			name: "the most specific pool decides; disabled pools still route",
			pools: []v1.IPPool{
				ippool("wide", "10.244.0.0/16", "", v1.EncapAlways, false),
				func() v1.IPPool {
					p := ippool("narrow", "10.244.2.0/24", "", "", false)
					p.Spec.Disabled = true
					return p
				}(),
			},
			learned: peerLearned,
			routes:  append(slices.Clone(blackholes[:1]), "10.244.2.0/26 via 192.168.1.11", "10.244.3.0/26 via 10.244.3.1 dev tabby.vxlan onlink", blackholes[1]),
			vxlan:   append(append([]string{vxlanDev}, fdb...), neigh...),
		},
		{
			name:     "malformed input is reported and skipped",
			pools:    []v1.IPPool{v4Never, ippool("bad", "10.244.0.0", "", "", false)},
			learned:  []string{"10.244.2.0/26 via fd00:1::11"},
			edit:     func(in *Inputs) { in.Learned = append(in.Learned, LearnedRoute{Prefix: pfx("10.244.5.0/26")}) },
			routes:   blackholes,
			warnings: []string{`pool bad: cidr "10.244.0.0" is not a CIDR`, "learned route 10.244.2.0/26 via fd00:1::11 mixes address families", "learned route 10.244.5.0/26 via invalid IP is incomplete"},
		},
		{
			name:    "blocks and learned prefixes with host bits set are masked",
			pools:   []v1.IPPool{v4Never},
			learned: []string{"10.244.2.5/26 via 192.168.1.11"},
			edit:    func(in *Inputs) { in.Blocks = prefixes("10.244.1.9/26") },
			routes:  []string{"blackhole 10.244.1.0/26", "10.244.2.0/26 via 192.168.1.11"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := Inputs{Node: node1, Pools: tt.pools, Blocks: prefixes(ownBlocks...), Learned: learned(tt.learned...),
				Peers: []NodeInfo{node2, node3}}
			if tt.edit != nil {
				tt.edit(&in)
			}
			s := Desired(in)
			if got := renderRoutes(s); !slices.Equal(got, tt.routes) {
				t.Errorf("routes:\n got %q\nwant %q", got, tt.routes)
			}
			if got := renderVXLAN(s.VXLAN); !slices.Equal(got, tt.vxlan) {
				t.Errorf("vxlan:\n got %q\nwant %q", got, tt.vxlan)
			}
			if got := renderIPIP(s.IPIP); got != tt.ipip {
				t.Errorf("ipip: got %q, want %q", got, tt.ipip)
			}
			if len(s.Warnings) != len(tt.warnings) {
				t.Errorf("warnings: got %q, want %d matching %q", s.Warnings, len(tt.warnings), tt.warnings)
			} else {
				for i, w := range tt.warnings {
					if !strings.Contains(s.Warnings[i], w) {
						t.Errorf("warning %d: %q lacks %q", i, s.Warnings[i], w)
					}
				}
			}
		})
	}
}

func TestDesiredNATAndForwarding(t *testing.T) {
	s := Desired(Inputs{Node: node1, Pools: []v1.IPPool{
		ippool("a", "10.244.0.0/16", "", "", true),
		ippool("b", "10.96.0.0/12", "", "", false),
		ippool("c", "fd00:10:244::/56", "", "", true),
		ippool("dup", "10.244.0.0/16", "", "", true),
	}})
	want := NAT{AllPools: prefixes("10.96.0.0/12", "10.244.0.0/16", "fd00:10:244::/56"), NATPools: prefixes("10.244.0.0/16", "fd00:10:244::/56")}
	if !reflect.DeepEqual(s.NAT, want) {
		t.Errorf("NAT = %v, want %v", s.NAT, want)
	}
	if !s.IPv4Forwarding || !s.IPv6Forwarding {
		t.Errorf("forwarding v4 %v v6 %v, want both", s.IPv4Forwarding, s.IPv6Forwarding)
	}
	s = Desired(Inputs{Node: NodeInfo{Name: "n", IPv4: pfx("192.168.1.10/24")}, Pools: []v1.IPPool{ippool("a", "10.244.0.0/16", "", "", false)}})
	if len(s.NAT.NATPools) != 0 || !s.IPv4Forwarding || s.IPv6Forwarding {
		t.Errorf("IPv4-only node without natOutgoing: NAT %v, forwarding v4 %v v6 %v", s.NAT, s.IPv4Forwarding, s.IPv6Forwarding)
	}
}

// Desired gives the same State for the same inputs in any order.
func TestDesiredIsDeterministic(t *testing.T) {
	in := Inputs{
		Node: node1,
		Pools: []v1.IPPool{
			ippool("v4", "10.244.0.0/16", "", v1.EncapCrossSubnet, true),
			ippool("v6", "fd00:10:244::/56", "", v1.EncapAlways, false),
			ippool("ext", "10.96.0.0/12", v1.EncapAlways, "", true),
			ippool("both", "10.97.0.0/16", v1.EncapAlways, v1.EncapAlways, false),
			ippool("ipip6", "fd00:10:245::/56", v1.EncapCrossSubnet, "", false),
			ippool("broken", "10.98.0.0", "", "", false),
		},
		Blocks: prefixes(append(ownBlocks, "10.244.1.64/26")...),
		Learned: learned(append(slices.Clone(peerLearned), "10.244.2.64/26 via 192.168.1.11", "10.96.3.0/26 via 192.168.2.10",
			"fd00:10:244:0:2::/122 via fd00:1::11", "fd00:10:244:0:3::/122 via fd00:2::10", "203.0.113.0/24 via 192.168.1.1",
			"10.244.9.0/26 via 192.168.1.99", "10.244.9.0/26 via 192.168.1.98")...),
		Peers: []NodeInfo{node2, node3, {Name: "node4", IPv4: pfx("192.168.2.11/24")}},
	}
	want := Desired(in)
	if len(want.Routes) < 10 || len(want.Warnings) == 0 {
		t.Fatalf("the fixture is too small to show anything: %d routes, warnings %q", len(want.Routes), want.Warnings)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 50 {
		in2 := in
		in2.Pools, in2.Blocks, in2.Learned, in2.Peers = slices.Clone(in.Pools), slices.Clone(in.Blocks), slices.Clone(in.Learned), slices.Clone(in.Peers)
		r.Shuffle(len(in2.Pools), func(i, j int) { in2.Pools[i], in2.Pools[j] = in2.Pools[j], in2.Pools[i] })
		r.Shuffle(len(in2.Blocks), func(i, j int) { in2.Blocks[i], in2.Blocks[j] = in2.Blocks[j], in2.Blocks[i] })
		r.Shuffle(len(in2.Learned), func(i, j int) { in2.Learned[i], in2.Learned[j] = in2.Learned[j], in2.Learned[i] })
		r.Shuffle(len(in2.Peers), func(i, j int) { in2.Peers[i], in2.Peers[j] = in2.Peers[j], in2.Peers[i] })
		if got := Desired(in2); !reflect.DeepEqual(got, want) {
			t.Fatalf("shuffled inputs give another state:\n got %+v\nwant %+v", got, want)
		}
	}
}

func TestNodeInfoAnnotations(t *testing.T) {
	ann := node2.Annotations()
	want := map[string]string{
		v1.AnnotationNodeIPv4Address:    "192.168.1.11/24",
		v1.AnnotationNodeIPv6Address:    "fd00:1::11/64",
		v1.AnnotationVXLANTunnelMAC:     "02:00:00:00:00:02",
		v1.AnnotationVXLANTunnelAddress: "10.244.2.1",
		v1.AnnotationIPIPTunnelAddress:  "10.244.2.2",
	}
	if !reflect.DeepEqual(ann, want) {
		t.Fatalf("Annotations() = %v, want %v", ann, want)
	}
	got, err := NodeInfoFromAnnotations("node2", ann)
	if err != nil || !reflect.DeepEqual(got, node2) {
		t.Fatalf("round trip = %+v, %v; want %+v", got, err, node2)
	}
	got, err = NodeInfoFromAnnotations("n", map[string]string{
		v1.AnnotationNodeIPv4Address:    "192.168.1.11", // no prefix length
		v1.AnnotationNodeIPv6Address:    "192.168.1.11/24",
		v1.AnnotationVXLANTunnelMAC:     "02:00:00:00:00:02:03:04",
		v1.AnnotationVXLANTunnelAddress: "fd00::1",
		v1.AnnotationIPIPTunnelAddress:  "10.244.2.2",
	})
	if err == nil || got.IPv4.IsValid() || got.IPv6.IsValid() || got.VXLANMAC != nil || got.VXLANAddress.IsValid() || got.IPIPAddress != addr("10.244.2.2") {
		t.Fatalf("malformed annotations gave %+v, %v", got, err)
	}
	for _, key := range []string{v1.AnnotationNodeIPv4Address, v1.AnnotationNodeIPv6Address, v1.AnnotationVXLANTunnelMAC, v1.AnnotationVXLANTunnelAddress} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("the error does not name %s: %v", key, err)
		}
	}
	if got, err := NodeInfoFromAnnotations("bare", nil); err != nil || !reflect.DeepEqual(got, NodeInfo{Name: "bare"}) {
		t.Errorf("no annotations: %+v, %v", got, err)
	}
}

func TestDefaultVXLANMACAndLinkLocal(t *testing.T) {
	a, b := DefaultVXLANMAC("node1"), DefaultVXLANMAC("node2")
	if a.String() == b.String() || a.String() != DefaultVXLANMAC("node1").String() {
		t.Fatalf("DefaultVXLANMAC is not a stable per-name MAC: %s %s", a, b)
	}
	for _, m := range []net.HardwareAddr{a, b} {
		if len(m) != 6 || m[0]&1 != 0 || m[0]&2 == 0 {
			t.Errorf("%s is not a unicast, locally administered MAC", m)
		}
	}
	if got := LinkLocalFromMAC(mustMAC("52:54:00:12:34:56")); got != addr("fe80::5054:ff:fe12:3456") {
		t.Errorf("LinkLocalFromMAC = %s, want fe80::5054:ff:fe12:3456", got)
	}
	if LinkLocalFromMAC(nil).IsValid() {
		t.Error("LinkLocalFromMAC(nil) is valid")
	}
}
