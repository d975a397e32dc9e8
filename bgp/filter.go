package bgp

import (
	"fmt"
	"net/netip"
	"sort"

	v1 "github.com/tabbynet/tabby/api/v1"
)

// Route filters: what this node accepts from and sends to each peer.
//
// Sessions with cluster nodes (mesh, reflector, and BGPPeers that select
// nodes) carry pod routes only, and IPAM says who may originate each: a
// route is accepted when its prefix lies in a block (at least as long as
// the block) and its next hop is the address of the node the block is
// affine to, or it is the /32 (/128) of an address a node borrowed and its
// next hop is that node. The next hop, not the session's peer, is what is
// checked: a route reflector passes on other nodes' routes with their next
// hop unchanged, and the next hop is where the kernel sends the traffic, so
// a node that lies about a block only ever names its rightful owner. The
// default route, node addresses, node subnets and service CIDRs are never
// accepted from a node, even inside a pool.
//
// External peers (BGPPeers with a peerIP) are trusted more: every route is
// accepted except the default route and tabby's own ranges (any prefix in
// an IP pool or a service CIDR, a node's address), which would take pod,
// service or node traffic away. BGPFilters named by the BGPPeer come first
// and can accept more (a top-of-rack's default route) or less.
//
// Exports: to nodes only pool prefixes at least as long as their pool's
// block size; to external peers those and the service CIDRs. Nothing else,
// so a route one external peer sends is never passed to another unless a
// BGPFilter export rule accepts it.
//
// Filters decides in Go (Import, Export); the speaker compiles the same
// table into GoBGP policies (see policy.go), so rejected routes never
// enter GoBGP's table, never win a best-path selection and are never
// reflected.

// FilterInputs are everything NewFilters needs.
type FilterInputs struct {
	// Nodes are the cluster's nodes, this one included.
	Nodes []Node
	// Pools are all IP pools. Disabled ones count too: they give out no new
	// addresses, but the pods holding old ones must stay reachable.
	Pools []v1.IPPool
	// Blocks are all IPAM blocks.
	Blocks []v1.IPAMBlock
	// Config is the "default" BGPConfiguration's spec (service CIDRs).
	Config v1.BGPConfigurationSpec
	// BGPPeers and BGPFilters: the filters each BGPPeer names.
	BGPPeers   []v1.BGPPeer
	BGPFilters []v1.BGPFilter
}

// poolRange is an IP pool's CIDR and block size.
type poolRange struct {
	cidr      netip.Prefix
	blockSize int
}

// FilterRule is one BGPFilter rule, parsed. A rule without a CIDR matches
// every route of its family.
type FilterRule struct {
	CIDR   netip.Prefix
	Op     v1.BGPFilterMatchOperator
	Accept bool
	// Family is 4 or 6.
	Family int
	// From names the BGPFilter and the rule, for logs: "NAME importV4[0]".
	From string
}

// matches says whether the rule matches prefix p.
func (r FilterRule) matches(p netip.Prefix) bool {
	if familyOf(p.Addr()) != r.Family {
		return false
	}
	if !r.CIDR.IsValid() {
		return true
	}
	in := r.CIDR.Bits() <= p.Bits() && r.CIDR.Contains(p.Addr())
	switch r.Op {
	case v1.MatchEqual:
		return p == r.CIDR
	case v1.MatchIn:
		return in
	case v1.MatchNotIn:
		return !in
	}
	return false
}

// peerRules are the rules of one BGPPeer's filters, in order.
type peerRules struct {
	imports, exports []FilterRule
}

// Filters are the route filters of a node, computed by NewFilters.
type Filters struct {
	pools []poolRange
	// owners: the node addresses allowed as next hop, by block or by
	// borrowed address (/32 or /128).
	blockOwner    map[netip.Prefix][]netip.Addr
	borrowedOwner map[netip.Prefix][]netip.Addr
	nodeAddrs     map[netip.Addr]bool
	nodeSubnets   map[netip.Prefix]bool
	services      []netip.Prefix
	peers         map[string]peerRules // by BGPPeer name

	// ownerNodes are the nodes that own something, with their addresses
	// and what they own (for the GoBGP policy).
	ownerNodes []ownerNode
}

type ownerNode struct {
	name  string
	addrs []netip.Addr
	owned []ownedPrefix
}

type ownedPrefix struct {
	prefix netip.Prefix
	block  bool // a block (and anything inside it), else one borrowed address
}

// Verdict is what a filter decided about a route, and why.
type Verdict struct {
	Accept bool
	Reason string
}

func accept(format string, args ...any) Verdict {
	return Verdict{Accept: true, Reason: fmt.Sprintf(format, args...)}
}

func reject(format string, args ...any) Verdict {
	return Verdict{Reason: fmt.Sprintf(format, args...)}
}

// NewFilters computes the filters. Unparsable objects are reported and left
// out (a block left out means its routes are rejected until it is fixed).
func NewFilters(in FilterInputs) (*Filters, []error) {
	f := &Filters{
		blockOwner:    map[netip.Prefix][]netip.Addr{},
		borrowedOwner: map[netip.Prefix][]netip.Addr{},
		nodeAddrs:     map[netip.Addr]bool{},
		nodeSubnets:   map[netip.Prefix]bool{},
		peers:         map[string]peerRules{},
	}
	var problems []error
	problem := func(format string, args ...any) { problems = append(problems, fmt.Errorf(format, args...)) }
	addrsOf := map[string][]netip.Addr{}
	for _, n := range in.Nodes {
		for _, p := range []netip.Prefix{n.IPv4, n.IPv6} {
			if !p.IsValid() {
				continue
			}
			addrsOf[n.Name] = append(addrsOf[n.Name], p.Addr())
			f.nodeAddrs[p.Addr()] = true
			f.nodeSubnets[p.Masked()] = true
		}
	}
	for _, p := range in.Pools {
		c, err := netip.ParsePrefix(p.Spec.CIDR)
		if err != nil {
			problem("IPPool %s: cidr %q is invalid: %v", p.Name, p.Spec.CIDR, err)
			continue
		}
		bs := p.Spec.BlockSize
		if bs == 0 {
			bs = v1.DefaultBlockSizeV4
			if c.Addr().Is6() {
				bs = v1.DefaultBlockSizeV6
			}
		}
		f.pools = append(f.pools, poolRange{cidr: c.Masked(), blockSize: bs})
	}
	owned := map[string][]ownedPrefix{}
	for i := range in.Blocks {
		f.addBlock(&in.Blocks[i], addrsOf, owned, problem)
	}
	for _, list := range [][]v1.ServiceIPBlock{in.Config.ServiceClusterIPs, in.Config.ServiceExternalIPs, in.Config.ServiceLoadBalancerIPs} {
		for _, s := range list {
			if p, err := netip.ParsePrefix(s.CIDR); err == nil {
				f.services = append(f.services, p.Masked())
			}
		}
	}
	for name, o := range owned {
		f.ownerNodes = append(f.ownerNodes, ownerNode{name: name, addrs: addrsOf[name], owned: o})
	}
	sort.Slice(f.ownerNodes, func(i, j int) bool { return f.ownerNodes[i].name < f.ownerNodes[j].name })
	problems = append(problems, f.addPeerRules(in.BGPPeers, in.BGPFilters)...)
	return f, problems
}

// addBlock records who may originate a block and the addresses borrowed
// from it.
func (f *Filters) addBlock(b *v1.IPAMBlock, addrsOf map[string][]netip.Addr, owned map[string][]ownedPrefix, problem func(string, ...any)) {
	if b.Spec.Deleted {
		return
	}
	p, err := netip.ParsePrefix(b.Spec.CIDR)
	if err != nil {
		problem("IPAMBlock %s: cidr %q is invalid: %v", b.Name, b.Spec.CIDR, err)
		return
	}
	p = p.Masked()
	if node, ok := hostAffinity(b.Spec.Affinity); ok && len(addrsOf[node]) > 0 {
		f.blockOwner[p] = addrsOf[node]
		owned[node] = append(owned[node], ownedPrefix{prefix: p, block: true})
	}
	Borrowed(b, func(ord int, node string) {
		if len(addrsOf[node]) == 0 {
			return
		}
		if a, ok := nthAddr(p, ord); ok {
			host := netip.PrefixFrom(a, a.BitLen())
			f.borrowedOwner[host] = append(f.borrowedOwner[host], addrsOf[node]...)
			owned[node] = append(owned[node], ownedPrefix{prefix: host})
		}
	})
}

// Borrowed calls f, in order, with each allocation of b (its ordinal in
// the block) that a node other than b's affine node holds, and that node:
// the addresses routed on their own, apart from their block. It is the
// one reading of a block's allocations that the filters, the
// advertisements and the routing loop's test for block updates share.
func Borrowed(b *v1.IPAMBlock, f func(ord int, node string)) {
	affine, _ := hostAffinity(b.Spec.Affinity)
	for ord, idx := range b.Spec.Allocations {
		if idx < 0 || idx >= len(b.Spec.Attributes) {
			continue
		}
		if node := b.Spec.Attributes[idx].Node; node != "" && node != affine {
			f(ord, node)
		}
	}
}

func hostAffinity(a string) (string, bool) {
	const host = "host:"
	if len(a) > len(host) && a[:len(host)] == host {
		return a[len(host):], true
	}
	return "", false
}

// addPeerRules parses the rules of the filters each BGPPeer names.
func (f *Filters) addPeerRules(peers []v1.BGPPeer, filters []v1.BGPFilter) []error {
	var problems []error
	byName := map[string]*v1.BGPFilter{}
	for i := range filters {
		byName[filters[i].Name] = &filters[i]
	}
	for _, bp := range peers {
		var pr peerRules
		for _, name := range bp.Spec.Filters {
			bf, ok := byName[name]
			if !ok {
				problems = append(problems, fmt.Errorf("BGPPeer %s names BGPFilter %s, which does not exist: create it or remove it from spec.filters (until then its peer gets the default filters)", bp.Name, name))
				continue
			}
			if err := bf.Validate(); err != nil {
				problems = append(problems, fmt.Errorf("BGPPeer %s: %w; the filter is ignored until it is fixed", bp.Name, err))
				continue
			}
			pr.imports = append(pr.imports, rulesV4(name, "importV4", bf.Spec.ImportV4)...)
			pr.imports = append(pr.imports, rulesV6(name, "importV6", bf.Spec.ImportV6)...)
			pr.exports = append(pr.exports, rulesV4(name, "exportV4", bf.Spec.ExportV4)...)
			pr.exports = append(pr.exports, rulesV6(name, "exportV6", bf.Spec.ExportV6)...)
		}
		if len(pr.imports)+len(pr.exports) > 0 {
			f.peers[bp.Name] = pr
		}
	}
	return problems
}

func rulesV4(filter, list string, rs []v1.BGPFilterRuleV4) []FilterRule {
	out := make([]FilterRule, 0, len(rs))
	for i, r := range rs {
		out = append(out, parseRule(filter, list, i, r.CIDR, r.MatchOperator, r.Action, 4))
	}
	return out
}

func rulesV6(filter, list string, rs []v1.BGPFilterRuleV6) []FilterRule {
	out := make([]FilterRule, 0, len(rs))
	for i, r := range rs {
		out = append(out, parseRule(filter, list, i, r.CIDR, r.MatchOperator, r.Action, 6))
	}
	return out
}

// parseRule parses a rule the caller has validated.
func parseRule(filter, list string, i int, cidr string, op v1.BGPFilterMatchOperator, action v1.BGPFilterAction, family int) FilterRule {
	r := FilterRule{Op: op, Accept: action == v1.FilterAccept, Family: family, From: fmt.Sprintf("BGPFilter %s %s[%d]", filter, list, i)}
	if p, err := netip.ParsePrefix(cidr); err == nil {
		r.CIDR = p.Masked()
	}
	return r
}

// isNodeSession says whether a session is with a cluster node.
func isNodeSession(p Peer) bool { return p.Node != "" || p.Kind != KindBGPPeer }

// Import decides whether a route received over the session with peer is
// accepted.
func (f *Filters) Import(peer Peer, r Route) Verdict {
	p := r.Prefix
	if !p.IsValid() || !r.NextHop.IsValid() || p.Addr().Is4() != r.NextHop.Is4() {
		return reject("malformed route")
	}
	p = p.Masked()
	if isNodeSession(peer) {
		if why, bad := f.forbiddenFromNode(p); bad {
			return reject("%s from a node", why)
		}
		return f.fromNode(p, r.NextHop)
	}
	for _, rule := range f.peers[peer.BGPPeer].imports {
		if rule.matches(p) {
			if rule.Accept {
				return accept("%s accepts it", rule.From)
			}
			return reject("%s rejects it", rule.From)
		}
	}
	if why, own := f.own(p); own {
		return reject("%s: only nodes announce it", why)
	}
	return accept("external route")
}

// forbiddenFromNode: the default route, node addresses and subnets, and
// anything inside a service CIDR.
func (f *Filters) forbiddenFromNode(p netip.Prefix) (string, bool) {
	switch {
	case p.Bits() == 0:
		return "the default route", true
	case p.IsSingleIP() && f.nodeAddrs[p.Addr()]:
		return "a node's address", true
	case f.nodeSubnets[p]:
		return "a node subnet", true
	}
	if s, ok := within(f.services, p); ok {
		return "inside service CIDR " + s.String(), true
	}
	return "", false
}

// fromNode checks a pod route against IPAM.
func (f *Filters) fromNode(p netip.Prefix, nh netip.Addr) Verdict {
	pool, ok := f.poolOf(p)
	if !ok {
		return reject("outside every IP pool")
	}
	if p.Bits() < pool.blockSize {
		return reject("shorter than pool %s's block size /%d", pool.cidr, pool.blockSize)
	}
	if p.IsSingleIP() && containsAddr(f.borrowedOwner[p], nh) {
		return accept("an address the next hop's node borrowed")
	}
	block := netip.PrefixFrom(p.Addr(), pool.blockSize).Masked()
	owners, ok := f.blockOwner[block]
	if !ok {
		return reject("in block %s, which no node holds", block)
	}
	if !containsAddr(owners, nh) {
		return reject("in block %s, whose node is not the next hop %s", block, nh)
	}
	return accept("in block %s of the next hop's node", block)
}

// own says whether p is one of tabby's own ranges: the default route, a
// node's address, or inside a pool or a service CIDR.
func (f *Filters) own(p netip.Prefix) (string, bool) {
	if p.Bits() == 0 {
		return "the default route", true
	}
	if p.IsSingleIP() && f.nodeAddrs[p.Addr()] {
		return "a node's address", true
	}
	for _, pool := range f.pools {
		if pool.cidr.Bits() <= p.Bits() && pool.cidr.Contains(p.Addr()) {
			return "inside IP pool " + pool.cidr.String(), true
		}
	}
	if s, ok := within(f.services, p); ok {
		return "inside service CIDR " + s.String(), true
	}
	return "", false
}

// Export decides whether a route goes to peer.
func (f *Filters) Export(peer Peer, p netip.Prefix) Verdict {
	p = p.Masked()
	if !isNodeSession(peer) {
		for _, rule := range f.peers[peer.BGPPeer].exports {
			if rule.matches(p) {
				if rule.Accept {
					return accept("%s accepts it", rule.From)
				}
				return reject("%s rejects it", rule.From)
			}
		}
		if s, ok := within(f.services, p); ok {
			return accept("inside service CIDR %s", s)
		}
	}
	if pool, ok := f.poolOf(p); ok && p.Bits() >= pool.blockSize {
		return accept("a block or address of pool %s", pool.cidr)
	}
	return reject("not a pod block or address")
}

// poolOf is the pool p lies in.
func (f *Filters) poolOf(p netip.Prefix) (poolRange, bool) {
	for _, pool := range f.pools {
		if pool.cidr.Bits() <= p.Bits() && pool.cidr.Contains(p.Addr()) {
			return pool, true
		}
	}
	return poolRange{}, false
}

// within returns the CIDR of list that contains p.
func within(list []netip.Prefix, p netip.Prefix) (netip.Prefix, bool) {
	for _, c := range list {
		if c.Bits() <= p.Bits() && c.Contains(p.Addr()) {
			return c, true
		}
	}
	return netip.Prefix{}, false
}

func containsAddr(list []netip.Addr, a netip.Addr) bool {
	for _, x := range list {
		if x == a {
			return true
		}
	}
	return false
}
