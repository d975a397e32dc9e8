package daemon

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/daemon/routing"
)

func TestAnnotationPatch(t *testing.T) {
	v4, mac, vx := tabbyv1.AnnotationNodeIPv4Address, tabbyv1.AnnotationVXLANTunnelMAC, tabbyv1.AnnotationVXLANTunnelAddress
	for _, tc := range []struct {
		name       string
		have, want map[string]string
		patch      string // "" for none
	}{
		{"nothing yet", nil, map[string]string{v4: "10.0.0.1/24"}, `{"metadata":{"annotations":{"tabby.io/ipv4-address":"10.0.0.1/24"}}}`},
		{"unchanged", map[string]string{v4: "10.0.0.1/24", "other": "x"}, map[string]string{v4: "10.0.0.1/24"}, ""},
		{"changed address, VXLAN gone; the user's AS stays",
			map[string]string{v4: "10.0.0.1/24", mac: "02:00:00:00:00:01", vx: "10.244.0.1", tabbyv1.AnnotationASNumber: "65001"},
			map[string]string{v4: "10.0.0.2/24"},
			`{"metadata":{"annotations":{"tabby.io/ipv4-address":"10.0.0.2/24","tabby.io/vxlan-tunnel-address":null,"tabby.io/vxlan-tunnel-mac":null}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := annotationPatch(tc.have, tc.want)
			if tc.patch == "" {
				if got != nil {
					t.Fatalf("patch %s, want none", got)
				}
				return
			}
			var a, b any
			_ = json.Unmarshal(got, &a)
			_ = json.Unmarshal([]byte(tc.patch), &b)
			if !reflect.DeepEqual(a, b) {
				t.Errorf("patch %s, want %s", got, tc.patch)
			}
		})
	}
}

func pool(name, cidr string, f func(*tabbyv1.IPPoolSpec)) tabbyv1.IPPool {
	p := tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: tabbyv1.IPPoolSpec{CIDR: cidr}}
	if f != nil {
		f(&p.Spec)
	}
	return p
}

func TestInstallable(t *testing.T) {
	pools := []tabbyv1.IPPool{pool("a", "10.244.0.0/16", nil)}
	nodes := map[netip.Addr]bool{netip.MustParseAddr("10.0.0.2"): true}
	lr := func(p, nh, peer string, stale bool) bgp.LearnedRoute {
		return bgp.LearnedRoute{Route: bgp.Route{Prefix: netip.MustParsePrefix(p), NextHop: netip.MustParseAddr(nh)},
			Peer: netip.MustParseAddr(peer), Stale: stale}
	}
	blk := func(cidr, node string) tabbyv1.IPAMBlock {
		return tabbyv1.IPAMBlock{ObjectMeta: metav1.ObjectMeta{Name: cidr}, Spec: tabbyv1.IPAMBlockSpec{CIDR: cidr, Affinity: "host:" + node}}
	}
	f, problems := bgp.NewFilters(bgp.FilterInputs{Pools: pools,
		Nodes:  []bgp.Node{{Name: "n1", IPv4: netip.MustParsePrefix("10.0.0.1/24")}, {Name: "n2", IPv4: netip.MustParsePrefix("10.0.0.2/24")}},
		Blocks: []tabbyv1.IPAMBlock{blk("10.244.1.0/26", "n2"), blk("10.244.2.0/26", "n2"), blk("10.244.3.0/26", "n1")}})
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	peers := []bgp.Peer{{Address: netip.MustParseAddr("10.0.0.2"), Kind: bgp.KindMesh, Node: "n2"},
		{Address: netip.MustParseAddr("10.0.0.254"), Kind: bgp.KindBGPPeer, BGPPeer: "tor"}}
	got, stale, refused := installable([]bgp.LearnedRoute{
		lr("10.244.1.0/26", "10.0.0.2", "10.0.0.2", false),     // a pod block of a node
		lr("10.244.2.7/32", "10.0.0.2", "10.0.0.2", true),      // inside its block, stale
		lr("10.96.0.0/12", "10.0.0.2", "10.0.0.2", false),      // a node's service CIDR: not installed
		lr("192.0.2.0/24", "10.0.0.254", "10.0.0.254", false),  // an external router's
		lr("10.244.3.0/26", "10.0.0.2", "10.0.0.2", false),     // n1's block from n2: refused
		lr("10.244.0.0/16", "10.0.0.254", "10.0.0.254", false), // a router's copy of the pool: refused
		lr("10.244.9.0/26", "10.0.0.9", "10.0.0.9", false),     // from no current session: left to the speaker
	}, pools, nodes, f, peers)
	var dsts []string
	for _, r := range got {
		dsts = append(dsts, r.Prefix.String())
	}
	if strings.Join(dsts, " ") != "10.244.1.0/26 10.244.2.7/32 192.0.2.0/24 10.244.9.0/26" || stale != 1 {
		t.Errorf("installable: %v, %d stale", dsts, stale)
	}
	if len(refused) != 2 || !strings.Contains(refused[0], "10.244.3.0/26") || !strings.Contains(refused[1], "inside IP pool 10.244.0.0/16") {
		t.Errorf("refused: %q", refused)
	}
}

func TestWithKept(t *testing.T) {
	r := func(dst, gw string) routing.Route {
		if gw == "" {
			return routing.Route{Dst: netip.MustParsePrefix(dst), Type: routing.Blackhole}
		}
		return routing.Route{Dst: netip.MustParsePrefix(dst), Gateway: netip.MustParseAddr(gw)}
	}
	s := routing.State{Routes: []routing.Route{r("10.244.0.0/26", ""), r("10.244.1.0/26", "10.0.0.3")}}
	kept := []routing.Route{r("10.244.1.0/26", "10.0.0.2"), r("10.244.2.0/26", "10.0.0.4"), r("10.243.0.0/26", "10.0.0.5")}
	got, n := withKept(s, kept)
	var lines []string
	for _, rt := range got.Routes {
		lines = append(lines, rt.String())
	}
	want := "10.243.0.0/26 via 10.0.0.5|blackhole 10.244.0.0/26|10.244.1.0/26 via 10.0.0.3|10.244.2.0/26 via 10.0.0.4"
	if n != 2 || strings.Join(lines, "|") != want {
		t.Errorf("withKept: %d added, %q\nwant 2, %q", n, strings.Join(lines, "|"), want)
	}
	if len(s.Routes) != 2 {
		t.Errorf("withKept changed its input")
	}
}

func TestConverged(t *testing.T) {
	a, b := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	desired := []bgp.Peer{{Address: a, Kind: bgp.KindMesh}, {Address: b, Kind: bgp.KindMesh}}
	up := func(addr netip.Addr, synced bool) bgp.PeerState {
		return bgp.PeerState{Peer: bgp.Peer{Address: addr}, State: bgp.StateEstablished, Synced: synced, Since: time.Now()}
	}
	if ok, why := converged(desired, []bgp.PeerState{up(a, true)}); ok || !strings.Contains(why, "10.0.0.3") {
		t.Errorf("one session missing: %v %q", ok, why)
	}
	if ok, why := converged(desired, []bgp.PeerState{up(a, true), up(b, false)}); ok || !strings.Contains(why, "not sent all") {
		t.Errorf("one peer not synced: %v %q", ok, why)
	}
	if ok, _ := converged(desired, []bgp.PeerState{up(a, true), up(b, true)}); !ok {
		t.Errorf("all up and synced: not converged")
	}
	if ok, _ := converged(nil, nil); !ok {
		t.Errorf("no peers: not converged")
	}
}

func TestTunnelPools(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"zone": "a"}}}
	pools := []tabbyv1.IPPool{
		pool("native", "10.1.0.0/16", nil),
		pool("vx", "10.2.0.0/16", func(s *tabbyv1.IPPoolSpec) { s.VXLANMode = tabbyv1.EncapAlways }),
		pool("vx-cross", "10.3.0.0/16", func(s *tabbyv1.IPPoolSpec) { s.VXLANMode = tabbyv1.EncapCrossSubnet }),
		pool("vx-disabled", "10.4.0.0/16", func(s *tabbyv1.IPPoolSpec) { s.VXLANMode = tabbyv1.EncapAlways; s.Disabled = true }),
		pool("vx-other-zone", "10.5.0.0/16", func(s *tabbyv1.IPPoolSpec) {
			s.VXLANMode = tabbyv1.EncapAlways
			s.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "b"}}
		}),
		pool("vx-workloads-only", "10.6.0.0/16", func(s *tabbyv1.IPPoolSpec) {
			s.VXLANMode = tabbyv1.EncapAlways
			s.AllowedUses = []tabbyv1.IPPoolAllowedUse{tabbyv1.UseWorkload}
		}),
		pool("vx6", "fd00::/48", func(s *tabbyv1.IPPoolSpec) { s.VXLANMode = tabbyv1.EncapAlways }),
		pool("ipip", "10.7.0.0/16", func(s *tabbyv1.IPPoolSpec) { s.IPIPMode = tabbyv1.EncapAlways }),
		pool("both", "10.8.0.0/16", func(s *tabbyv1.IPPoolSpec) { s.IPIPMode, s.VXLANMode = tabbyv1.EncapAlways, tabbyv1.EncapAlways }),
	}
	names := func(ps []tabbyv1.IPPool) string {
		var out []string
		for _, p := range ps {
			out = append(out, p.Name)
		}
		return strings.Join(out, " ")
	}
	if got := names(tunnelPools(pools, node, true)); got != "vx vx-cross both" {
		t.Errorf("VXLAN tunnel pools: %s", got)
	}
	if got := names(tunnelPools(pools, node, false)); got != "ipip" {
		t.Errorf("IPIP tunnel pools: %s", got)
	}
}

func TestNodeChanged(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"a": "1"}, Annotations: map[string]string{"b": "2"}}}
	heartbeat := n.DeepCopy()
	heartbeat.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	heartbeat.ResourceVersion = "7"
	if nodeChanged(n, heartbeat) {
		t.Errorf("a heartbeat counts as a change")
	}
	labelled := n.DeepCopy()
	labelled.Labels[tabbyv1.LabelRouteReflector] = "true"
	annotated := n.DeepCopy()
	annotated.Annotations[tabbyv1.AnnotationNodeIPv4Address] = "10.0.0.1/24"
	for _, m := range []*corev1.Node{labelled, annotated} {
		if !nodeChanged(n, m) {
			t.Errorf("%v -> %v is no change", n.ObjectMeta, m.ObjectMeta)
		}
	}
}

// TestBlockChanged: an update blockChanged calls no change must change
// nothing routing computes from the blocks (every node's advertisements
// and the route filters), on random blocks and random updates; and the
// updates a busy cluster makes most (a pod's address in its own node's
// block) must be no change.
func TestBlockChanged(t *testing.T) {
	nodes := []string{"n1", "n2", "n3"}
	var bnodes []bgp.Node
	for i, n := range nodes {
		bnodes = append(bnodes, bgp.Node{Name: n, IPv4: netip.MustParsePrefix(fmt.Sprintf("10.0.0.%d/24", i+1))})
	}
	pools := []tabbyv1.IPPool{{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: tabbyv1.IPPoolSpec{CIDR: "10.244.0.0/16", BlockSize: 29}}}
	rng := rand.New(rand.NewPCG(7, 7))
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	randomize := func(b *tabbyv1.IPAMBlock) {
		b.Spec.Attributes = nil
		b.Spec.Allocations = make([]int, 8)
		for ord := range b.Spec.Allocations {
			b.Spec.Allocations[ord] = -1
			if rng.IntN(2) == 0 {
				b.Spec.Allocations[ord] = len(b.Spec.Attributes)
				b.Spec.Attributes = append(b.Spec.Attributes, tabbyv1.AllocationAttribute{HandleID: fmt.Sprintf("h%d", rng.IntN(1000)), Node: pick("", "n1", "n2", "n3")})
			}
		}
	}
	routingOf := func(b *tabbyv1.IPAMBlock) (string, *bgp.Filters) {
		blocks := []tabbyv1.IPAMBlock{*b}
		var out strings.Builder
		for _, n := range nodes {
			ads, _ := bgp.Advertisements(bgp.AdvertInputs{Node: n, IPv4: netip.MustParseAddr("10.0.0.9"), Pools: pools, Blocks: blocks})
			fmt.Fprintf(&out, "%s: %v\n", n, ads)
		}
		f, _ := bgp.NewFilters(bgp.FilterInputs{Nodes: bnodes, Pools: pools, Blocks: blocks})
		return out.String(), f
	}
	unchanged, changed := 0, 0
	for range 3000 {
		a := &tabbyv1.IPAMBlock{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: tabbyv1.IPAMBlockSpec{CIDR: "10.244.1.0/29", Affinity: pick("host:n1", "host:n2", "", "other")}}
		randomize(a)
		b := a.DeepCopy()
		switch rng.IntN(6) {
		case 0:
			b.Spec.CIDR = "10.244.1.8/29"
		case 1:
			b.Spec.Affinity = pick("host:n1", "host:n3", "")
		case 2:
			b.Spec.Deleted = !b.Spec.Deleted
		default:
			randomize(b)
		}
		if blockChanged(a, b) {
			changed++
			continue
		}
		unchanged++
		adsA, fA := routingOf(a)
		adsB, fB := routingOf(b)
		if adsA != adsB || !reflect.DeepEqual(fA, fB) {
			t.Fatalf("%+v -> %+v is no change to blockChanged, but routing differs:\n%s%+v\n--\n%s%+v", a.Spec, b.Spec, adsA, fA, adsB, fB)
		}
	}
	if unchanged < 100 || changed < 100 {
		t.Fatalf("%d updates no change, %d a change: the test does not reach both", unchanged, changed)
	}
	own := &tabbyv1.IPAMBlock{Spec: tabbyv1.IPAMBlockSpec{CIDR: "10.244.1.0/29", Affinity: "host:n1", Allocations: []int{0, -1}, Attributes: []tabbyv1.AllocationAttribute{{HandleID: "k8s.a", Node: "n1"}}}}
	next := own.DeepCopy()
	next.Spec.Allocations[1] = 1
	next.Spec.Attributes = append(next.Spec.Attributes, tabbyv1.AllocationAttribute{HandleID: "k8s.b", Node: "n1", Namespace: "ns", Pod: "b"})
	if blockChanged(own, next) {
		t.Errorf("a pod's address in its own node's block counts as a routing change")
	}
	next.Spec.Attributes[1].Node = "n2"
	if !blockChanged(own, next) {
		t.Errorf("an address n2 borrowed from n1's block counts as no change")
	}
}

// TestSnapshotReuse: the caches are copied again after every change that
// matters to routing and once the last copy is snapshotReuse old, and not
// otherwise.
func TestSnapshotReuse(t *testing.T) {
	inf := func() cache.SharedIndexInformer {
		return cache.NewSharedIndexInformer(&cache.ListWatch{}, &corev1.Node{}, 0, cache.Indexers{})
	}
	c := &caches{nodes: inf(), pools: inf(), blocks: inf(), configs: inf(), peers: inf(), filters: inf()}
	add := func(name string) {
		if err := c.nodes.GetStore().Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
			t.Fatal(err)
		}
	}
	names := func(s snapshot) string {
		var out []string
		for _, n := range s.nodes {
			out = append(out, n.Name)
		}
		return strings.Join(out, " ")
	}
	add("b")
	if got := names(c.snapshot()); got != "b" {
		t.Fatalf("first snapshot: %q", got)
	}
	add("a") // a change the filters ignore: no count
	if got := names(c.snapshot()); got != "b" {
		t.Errorf("a snapshot without a counted change copied the caches again: %q", got)
	}
	c.gen.Add(1)
	if got := names(c.snapshot()); got != "a b" {
		t.Errorf("after a counted change: %q, want a b", got)
	}
	add("c")
	c.lastAt = time.Now().Add(-snapshotReuse)
	if got := names(c.snapshot()); got != "a b c" {
		t.Errorf("a copy snapshotReuse old was reused: %q", got)
	}
}

// TestReusablePlan: a pass reuses the last plan only for the same
// snapshot and identity, and never with a password to read.
func TestReusablePlan(t *testing.T) {
	self := bgp.Node{Name: "n1", IPv4: netip.MustParsePrefix("10.0.0.1/24"), Labels: map[string]string{"a": "b"}}
	last := &plan{snap: 3, self: self}
	snap := &snapshot{id: 3}
	relabelled := self
	relabelled.Labels = map[string]string{"a": "c"}
	moved := self
	moved.IPv4 = netip.MustParsePrefix("10.0.0.2/24")
	withPeerPassword := &snapshot{id: 3, peers: []tabbyv1.BGPPeer{{Spec: tabbyv1.BGPPeerSpec{Password: &tabbyv1.SecretKeyRef{Name: "s", Key: "k"}}}}}
	withMeshPassword := &snapshot{id: 3, config: tabbyv1.BGPConfigurationSpec{NodeMeshPassword: &tabbyv1.SecretKeyRef{Name: "s", Key: "k"}}}
	for _, c := range []struct {
		name string
		last *plan
		snap *snapshot
		self bgp.Node
		want bool
	}{
		{"same snapshot, same identity", last, snap, self, true},
		{"no plan yet", nil, snap, self, false},
		{"another snapshot", last, &snapshot{id: 4}, self, false},
		{"relabelled", last, snap, relabelled, false},
		{"another address", last, snap, moved, false},
		{"a BGPPeer's password", last, withPeerPassword, self, false},
		{"the mesh password", last, withMeshPassword, self, false},
	} {
		if got := reusablePlan(c.last, c.snap, c.self); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
