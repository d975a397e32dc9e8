package bgp

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	v1 "github.com/tabbynet/tabby/api/v1"
)

// Node is a cluster node as BGP sees it.
type Node struct {
	Name   string
	Labels map[string]string
	// IPv4 and IPv6 are the node's addresses with their subnet's prefix
	// length (the tabby.io/ipv4-address and tabby.io/ipv6-address
	// annotations); the zero Prefix when the node has none (yet).
	IPv4, IPv6 netip.Prefix
	// AS overrides the cluster's AS number for this node (the
	// tabby.io/as-number annotation, see NodeAS); 0 for none.
	AS uint32
}

// Reflector says whether the node is a route reflector.
func (n Node) Reflector() bool { return n.Labels[v1.LabelRouteReflector] == "true" }

// familyOf is 4 or 6.
func familyOf(a netip.Addr) int {
	if a.Is4() {
		return 4
	}
	return 6
}

// addr is the node's address of one family (4 or 6), or the zero Addr.
func (n Node) addr(family int) netip.Addr {
	if family == 4 {
		return n.IPv4.Addr()
	}
	return n.IPv6.Addr()
}

// Inputs are everything DesiredPeers needs.
type Inputs struct {
	// Self is this node.
	Self Node
	// Nodes are the cluster's nodes; an entry named like Self is skipped.
	Nodes []Node
	// Config is the "default" BGPConfiguration's spec (zero: defaults).
	Config v1.BGPConfigurationSpec
	// BGPPeers are all BGPPeer resources.
	BGPPeers []v1.BGPPeer
	// MeshPassword is Config.NodeMeshPassword, already read from its Secret.
	MeshPassword string
	// Passwords holds each BGPPeer's password by BGPPeer name, already
	// read from its Secret.
	Passwords map[string]string
	// NoIPv6Pools says the cluster has no IPv6 IPPool: sessions between
	// nodes are then IPv4 only, as IPv6 would carry nothing, so that
	// nodes which merely have IPv6 addresses (most hosts do) in an IPv4
	// cluster open no IPv6 session a firewall between them may block.
	// BGPPeers of either family are kept.
	NoIPv6Pools bool
}

// NoIPv6Pools says whether no IPPool is of IPv6 (Inputs.NoIPv6Pools);
// disabled pools count, as their blocks still hold addresses to route.
func NoIPv6Pools(pools []v1.IPPool) bool {
	for _, p := range pools {
		if pfx, err := netip.ParsePrefix(p.Spec.CIDR); err == nil && pfx.Addr().Is6() {
			return false
		}
	}
	return true
}

// Kind says why a session exists.
type Kind string

// The kinds of session.
const (
	// KindMesh: node-to-node full mesh (no route reflector exists).
	KindMesh Kind = "node-mesh"
	// KindReflector: the remote node is a route reflector.
	KindReflector Kind = "route-reflector"
	// KindReflectorClient: this node is a route reflector and the remote
	// node one of its clients.
	KindReflectorClient Kind = "route-reflector-client"
	// KindBGPPeer: a BGPPeer resource asks for it.
	KindBGPPeer Kind = "bgppeer"
)

// Peer is one BGP session this node should have. The fields up to
// KeepOriginalNextHop are the session's settings; the rest say why it
// exists.
type Peer struct {
	// Address and Port of the remote speaker.
	Address netip.Addr
	Port    uint16
	// AS of the remote speaker; iBGP when it equals this node's.
	AS uint32
	// LocalAddress the session is bound to; the zero Addr leaves the
	// choice to the kernel.
	LocalAddress netip.Addr
	// Passive: only wait for the remote to connect. Of the two nodes of a
	// node-to-node session the one with the higher address is passive, so
	// exactly one side connects.
	Passive bool
	// RRClient: this node reflects routes to the remote (its route-reflector
	// client), with ClusterID as the cluster ID.
	RRClient  bool
	ClusterID string
	// Password for TCP MD5 signatures; "" for none.
	Password string
	// RestartTime is the graceful-restart time this node announces: how long
	// the remote keeps this node's routes while it restarts.
	RestartTime time.Duration
	// KeepOriginalNextHop: routes sent to this (eBGP) peer keep their next
	// hop instead of this node's address.
	KeepOriginalNextHop bool
	// MaxPrefixes is the most prefixes the peer may send per address
	// family before the session is closed (0: DefaultMaxPrefixes).
	MaxPrefixes uint32

	// Kind says why the session exists; BGPPeer names the BGPPeer resource
	// for KindBGPPeer.
	Kind    Kind
	BGPPeer string
	// Node is the remote node's name when the remote is a cluster node.
	Node string
	// Relays: the remote passes on routes of other speakers (a route
	// reflector, or a router a BGPPeer names), so it can take over from
	// sessions that are going away (see Transition).
	Relays bool
}

// Reason is why the session exists, for status output: "node-mesh",
// "route-reflector", "route-reflector-client" or "bgppeer/NAME".
func (p Peer) Reason() string {
	if p.Kind == KindBGPPeer {
		return string(KindBGPPeer) + "/" + p.BGPPeer
	}
	return string(p.Kind)
}

func (p Peer) maxPrefixes() uint32 {
	if p.MaxPrefixes == 0 {
		return DefaultMaxPrefixes
	}
	return p.MaxPrefixes
}

// Key is the peer's address as the speaker and Transition key it.
func (p Peer) Key() string { return p.Address.String() }

// DesiredPeers returns the sessions in.Self should have, ordered by address.
// Problems that cost a session (a BGPPeer with a bad selector or an unread
// password, a node with a bad cluster ID) are returned with it; every
// session that can be configured still is.
func DesiredPeers(in Inputs) ([]Peer, []error) {
	d := &peerBuilder{in: in, s: SettingsOf(in.Config), byAddr: map[netip.Addr]bool{}}
	d.selfAS = d.asOf(in.Self)
	d.selfID = d.clusterIDOf(in.Self)
	d.mesh()
	d.bgpPeers()
	sort.Slice(d.out, func(i, j int) bool { return d.out[i].Address.Less(d.out[j].Address) })
	return d.out, d.problems
}

type peerBuilder struct {
	in       Inputs
	s        Settings
	selfAS   uint32
	selfID   string
	out      []Peer
	byAddr   map[netip.Addr]bool
	problems []error
}

func (d *peerBuilder) problem(format string, args ...any) {
	d.problems = append(d.problems, fmt.Errorf(format, args...))
}

// add keeps the first session asked for an address: mesh and reflector
// sessions come first, then BGPPeers by name.
func (d *peerBuilder) add(p Peer) {
	if !p.Address.IsValid() || d.byAddr[p.Address] {
		return
	}
	if p.Address == d.in.Self.IPv4.Addr() || p.Address == d.in.Self.IPv6.Addr() {
		return
	}
	d.byAddr[p.Address] = true
	d.out = append(d.out, p)
}

func (d *peerBuilder) asOf(n Node) uint32 {
	if n.AS != 0 {
		return n.AS
	}
	return d.s.AS
}

// clusterIDOf is a reflector's cluster ID: its label, else the cluster's.
func (d *peerBuilder) clusterIDOf(n Node) string {
	v, ok := n.Labels[v1.LabelRouteReflectorClusterID]
	if !ok || !n.Reflector() {
		return d.s.ClusterID
	}
	id, err := netip.ParseAddr(v)
	if err != nil || !id.Is4() {
		d.problem("node %s: label %s=%q is not an IPv4 address such as 244.0.0.1; using cluster ID %s", n.Name, v1.LabelRouteReflectorClusterID, v, d.s.ClusterID)
		return d.s.ClusterID
	}
	return id.String()
}

// others are the cluster's nodes other than Self, by name.
func (d *peerBuilder) others() []Node {
	var out []Node
	for _, n := range d.in.Nodes {
		if n.Name != d.in.Self.Name {
			out = append(out, n)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// mesh adds the node-to-node sessions: a full mesh without reflectors;
// with them, reflectors peer with every node and the others with the
// reflectors only.
func (d *peerBuilder) mesh() {
	if !d.s.Mesh {
		return
	}
	if d.in.Config.NodeMeshPassword != nil && d.in.MeshPassword == "" {
		d.problem("BGPConfiguration nodeMeshPassword names Secret %s key %s, which could not be read: no node-to-node sessions until it can", d.in.Config.NodeMeshPassword.Name, d.in.Config.NodeMeshPassword.Key)
		return
	}
	nodes := d.others()
	anyReflector := d.in.Self.Reflector()
	for _, n := range nodes {
		anyReflector = anyReflector || n.Reflector()
	}
	for _, n := range nodes {
		if anyReflector && !d.in.Self.Reflector() && !n.Reflector() {
			continue
		}
		d.nodePeers(n, KindMesh, "", d.in.MeshPassword, d.s.MeshRestartTime, false, d.s.MeshMaxPrefixes)
	}
}

// nodePeers adds one session per address family the two nodes share. kind
// is refined for reflectors: a session of a reflector with a node that is
// not a reflector of its cluster makes that node its client.
func (d *peerBuilder) nodePeers(n Node, kind Kind, bgpPeer, password string, restart time.Duration, keepNextHop bool, maxPrefixes uint32) {
	self := d.in.Self
	for _, family := range []int{4, 6} {
		local, remote := self.addr(family), n.addr(family)
		if !local.IsValid() || !remote.IsValid() || (family == 6 && d.in.NoIPv6Pools && bgpPeer == "") {
			continue
		}
		p := Peer{
			Address:             remote,
			Port:                d.s.ListenPort,
			AS:                  d.asOf(n),
			LocalAddress:        local,
			Passive:             remote.Less(local),
			Password:            password,
			RestartTime:         restart,
			KeepOriginalNextHop: keepNextHop,
			MaxPrefixes:         maxPrefixes,
			Kind:                kind,
			BGPPeer:             bgpPeer,
			Node:                n.Name,
			Relays:              n.Reflector(),
		}
		ibgp := p.AS == d.selfAS
		if ibgp && self.Reflector() && (!n.Reflector() || d.clusterIDOf(n) != d.selfID) {
			p.RRClient, p.ClusterID = true, d.selfID
		}
		if kind == KindMesh {
			switch {
			case p.RRClient:
				p.Kind = KindReflectorClient
			case n.Reflector():
				p.Kind = KindReflector
			}
		}
		d.add(p)
	}
}

// bgpPeers adds the sessions BGPPeer resources ask for, by name.
func (d *peerBuilder) bgpPeers() {
	peers := append([]v1.BGPPeer(nil), d.in.BGPPeers...)
	sort.Slice(peers, func(i, j int) bool { return peers[i].Name < peers[j].Name })
	for i := range peers {
		d.bgpPeer(&peers[i])
	}
}

func (d *peerBuilder) bgpPeer(bp *v1.BGPPeer) {
	spec := &bp.Spec
	password := ""
	if spec.Password != nil {
		pw, ok := d.in.Passwords[bp.Name]
		if !ok || pw == "" {
			d.problem("BGPPeer %s: password Secret %s key %s could not be read: no session until it can", bp.Name, spec.Password.Name, spec.Password.Key)
			return
		}
		password = pw
	}
	restart := DefaultMaxRestartTime
	if spec.MaxRestartTime != nil && spec.MaxRestartTime.Duration > 0 {
		restart = spec.MaxRestartTime.Duration
	}
	picksSelf, err := d.picks(bp.Name, "nodeSelector", spec.Node, spec.NodeSelector, d.in.Self)
	if err != nil {
		return
	}
	if spec.PeerSelector != nil {
		d.selectedNodes(bp, password, restart, picksSelf)
		return
	}
	if !picksSelf {
		return
	}
	addr, port, err := parsePeerIP(spec.PeerIP)
	if err != nil {
		d.problem("BGPPeer %s: %v", bp.Name, err)
		return
	}
	family := familyOf(addr)
	local := d.in.Self.addr(family)
	if !local.IsValid() {
		d.problem("BGPPeer %s: peer %s is IPv%d but node %s has no IPv%d address", bp.Name, addr, family, d.in.Self.Name, family)
		return
	}
	if spec.SourceAddress == "None" {
		local = netip.Addr{}
	}
	d.add(Peer{
		Address:             addr,
		Port:                port,
		AS:                  spec.ASNumber,
		LocalAddress:        local,
		Password:            password,
		RestartTime:         restart,
		KeepOriginalNextHop: spec.KeepOriginalNextHop,
		MaxPrefixes:         peerMaxPrefixes(spec),
		Kind:                KindBGPPeer,
		BGPPeer:             bp.Name,
		Relays:              true,
	})
}

// selectedNodes adds sessions with the nodes a peerSelector picks. As in
// Calico it works both ways: a node peers with M when the BGPPeer picks
// this node and selects M, or picks M and selects this node.
func (d *peerBuilder) selectedNodes(bp *v1.BGPPeer, password string, restart time.Duration, picksSelf bool) {
	spec := &bp.Spec
	selectsSelf, err := d.picks(bp.Name, "peerSelector", "", spec.PeerSelector, d.in.Self)
	if err != nil {
		return
	}
	for _, n := range d.others() {
		picks, _ := d.picks(bp.Name, "nodeSelector", spec.Node, spec.NodeSelector, n)
		selects, _ := d.picks(bp.Name, "peerSelector", "", spec.PeerSelector, n)
		if (picksSelf && selects) || (picks && selectsSelf) {
			d.nodePeers(n, KindBGPPeer, bp.Name, password, restart, spec.KeepOriginalNextHop, peerMaxPrefixes(spec))
		}
	}
}

// picks says whether a BGPPeer's node name or selector picks node n; with
// neither, every node is picked. A bad selector is reported (once, when it
// is tried on Self) and picks nothing.
func (d *peerBuilder) picks(bgpPeer, field, name string, sel *metav1.LabelSelector, n Node) (bool, error) {
	if name != "" {
		return name == n.Name, nil
	}
	if sel == nil {
		return true, nil
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		if n.Name == d.in.Self.Name {
			d.problem("BGPPeer %s: %s is invalid, so the BGPPeer is ignored: %v", bgpPeer, field, err)
		}
		return false, err
	}
	return s.Matches(labels.Set(n.Labels)), nil
}

func peerMaxPrefixes(spec *v1.BGPPeerSpec) uint32 {
	if spec.MaxPrefixes != nil && *spec.MaxPrefixes > 0 {
		return *spec.MaxPrefixes
	}
	return DefaultMaxPrefixes
}

// parsePeerIP splits a BGPPeer's peerIP: an address, address:port or
// [v6]:port; the port defaults to 179.
func parsePeerIP(s string) (netip.Addr, uint16, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), DefaultExternalBGPPort, nil
	}
	if strings.Count(s, ":") == 1 || strings.HasPrefix(s, "[") {
		ap, err := netip.ParseAddrPort(s)
		if err == nil && ap.Port() != 0 {
			return ap.Addr().Unmap(), ap.Port(), nil
		}
	}
	return netip.Addr{}, 0, fmt.Errorf("peerIP %q is not an address, IPv4:port or [IPv6]:port", s)
}
