package bgp

import (
	"net/netip"
	"testing"
	"time"

	v1 "github.com/tabbynet/tabby/api/v1"
)

// TestLabTopologyChange labels a node of a 4-node mesh a route reflector
// and later removes the label, reconciling once each time as tabbyd would
// on the Node update; the speakers' make-before-break does the rest. No
// node is ever without a route to another node's block.
func TestLabTopologyChange(t *testing.T) {
	needRoot(t)
	c := newCluster(t, 4, Config{Transition: TransitionOptions{ChangeDelay: 5 * time.Second}})
	c.reconcile()
	for i := 1; i <= 4; i++ {
		c.waitFor(i, 30*time.Second, expectRoutes(0, others(i)...))
	}
	want := map[int][]netip.Prefix{}
	for i := 1; i <= 4; i++ {
		for _, j := range others(i) {
			want[i] = append(want[i], blockOf(j))
		}
	}
	w := watchGaps(c, want)
	defer w.finish(t)

	start := time.Now()
	c.nodes[2].labels = []string{v1.LabelRouteReflector, "true"}
	c.reconcile()
	c.waitSessions(1, 60*time.Second, "10.77.0.2:Established:route-reflector")
	c.waitSessions(3, 30*time.Second, "10.77.0.2:Established:route-reflector")
	c.waitSessions(4, 30*time.Second, "10.77.0.2:Established:route-reflector")
	c.waitSessions(2, 30*time.Second, "10.77.0.1:Established:route-reflector-client 10.77.0.3:Established:route-reflector-client 10.77.0.4:Established:route-reflector-client")
	for _, i := range []int{1, 3, 4} {
		c.waitFor(i, 10*time.Second, expectRoutes(2, others(i)...))
	}
	t.Logf("mesh → route reflector: done in %s", time.Since(start).Round(time.Millisecond))

	start = time.Now()
	c.nodes[2].labels = nil
	c.reconcile()
	for i := 1; i <= 4; i++ {
		c.waitFor(i, 60*time.Second, expectRoutes(0, others(i)...))
	}
	c.waitSessions(2, 30*time.Second, "10.77.0.1:Established:node-mesh 10.77.0.3:Established:node-mesh 10.77.0.4:Established:node-mesh")
	t.Logf("route reflector → mesh: done in %s", time.Since(start).Round(time.Millisecond))
}

// others are the nodes 1..4 other than i.
func others(i int) []int {
	var out []int
	for j := 1; j <= 4; j++ {
		if j != i {
			out = append(out, j)
		}
	}
	return out
}
