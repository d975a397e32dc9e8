package bgp

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	v1 "github.com/tabbynet/tabby/api/v1"
)

func TestLabFullMesh(t *testing.T) {
	needRoot(t)
	start := time.Now()
	c := newCluster(t, 3, Config{})
	c.reconcile()
	c.waitFor(1, 20*time.Second, expectRoutes(0, 2, 3))
	c.waitFor(2, 20*time.Second, expectRoutes(0, 1, 3))
	c.waitFor(3, 20*time.Second, expectRoutes(0, 1, 2))
	t.Logf("3-node mesh converged in %s", time.Since(start).Round(time.Millisecond))
	c.waitSessions(1, 5*time.Second, "10.77.0.2:Established:node-mesh 10.77.0.3:Established:node-mesh")
	c.waitSessions(2, 5*time.Second, "10.77.0.1:Established:node-mesh 10.77.0.3:Established:node-mesh")
	for _, st := range c.nodes[3].p.states() {
		if !st.Synced || st.Received != 1 || len(st.Prefixes) != 1 || !st.Passive {
			t.Errorf("node3's session with %s: %+v", st.Address, st)
		}
	}
}

func TestLabRouteReflector(t *testing.T) {
	needRoot(t)
	c := newCluster(t, 3, Config{})
	c.nodes[2].labels = []string{v1.LabelRouteReflector, "true"}
	c.reconcile()
	// Clients learn each other's blocks over the reflector, next hops untouched.
	c.waitFor(1, 20*time.Second, expectRoutes(2, 2, 3))
	c.waitFor(3, 20*time.Second, expectRoutes(2, 1, 2))
	c.waitFor(2, 5*time.Second, expectRoutes(0, 1, 3))
	c.waitSessions(1, 5*time.Second, "10.77.0.2:Established:route-reflector")
	c.waitSessions(2, 5*time.Second, "10.77.0.1:Established:route-reflector-client 10.77.0.3:Established:route-reflector-client")
}

// TestLabDualStack: two dual-stack nodes have an IPv4 and an IPv6 session
// and learn each other's blocks of both families over them.
func TestLabDualStack(t *testing.T) {
	needRoot(t)
	l := newLab(t)
	l.dualStack = true
	c := newClusterOn(t, l, 2, Config{})
	c.reconcile()
	c.waitFor(1, 20*time.Second, expectRoutes(0, 2)+" "+blockOf6(2).String()+">fd00:77::2@fd00:77::2")
	c.waitFor(2, 20*time.Second, expectRoutes(0, 1)+" "+blockOf6(1).String()+">fd00:77::1@fd00:77::1")
	c.waitSessions(1, 5*time.Second, "10.77.0.2:Established:node-mesh fd00:77::2:Established:node-mesh")
}

func TestLabMD5(t *testing.T) {
	needRoot(t)
	c := newCluster(t, 3, Config{Transition: TransitionOptions{ChangeDelay: time.Second}})
	c.spec.NodeMeshPassword = &v1.SecretKeyRef{Name: "bgp", Key: "password"}
	c.passwd = "s3cret"
	c.reconcile()
	c.waitFor(1, 20*time.Second, expectRoutes(0, 2, 3))
	c.waitFor(3, 20*time.Second, expectRoutes(0, 1, 2))
	states := c.nodes[1].p.states()
	if len(states) != 2 || states[0].Password != "s3cret" {
		t.Fatalf("node1's sessions do not use the password: %+v", states)
	}

	// node3 gets the wrong password: its sessions go down and stay down;
	// node1 keeps node3's routes, stale, for node3's restart time.
	wrong := c.desired(3)
	for i := range wrong {
		wrong[i].Password = "wrong"
	}
	c.nodes[3].p.must(helperRequest{Op: "peers", Peers: wrong})
	c.waitFor(1, 10*time.Second, expectRoutes(0, 2)+" "+expectRoutes(0, 3)+"(stale)")
	time.Sleep(8 * time.Second)
	for _, st := range c.nodes[3].p.states() {
		if st.Established() {
			t.Errorf("node3 established a session with %s despite the wrong password", st.Address)
		}
	}
	if got := sessionsOf(c.nodes[1].p.states()); got != "10.77.0.2:Established:node-mesh 10.77.0.3:Active:node-mesh" {
		t.Errorf("node1's sessions: %s", got)
	}
}

// TestLabTwoReflectors: two reflectors of one cluster. GoBGP sends a
// reflected route to a non-client without ORIGINATOR_ID and CLUSTER_LIST,
// so each reflector also learns every client's route from the other one,
// as if the other had originated it; with the lower router ID that copy
// used to win, and each reflector re-sent every route to all its clients
// a moment after the first (twice the updates per claim). A reflector
// prefers what its clients send it; the other reflector's copy is only
// the fallback.
func TestLabTwoReflectors(t *testing.T) {
	needRoot(t)
	c := newCluster(t, 4, Config{})
	c.nodes[1].labels = []string{v1.LabelRouteReflector, "true"}
	c.nodes[2].labels = []string{v1.LabelRouteReflector, "true"}
	c.reconcile()
	c.waitFor(1, 20*time.Second, expectRoutes(0, 2, 3, 4))
	c.waitFor(2, 20*time.Second, expectRoutes(0, 1, 3, 4))
	// A client learns each reflector's own block from it (the other
	// reflector's copy has the lower preference) and the other clients'
	// blocks from either (node1: the lower router ID).
	c.waitFor(3, 20*time.Second, expectRoutes(0, 1, 2)+" "+expectRoutes(1, 4))
	c.waitFor(4, 20*time.Second, expectRoutes(0, 1, 2)+" "+expectRoutes(1, 3))
}

// TestLabClaimAfterRoute: a node's route for a block it just claimed
// reaches the others before their filters know the block (their informer
// is behind), and is rejected; once the filters have it, the sessions its
// route came over take it again (a soft reset in of those sessions only:
// the owner's and the reflectors'), with a full mesh and with reflectors.
func TestLabClaimAfterRoute(t *testing.T) {
	needRoot(t)
	for _, reflectors := range []bool{false, true} {
		t.Run(fmt.Sprintf("reflectors=%v", reflectors), func(t *testing.T) {
			c := newCluster(t, 4, Config{})
			if reflectors {
				c.nodes[1].labels = []string{v1.LabelRouteReflector, "true"}
			}
			c.reconcile()
			c.waitFor(4, 20*time.Second, expectRoutes(map[bool]int{false: 0, true: 1}[reflectors], 1, 2, 3))
			claimed := netip.MustParsePrefix("10.244.103.0/26")
			c.nodes[3].p.must(helperRequest{Op: "adverts", Adverts: []Route{
				{Prefix: blockOf(3), NextHop: addrOf(3)}, {Prefix: claimed, NextHop: addrOf(3)}}})
			time.Sleep(time.Second) // rejected meanwhile
			c.blocks = []v1.IPAMBlock{block(claimed.String(), "host:node3", nil)}
			c.reconcile()
			for _, i := range []int{1, 2, 4} {
				via := 3 // from node3 itself, or over the reflector node1
				if reflectors && i != 1 {
					via = 1
				}
				want := fmt.Sprintf("%s>%s@%s", claimed, addrOf(3), addrOf(via))
				eventually(t, 10*time.Second, fmt.Sprintf("node%d learns %s", i, want), func() (bool, string) {
					got := routesOf(c.nodes[i].p.learned())
					return strings.Contains(got, want), got
				})
			}
		})
	}
}
