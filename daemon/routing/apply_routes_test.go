package routing

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	v1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/contract"
)

var dualStackNever = []v1.IPPool{
	ippool("v4", "10.244.0.0/16", "", "", false),
	ippool("v6", "fd00:10:244::/56", "", "", false),
}

// notOurs is the node's main table without tabby's routes.
func notOurs(t *testing.T, n *node) string {
	t.Helper()
	var keep []string
	for _, fam := range []string{"-4", "-6"} {
		for _, l := range strings.Split(n.ns.Exec("ip", fam, "route", "show", "table", "main"), "\n") {
			if !strings.Contains(l, "proto 81") {
				keep = append(keep, l)
			}
		}
	}
	return strings.Join(keep, "\n")
}

func mustContain(t *testing.T, what, text string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(text, w) {
			t.Errorf("%s lacks %q:\n%s", what, w, text)
		}
	}
}

func mustNotContain(t *testing.T, what, text string, unwanted ...string) {
	t.Helper()
	for _, w := range unwanted {
		if strings.Contains(text, w) {
			t.Errorf("%s still has %q:\n%s", what, w, text)
		}
	}
}

// Two nodes on one subnet route their pods natively, both families; the
// applier replaces a changed route, removes stale ones, leaves other
// protocols' routes (the CNI plugin's proto-80 pod routes included) alone,
// changes nothing on a second Apply, and Cleanup removes only its own.
func TestApplyNativeRoutes(t *testing.T) {
	l := newLab(t, 1)
	n1, n2 := l.addNode(1, 1), l.addNode(2, 1)
	p1, p2 := n1.addPod(t, 10), n2.addPod(t, 10)

	// node1 before tabbyd: the admin's routes, and what an earlier tabbyd
	// left (a route that has since moved, stale ones).
	for _, r := range []string{
		"route add 203.0.113.0/24 via 192.168.1.1 proto static",
		"route add 198.51.100.0/24 via 192.168.1.1 proto boot",
		"-6 route add fd00:203::/64 via fd00:1::1 proto static",
		"route add 10.244.2.0/26 via 192.168.1.13 proto 81",
		"route add 10.244.99.0/26 via 192.168.1.99 proto 81",
		"-6 route add fd00:10:244:0:99::/122 via fd00:1::99 proto 81",
	} {
		n1.ns.IP("%s", r)
	}
	foreign := notOurs(t, n1)
	mustContain(t, "node1's routes before tabby", foreign, "10.244.1.10 dev tabnode1-10 proto 80", "fd00:10:244:0:1::a dev tabnode1-10 proto 80")

	// An external BGP peer advertises 198.51.100.0/24, which the admin
	// routes already: tabby leaves that route alone.
	in1 := l.inputs(n1, dualStackNever...)
	in1.Learned = append(in1.Learned, LearnedRoute{Prefix: pfx("198.51.100.0/24"), NextHop: addr("192.168.1.1")})
	s1 := Desired(in1)
	st := n1.apply(t, s1)
	want := Counts{Added: 3, Updated: 1, Removed: 2, Unchanged: 0} // blackholes ×2 and the IPv6 route; 10.244.2.0/26; two stale
	if st.Routes != want {
		t.Errorf("first Apply: routes %+v, want %+v", st.Routes, want)
	}
	if len(st.Conflicts) != 1 || !strings.Contains(st.Conflicts[0], "198.51.100.0/24") {
		t.Errorf("conflicts %q, want the one for 198.51.100.0/24", st.Conflicts)
	}
	n2.apply(t, Desired(l.inputs(n2, dualStackNever...)))

	ours := ourRoutes(t, n1.ns)
	mustContain(t, "node1's tabby routes", ours,
		"blackhole 10.244.1.0/26 proto 81",
		"10.244.2.0/26 via 192.168.1.12 dev eth0 proto 81",
		"blackhole fd00:10:244:0:1::/122 dev lo proto 81",
		"fd00:10:244:0:2::/122 via fd00:1::12 dev eth0 proto 81")
	mustNotContain(t, "node1's tabby routes", ours, "10.244.99.0", "fd00:10:244:0:99::", "192.168.1.13", "198.51.100")
	if got := notOurs(t, n1); got != foreign {
		t.Errorf("routes that are not tabby's changed:\nbefore\n%s\nafter\n%s", foreign, got)
	}

	for _, c := range [][2]*pod{{p1, p2}, {p2, p1}} {
		ping(t, c[0], c[1].v4)
		ping(t, c[0], c[1].v6)
	}

	// Again: nothing changes.
	before := snapshot(t, n1.ns)
	st = n1.apply(t, s1)
	if st.Changed() != 0 || st.Routes.Unchanged != 4 {
		t.Errorf("second Apply changed %d things (routes %+v)", st.Changed(), st.Routes)
	}
	sameSnapshot(t, "the second Apply", before, snapshot(t, n1.ns))

	// node2 leaves the cluster: its routes go, the blackholes stay.
	s1 = Desired(Inputs{Node: n1.info, Pools: dualStackNever, Blocks: n1.blocks})
	st = n1.apply(t, s1)
	if st.Routes != (Counts{Removed: 2, Unchanged: 2}) {
		t.Errorf("after node2 left: routes %+v, want 2 removed, 2 unchanged", st.Routes)
	}
	ours = ourRoutes(t, n1.ns)
	mustNotContain(t, "node1's tabby routes", ours, "10.244.2.0", "fd00:10:244:0:2::")
	mustContain(t, "node1's tabby routes", ours, "blackhole 10.244.1.0/26", "blackhole fd00:10:244:0:1::/122")

	// Cleanup removes tabby's routes and nothing else.
	n1.ns.Must(n1.applier.Cleanup)
	if ours := ourRoutes(t, n1.ns); strings.TrimSpace(ours) != "" {
		t.Errorf("after Cleanup tabby routes remain:\n%s", ours)
	}
	if got := notOurs(t, n1); got != foreign {
		t.Errorf("Cleanup changed routes that are not tabby's:\nbefore\n%s\nafter\n%s", foreign, got)
	}
}

// The kernel refuses a native route via a node it cannot reach directly:
// Apply says why and still programs everything else.
func TestApplyUnreachableNextHop(t *testing.T) {
	l := newLab(t, 2)
	n1, n3 := l.addNode(1, 1), l.addNode(3, 2)
	_ = n3
	s := Desired(l.inputs(n1, dualStackNever...))
	if !slices.ContainsFunc(s.Warnings, func(w string) bool { return strings.Contains(w, "not on this node's subnet") }) {
		t.Errorf("Desired did not warn about the off-subnet next hop: %q", s.Warnings)
	}
	st, err := n1.tryApply(s)
	for _, re := range []string{`10\.244\.3\.0/26 via 192\.168\.2\.13: .*not on a subnet of this node`, `fd00:10:244:0:3::/122 via fd00:2::13: .*not on a subnet of this node`} {
		if err == nil || !regexp.MustCompile(re).MatchString(err.Error()) {
			t.Errorf("Apply error = %v, want one matching %s", err, re)
		}
	}
	if st.Routes.Added != 2 {
		t.Errorf("routes %+v: the two blackholes should still be added", st.Routes)
	}
}

// A /32 block holds one pod: the CNI plugin's route to the pod and the
// block's blackhole have the same destination. When the plugin adds its
// route after Apply listed the routes, the blackhole must not overwrite
// it (the pod would be unreachable until the next full resync); it is
// reported as a conflict instead. ApplyRoutes then programs routes only,
// and SameButRoutes says when that suffices.
func TestApplyLeavesAPodRouteAddedMeanwhile(t *testing.T) {
	l := newLab(t, 1)
	n1, n2 := l.addNode(1, 1), l.addNode(2, 1)
	own := pfx("10.244.1.77/32")
	n1.blocks = append(n1.blocks, own)
	in := l.inputs(n1, dualStackNever...)
	in.Blocks = n1.blocks
	s := Desired(in)
	podRoute := "10.244.1.77 dev lo proto 80 scope link"
	n1.applier.afterList = func() {
		n1.ns.IP("route add %s", podRoute)
		n1.applier.afterList = nil // once: the listing is per family
	}
	st := n1.apply(t, s)
	mustContain(t, "node1's routes", notOurs(t, n1), podRoute)
	mustNotContain(t, "node1's tabby routes", ourRoutes(t, n1.ns), "10.244.1.77")
	// The pod's route holding its /32 block is no conflict (it is there
	// for every local pod of such a pool), neither when it came meanwhile
	// nor on the next apply.
	if len(st.Conflicts) != 0 {
		t.Errorf("conflicts %q, want none", st.Conflicts)
	}
	if st = n1.apply(t, s); len(st.Conflicts) != 0 {
		t.Errorf("conflicts on the next apply %q, want none", st.Conflicts)
	}
	// Another program's route meanwhile is a conflict, left alone.
	other := pfx("10.244.1.78/32")
	n1.blocks = append(n1.blocks, other)
	in.Blocks = n1.blocks
	s = Desired(in)
	n1.applier.afterList = func() {
		n1.ns.IP("route add 10.244.1.78 dev lo proto 4 scope link")
		n1.applier.afterList = nil
	}
	st = n1.apply(t, s)
	if !slices.ContainsFunc(st.Conflicts, func(c string) bool { return strings.Contains(c, "10.244.1.78/32") }) {
		t.Errorf("conflicts %q, want one for 10.244.1.78/32", st.Conflicts)
	}
	mustContain(t, "node1's routes", notOurs(t, n1), "10.244.1.78 dev lo proto static scope link")

	// node2 claims another block: only the routes differ, and
	// ApplyRoutes adds its route.
	n2.blocks = append(n2.blocks, pfx("10.244.2.77/32"))
	s2 := Desired(l.inputs(n1, dualStackNever...))
	if !SameButRoutes(s, s2) || slices.Equal(s.Routes, s2.Routes) {
		t.Fatalf("a new block elsewhere should change the routes alone:\n%+v\n%+v", s, s2)
	}
	var err error
	n1.ns.Must(func() error { st, err = n1.applier.ApplyRoutes(s2); return err })
	if st.Routes.Added != 1 {
		t.Errorf("ApplyRoutes: routes %+v, want 1 added", st.Routes)
	}
	mustContain(t, "node1's tabby routes", ourRoutes(t, n1.ns), "10.244.2.77 via 192.168.1.12 dev eth0 proto 81")
	s2.IPv4Forwarding = !s2.IPv4Forwarding
	if SameButRoutes(s, s2) {
		t.Errorf("SameButRoutes ignores forwarding")
	}
}

// contract.RouteProtocolPod is not ours: the applier must never match it.
func TestRouteProtocolIsNotTheCNIPlugins(t *testing.T) {
	if RouteProtocol == contract.RouteProtocolPod {
		t.Fatalf("routing.RouteProtocol %d equals the CNI plugin's", RouteProtocol)
	}
}
