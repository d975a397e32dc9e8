package bgp

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/tabbynet/tabby/api/v1"
)

// cluster drives lab speakers the way tabbyd will: DesiredPeers and
// Advertisements from the cluster's objects, then SetPeers and
// SetAdvertisements, on every "reconcile".
type cluster struct {
	t       *testing.T
	lab     *lab
	nodes   map[int]*cnode
	cfg     Config
	spec    v1.BGPConfigurationSpec
	peers   []v1.BGPPeer
	filters []v1.BGPFilter
	extra   map[int][]Peer // sessions added by hand (e.g. to BIRD)
	blocks  []v1.IPAMBlock // more blocks the filters know of
	passwd  string
}

type cnode struct {
	i      int
	name   string
	ln     *labNode
	p      *proc
	labels []string
}

// newCluster starts speakers on nodes 1..n of a new lab, each advertising
// its block 10.244.i.0/26, without sessions yet.
func newCluster(t *testing.T, n int, cfg Config) *cluster {
	return newClusterOn(t, newLab(t), n, cfg)
}

// newClusterOn is newCluster on a given lab; a dual-stack lab's nodes also
// advertise the IPv6 block blockOf6(i).
func newClusterOn(t *testing.T, l *lab, n int, cfg Config) *cluster {
	c := &cluster{t: t, lab: l, nodes: map[int]*cnode{}, cfg: cfg, extra: map[int][]Peer{}}
	for i := 1; i <= n; i++ {
		ln := c.lab.node(i)
		cn := &cnode{i: i, name: fmt.Sprintf("node%d", i), ln: ln}
		cn.p = startProc(t, cn.name, ln)
		c.nodes[i] = cn
		c.start(i, cfg)
	}
	return c
}

// start makes node i's process a speaker and gives it its advertisements.
func (c *cluster) start(i int, cfg Config) {
	n := c.nodes[i]
	cfg.RouterID, cfg.AS = n.ln.addr.Addr(), 64512
	n.p.must(helperRequest{Op: "start", Config: cfg})
	n.p.must(helperRequest{Op: "filters", Filters: c.filterInputs()})
	c.advertise(i)
}

// advertise computes node i's advertisements from IPAM objects and sets them.
func (c *cluster) advertise(i int) {
	n := c.nodes[i]
	in := AdvertInputs{Node: n.name, IPv4: n.ln.addr.Addr(), Blocks: []v1.IPAMBlock{block(blockOf(i).String(), "host:"+n.name, nil)}}
	if n.ln.addr6.IsValid() {
		in.IPv6 = n.ln.addr6.Addr()
		in.Blocks = append(in.Blocks, block(blockOf6(i).String(), "host:"+n.name, nil))
	}
	ads, problems := Advertisements(in)
	if len(problems) != 0 {
		c.t.Fatal(problems)
	}
	var routes []Route
	for _, a := range ads {
		routes = append(routes, a.Route)
	}
	n.p.must(helperRequest{Op: "adverts", Adverts: routes})
}

func (c *cluster) bgpNodes() []Node {
	var out []Node
	for _, i := range c.indexes() {
		n := c.nodes[i]
		out = append(out, n.ln.bgpNode(n.name, n.labels...))
	}
	return out
}

func (c *cluster) indexes() []int {
	var is []int
	for i := range c.nodes {
		is = append(is, i)
	}
	sort.Ints(is)
	return is
}

// desired is what DesiredPeers gives node i now.
func (c *cluster) desired(i int) []Peer {
	n := c.nodes[i]
	peers, problems := DesiredPeers(Inputs{Self: n.ln.bgpNode(n.name, n.labels...), Nodes: c.bgpNodes(),
		Config: c.spec, BGPPeers: c.peers, MeshPassword: c.passwd})
	if len(problems) != 0 {
		c.t.Fatal(problems)
	}
	return append(peers, c.extra[i]...)
}

// filterInputs are the lab's IPAM as the route filters see it: nodes 1..9
// (10.77.0.i, fd00:77::i), the pools 10.244.0.0/16 and fd00:244::/48, and
// each node's blocks blockOf(i) and blockOf6(i).
func (c *cluster) filterInputs() *FilterInputs {
	in := &FilterInputs{Config: c.spec, BGPPeers: c.peers, BGPFilters: c.filters,
		Pools: []v1.IPPool{sizedPool("10.244.0.0/16", 26), sizedPool("fd00:244::/48", 122)}}
	for i := 1; i <= 9; i++ {
		name := fmt.Sprintf("node%d", i)
		in.Nodes = append(in.Nodes, Node{Name: name, IPv4: netip.PrefixFrom(addrOf(i), 24),
			IPv6: netip.MustParsePrefix(fmt.Sprintf("fd00:77::%d/64", i))})
		in.Blocks = append(in.Blocks, block(blockOf(i).String(), "host:"+name, nil), block(blockOf6(i).String(), "host:"+name, nil))
	}
	in.Blocks = append(in.Blocks, c.blocks...)
	return in
}

func sizedPool(cidr string, blockSize int) v1.IPPool {
	return v1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: cidr}, Spec: v1.IPPoolSpec{CIDR: cidr, BlockSize: blockSize}}
}

// reconcile sets every node's filters and sessions to what NewFilters and
// DesiredPeers give it.
func (c *cluster) reconcile() {
	for _, i := range c.indexes() {
		c.nodes[i].p.must(helperRequest{Op: "filters", Filters: c.filterInputs()})
		c.nodes[i].p.must(helperRequest{Op: "peers", Peers: c.desired(i)})
	}
}

// routesOf renders what node i learned: "prefix>nexthop@peer" sorted.
func routesOf(learned []LearnedRoute) string {
	var parts []string
	for _, r := range learned {
		s := fmt.Sprintf("%s>%s@%s", r.Prefix, r.NextHop, r.Peer)
		if r.Stale {
			s += "(stale)"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// sessionsOf renders node i's sessions: "address:state:reason" sorted.
func sessionsOf(states []PeerState) string {
	var parts []string
	for _, s := range states {
		parts = append(parts, fmt.Sprintf("%s:%s:%s", s.Address, s.State, s.Reason()))
	}
	return strings.Join(parts, " ")
}

// blockOf6 is node i's IPv6 block in the lab.
func blockOf6(i int) netip.Prefix {
	return netip.MustParsePrefix(fmt.Sprintf("fd00:244:0:%d::/122", i))
}

// addrOf is node i's address.
func addrOf(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 77, 0, byte(i)}) }

// addr6Of is node i's IPv6 address in a dual-stack lab.
func addr6Of(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("fd00:77::%d", i)) }

// expectRoutes is the learned-route rendering of blocks of the nodes in
// from, each with its node's address as next hop, learned from peer (0:
// from the node itself).
func expectRoutes(peer int, from ...int) string {
	var parts []string
	for _, i := range from {
		via := i
		if peer != 0 {
			via = peer
		}
		parts = append(parts, fmt.Sprintf("%s>%s@%s", blockOf(i), addrOf(i), addrOf(via)))
	}
	return strings.Join(parts, " ")
}

// waitFor polls node i until what it learned renders as want.
func (c *cluster) waitFor(i int, timeout time.Duration, want string) {
	c.t.Helper()
	eventually(c.t, timeout, fmt.Sprintf("node%d learns %q", i, want), func() (bool, string) {
		got := routesOf(c.nodes[i].p.learned())
		return got == want, got
	})
}

// waitSessions polls node i until its sessions render as want.
func (c *cluster) waitSessions(i int, timeout time.Duration, want string) {
	c.t.Helper()
	eventually(c.t, timeout, fmt.Sprintf("node%d has sessions %q", i, want), func() (bool, string) {
		got := sessionsOf(c.nodes[i].p.states())
		return got == want, got
	})
}
