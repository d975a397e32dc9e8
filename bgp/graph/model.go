// Package graph draws a cluster's BGP topology: who peers with whom (a
// full mesh, or route reflectors and their clients), external BGPPeers,
// each session's state and the routes each node carries. It is what
// `tabbyctl bgp graph` prints, as Graphviz DOT or Mermaid.
//
// It follows "compute, then apply". Build is pure: from the API's objects
// (Nodes, the BGPConfiguration, BGPPeers) it asks bgp.DesiredPeers, the
// same function tabbyd configures its speaker with, for every node's
// sessions, so the picture cannot drift from what tabbyd does; each node's
// live status (tabbyd's /status), where it could be read, adds the state of
// every session and its routes. DOT and Mermaid are pure too. Load and
// Statuses are the I/O: the objects from the API server, and each node's
// status by exec in its tabby-node pod, the way Cilium's CLI reaches its
// agents.
package graph

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	v1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/daemon/nodestatus"
	"github.com/tabbynet/tabby/daemon/routing"
)

// StateConfigured is a session's state when no live status says more:
// the configuration asks for it, nothing is known of it.
const StateConfigured = "configured"

// Inputs are what Build reads.
type Inputs struct {
	// Nodes are the cluster's Nodes as the API server has them.
	Nodes []corev1.Node
	// Config is the "default" BGPConfiguration's spec (zero: defaults).
	Config v1.BGPConfigurationSpec
	// BGPPeers are all BGPPeer resources.
	BGPPeers []v1.BGPPeer
	// NoIPv6Pools: no IPPool is IPv6, so tabbyd opens no IPv6 session
	// between nodes (bgp.Inputs.NoIPv6Pools).
	NoIPv6Pools bool
	// Status holds each node's tabbyd status, by node name; a node
	// without an entry is drawn from the configuration alone.
	Status map[string]*nodestatus.Status
	// StatusErrors say why a node's status could not be read, by node name.
	StatusErrors map[string]string
}

// Model is a cluster's BGP topology.
type Model struct {
	// AS is the cluster's AS number; Mesh whether node-to-node sessions
	// are on (BGPConfiguration nodeToNodeMeshEnabled); Reflectors whether
	// any node is a route reflector (then the mesh is reflectors and
	// their clients).
	AS         uint32
	Mesh       bool
	Reflectors bool
	// Nodes are the cluster's nodes, by name; Externals the speakers
	// outside the cluster BGPPeers name, by address.
	Nodes     []Node
	Externals []External
	// Sessions are the BGP sessions, ordered by their ends.
	Sessions []Session
	// Problems are what the configuration asks for that cannot be done,
	// and the nodes whose status could not be read.
	Problems []string
}

// Node is one cluster node.
type Node struct {
	Name      string
	Addresses []string
	AS        uint32
	// Reflector: the node is a route reflector, of ClusterID.
	Reflector bool
	ClusterID string
	// Status is what its tabbyd said; nil when it was not read.
	Status *NodeStatus
}

// NodeStatus is the part of a node's tabbyd status the graph shows.
type NodeStatus struct {
	Ready bool
	// Learned, Advertised and Programmed count its routes (see
	// nodestatus.Routes).
	Learned, Advertised, Programmed int
}

// External is a BGP speaker outside the cluster.
type External struct {
	// ID is how sessions name it: "peer/" and its address.
	ID      string
	Address string
	Port    uint16
	AS      uint32
	// BGPPeers are the names of the BGPPeers that name it.
	BGPPeers []string
}

// Session is one BGP session between two ends: node names, or an
// External's ID.
type Session struct {
	// A and B are its ends. When one end reflects routes for the other
	// (a route reflector and its client) A is the reflector; otherwise
	// they are ordered by name, a node before an external speaker.
	A, B string
	// Family is 4 or 6.
	Family int
	// Type is why it exists: node-mesh, route-reflector (A reflects
	// for B), reflectors (two reflectors of one cluster ID; neither
	// reflects for the other), eBGP (nodes of different AS numbers),
	// bgppeer/NAME.
	Type string
	// Reflects: A reflects routes for B (and BothReflect: B also for A,
	// reflectors of different cluster IDs).
	Reflects, BothReflect bool
	// AEnd and BEnd are each end's view; an external speaker's is empty.
	AEnd, BEnd End
}

// End is one end's view of a session.
type End struct {
	// Configured: the end's configuration asks for the session.
	Configured bool
	// Live: the end's status lists the session; then State is its BGP
	// state and Accepted and Rejected count the routes the other end sent.
	Live               bool
	State              string
	Accepted, Rejected int
}

// State is the session's state: Established when every end that reports
// says so; else the state of the first end that is not Established;
// "configured" when no end reports.
func (s Session) State() string {
	state := StateConfigured
	for _, e := range []End{s.AEnd, s.BEnd} {
		if !e.Live {
			continue
		}
		if e.State != "Established" {
			return e.State
		}
		state = e.State
	}
	return state
}

// Build draws the topology the configuration asks for, with the live
// status where there is one. Passwords play no part in who peers with whom,
// so the graph needs no Secret: they are taken as read.
func Build(in Inputs) Model {
	s := bgp.SettingsOf(in.Config)
	m := Model{AS: s.AS, Mesh: s.Mesh}
	b := &builder{m: &m, in: in, sessions: map[string]*Session{}, byAddr: map[netip.Addr]string{}}
	nodes := b.nodes()
	for _, self := range nodes {
		b.configured(self, nodes)
	}
	for _, self := range nodes {
		b.live(self.Name)
	}
	b.finish()
	return m
}

type builder struct {
	m        *Model
	in       Inputs
	sessions map[string]*Session
	// byAddr names the node of each node address.
	byAddr    map[netip.Addr]string
	externals map[string]*External
}

// nodes fills m.Nodes and returns them as bgp sees them.
func (b *builder) nodes() []bgp.Node {
	var out []bgp.Node
	for i := range b.in.Nodes {
		n := &b.in.Nodes[i]
		bn, err := bgpNode(n)
		if err != nil {
			b.problem("%v", err)
		}
		out = append(out, bn)
		node := Node{Name: n.Name, AS: bn.AS, Reflector: bn.Reflector()}
		if node.AS == 0 {
			node.AS = b.m.AS
		}
		for _, p := range []netip.Prefix{bn.IPv4, bn.IPv6} {
			if p.IsValid() {
				node.Addresses = append(node.Addresses, p.Addr().String())
				b.byAddr[p.Addr()] = n.Name
			}
		}
		if node.Reflector {
			b.m.Reflectors = true
			node.ClusterID = bgp.SettingsOf(b.in.Config).ClusterID
			if id, ok := n.Labels[v1.LabelRouteReflectorClusterID]; ok {
				node.ClusterID = id
			}
		}
		if st := b.in.Status[n.Name]; st != nil {
			node.Status = &NodeStatus{Ready: st.Ready, Learned: st.Routes.Learned, Advertised: st.Routes.Advertised, Programmed: st.Routes.Programmed}
		}
		b.m.Nodes = append(b.m.Nodes, node)
	}
	sort.Slice(b.m.Nodes, func(i, j int) bool { return b.m.Nodes[i].Name < b.m.Nodes[j].Name })
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// bgpNode is a Node as BGP sees it: what tabbyd's reconcile reads (its
// addresses and AS from its annotations, its labels).
func bgpNode(n *corev1.Node) (bgp.Node, error) {
	ni, err := routing.NodeInfoFromAnnotations(n.Name, n.Annotations)
	as, asErr := bgp.NodeAS(n.Annotations)
	if asErr != nil {
		asErr = fmt.Errorf("node %s: %w", n.Name, asErr)
	}
	return bgp.Node{Name: n.Name, Labels: n.Labels, IPv4: ni.IPv4, IPv6: ni.IPv6, AS: as}, joinErr(err, asErr)
}

func joinErr(a, b error) error {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return fmt.Errorf("%v; %v", a, b)
}

func (b *builder) problem(format string, args ...any) {
	b.m.Problems = append(b.m.Problems, fmt.Sprintf(format, args...))
}

// configured adds the sessions bgp.DesiredPeers gives self.
func (b *builder) configured(self bgp.Node, nodes []bgp.Node) {
	in := bgp.Inputs{Self: self, Nodes: nodes, Config: b.in.Config, BGPPeers: b.in.BGPPeers, Passwords: map[string]string{}, NoIPv6Pools: b.in.NoIPv6Pools}
	if b.in.Config.NodeMeshPassword != nil {
		in.MeshPassword = "(not read)"
	}
	for _, p := range b.in.BGPPeers {
		in.Passwords[p.Name] = "(not read)"
	}
	peers, errs := bgp.DesiredPeers(in)
	for _, err := range errs {
		b.problem("node %s: %v", self.Name, err)
	}
	for _, p := range peers {
		remote := p.Node
		if remote == "" {
			remote = b.remoteOf(p.Address, p.Port, p.AS, p.BGPPeer)
		}
		end := b.end(self.Name, remote, familyOf(p.Address), p.Reason(), p.RRClient)
		end.Configured = true
	}
}

// live adds what the node's status says of its sessions.
func (b *builder) live(node string) {
	st := b.in.Status[node]
	if st == nil {
		if why, ok := b.in.StatusErrors[node]; ok {
			b.problem("node %s: no live status: %s", node, why)
		}
		return
	}
	for _, p := range st.Peers {
		addr, err := netip.ParseAddr(p.Address)
		if err != nil {
			b.problem("node %s: its status names a peer %q that is not an address", node, p.Address)
			continue
		}
		remote := p.Node
		if remote == "" {
			name, _ := strings.CutPrefix(p.Type, string(bgp.KindBGPPeer)+"/")
			remote = b.remoteOf(addr.Unmap(), p.Port, p.AS, name)
		}
		end := b.end(node, remote, familyOf(addr), p.Type, p.Type == string(bgp.KindReflectorClient))
		end.Live, end.State, end.Accepted, end.Rejected = true, p.State, p.Accepted, p.Rejected
	}
}

// remoteOf is the end a session with addr has: the node of that address,
// else an external speaker.
func (b *builder) remoteOf(addr netip.Addr, port uint16, as uint32, bgpPeer string) string {
	if n, ok := b.byAddr[addr]; ok {
		return n
	}
	if b.externals == nil {
		b.externals = map[string]*External{}
	}
	id := "peer/" + addr.String()
	e := b.externals[id]
	if e == nil {
		e = &External{ID: id, Address: addr.String(), Port: port, AS: as}
		b.externals[id] = e
	}
	if bgpPeer != "" && !contains(e.BGPPeers, bgpPeer) {
		e.BGPPeers = append(e.BGPPeers, bgpPeer)
		sort.Strings(e.BGPPeers)
	}
	return id
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// end returns self's end of the session between self and remote, making
// the session on first sight. typ is why self has it; reflects whether
// self reflects for remote.
func (b *builder) end(self, remote string, family int, typ string, reflects bool) *End {
	a, z := self, remote
	if less(z, a) {
		a, z = z, a
	}
	key := fmt.Sprintf("%s|%s|%d", a, z, family)
	s := b.sessions[key]
	if s == nil {
		s = &Session{A: a, B: z, Family: family}
		b.sessions[key] = s
	}
	// classify may swap the ends: pick self's after it.
	b.classify(s, self, typ, reflects)
	if self == s.B {
		return &s.BEnd
	}
	return &s.AEnd
}

// less orders ends: nodes by name, then external speakers.
func less(x, y string) bool {
	xe, ye := strings.HasPrefix(x, "peer/"), strings.HasPrefix(y, "peer/")
	if xe != ye {
		return !xe
	}
	return x < y
}

// classify records what one end says of the session: its type and who
// reflects for whom. Type stays what the first end said, unless that was
// a reflector relation the other end explains better.
func (b *builder) classify(s *Session, self, typ string, reflects bool) {
	bgpPeer := strings.HasPrefix(typ, string(bgp.KindBGPPeer)+"/")
	if s.Type == "" || (bgpPeer && !strings.HasPrefix(s.Type, string(bgp.KindBGPPeer)+"/")) {
		s.Type = typ
	}
	if !reflects {
		return
	}
	switch {
	case s.Reflects && s.A != self:
		s.BothReflect = true
	case !s.Reflects:
		s.Reflects = true
		if s.A != self {
			s.A, s.B = s.B, s.A
			s.AEnd, s.BEnd = s.BEnd, s.AEnd
		}
	}
}

// finish orders the sessions and names their types from both ends.
func (b *builder) finish() {
	for _, s := range b.sessions {
		if strings.HasPrefix(s.Type, string(bgp.KindBGPPeer)+"/") {
			b.m.Sessions = append(b.m.Sessions, *s)
			continue
		}
		a, z := b.node(s.A), b.node(s.B)
		switch {
		case s.Reflects:
			s.Type = string(bgp.KindReflector)
		case a != nil && z != nil && a.AS != z.AS:
			// Reflectors reflect for iBGP clients only.
			s.Type = "eBGP"
		case a != nil && z != nil && a.Reflector && z.Reflector:
			// Reflectors of one cluster: a session of equals, neither
			// a client of the other.
			s.Type = "reflectors"
		default:
			s.Type = string(bgp.KindMesh)
		}
		b.m.Sessions = append(b.m.Sessions, *s)
	}
	sort.Slice(b.m.Sessions, func(i, j int) bool {
		x, y := b.m.Sessions[i], b.m.Sessions[j]
		if x.A != y.A {
			return less(x.A, y.A)
		}
		if x.B != y.B {
			return less(x.B, y.B)
		}
		return x.Family < y.Family
	})
	for _, e := range b.externals {
		b.m.Externals = append(b.m.Externals, *e)
	}
	sort.Slice(b.m.Externals, func(i, j int) bool { return b.m.Externals[i].ID < b.m.Externals[j].ID })
	sort.Strings(b.m.Problems)
}

// node is the model's node of that name, nil for an end that is none.
func (b *builder) node(name string) *Node {
	for i := range b.m.Nodes {
		if b.m.Nodes[i].Name == name {
			return &b.m.Nodes[i]
		}
	}
	return nil
}

func familyOf(a netip.Addr) int {
	if a.Is4() {
		return 4
	}
	return 6
}
