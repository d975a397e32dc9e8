package bgp

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/tabbynet/tabby/api/v1"
)

// node makes a test node n<i> with address 10.0.0.<i>/24 and labels.
func node(i int, lbls ...string) Node {
	n := Node{Name: fmt.Sprintf("n%d", i), Labels: map[string]string{}, IPv4: netip.MustParsePrefix(fmt.Sprintf("10.0.0.%d/24", i))}
	for j := 0; j+1 < len(lbls); j += 2 {
		n.Labels[lbls[j]] = lbls[j+1]
	}
	return n
}

func rr(i int, lbls ...string) Node {
	return node(i, append([]string{v1.LabelRouteReflector, "true"}, lbls...)...)
}

// describe renders peers compactly: address, kind, and the flags that are set.
func describe(peers []Peer) string {
	var parts []string
	for _, p := range peers {
		s := fmt.Sprintf("%s %s as%d", p.Address, p.Reason(), p.AS)
		if p.Port != 179 {
			s += fmt.Sprintf(" port%d", p.Port)
		}
		if p.Passive {
			s += " passive"
		}
		if p.RRClient {
			s += " client:" + p.ClusterID
		}
		if p.Relays {
			s += " relays"
		}
		if p.Password != "" {
			s += " md5"
		}
		if !p.LocalAddress.IsValid() {
			s += " anysrc"
		}
		if p.RestartTime != DefaultMaxRestartTime {
			s += " gr" + p.RestartTime.String()
		}
		if p.KeepOriginalNextHop {
			s += " keepnh"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

func u32(v uint32) *uint32 { return &v }
func boolp(v bool) *bool   { return &v }

func TestDesiredPeers(t *testing.T) {
	all := func(self Node, nodes ...Node) Inputs {
		return Inputs{Self: self, Nodes: append([]Node{self}, nodes...)}
	}
	noMesh := v1.BGPConfigurationSpec{NodeToNodeMeshEnabled: boolp(false)}
	tor := v1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: "tor"}, Spec: v1.BGPPeerSpec{PeerIP: "10.0.0.254", ASNumber: 65001}}
	rrPeers := v1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: "to-rrs"}, Spec: v1.BGPPeerSpec{
		PeerSelector: &metav1.LabelSelector{MatchLabels: map[string]string{v1.LabelRouteReflector: "true"}}}}
	dual := node(1)
	dual.IPv6 = netip.MustParsePrefix("fd00::1/64")
	dual2 := node(2)
	dual2.IPv6 = netip.MustParsePrefix("fd00::2/64")
	noAddr := Node{Name: "n9"}
	ownAS := node(3)
	ownAS.AS = 65003

	tests := []struct {
		name     string
		in       Inputs
		want     string
		problems string
	}{
		{name: "full mesh, lower address connects",
			in:   all(node(2), node(1), node(3), noAddr),
			want: "10.0.0.1 node-mesh as64512 passive; 10.0.0.3 node-mesh as64512"},
		{name: "ordinary node peers only with the reflector",
			in:   all(node(1), rr(2), node(3)),
			want: "10.0.0.2 route-reflector as64512 relays"},
		{name: "reflector peers with every node as clients",
			in:   all(rr(2), node(1), node(3)),
			want: "10.0.0.1 route-reflector-client as64512 passive client:244.0.0.1; 10.0.0.3 route-reflector-client as64512 client:244.0.0.1"},
		{name: "reflectors of one cluster are not each other's clients",
			in:   all(rr(1), rr(2), node(3)),
			want: "10.0.0.2 route-reflector as64512 relays; 10.0.0.3 route-reflector-client as64512 client:244.0.0.1"},
		{name: "reflectors of different clusters are each other's clients",
			in:   all(rr(1, v1.LabelRouteReflectorClusterID, "1.1.1.1"), rr(2, v1.LabelRouteReflectorClusterID, "2.2.2.2")),
			want: "10.0.0.2 route-reflector-client as64512 client:1.1.1.1 relays"},
		{name: "bad cluster ID label falls back to the configured one",
			in: func() Inputs {
				in := all(rr(1, v1.LabelRouteReflectorClusterID, "nope"), node(2))
				in.Config.RouteReflectorClusterID = "10.9.9.9"
				return in
			}(),
			want:     "10.0.0.2 route-reflector-client as64512 client:10.9.9.9",
			problems: `node n1: label tabby.io/route-reflector-cluster-id="nope" is not an IPv4 address`},
		{name: "per-node AS makes eBGP, never a client",
			in:   all(rr(1), ownAS),
			want: "10.0.0.3 node-mesh as65003"},
		{name: "dual stack gives one session per family",
			in:   all(dual, dual2),
			want: "10.0.0.2 node-mesh as64512; fd00::2 node-mesh as64512"},
		{name: "without an IPv6 pool, dual-stack nodes meet over IPv4 only",
			in: func() Inputs {
				in := all(dual, dual2)
				in.NoIPv6Pools = true
				return in
			}(),
			want: "10.0.0.2 node-mesh as64512"},
		{name: "mesh settings: AS, port, restart time, password",
			in: func() Inputs {
				in := all(node(1), node(2))
				in.Config = v1.BGPConfigurationSpec{ASNumber: u32(65100), ListenPort: func() *uint16 { p := uint16(1179); return &p }(),
					NodeMeshMaxRestartTime: &metav1.Duration{Duration: 30 * time.Second}, NodeMeshPassword: &v1.SecretKeyRef{Name: "s", Key: "k"}}
				in.MeshPassword = "pw"
				return in
			}(),
			want: "10.0.0.2 node-mesh as65100 port1179 md5 gr30s"},
		{name: "unread mesh password: no mesh at all",
			in: func() Inputs {
				in := all(node(1), node(2))
				in.Config.NodeMeshPassword = &v1.SecretKeyRef{Name: "s", Key: "k"}
				return in
			}(),
			problems: "nodeMeshPassword names Secret s key k, which could not be read"},
		{name: "mesh disabled: only BGPPeers",
			in: func() Inputs {
				in := all(node(1), node(2))
				in.Config = noMesh
				in.BGPPeers = []v1.BGPPeer{tor}
				return in
			}(),
			want: "10.0.0.254 bgppeer/tor as65001 relays"},
		{name: "BGPPeer settings",
			in: func() Inputs {
				in := all(node(1, "rack", "a"))
				in.BGPPeers = []v1.BGPPeer{{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Spec: v1.BGPPeerSpec{
					PeerIP: "10.0.0.200:1790", ASNumber: 65002, NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "a"}},
					Password: &v1.SecretKeyRef{Name: "s", Key: "k"}, SourceAddress: "None", KeepOriginalNextHop: true,
					MaxRestartTime: &metav1.Duration{Duration: time.Minute}}}}
				in.Passwords = map[string]string{"x": "secret"}
				return in
			}(),
			want: "10.0.0.200 bgppeer/x as65002 port1790 relays md5 anysrc gr1m0s keepnh"},
		{name: "BGPPeer for another node or selector does not apply",
			in: func() Inputs {
				in := all(node(1))
				a, b := tor, tor
				a.Spec.Node = "n2"
				b.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "b"}}
				in.BGPPeers = []v1.BGPPeer{a, b}
				return in
			}()},
		{name: "BGPPeer problems cost only their session",
			in: func() Inputs {
				in := all(node(1))
				pw, v6, bad := tor, tor, tor
				pw.Name, pw.Spec.Password = "pw", &v1.SecretKeyRef{Name: "s", Key: "k"}
				v6.Name, v6.Spec.PeerIP = "v6", "fd00::99"
				bad.Name, bad.Spec.NodeSelector = "bad", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Bogus"}}}
				in.BGPPeers = []v1.BGPPeer{pw, v6, bad, tor}
				return in
			}(),
			want:     "10.0.0.254 bgppeer/tor as65001 relays",
			problems: "BGPPeer bad: nodeSelector is invalid|BGPPeer pw: password Secret s key k could not be read|BGPPeer v6: peer fd00::99 is IPv6 but node n1 has no IPv6 address"},
		{name: "peerSelector works both ways: client side",
			in: func() Inputs {
				in := all(node(1), rr(2), node(3))
				in.Config, in.BGPPeers = noMesh, []v1.BGPPeer{rrPeers}
				return in
			}(),
			want: "10.0.0.2 bgppeer/to-rrs as64512 relays"},
		{name: "peerSelector works both ways: reflector side",
			in: func() Inputs {
				in := all(rr(2), node(1), node(3))
				in.Config, in.BGPPeers = noMesh, []v1.BGPPeer{rrPeers}
				return in
			}(),
			want: "10.0.0.1 bgppeer/to-rrs as64512 passive client:244.0.0.1; 10.0.0.3 bgppeer/to-rrs as64512 client:244.0.0.1"},
		{name: "a mesh session wins over a BGPPeer to the same address",
			in: func() Inputs {
				in := all(node(1), rr(2))
				in.BGPPeers = []v1.BGPPeer{rrPeers}
				return in
			}(),
			want: "10.0.0.2 route-reflector as64512 relays"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			peers, problems := DesiredPeers(tc.in)
			if got := describe(peers); got != tc.want {
				t.Errorf("peers:\n got %s\nwant %s", got, tc.want)
			}
			var ps []string
			for _, p := range problems {
				ps = append(ps, p.Error())
			}
			got := strings.Join(ps, "|")
			for _, w := range strings.Split(tc.problems, "|") {
				if !strings.Contains(got, w) {
					t.Errorf("problems %q lack %q", got, w)
				}
			}
			if tc.problems == "" && got != "" {
				t.Errorf("unexpected problems: %s", got)
			}
			again, _ := DesiredPeers(tc.in)
			if describe(again) != describe(peers) {
				t.Errorf("not deterministic")
			}
		})
	}
}

func TestSettingsAndHelpers(t *testing.T) {
	s := SettingsOf(v1.BGPConfigurationSpec{})
	if s.AS != 64512 || !s.Mesh || s.ListenPort != 179 || s.ClusterID != "244.0.0.1" || s.MeshRestartTime != 120*time.Second {
		t.Errorf("defaults: %+v", s)
	}
	if as, err := NodeAS(map[string]string{v1.AnnotationASNumber: "65010"}); err != nil || as != 65010 {
		t.Errorf("NodeAS = %d, %v", as, err)
	}
	if _, err := NodeAS(map[string]string{v1.AnnotationASNumber: "x"}); err == nil {
		t.Error("NodeAS accepted x")
	}
	if as, err := NodeAS(nil); err != nil || as != 0 {
		t.Errorf("NodeAS(nil) = %d, %v", as, err)
	}
	if id := RouterID(node(7)); id.String() != "10.0.0.7" {
		t.Errorf("RouterID = %s", id)
	}
	v6only := Node{Name: "x", IPv6: netip.MustParsePrefix("fd00::1/64")}
	if a, b := RouterID(v6only), RouterID(v6only); !a.Is4() || a != b {
		t.Errorf("RouterID of an IPv6-only node = %s, %s", a, b)
	}
	for in, want := range map[string]string{"10.1.1.1": "10.1.1.1:179", "10.1.1.1:1790": "10.1.1.1:1790", "[fd00::1]:1790": "[fd00::1]:1790", "fd00::1": "[fd00::1]:179"} {
		a, p, err := parsePeerIP(in)
		if got := netip.AddrPortFrom(a, p).String(); err != nil || got != want {
			t.Errorf("parsePeerIP(%q) = %s, %v; want %s", in, got, err, want)
		}
	}
	if _, _, err := parsePeerIP("10.1.1.1:0"); err == nil {
		t.Error("port 0 accepted")
	}
}
