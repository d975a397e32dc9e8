package bgp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	api "github.com/osrg/gobgp/v3/api"
	"google.golang.org/protobuf/proto"
)

// The speaker's GoBGP policies: Filters (see filter.go) compiled into
// defined sets and two global policies, one for imports and one for
// exports, both with REJECT as their default. GoBGP applies per-peer
// policies only to route-server clients, so the policies are global and
// neighbor sets say which statements apply to which session: for imports
// the session a route came from, for exports the session it goes to.
//
// The export policy also carries KeepOriginalNextHop: routes sent to the
// neighbors of one set keep their next hop (a statement without a route
// action, so evaluation goes on).
//
// GoBGP matches a prefix set by longest match: of the set's entries that
// contain a prefix only the most specific is tried. Each set is therefore
// built so that nesting cannot hide an entry (see Filters), and the lab
// tests check that GoBGP and Filters agree on real sessions.
const (
	importPolicy = "tabby-import"
	exportPolicy = "tabby-export"

	setNodes       = "tabby-nodes"    // sessions with cluster nodes
	setExternal    = "tabby-external" // sessions with external peers
	setKeepNextHop = "tabby-keep-next-hop"
	// setReflectors are, on a reflector, its sessions with the other
	// reflectors of its cluster.
	setReflectors = "tabby-cluster-reflectors"

	// reflectorCopyPref is the local preference of what a reflector
	// learns from another reflector of its cluster (below the default
	// 100): GoBGP reflects to non-clients without ORIGINATOR_ID and
	// CLUSTER_LIST, so that copy looks originated by the other reflector,
	// and with a lower router ID it would win over the client's own route,
	// making each reflector re-send every route a moment after the first.
	// It stays the fallback when the client's own session is down.
	reflectorCopyPref = 90

	// placeholder keeps neighbor sets non-empty: GoBGP's empty neighbor
	// set matches every neighbor.
	placeholder = "0.0.0.0/32"
)

// installPolicies defines the policies (from empty filters) and assigns
// them, once, at Start. Later syncs replace the sets and policies in place
// (SetPolicies keeps the assignments, which name the policies).
func (s *Speaker) installPolicies(ctx context.Context) error {
	req := compilePolicies(s.filters, nil)
	if err := s.srv.SetPolicies(ctx, req); err != nil {
		return fmt.Errorf("defining the BGP route filters: %w", err)
	}
	for _, a := range []struct {
		dir  api.PolicyDirection
		name string
	}{{api.PolicyDirection_IMPORT, importPolicy}, {api.PolicyDirection_EXPORT, exportPolicy}} {
		if err := s.srv.AddPolicyAssignment(ctx, &api.AddPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
			Name: "global", Direction: a.dir, Policies: []*api.Policy{{Name: a.name}}, DefaultAction: api.RouteAction_REJECT}}); err != nil {
			return fmt.Errorf("assigning the BGP route filter %s: %w", a.name, err)
		}
	}
	s.policy = req
	return nil
}

// syncPolicies recompiles the policies for the current filters and
// sessions and, when they changed, replaces them and has the sessions
// apply the direction that changed: re-evaluate what they received when
// the import policy changed (soft reset in, no message to the peer),
// re-send what they send when the export policy changed (soft reset out).
// A block claimed anywhere changes only the import policy (who may
// originate what), so it costs each session a pass over what it received
// rather than the whole table sent again to every session: on a route
// reflector with 29 clients that resend was most of a claim's cost. And
// only the sessions that brought a route of the block claimed (or
// released) re-evaluate anything (importChange, adjInHas).
// Called with s.mu held.
func (s *Speaker) syncPolicies(ctx context.Context) (err error) {
	s.policySynced = false
	defer func() { s.policySynced = err == nil }()
	peers := make([]Peer, 0, len(s.sessions))
	for _, ss := range s.sessions {
		peers = append(peers, ss.peer)
	}
	req := compilePolicies(s.filters, peers)
	if s.policy != nil && proto.Equal(req, s.policy) {
		return nil
	}
	in, out := func(Peer) bool { return true }, true
	var scope []netip.Prefix // nil: every route of a session in
	if s.policy != nil {
		in, scope = importChange(s.policy, req, s.cfg.AS)
		out = !proto.Equal(policyPart(req, exportPolicy), policyPart(s.policy, exportPolicy))
	}
	if out {
		scope = nil
	}
	if err := s.srv.SetPolicies(ctx, req); err != nil {
		s.changed.Add(1) // in doubt
		return fmt.Errorf("replacing the BGP route filters: %w", err)
	}
	s.policy = req
	// Only the sessions to reset are looked up in GoBGP: a claim resets
	// one or two of them, and listing all 29 of a mesh node's sessions
	// (GoBGP converts each one's whole configuration) was a fifth of each
	// node's CPU per claim, paid on every node of the cluster at once.
	var keys []string
	for key, ss := range s.sessions {
		if out || in(ss.peer) {
			keys = append(keys, key)
		}
	}
	up, err := s.establishedKeys(ctx, keys)
	if err != nil {
		s.changed.Add(1)
		return fmt.Errorf("re-applying the route filters: %w", err)
	}
	var errs []error
	reset := false
	for _, key := range keys {
		if !up[key] {
			continue
		}
		ss := s.sessions[key]
		resetIn := in(ss.peer)
		// A claim changes what one node may originate. Routes the change
		// can give another verdict are only those of the prefixes it
		// added or removed: a session that received none of them has
		// nothing to re-evaluate (what it receives from now on meets the
		// new filters), and on a reflector's client, whose two sessions
		// bring every route, the re-evaluation was a fifth of its CPU per
		// claim. The session is asked after the filters changed, so a
		// route arriving meanwhile is either found or judged by them.
		if resetIn && scope != nil {
			if has, err := s.adjInHas(ctx, key, scope); err == nil && !has {
				resetIn = false
			}
		}
		for dir, do := range map[api.ResetPeerRequest_SoftResetDirection]bool{api.ResetPeerRequest_IN: resetIn, api.ResetPeerRequest_OUT: out} {
			if !do {
				continue
			}
			reset = true
			if dir == api.ResetPeerRequest_IN {
				s.resets.Add(1)
			}
			if err := s.srv.ResetPeer(ctx, &api.ResetPeerRequest{Address: key, Soft: true, Direction: dir}); err != nil {
				errs = append(errs, fmt.Errorf("re-applying the route filters to %s: %w", key, err))
			}
		}
	}
	// What the sessions learned changed only if one re-evaluated it (see
	// LearnedVersion). What arrives from now on meets the new filters and
	// is signalled as any route is; a routing pass picks up what came
	// meanwhile through the signal's version, not a read of the table
	// after every filter change.
	if reset || len(errs) > 0 {
		s.changed.Add(1)
	}
	return errors.Join(errs...)
}

// adjInHas says whether session key received a route to one of prefixes
// or a prefix inside one, accepted or not.
func (s *Speaker) adjInHas(ctx context.Context, key string, prefixes []netip.Prefix) (bool, error) {
	has := false
	for _, fam := range []*api.Family{familyV4, familyV6} {
		var lookup []*api.TableLookupPrefix
		for _, p := range prefixes {
			if familyFor(p.Addr()) == fam {
				lookup = append(lookup, &api.TableLookupPrefix{Prefix: p.String(), Type: api.TableLookupPrefix_LONGER})
			}
		}
		if len(lookup) == 0 {
			continue
		}
		err := s.srv.ListPath(ctx, &api.ListPathRequest{TableType: api.TableType_ADJ_IN, Name: key, Family: fam, Prefixes: lookup},
			func(d *api.Destination) { has = has || len(d.Paths) > 0 })
		if err != nil || has {
			return has, err
		}
	}
	return false, nil
}

// Names of what one node may originate (see nodeImports): its prefix
// sets start with nodeSetPrefix, the import statements using them with
// ownedStmtPrefix; both end in -v4 or -v6.
const (
	nodeSetPrefix   = "tabby-node-"
	ownedStmtPrefix = "owned-" + nodeSetPrefix
)

// importChange says what must re-evaluate what it received when the
// import policy goes from old to new. When only statements of what nodes
// may originate changed (a block claimed, released or moved, an address
// borrowed), only those nodes' routes can change verdict: they come over
// the sessions with those nodes, with reflectors (which relay every
// node's routes) and with other ASes (eBGP passes routes on). On a
// reflector with 29 clients a claim so costs two sessions' re-evaluation
// instead of 29, in GoBGP's one loop that is meanwhile passing the
// claimed block's route on. Any other change re-evaluates every session.
//
// scope narrows it further: when non-nil, only routes to those prefixes
// (or inside them) can change verdict, the entries of those nodes' prefix
// sets that one policy has and the other has not. GoBGP matches a set by
// its most specific entry, so a prefix outside every changed entry keeps
// its match. scope is nil when a node's statement changed in anything
// else (its next hops: every route of the node can change) or when no
// changed entry was found.
func importChange(old, new *api.SetPoliciesRequest, as uint32) (sessions func(Peer) bool, scope []netip.Prefix) {
	all := func(Peer) bool { return true }
	a, aOrder := statementsOf(old, importPolicy)
	b, bOrder := statementsOf(new, importPolicy)
	if !slices.Equal(aOrder, bOrder) {
		return all, nil
	}
	names := map[string]bool{}
	for name := range a {
		names[name] = true
	}
	for name := range b {
		names[name] = true
	}
	nodes := map[string]bool{}
	seen := map[netip.Prefix]bool{}
	scoped := true
	for name := range names {
		if proto.Equal(a[name], b[name]) {
			continue
		}
		node, ok := strings.CutPrefix(name, ownedStmtPrefix)
		if !ok {
			return all, nil
		}
		nodes[strings.TrimSuffix(strings.TrimSuffix(node, "-v4"), "-v6")] = true
		ea, ha := ownedEntries(a[name])
		eb, hb := ownedEntries(b[name])
		if a[name] != nil && b[name] != nil && !slices.Equal(ha, hb) {
			scoped = false
		}
		for _, pair := range [2][2]map[string]netip.Prefix{{ea, eb}, {eb, ea}} {
			for e, p := range pair[0] {
				if _, both := pair[1][e]; !both && !seen[p] {
					seen[p] = true
					scope = append(scope, p)
				}
			}
		}
	}
	if len(nodes) == 0 {
		return func(Peer) bool { return false }, nil
	}
	if !scoped {
		scope = nil
	}
	return func(p Peer) bool { return p.Relays || p.AS != as || nodes[p.Node] }, scope
}

// ownedEntries are the prefix-set entries of one owned statement (as
// statementsOf gives it), by a key of entry and lengths, and the next
// hops it accepts.
func ownedEntries(st *api.SetPoliciesRequest) (map[string]netip.Prefix, []string) {
	out := map[string]netip.Prefix{}
	if st == nil {
		return out, nil
	}
	for _, d := range st.DefinedSets {
		if d.DefinedType != api.DefinedType_PREFIX {
			continue
		}
		for _, e := range d.Prefixes {
			if p, err := netip.ParsePrefix(e.IpPrefix); err == nil {
				out[fmt.Sprintf("%s %d %d", e.IpPrefix, e.MaskLengthMin, e.MaskLengthMax)] = p
			}
		}
	}
	var hops []string
	for _, p := range st.Policies {
		for _, x := range p.Statements {
			hops = append(hops, x.GetConditions().GetNextHopInList()...)
		}
	}
	return out, hops
}

// statementsOf are the statements of req's policy name, each with the
// defined sets it uses, by name; and, in order, the names of those that
// are not a node's owned prefixes (whose order among themselves does not
// matter: each accepts its node's next hops only).
func statementsOf(req *api.SetPoliciesRequest, name string) (map[string]*api.SetPoliciesRequest, []string) {
	sets := map[string]*api.DefinedSet{}
	for _, d := range req.DefinedSets {
		sets[d.Name] = d
	}
	out := map[string]*api.SetPoliciesRequest{}
	var order []string
	for _, p := range req.Policies {
		if p.Name != name {
			continue
		}
		for _, st := range p.Statements {
			one := &api.SetPoliciesRequest{Policies: []*api.Policy{{Name: name, Statements: []*api.Statement{st}}}}
			if c := st.Conditions; c != nil {
				for _, used := range []string{c.GetNeighborSet().GetName(), c.GetPrefixSet().GetName()} {
					if d := sets[used]; d != nil {
						one.DefinedSets = append(one.DefinedSets, d)
					}
				}
			}
			out[st.Name] = one
			if !strings.HasPrefix(st.Name, ownedStmtPrefix) {
				order = append(order, st.Name)
			}
		}
	}
	return out, order
}

// policyPart is the policy named name of req with the defined sets its
// statements use: what decides the routes of that direction.
func policyPart(req *api.SetPoliciesRequest, name string) *api.SetPoliciesRequest {
	part := &api.SetPoliciesRequest{}
	used := map[string]bool{}
	for _, p := range req.Policies {
		if p.Name != name {
			continue
		}
		part.Policies = append(part.Policies, p)
		for _, st := range p.Statements {
			if c := st.Conditions; c != nil {
				used[c.GetNeighborSet().GetName()] = true
				used[c.GetPrefixSet().GetName()] = true
			}
		}
	}
	for _, d := range req.DefinedSets {
		if used[d.Name] {
			part.DefinedSets = append(part.DefinedSets, d)
		}
	}
	return part
}

// policyBuilder collects defined sets and statements.
type policyBuilder struct {
	sets             []*api.DefinedSet
	imports, exports []*api.Statement
}

func (b *policyBuilder) neighborSet(name string, addrs []netip.Addr) {
	list := []string{placeholder}
	for _, a := range addrs {
		list = append(list, netip.PrefixFrom(a, a.BitLen()).String())
	}
	sort.Strings(list[1:])
	b.sets = append(b.sets, &api.DefinedSet{DefinedType: api.DefinedType_NEIGHBOR, Name: name, List: list})
}

// prefixSets defines name-v4 and name-v6 from entries and returns the
// names of the non-empty ones (GoBGP's prefix sets hold one family).
func (b *policyBuilder) prefixSets(name string, entries []*api.Prefix) []string {
	var names []string
	for _, family := range []int{4, 6} {
		var list []*api.Prefix
		for _, e := range entries {
			if p := netip.MustParsePrefix(e.IpPrefix); familyOf(p.Addr()) == family {
				list = append(list, e)
			}
		}
		if len(list) == 0 {
			continue
		}
		sort.Slice(list, func(i, j int) bool {
			if list[i].IpPrefix != list[j].IpPrefix {
				return list[i].IpPrefix < list[j].IpPrefix
			}
			return list[i].MaskLengthMin < list[j].MaskLengthMin
		})
		n := fmt.Sprintf("%s-v%d", name, family)
		b.sets = append(b.sets, &api.DefinedSet{DefinedType: api.DefinedType_PREFIX, Name: n, Prefixes: list})
		names = append(names, n)
	}
	return names
}

// exact is an entry matching p only; orLonger p and anything inside it
// at least min long.
func exact(p netip.Prefix) *api.Prefix {
	return &api.Prefix{IpPrefix: p.String(), MaskLengthMin: uint32(p.Bits()), MaskLengthMax: uint32(p.Bits())}
}

func orLonger(p netip.Prefix, min int) *api.Prefix {
	return &api.Prefix{IpPrefix: p.String(), MaskLengthMin: uint32(max(min, p.Bits())), MaskLengthMax: uint32(p.Addr().BitLen())}
}

func stmt(name string, c *api.Conditions, action api.RouteAction) *api.Statement {
	return &api.Statement{Name: name, Conditions: c, Actions: &api.Actions{RouteAction: action}}
}

func inNeighbors(set string) *api.MatchSet {
	return &api.MatchSet{Type: api.MatchSet_ANY, Name: set}
}

// compilePolicies is the GoBGP form of f for the sessions peers.
func compilePolicies(f *Filters, peers []Peer) *api.SetPoliciesRequest {
	b := &policyBuilder{}
	var nodes, external, keepNH, reflectors []netip.Addr
	byBGPPeer := map[string][]netip.Addr{}
	reflects := slices.ContainsFunc(peers, func(p Peer) bool { return p.RRClient })
	for _, p := range peers {
		if reflects && p.Kind == KindReflector && !p.RRClient {
			reflectors = append(reflectors, p.Address)
		}
		if isNodeSession(p) {
			nodes = append(nodes, p.Address)
		} else {
			external = append(external, p.Address)
			byBGPPeer[p.BGPPeer] = append(byBGPPeer[p.BGPPeer], p.Address)
		}
		if p.KeepOriginalNextHop {
			keepNH = append(keepNH, p.Address)
		}
	}
	b.neighborSet(setNodes, nodes)
	b.neighborSet(setExternal, external)
	b.neighborSet(setKeepNextHop, keepNH)
	b.neighborSet(setReflectors, reflectors)
	// What this node originates passes GoBGP's import policy too.
	b.imports = append(b.imports, stmt("local", &api.Conditions{RouteType: api.Conditions_ROUTE_TYPE_LOCAL}, api.RouteAction_ACCEPT))
	// No route action: evaluation goes on to the filters below.
	b.imports = append(b.imports, &api.Statement{Name: setReflectors,
		Conditions: &api.Conditions{NeighborSet: inNeighbors(setReflectors)},
		Actions:    &api.Actions{LocalPref: &api.LocalPrefAction{Value: reflectorCopyPref}}})
	b.exports = append(b.exports, &api.Statement{Name: setKeepNextHop,
		Conditions: &api.Conditions{NeighborSet: inNeighbors(setKeepNextHop)},
		Actions:    &api.Actions{Nexthop: &api.NexthopAction{Unchanged: true}}})
	b.nodeImports(f, nodes)
	b.peerRules(f, byBGPPeer)
	b.externalDefaults(f)
	return &api.SetPoliciesRequest{DefinedSets: b.sets, Policies: []*api.Policy{
		{Name: importPolicy, Statements: b.imports},
		{Name: exportPolicy, Statements: b.exports},
	}}
}

// nodeImports: from nodes, reject what is forbidden, accept what IPAM
// gives to the route's next hop, reject the rest.
func (b *policyBuilder) nodeImports(f *Filters, nodes []netip.Addr) {
	if len(nodes) == 0 {
		return
	}
	var forbidden []*api.Prefix
	for _, p := range []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")} {
		forbidden = append(forbidden, exact(p))
	}
	for a := range f.nodeAddrs {
		forbidden = append(forbidden, exact(netip.PrefixFrom(a, a.BitLen())))
	}
	for p := range f.nodeSubnets {
		if !p.IsSingleIP() {
			forbidden = append(forbidden, exact(p))
		}
	}
	for _, s := range f.services {
		forbidden = append(forbidden, orLonger(s, 0))
	}
	for _, set := range b.prefixSets("tabby-forbidden", dedupe(forbidden)) {
		b.imports = append(b.imports, stmt("forbidden-"+set, &api.Conditions{NeighborSet: inNeighbors(setNodes),
			PrefixSet: &api.MatchSet{Type: api.MatchSet_ANY, Name: set}}, api.RouteAction_REJECT))
	}
	for _, o := range f.ownerNodes {
		var entries []*api.Prefix
		for _, op := range o.owned {
			if op.block {
				entries = append(entries, orLonger(op.prefix, 0))
			} else {
				entries = append(entries, exact(op.prefix))
			}
		}
		var hops []string
		for _, a := range o.addrs {
			hops = append(hops, a.String())
		}
		for _, set := range b.prefixSets(nodeSetPrefix+o.name, dedupe(entries)) {
			b.imports = append(b.imports, stmt("owned-"+set, &api.Conditions{NeighborSet: inNeighbors(setNodes),
				PrefixSet: &api.MatchSet{Type: api.MatchSet_ANY, Name: set}, NextHopInList: hops}, api.RouteAction_ACCEPT))
		}
	}
	b.imports = append(b.imports, stmt("nodes-rest", &api.Conditions{NeighborSet: inNeighbors(setNodes)}, api.RouteAction_REJECT))
}

// peerRules: the BGPFilter rules of each BGPPeer with sessions here.
func (b *policyBuilder) peerRules(f *Filters, byBGPPeer map[string][]netip.Addr) {
	names := make([]string, 0, len(byBGPPeer))
	for n := range byBGPPeer {
		if _, ok := f.peers[n]; ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		set := "tabby-peer-" + n
		b.neighborSet(set, byBGPPeer[n])
		pr := f.peers[n]
		b.imports = append(b.imports, b.rules(set, "import", pr.imports)...)
		b.exports = append(b.exports, b.rules(set, "export", pr.exports)...)
	}
}

func (b *policyBuilder) rules(neighbors, dir string, rules []FilterRule) []*api.Statement {
	out := make([]*api.Statement, 0, len(rules))
	for i, r := range rules {
		c := &api.Conditions{NeighborSet: inNeighbors(neighbors)}
		if !r.CIDR.IsValid() {
			c.AfiSafiIn = []*api.Family{familyV4}
			if r.Family == 6 {
				c.AfiSafiIn = []*api.Family{familyV6}
			}
		} else {
			entry, match := orLonger(r.CIDR, 0), api.MatchSet_ANY
			switch r.Op {
			case "Equal":
				entry = exact(r.CIDR)
			case "NotIn":
				match = api.MatchSet_INVERT
			}
			name := fmt.Sprintf("%s-%s-%d", neighbors, dir, i)
			c.PrefixSet = &api.MatchSet{Type: match, Name: b.prefixSets(name, []*api.Prefix{entry})[0]}
		}
		action := api.RouteAction_REJECT
		if r.Accept {
			action = api.RouteAction_ACCEPT
		}
		out = append(out, stmt(fmt.Sprintf("%s-%s-%d", neighbors, dir, i), c, action))
	}
	return out
}

// externalDefaults: from external peers, everything but tabby's own
// ranges; to them, pod blocks and addresses and the service CIDRs; to
// nodes, pod blocks and addresses.
func (b *policyBuilder) externalDefaults(f *Filters) {
	own := []*api.Prefix{exact(netip.MustParsePrefix("0.0.0.0/0")), exact(netip.MustParsePrefix("::/0"))}
	var blocks, services []*api.Prefix
	for a := range f.nodeAddrs {
		own = append(own, exact(netip.PrefixFrom(a, a.BitLen())))
	}
	for _, p := range f.pools {
		own = append(own, orLonger(p.cidr, 0))
		blocks = append(blocks, orLonger(p.cidr, p.blockSize))
	}
	for _, s := range f.services {
		own = append(own, orLonger(s, 0))
		services = append(services, orLonger(s, 0))
	}
	for _, set := range b.prefixSets("tabby-own", dedupe(own)) {
		b.imports = append(b.imports, stmt("own-"+set, &api.Conditions{NeighborSet: inNeighbors(setExternal),
			PrefixSet: &api.MatchSet{Type: api.MatchSet_ANY, Name: set}}, api.RouteAction_REJECT))
	}
	b.imports = append(b.imports, stmt("external-rest", &api.Conditions{NeighborSet: inNeighbors(setExternal)}, api.RouteAction_ACCEPT))
	for _, set := range b.prefixSets("tabby-services", dedupe(services)) {
		b.exports = append(b.exports, stmt("services-"+set, &api.Conditions{NeighborSet: inNeighbors(setExternal),
			PrefixSet: &api.MatchSet{Type: api.MatchSet_ANY, Name: set}}, api.RouteAction_ACCEPT))
	}
	for _, set := range b.prefixSets("tabby-blocks", dedupe(blocks)) {
		b.exports = append(b.exports, stmt("blocks-"+set, &api.Conditions{
			PrefixSet: &api.MatchSet{Type: api.MatchSet_ANY, Name: set}}, api.RouteAction_ACCEPT))
	}
}

// dedupe drops repeated entries (GoBGP refuses none, but they are noise).
func dedupe(list []*api.Prefix) []*api.Prefix {
	seen := map[string]bool{}
	out := list[:0]
	for _, p := range list {
		k := fmt.Sprintf("%s %d %d", p.IpPrefix, p.MaskLengthMin, p.MaskLengthMax)
		if !seen[k] {
			seen[k] = true
			out = append(out, p)
		}
	}
	return out
}
