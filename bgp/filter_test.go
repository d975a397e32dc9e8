package bgp

import (
	"fmt"
	"net/netip"
	"testing"

	api "github.com/osrg/gobgp/v3/api"
	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/tabbynet/tabby/api/v1"
)

// testFilters: nodes n1 (10.0.0.1) and n2 (10.0.0.2, fd00::2) on
// 10.0.0.0/24; pools 10.244.0.0/16 (/26 blocks) and fd00:244::/48 (/122);
// n1 holds 10.244.1.0/26, n2 holds 10.244.2.0/26 and fd00:244::/122, and
// n1 borrowed 10.244.2.5 from n2's block; service CIDR 10.96.0.0/12; the
// BGPPeer "tor" names a filter that accepts the default route and rejects
// 198.51.100.0/24, and exports 203.0.113.0/24.
func testFilters(t testing.TB) *Filters {
	b := block("10.244.2.0/26", "host:n2", map[int]string{5: "n1"})
	in := FilterInputs{
		Nodes: []Node{{Name: "n1", IPv4: netip.MustParsePrefix("10.0.0.1/24")},
			{Name: "n2", IPv4: netip.MustParsePrefix("10.0.0.2/24"), IPv6: netip.MustParsePrefix("fd00::2/64")}},
		Pools:  []v1.IPPool{sizedPool("10.244.0.0/16", 26), sizedPool("fd00:244::/48", 122)},
		Blocks: []v1.IPAMBlock{block("10.244.1.0/26", "host:n1", nil), b, block("fd00:244::/122", "host:n2", nil)},
		Config: v1.BGPConfigurationSpec{ServiceClusterIPs: []v1.ServiceIPBlock{{CIDR: "10.96.0.0/12"}}},
		BGPPeers: []v1.BGPPeer{{ObjectMeta: metav1.ObjectMeta{Name: "tor"}, Spec: v1.BGPPeerSpec{Filters: []string{"tor-in"}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "broken"}, Spec: v1.BGPPeerSpec{Filters: []string{"missing"}}}},
		BGPFilters: []v1.BGPFilter{{ObjectMeta: metav1.ObjectMeta{Name: "tor-in"}, Spec: v1.BGPFilterSpec{
			ImportV4: []v1.BGPFilterRuleV4{{CIDR: "0.0.0.0/0", MatchOperator: v1.MatchEqual, Action: v1.FilterAccept},
				{CIDR: "198.51.100.0/24", MatchOperator: v1.MatchIn, Action: v1.FilterReject}},
			ExportV4: []v1.BGPFilterRuleV4{{CIDR: "203.0.113.0/24", MatchOperator: v1.MatchEqual, Action: v1.FilterAccept}},
		}}},
	}
	f, problems := NewFilters(in)
	if len(problems) != 1 || problems[0].Error() != "BGPPeer broken names BGPFilter missing, which does not exist: create it or remove it from spec.filters (until then its peer gets the default filters)" {
		t.Fatalf("problems: %v", problems)
	}
	return f
}

var (
	meshPeer = Peer{Address: netip.MustParseAddr("10.0.0.2"), Kind: KindMesh, Node: "n2"}
	rrPeer   = Peer{Address: netip.MustParseAddr("10.0.0.9"), Kind: KindReflector, Node: "rr"}
	torPeer  = Peer{Address: netip.MustParseAddr("10.0.0.254"), Kind: KindBGPPeer, BGPPeer: "tor"}
	extPeer  = Peer{Address: netip.MustParseAddr("10.0.0.253"), Kind: KindBGPPeer, BGPPeer: "upstream"}
)

func TestFiltersImport(t *testing.T) {
	f := testFilters(t)
	for _, tc := range []struct {
		peer   Peer
		prefix string
		nh     string
		accept bool
		reason string
	}{
		// Nodes: IPAM decides, by next hop.
		{meshPeer, "10.244.2.0/26", "10.0.0.2", true, "in block 10.244.2.0/26 of the next hop's node"},
		{meshPeer, "10.244.2.9/32", "10.0.0.2", true, "in block 10.244.2.0/26 of the next hop's node"},
		{meshPeer, "fd00:244::/122", "fd00::2", true, "in block fd00:244::/122 of the next hop's node"},
		{meshPeer, "10.244.1.0/26", "10.0.0.2", false, "in block 10.244.1.0/26, whose node is not the next hop 10.0.0.2"},
		{meshPeer, "10.244.1.7/32", "10.0.0.2", false, "in block 10.244.1.0/26, whose node is not the next hop 10.0.0.2"},
		{meshPeer, "10.244.0.0/16", "10.0.0.2", false, "shorter than pool 10.244.0.0/16's block size /26"},
		{meshPeer, "10.244.2.0/25", "10.0.0.2", false, "shorter than pool 10.244.0.0/16's block size /26"},
		{meshPeer, "10.244.7.0/26", "10.0.0.2", false, "in block 10.244.7.0/26, which no node holds"},
		{meshPeer, "0.0.0.0/0", "10.0.0.2", false, "the default route from a node"},
		{meshPeer, "::/0", "fd00::2", false, "the default route from a node"},
		{meshPeer, "10.0.0.1/32", "10.0.0.2", false, "a node's address from a node"},
		{meshPeer, "10.0.0.0/24", "10.0.0.2", false, "a node subnet from a node"},
		{meshPeer, "10.96.0.0/12", "10.0.0.2", false, "inside service CIDR 10.96.0.0/12 from a node"},
		{meshPeer, "10.96.5.5/32", "10.0.0.2", false, "inside service CIDR 10.96.0.0/12 from a node"},
		{meshPeer, "192.0.2.0/24", "10.0.0.2", false, "outside every IP pool"},
		// A reflector relays: the next hop, not the session, must own it.
		{rrPeer, "10.244.1.0/26", "10.0.0.1", true, "in block 10.244.1.0/26 of the next hop's node"},
		{rrPeer, "10.244.1.0/26", "10.0.0.9", false, "in block 10.244.1.0/26, whose node is not the next hop 10.0.0.9"},
		// A borrowed address: its borrower or the block's node.
		{rrPeer, "10.244.2.5/32", "10.0.0.1", true, "an address the next hop's node borrowed"},
		{rrPeer, "10.244.2.5/32", "10.0.0.2", true, "in block 10.244.2.0/26 of the next hop's node"},
		{rrPeer, "10.244.2.6/32", "10.0.0.1", false, "in block 10.244.2.0/26, whose node is not the next hop 10.0.0.1"},
		{meshPeer, "10.244.2.0/26", "fd00::2", false, "malformed route"},
		// External peers: all but tabby's ranges, unless a filter says.
		{extPeer, "192.0.2.0/24", "10.0.0.253", true, "external route"},
		{extPeer, "10.0.0.0/24", "10.0.0.253", true, "external route"},
		{extPeer, "10.0.0.0/8", "10.0.0.253", true, "external route"},
		{extPeer, "0.0.0.0/0", "10.0.0.253", false, "the default route: only nodes announce it"},
		{extPeer, "10.244.1.0/26", "10.0.0.253", false, "inside IP pool 10.244.0.0/16: only nodes announce it"},
		{extPeer, "10.244.0.0/16", "10.0.0.253", false, "inside IP pool 10.244.0.0/16: only nodes announce it"},
		{extPeer, "10.0.0.1/32", "10.0.0.253", false, "a node's address: only nodes announce it"},
		{extPeer, "10.96.0.10/32", "10.0.0.253", false, "inside service CIDR 10.96.0.0/12: only nodes announce it"},
		{torPeer, "0.0.0.0/0", "10.0.0.254", true, "BGPFilter tor-in importV4[0] accepts it"},
		{torPeer, "198.51.100.128/25", "10.0.0.254", false, "BGPFilter tor-in importV4[1] rejects it"},
		{torPeer, "10.244.1.0/26", "10.0.0.254", false, "inside IP pool 10.244.0.0/16: only nodes announce it"},
		{torPeer, "::/0", "fd00::254", false, "the default route: only nodes announce it"},
	} {
		v := f.Import(tc.peer, Route{Prefix: netip.MustParsePrefix(tc.prefix), NextHop: netip.MustParseAddr(tc.nh)})
		if v.Accept != tc.accept || v.Reason != tc.reason {
			t.Errorf("%s via %s from %s: %v %q, want %v %q", tc.prefix, tc.nh, tc.peer.Reason(), v.Accept, v.Reason, tc.accept, tc.reason)
		}
	}
}

func TestFiltersExport(t *testing.T) {
	f := testFilters(t)
	for _, tc := range []struct {
		peer   Peer
		prefix string
		accept bool
	}{
		{meshPeer, "10.244.1.0/26", true},
		{meshPeer, "10.244.2.5/32", true},
		{meshPeer, "10.96.0.0/12", false},  // nodes reject service CIDRs
		{meshPeer, "192.0.2.0/24", false},  // an external peer's route
		{meshPeer, "10.244.0.0/16", false}, // the pool itself
		{extPeer, "10.244.1.0/26", true},
		{extPeer, "fd00:244::/122", true},
		{extPeer, "10.96.0.0/12", true},
		{extPeer, "192.0.2.0/24", false}, // never from one external peer to another
		{extPeer, "0.0.0.0/0", false},
		{torPeer, "203.0.113.0/24", true}, // its filter's export rule
		{torPeer, "203.0.113.0/25", false},
	} {
		if v := f.Export(tc.peer, netip.MustParsePrefix(tc.prefix)); v.Accept != tc.accept {
			t.Errorf("export %s to %s: %v (%s), want %v", tc.prefix, tc.peer.Reason(), v.Accept, v.Reason, tc.accept)
		}
	}
}

func TestFilterRuleMatches(t *testing.T) {
	cidr := netip.MustParsePrefix("10.0.0.0/8")
	for _, tc := range []struct {
		op     v1.BGPFilterMatchOperator
		prefix string
		want   bool
	}{
		{v1.MatchEqual, "10.0.0.0/8", true}, {v1.MatchEqual, "10.0.0.0/9", false},
		{v1.MatchIn, "10.1.0.0/16", true}, {v1.MatchIn, "10.0.0.0/8", true}, {v1.MatchIn, "0.0.0.0/0", false},
		{v1.MatchNotIn, "11.0.0.0/8", true}, {v1.MatchNotIn, "10.1.0.0/16", false},
		{v1.MatchNotIn, "fd00::/8", false}, // other family: never
	} {
		r := FilterRule{CIDR: cidr, Op: tc.op, Family: 4}
		if got := r.matches(netip.MustParsePrefix(tc.prefix)); got != tc.want {
			t.Errorf("%s %s %s: %v, want %v", tc.prefix, tc.op, cidr, got, tc.want)
		}
	}
	if !(FilterRule{Family: 6}).matches(netip.MustParsePrefix("::/0")) || (FilterRule{Family: 6}).matches(netip.MustParsePrefix("0.0.0.0/0")) {
		t.Error("a rule without cidr must match every route of its family only")
	}
}

// FuzzImportFilter: whatever a node sends, what is accepted lies in a
// block (or is a borrowed address) whose node is the next hop, and is none
// of the forbidden prefixes; whatever an external peer without filters
// sends, nothing accepted is the default route or inside a pool or service
// CIDR. The properties are checked against the inputs directly, not
// through Filters' own helpers.
func FuzzImportFilter(f *testing.F) {
	f.Add([]byte{10, 244, 1, 0}, uint8(26), []byte{10, 0, 0, 1}, false)
	f.Add([]byte{10, 244, 2, 5}, uint8(32), []byte{10, 0, 0, 1}, true)
	f.Add([]byte{0, 0, 0, 0}, uint8(0), []byte{10, 0, 0, 2}, false)
	f.Add([]byte{10, 96, 0, 0}, uint8(12), []byte{10, 0, 0, 2}, true)
	f.Add([]byte{0xfd, 0, 2, 0x44, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, uint8(122), []byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2}, false)
	filters := testFilters(f)
	blocks := map[string]netip.Prefix{"n1": netip.MustParsePrefix("10.244.1.0/26"), "n2": netip.MustParsePrefix("10.244.2.0/26")}
	addrs := map[string]netip.Addr{"n1": netip.MustParseAddr("10.0.0.1"), "n2": netip.MustParseAddr("10.0.0.2")}
	f.Fuzz(func(t *testing.T, prefix []byte, bits uint8, nexthop []byte, external bool) {
		a, ok1 := netip.AddrFromSlice(prefix)
		nh, ok2 := netip.AddrFromSlice(nexthop)
		if !ok1 || !ok2 || int(bits) > a.BitLen() {
			return
		}
		p := netip.PrefixFrom(a, int(bits)).Masked()
		peer := meshPeer
		if external {
			peer = extPeer
		}
		v := filters.Import(peer, Route{Prefix: p, NextHop: nh})
		if !v.Accept {
			return
		}
		if p.Bits() == 0 {
			t.Fatalf("accepted the default route %s from %s", p, peer.Reason())
		}
		if p.Addr().Is6() {
			if !external && (p.Bits() < 122 || !netip.MustParsePrefix("fd00:244::/122").Contains(p.Addr()) || nh != netip.MustParseAddr("fd00::2")) {
				t.Fatalf("accepted %s via %s from a node", p, nh)
			}
			return
		}
		inPool := p.Bits() >= 16 && netip.MustParsePrefix("10.244.0.0/16").Contains(p.Addr())
		inService := p.Bits() >= 12 && netip.MustParsePrefix("10.96.0.0/12").Contains(p.Addr())
		if external {
			if inPool || inService || p == netip.PrefixFrom(addrs["n1"], 32) || p == netip.PrefixFrom(addrs["n2"], 32) {
				t.Fatalf("accepted tabby's own %s from an external peer (%s)", p, v.Reason)
			}
			return
		}
		borrowed := p == netip.MustParsePrefix("10.244.2.5/32") && nh == addrs["n1"]
		owned := false
		for n, b := range blocks {
			owned = owned || (p.Bits() >= b.Bits() && b.Contains(p.Addr()) && nh == addrs[n])
		}
		if !borrowed && !owned {
			t.Fatalf("accepted %s via %s from a node, which IPAM does not give it (%s)", p, nh, v.Reason)
		}
	})
}

// A block claimed anywhere changes who may originate what: the import
// policy alone, so sessions re-evaluate what they received and resend
// nothing. A new pool changes what is exported too.
func TestPolicyPartsOfAChange(t *testing.T) {
	nodes := []Node{{Name: "n1", IPv4: netip.MustParsePrefix("10.0.0.1/24")}, {Name: "n2", IPv4: netip.MustParsePrefix("10.0.0.2/24")}}
	pools := []v1.IPPool{sizedPool("10.244.0.0/16", 26)}
	blocks := []v1.IPAMBlock{block("10.244.1.0/26", "host:n1", nil)}
	compile := func(pools []v1.IPPool, blocks []v1.IPAMBlock) *api.SetPoliciesRequest {
		f, problems := NewFilters(FilterInputs{Nodes: nodes, Pools: pools, Blocks: blocks})
		if len(problems) > 0 {
			t.Fatal(problems)
		}
		return compilePolicies(f, []Peer{meshPeer, torPeer})
	}
	changed := func(a, b *api.SetPoliciesRequest, name string) bool {
		return !proto.Equal(policyPart(a, name), policyPart(b, name))
	}
	before := compile(pools, blocks)
	claimed := compile(pools, append(blocks, block("10.244.2.0/26", "host:n2", nil)))
	if !changed(before, claimed, importPolicy) || changed(before, claimed, exportPolicy) {
		t.Errorf("a claimed block: import changed %v (want true), export changed %v (want false)",
			changed(before, claimed, importPolicy), changed(before, claimed, exportPolicy))
	}
	pooled := compile(append(pools, sizedPool("10.245.0.0/16", 26)), blocks)
	if !changed(before, pooled, exportPolicy) {
		t.Errorf("a new pool did not change the export policy")
	}

	// Which sessions re-evaluate what they received: for n2's claim,
	// the session with n2 and those that relay (reflectors, eBGP); for a
	// new pool, all.
	const as = 64512
	n3 := Peer{Address: netip.MustParseAddr("10.0.0.3"), Kind: KindMesh, Node: "n3", AS: as}
	n4 := Peer{Address: netip.MustParseAddr("10.0.0.4"), Kind: KindMesh, Node: "n4", AS: 64513} // eBGP passes n2's route on
	mesh, reflector, tor := meshPeer, rrPeer, torPeer
	mesh.AS, reflector.AS, tor.AS, reflector.Relays = as, as, as, true
	claim, _ := importChange(before, claimed, as)
	pool, _ := importChange(before, pooled, as)
	for _, tc := range []struct {
		peer        Peer
		claim, pool bool
	}{{mesh, true, true}, {n3, false, true}, {n4, true, true}, {reflector, true, true}, {tor, false, true}} {
		if claim(tc.peer) != tc.claim || pool(tc.peer) != tc.pool {
			t.Errorf("session with %s (%s): re-evaluated after the claim %v (want %v), after the new pool %v (want %v)",
				tc.peer.Address, tc.peer.Kind, claim(tc.peer), tc.claim, pool(tc.peer), tc.pool)
		}
	}
	if same, _ := importChange(before, compile(pools, blocks), as); same(mesh) || same(reflector) || same(n4) {
		t.Errorf("an unchanged import policy re-evaluates sessions")
	}
	// The routes a claim can give another verdict: those of the block
	// claimed, or released; any other change leaves it unscoped.
	for _, tc := range []struct {
		name     string
		from, to *api.SetPoliciesRequest
		want     string // "" for unscoped
	}{
		{"a claim", before, claimed, "[10.244.2.0/26]"},
		{"a release", claimed, before, "[10.244.2.0/26]"},
		{"a block moving", claimed, compile(pools, append(blocks, block("10.244.2.0/26", "host:n1", nil))), "[10.244.2.0/26]"},
		{"a new pool", before, pooled, ""},
		{"nothing", before, compile(pools, blocks), ""},
	} {
		_, got := importChange(tc.from, tc.to, as)
		if s := fmt.Sprint(got); got != nil && s != tc.want || got == nil && tc.want != "" {
			t.Errorf("%s: importChange's scope = %s; want %q", tc.name, s, tc.want)
		}
	}
	moved := []Node{{Name: "n1", IPv4: netip.MustParsePrefix("10.0.0.7/24")}, nodes[1]}
	f, _ := NewFilters(FilterInputs{Nodes: moved, Pools: pools, Blocks: blocks})
	if _, got := importChange(before, compilePolicies(f, []Peer{meshPeer, torPeer}), as); got != nil {
		t.Errorf("a node's new address: importChange's scope = %v; want none (all its routes change verdict)", got)
	}
	if part := policyPart(before, exportPolicy); len(part.Policies) != 1 || len(part.DefinedSets) == 0 {
		t.Errorf("the export part has %d policies and %d sets, want 1 and its sets", len(part.Policies), len(part.DefinedSets))
	}
}
