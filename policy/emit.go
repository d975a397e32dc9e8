package policy

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// selectLocal finds, for every local pod, the policies selecting it.
// Policies are sorted, so each pod's lists are too.
func (c *compiler) selectLocal() {
	for _, p := range c.policies {
		for _, g := range c.localNs[p.ns] {
			if !p.sel.Matches(g.labels) {
				continue
			}
			for _, ep := range g.eps {
				if p.ingress {
					ep.in = append(ep.in, p)
					p.used[dirIngress] = true
				}
				if p.egress {
					ep.eg = append(ep.eg, p)
					p.used[dirEgress] = true
				}
			}
		}
	}
}

func (p *cpolicy) chain(dir direction) string {
	if p.chains[dir] != "" {
		return p.chains[dir] // named when checked
	}
	if dir == dirIngress {
		return chainName(kindPolicyIngress, p.key)
	}
	return chainName(kindPolicyEgress, p.key)
}

// rulesOf are the policy's valid rules in dir.
func (p *cpolicy) rulesOf(dir direction) []*crule {
	if dir == dirEgress {
		return p.eg
	}
	return p.in
}

// signature is one distinct combination of policies selecting local pods
// in one direction: a TABBY-NP-E-/I- chain and its dispatch set.
type signature struct {
	name string // the chain
	hash string // the hash in its name, which the set's name repeats
	dir  direction
	keys []string // of cnps then pols
	cnps []*ccnp  // in the order they run
	pols []*cpolicy
	eps  []*endpoint // the local pods it selects, sorted
	keep [2]bool     // by family: Input.Keep holds it
}

// setName is the name of the signature's dispatch set in one family.
func (s *signature) setName(fam int) string {
	if s.dir == dirEgress {
		return hashedSetName(setKindEgress, fam, s.hash)
	}
	return hashedSetName(setKindIngress, fam, s.hash)
}

// emit builds the Ruleset from the selected policies: the policies' own
// chains, then per family the fixed chains, the dispatch to a chain per
// signature and those chains; everything sorted so equal inputs give equal
// output.
func (c *compiler) emit() *Ruleset {
	sigs := c.signatures()
	for _, p := range c.policies {
		c.policyChains(p)
	}
	for _, p := range c.cnps {
		c.cnpChains(p)
	}
	for fam, family := range families {
		c.emitFamily(fam, family, sigs)
	}
	c.dropUnnamedSets()
	c.rs.Denials = c.denials(sigs)
	c.sortRuleset()
	rs := c.rs
	return &rs
}

// signatures groups the local pods by the policies selecting them, one
// signature per direction and combination, in name order, and lists the
// local pods as programmed.
func (c *compiler) signatures() []*signature {
	sigs := map[string]*signature{}
	sigOf := func(dir direction, cnps []*ccnp, pols []*cpolicy) *signature {
		if len(pols) > 0 {
			// Baseline never runs for a pod a NetworkPolicy selects:
			// pods differing only in Baseline policies share a chain.
			cnps = slices.DeleteFunc(slices.Clone(cnps), func(p *ccnp) bool { return !p.admin })
		}
		keys := make([]string, 0, len(cnps)+len(pols))
		for _, p := range cnps {
			keys = append(keys, p.key)
		}
		for _, p := range pols {
			keys = append(keys, p.key)
		}
		kind := kindPodIngress
		if dir == dirEgress {
			kind = kindPodEgress
		}
		h := hash(keys...)
		name := PolicyChainPrefix + kind + h
		s := sigs[name]
		if s == nil {
			s = &signature{name: name, hash: h, dir: dir, keys: keys, cnps: cnps, pols: pols}
			sigs[name] = s
		}
		return s
	}
	for _, ep := range c.locals {
		if ep.selected(dirEgress) {
			s := sigOf(dirEgress, ep.cnp[dirEgress], ep.eg)
			s.eps = append(s.eps, ep)
		}
		if ep.selected(dirIngress) {
			s := sigOf(dirIngress, ep.cnp[dirIngress], ep.in)
			s.eps = append(s.eps, ep)
		}
		c.rs.Programmed = append(c.rs.Programmed, ep.key)
	}
	c.keptSignatures(sigOf)
	names := slices.Sorted(maps.Keys(sigs))
	out := make([]*signature, len(names))
	for i, n := range names {
		out[i] = sigs[n]
	}
	return out
}

// keptSignatures adds Input.Keep's combinations to the signatures
// (sigOf), marking the policies they run used, and leaves out those that
// are not a combination of this input's policies a pod could have.
func (c *compiler) keptSignatures(sigOf func(direction, []*ccnp, []*cpolicy) *signature) {
	if len(c.in.Keep) == 0 {
		return
	}
	cnpAt := make(map[string]int, len(c.cnps))
	for i, p := range c.cnps {
		cnpAt[p.key] = i
	}
	polAt := make(map[string]int, len(c.policies))
	for i, p := range c.policies {
		polAt[p.key] = i
	}
	for _, k := range c.in.Keep {
		fam := slices.Index(families[:], k.Family)
		d := slices.IndexFunc(allDirections[:], func(d direction) bool { return d.String() == k.Direction })
		if fam < 0 || d < 0 || len(k.Policies) == 0 {
			continue
		}
		dir := allDirections[d]
		cnps, pols, ok := c.keptPolicies(k.Policies, dir, cnpAt, polAt)
		if !ok {
			continue
		}
		s := sigOf(dir, cnps, pols)
		s.keep[fam] = true
		for _, p := range s.cnps {
			p.used[dir] = true
		}
		for _, p := range s.pols {
			p.used[dir] = true
		}
	}
}

// keptPolicies resolves the keys of a kept combination: the
// ClusterNetworkPolicies in the order they run, then the NetworkPolicies
// in theirs, each once and each with rules (or isolation) in dir, and no
// Baseline policy with NetworkPolicies (they never run together).
func (c *compiler) keptPolicies(keys []string, dir direction, cnpAt, polAt map[string]int) (cnps []*ccnp, pols []*cpolicy, ok bool) {
	lastCNP, lastPol := -1, -1
	for _, key := range keys {
		if i, found := cnpAt[key]; found {
			p := c.cnps[i]
			if len(pols) > 0 || i <= lastCNP || len(p.rulesOf(dir)) == 0 {
				return nil, nil, false
			}
			cnps, lastCNP = append(cnps, p), i
			continue
		}
		i, found := polAt[key]
		if !found || i <= lastPol {
			return nil, nil, false
		}
		p := c.policies[i]
		if dir == dirIngress && !p.ingress || dir == dirEgress && !p.egress {
			return nil, nil, false
		}
		pols, lastPol = append(pols, p), i
	}
	if len(pols) > 0 && slices.ContainsFunc(cnps, func(p *ccnp) bool { return !p.admin }) {
		return nil, nil, false
	}
	return cnps, pols, true
}

// selected says whether any policy (NetworkPolicy or
// ClusterNetworkPolicy) selects the local pod in dir.
func (ep *endpoint) selected(dir direction) bool {
	if dir == dirEgress {
		return len(ep.eg) > 0 || len(ep.cnp[dirEgress]) > 0
	}
	return len(ep.in) > 0 || len(ep.cnp[dirIngress]) > 0
}

// ifaceMatches are the -i/-o arguments for local pods' veths (pre) and,
// when the veth prefix covers them, tabby's own devices (dev, else "").
func (c *compiler) ifaceMatches() (pre, dev string) {
	pre = c.prefix + "+"
	if c.excludeDevices() {
		dev = DeviceIfacePrefix + "+"
	}
	return pre, dev
}

// emitFamily adds the chains of one family.
func (c *compiler) emitFamily(fam int, family string, sigs []*signature) {
	add := func(name string, rules [][]string) {
		c.rs.Chains = append(c.rs.Chains, Chain{Name: name, Family: family, Rules: rules})
	}
	pre, dev := c.ifaceMatches()
	add(ChainForward, forwardRules(pre, dev))
	add(ChainPod, podRules(pre))
	from, to, buckets, present := c.dispatchRules(fam, family, dev, sigs)
	add(ChainFromPod, from)
	add(ChainToPod, to)
	c.rs.Chains = append(c.rs.Chains, buckets...)
	// The policies' chains of the family are those its signature chains
	// jump to: with no local pod of the family under a policy, its chain
	// would be unreachable there (and the sets only it names, empty or
	// not, made for nothing; emit leaves those out too).
	named := map[string]bool{}
	for _, s := range present {
		rules := c.sigRules(s)
		add(s.name, rules)
		for _, r := range rules {
			if i := slices.Index(r, "-j"); i >= 0 && i+1 < len(r) {
				named[r[i+1]] = true
			}
		}
	}
	for _, p := range c.policies {
		for _, dir := range allDirections {
			if p.used[dir] && named[p.chain(dir)] {
				add(p.chain(dir), p.rules[dir][fam])
			}
		}
	}
	for _, p := range c.cnps {
		for _, dir := range allDirections {
			if p.used[dir] && named[p.chain(dir)] {
				add(p.chain(dir), p.rules[dir][fam])
			}
		}
	}
}

// dropUnnamedSets leaves out of the Ruleset the sets no rule names: those
// of policy rules in a family where the policy's chain is left out
// (emitFamily).
func (c *compiler) dropUnnamedSets() {
	named := map[string]bool{}
	for _, ch := range c.rs.Chains {
		for _, r := range ch.Rules {
			for i := 0; i+1 < len(r); i++ {
				if r[i] == "--match-set" {
					named[r[i+1]] = true
				}
			}
		}
	}
	maps.DeleteFunc(c.sets, func(name string, _ *Set) bool { return !named[name] })
}

// forwardRules send traffic in from or out to a local pod's veth to
// ChainPod, letting tabby's own devices (dev, when not "") pass.
func forwardRules(pre, dev string) [][]string {
	if dev == "" {
		return [][]string{
			{"-i", pre, "-j", ChainPod},
			{"-o", pre, "-j", ChainPod},
		}
	}
	return [][]string{
		{"-i", dev, "-o", dev, "-j", "RETURN"},
		{"-i", dev, "-o", pre, "-j", ChainPod},
		{"-i", dev, "-j", "RETURN"},
		{"-i", pre, "-j", ChainPod},
		{"-o", dev, "-j", "RETURN"},
		{"-o", pre, "-j", ChainPod},
	}
}

func podRules(pre string) [][]string {
	return [][]string{
		{"-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"},
		{"-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"},
		{"-i", pre, "-j", ChainFromPod},
		{"-o", pre, "-j", ChainToPod},
		{"-j", "MARK", "--set-xmark", markClear},
		{"-j", "ACCEPT"},
	}
}

// dispatchRules are the rules of ChainFromPod and ChainToPod in one
// family, the bucket chains they send to when there are many, and make
// the sets they name. A signature none of whose pods has an address of
// the family (an IPv4-only pod's in IPv6) has neither set nor rule nor
// chain in it: the rule of an empty set matches nothing, so the packet is
// dispatched as before, and a node of single-stack pods makes each
// signature's set and chain once, not twice. present are the signatures
// that have them.
func (c *compiler) dispatchRules(fam int, family, dev string, sigs []*signature) (from, to [][]string, buckets []Chain, present []*signature) {
	// Dispatch: a rule per combination of policies, its pods in a set.
	var fromSigs, toSigs []sigDispatch
	for _, s := range sigs {
		set := s.setName(fam)
		m := c.ifaceMembers(fam, s.eps)
		if len(m) == 0 && !s.keep[fam] {
			continue
		}
		c.addIfaceSet(set, fam, m)
		present = append(present, s)
		c.rs.Signatures = append(c.rs.Signatures, Signature{Chain: s.name, Family: family,
			Direction: s.dir.String(), Policies: s.keys, Pods: len(m)})
		if s.dir == dirEgress {
			fromSigs = append(fromSigs, sigDispatch{s, m, []string{"-m", "set", "--match-set", set, "src,src", "-g", s.name}})
		} else {
			toSigs = append(toSigs, sigDispatch{s, m, []string{"-m", "set", "--match-set", set, "dst,dst", "-g", s.name}})
		}
	}
	var fromTail, toTail [][]string
	if c.in.DenyUnlisted {
		eg, in := c.unselectedSets(fam, family)
		fromTail = [][]string{{"-m", "set", "--match-set", eg, "src,src", "-j", "RETURN"}}
		toTail = [][]string{{"-m", "set", "--match-set", in, "dst,dst", "-j", "RETURN"}}
		if dev != "" {
			fromTail = append(fromTail, []string{"-i", dev, "-j", "RETURN"})
			toTail = append(toTail, []string{"-o", dev, "-j", "RETURN"})
		}
		fromTail = dropRules(fromTail, nil, c.logRule(UnlistedLogPrefix(true)))
		toTail = dropRules(toTail, nil, c.logRule(UnlistedLogPrefix(false)))
	}
	from, fromBuckets := c.bucketed(fam, family, dirEgress, fromSigs, fromTail)
	to, toBuckets := c.bucketed(fam, family, dirIngress, toSigs, toTail)
	return from, to, append(fromBuckets, toBuckets...), present
}

// sigDispatch is a signature's dispatch rule in one family and its set's
// members.
type sigDispatch struct {
	s       *signature
	members []string
	rule    []string
}

// DispatchBuckets is how many bucket chains a dispatch chain
// (ChainFromPod, ChainToPod) spreads its signatures' rules over when it
// has more than DispatchFlatMax of them.
//
// A new connection's first packet meets the dispatch rules in turn until
// its pod's set matches, and each is a set lookup (about 170 ns through
// iptables-nft's compatibility layer, measured: BenchmarkNetpolConnRate).
// With a rule per combination of policies, a node of 110 pods can have a
// hundred of them, 17 µs before the first policy rule, in each direction.
// Over DispatchFlatMax, the dispatch chain instead tests one set per
// bucket: the union of its signatures' sets, and sends the packet to the
// bucket's chain (ChainFromPod or ChainToPod + "-" + the bucket in hex),
// which holds the rules of those signatures: at most 16 lookups plus a
// bucket's share (a sixteenth) of the signatures.
//
// A signature's bucket comes from its hash, not from the others, so a pod
// changing labels still changes set members only (its old and new
// signatures' sets and buckets' sets), and rules change only as they did:
// when a combination gains its first pod or loses its last. A bucket
// chain ends as its dispatch chain does (the unselected pods' set, the
// drop of unknown pods, with DenyUnlisted), so a pod found in a bucket's
// set but in none of its signatures' is treated as a pod in no
// signature's set would be. The applier adds members in set name order
// and removes them in reverse (bucket sets, 'f' and 't', sort after the
// signatures' 'e' and 'i'), so a moving pod is in a signature's set
// whenever it is in that signature's bucket's set.
const (
	DispatchBuckets = 16
	DispatchFlatMax = 32
)

// dispatchFlatMax is DispatchFlatMax; tests lower it to run their worlds
// through buckets.
var dispatchFlatMax = DispatchFlatMax

// bucketed returns the rules of one dispatch chain given its signatures'
// rules and its tail, and the bucket chains they need (none when there
// are at most dispatchFlatMax signatures).
func (c *compiler) bucketed(fam int, family string, dir direction, sigs []sigDispatch, tail [][]string) (rules [][]string, chains []Chain) {
	if len(sigs) <= dispatchFlatMax {
		rules = make([][]string, 0, len(sigs)+len(tail))
		for _, d := range sigs {
			rules = append(rules, d.rule)
		}
		return append(rules, tail...), nil
	}
	var by [DispatchBuckets][]sigDispatch
	for _, d := range sigs {
		b := bucketOf(d.s.hash)
		by[b] = append(by[b], d)
	}
	parent, kind, match := ChainToPod, byte(setKindToBucket), "dst,dst"
	if dir == dirEgress {
		parent, kind, match = ChainFromPod, setKindFromBucket, "src,src"
	}
	for b, ds := range by {
		if len(ds) == 0 {
			continue
		}
		name := fmt.Sprintf("%s-%x", parent, b)
		set := setName(kind, fam, name)
		var m []string
		brules := make([][]string, 0, len(ds)+len(tail))
		for _, d := range ds {
			m = append(m, d.members...)
			brules = append(brules, d.rule)
		}
		slices.Sort(m)
		c.addIfaceSet(set, fam, m)
		rules = append(rules, []string{"-m", "set", "--match-set", set, match, "-g", name})
		chains = append(chains, Chain{Name: name, Family: family, Rules: append(brules, tail...)})
	}
	return append(rules, tail...), chains
}

// bucketOf is the dispatch bucket of a signature with hash h (base32).
func bucketOf(h string) int {
	return strings.IndexByte(base32Alphabet, h[0]) % DispatchBuckets
}

const base32Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"

// unselectedSets makes the sets of the local pods no policy selects for
// egress and for ingress in one family, and returns their names.
func (c *compiler) unselectedSets(fam int, family string) (eg, in string) {
	var openEg, openIn []*endpoint
	for _, ep := range c.locals {
		if !ep.selected(dirEgress) {
			openEg = append(openEg, ep)
		}
		if !ep.selected(dirIngress) {
			openIn = append(openIn, ep)
		}
	}
	eg, in = UnselectedSetName(family, true), UnselectedSetName(family, false)
	c.addIfaceSet(eg, fam, c.ifaceMembers(fam, openEg))
	c.addIfaceSet(in, fam, c.ifaceMembers(fam, openIn))
	return eg, in
}

// rules are the signature's chain, the tiers in order. Admin: each
// ClusterNetworkPolicy's chain in turn (a Deny drops; the first decision
// of the tier stops the others' rules), an Accept returns, a Pass or no
// decision clears the marks and goes on. NetworkPolicy: each policy's
// chain in turn, the first to mark the packet accepts it, and none drops
// it (after log, when not nil, logs it). Only without NetworkPolicies,
// Baseline: as Admin, and what it leaves undecided (or passes) returns,
// allowed.
func (s *signature) rules(log []string) [][]string {
	rules := [][]string{{"-j", "MARK", "--set-xmark", markClear}}
	jump := func(key, chain string) {
		rules = append(rules, []string{"-m", "comment", "--comment", comment(key), "-j", chain})
	}
	admin := 0
	for _, p := range s.cnps {
		if p.admin {
			jump(p.comment(), p.chain(s.dir))
			admin++
		}
	}
	if admin > 0 {
		rules = append(rules,
			[]string{"-m", "mark", "--mark", markSet, "-j", "RETURN"},
			[]string{"-j", "MARK", "--set-xmark", markClear})
	}
	if len(s.pols) == 0 {
		for _, p := range s.cnps[admin:] {
			jump(p.comment(), p.chain(s.dir))
		}
		return rules
	}
	for _, p := range s.pols {
		jump(p.key, p.chain(s.dir))
		rules = append(rules, []string{"-m", "mark", "--mark", markSet, "-j", "RETURN"})
	}
	if log != nil {
		rules = append(rules, log)
	}
	return append(rules, []string{"-j", "DROP"})
}

// sortRuleset puts the chains, sets and problems in order and adds the
// jump from FORWARD.
func (c *compiler) sortRuleset() {
	// Names are unique within a family.
	slices.SortFunc(c.rs.Chains, func(a, b Chain) int {
		if c := strings.Compare(a.Family, b.Family); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})

	for _, s := range c.sets {
		c.rs.Sets = append(c.rs.Sets, *s)
	}
	slices.SortFunc(c.rs.Sets, func(a, b Set) int { return strings.Compare(a.Name, b.Name) })

	c.rs.Jumps = []Jump{{Chain: "FORWARD", Rule: []string{"-m", "comment", "--comment", jumpComment, "-j", ChainForward}}}

	sort.SliceStable(c.rs.Problems, func(i, j int) bool {
		a, b := c.rs.Problems[i], c.rs.Problems[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		return a.Message < b.Message
	})
}

// excludeDevices says whether names with the veth prefix may be tabby's
// own devices.
func (c *compiler) excludeDevices() bool {
	return len(c.prefix) < len(DeviceIfacePrefix) && strings.HasPrefix(DeviceIfacePrefix, c.prefix)
}

func cat(parts ...[]string) []string {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	out := make([]string, 0, n)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

var markRule = []string{"-j", "MARK", "--set-xmark", markSet}

// policyRules are the rules of one policy chain in one family and
// direction (which says whether the peer is the source or destination).
func (c *compiler) policyRules(rules []*crule, dir direction, fam int) [][]string {
	out := [][]string{}
	for _, r := range rules {
		for _, m := range c.ruleMatches(r, dir, fam) {
			out = append(out, cat(m, markRule))
		}
	}
	return out
}

// ruleMatches are the alternative matches (port match, then peer match)
// of one rule in one family and direction; none when every peer is of the
// other family.
func (c *compiler) ruleMatches(r *crule, dir direction, fam int) [][]string {
	var peers [][]string
	if r.allPeers {
		peers = [][]string{nil}
	} else {
		for i := range r.podGroups {
			peers = append(peers, []string{"-m", "set", "--match-set", c.podSet(&r.podGroups[i], fam), dir.peerMatch()})
		}
		if nets := c.ruleNets(r); len(nets[fam]) > 0 {
			peers = append(peers, []string{"-m", "set", "--match-set", c.netSet(nets[fam], fam), dir.peerMatch()})
		}
	}
	if len(peers) == 0 {
		return nil // every peer is of the other family
	}
	var out [][]string
	for _, pm := range c.portMatches(r, fam, dir == dirIngress) {
		for _, pe := range peers {
			out = append(out, cat(pm, pe))
		}
	}
	return out
}

// policyChains computes the rules of a policy's chains, in the directions
// in which it selects a local pod, and checks them against the limits:
// within them, the sets they name join the Ruleset; over them, the
// policy is reported and its chains are empty, so it isolates its pods
// and allows them nothing (fail closed), and its sets are not made.
func (c *compiler) policyChains(p *cpolicy) {
	if !p.used[dirIngress] && !p.used[dirEgress] {
		return
	}
	over, limit := c.limitedRules(p.used, &p.rules, func(dir direction, fam int) [][]string {
		return c.policyRulesOf(p, dir, fam)
	})
	if over == "" {
		return
	}
	c.rs.Problems = append(c.rs.Problems, Problem{Namespace: p.ns, Name: p.name, Kind: KindNetworkPolicy, Limit: limit,
		Message: over + ": the policy is not enforced as written: it isolates the pods it selects for " + strings.Join(p.types(), " and ") +
			" and allows them nothing (fail closed) until it is made smaller or the limit is raised"})
	for dir := range p.rules {
		for fam := range p.rules[dir] {
			p.rules[dir][fam] = [][]string{}
		}
	}
}

// limitedRules fills rules with gen's rules in the directions used and
// checks them against the limits: within them, the sets they name join
// the Ruleset and it returns ""; over them, it says what is over and the
// flag that raises the limit, and the sets are not made.
func (c *compiler) limitedRules(used [directions]bool, rules *[directions][2][][]string, gen func(direction, int) [][]string) (over, flag string) {
	// One map serves every policy of the compile: most name few sets.
	if c.curBuf == nil {
		c.curBuf = map[string]*Set{}
	}
	clear(c.curBuf)
	c.cur = c.curBuf
	defer func() { c.cur = nil }()
	most := 0
	for fam := range families {
		n := 0
		for _, dir := range allDirections {
			if used[dir] {
				rules[dir][fam] = gen(dir, fam)
				n += len(rules[dir][fam])
			}
		}
		most = max(most, n)
	}
	if over, flag = c.overLimits(most); over == "" {
		for name, s := range c.cur {
			c.sets[name] = s
		}
	}
	return over, flag
}

// overLimits says which limit the sets in c.cur and a policy's rules (the
// most of one family) are over, naming the flag that raises it; "" when
// within them.
func (c *compiler) overLimits(rules int) (msg, flag string) {
	l := c.limits
	for _, s := range c.cur {
		if len(s.Members) <= l.SetMembers {
			continue
		}
		// The first set over the limit by name, so that the message
		// is the same every time.
		for _, n := range slices.Sorted(maps.Keys(c.cur)) {
			if m := len(c.cur[n].Members); m > l.SetMembers {
				return fmt.Sprintf("its %s make the ipset %s of %d members, over the limit of %d members per set (tabbyd --%s)",
					setContent(n), n, m, l.SetMembers, FlagMaxSetMembers), FlagMaxSetMembers
			}
		}
	}
	if len(c.cur) > l.Sets {
		return fmt.Sprintf("its rules name %d ipsets, over the limit of %d per policy (tabbyd --%s)", len(c.cur), l.Sets, FlagMaxPolicySets), FlagMaxPolicySets
	}
	if rules > l.Rules {
		return fmt.Sprintf("its rules make %d iptables rules, over the limit of %d per policy (tabbyd --%s)", rules, l.Rules, FlagMaxRules), FlagMaxRules
	}
	return "", ""
}

// setContent says what a set of a policy holds, from its name.
func setContent(name string) string {
	switch name[len(SetPrefix)] {
	case setKindNets:
		return "ipBlocks"
	case setKindPods:
		return "selector peers' pods"
	}
	return "named ports"
}

// portMatches are the alternatives of a rule's ports: {nil} for any port.
// ingress says the rule is an ingress rule, whose destination is always a
// local pod (named ports resolve against the local pods' alone).
func (c *compiler) portMatches(r *crule, fam int, ingress bool) [][]string {
	if r.allPorts {
		return [][]string{nil}
	}
	var out [][]string
	for _, proto := range []string{"tcp", "udp", "sctp"} {
		all := false
		var ranges [][2]int32
		var names []string
		for _, p := range r.ports {
			if p.proto != proto {
				continue
			}
			switch {
			case p.all:
				all = true
			case p.name != "":
				names = append(names, p.name)
			default:
				ranges = append(ranges, [2]int32{p.lo, p.hi})
			}
		}
		if all {
			out = append(out, []string{"-p", proto})
			continue
		}
		out = append(out, portRanges(proto, mergeRanges(ranges))...)
		slices.Sort(names)
		for _, n := range slices.Compact(names) {
			out = append(out, []string{"-p", proto, "-m", "set", "--match-set", c.namedSet(n, fam, ingress), "dst,dst"})
		}
	}
	return out
}

func mergeRanges(in [][2]int32) [][2]int32 {
	if len(in) == 0 {
		return nil
	}
	slices.SortFunc(in, func(a, b [2]int32) int {
		if a[0] != b[0] {
			return int(a[0] - b[0])
		}
		return int(a[1] - b[1])
	})
	out := [][2]int32{in[0]}
	for _, r := range in[1:] {
		last := &out[len(out)-1]
		if r[0] <= last[1]+1 {
			last[1] = max(last[1], r[1])
			continue
		}
		out = append(out, r)
	}
	return out
}

// multiportSlots is how many ports one multiport match takes (a range
// counts two).
const multiportSlots = 15

func portRanges(proto string, ranges [][2]int32) [][]string {
	str := func(r [2]int32) string {
		if r[0] == r[1] {
			return strconv.Itoa(int(r[0]))
		}
		return strconv.Itoa(int(r[0])) + ":" + strconv.Itoa(int(r[1]))
	}
	var out [][]string
	for len(ranges) > 0 {
		n, slots := 0, 0
		for n < len(ranges) {
			s := 1
			if ranges[n][0] != ranges[n][1] {
				s = 2
			}
			if slots+s > multiportSlots {
				break
			}
			slots += s
			n++
		}
		chunk := ranges[:n]
		ranges = ranges[n:]
		if len(chunk) == 1 {
			out = append(out, []string{"-p", proto, "-m", proto, "--dport", str(chunk[0])})
			continue
		}
		ps := make([]string, len(chunk))
		for i, r := range chunk {
			ps[i] = str(r)
		}
		out = append(out, []string{"-p", proto, "-m", "multiport", "--dports", strings.Join(ps, ",")})
	}
	return out
}

// podSet names the hash:ip set of one group of a rule's selector peers in
// one family, computing the members of both families the first time. Sets
// are keyed by the group's key, so every rule (of any policy, in any
// namespace) with the same group shares one.
func (c *compiler) podSet(g *podGroup, fam int) string {
	c.record(func(c *compiler) { c.podSet(g, fam) })
	ps := c.podSets[g.key]
	if ps == nil {
		m := c.membersOf(g)
		ps = &podSet{names: m.names}
		c.podSets[g.key] = ps
		for f := range families {
			c.made[ps.names[f]] = &Set{Name: ps.names[f], Type: SetHashIP, Family: families[f], Members: m.members[f]}
		}
	}
	return c.use(ps.names[fam])
}

// use records that the policy being emitted names the set, which is in
// c.made.
func (c *compiler) use(name string) string {
	c.cur[name] = c.made[name]
	return name
}

type podSet struct{ names [2]string }

func (c *compiler) podMembers(peers []podPeer) [2][]string {
	var ranks []int
	c.stampGen++
	for _, x := range peers {
		nss := []string{x.ns}
		if x.nsSel != nil {
			nss = c.matchNamespaces(x)
		}
		for _, ns := range nss {
			for _, g := range c.byNs[ns] {
				if !x.podSel.Matches(g.labels) {
					continue
				}
				for _, ep := range g.eps {
					if c.stamp[ep.idx] == c.stampGen {
						continue
					}
					c.stamp[ep.idx] = c.stampGen
					ranks = append(ranks, ep.ranks...)
				}
			}
		}
	}
	slices.Sort(ranks)
	ranks = slices.Compact(ranks)
	var out [2][]string
	for _, r := range ranks {
		f := c.addrFam[r]
		out[f] = append(out[f], c.addrs[r])
	}
	return out
}

func (c *compiler) matchNamespaces(x podPeer) []string {
	if nss, ok := c.nsSel[x.nsKey]; ok {
		return nss
	}
	if c.nsNames == nil {
		c.nsNames = make([]string, 0, len(c.nsLabels))
		for n := range c.nsLabels {
			c.nsNames = append(c.nsNames, n)
		}
		sort.Strings(c.nsNames)
	}
	nss := []string{}
	for _, n := range c.nsNames {
		if x.nsSel.Matches(c.nsLabels[n]) {
			nss = append(nss, n)
		}
	}
	c.nsSel[x.nsKey] = nss
	return nss
}

// ruleNets gives the exact CIDRs of a rule's ipBlocks, computed once per
// distinct list of blocks.
func (c *compiler) ruleNets(r *crule) *[2][]string {
	if r.nets != nil || len(r.blocks) == 0 {
		if r.nets == nil {
			r.nets = &[2][]string{}
		}
		return r.nets
	}
	var b strings.Builder
	for _, x := range r.blocks {
		b.WriteString(x.cidr.String())
		for _, e := range x.except {
			b.WriteByte(' ')
			b.WriteString(e.String())
		}
		b.WriteByte(';')
	}
	key := b.String()
	if n, ok := c.netMemo[key]; ok {
		r.nets = n
		return n
	}
	n := &[2][]string{}
	n[0], n[1] = netMembers(r.blocks)
	c.netMemo[key] = n
	r.nets = n
	return n
}

// netSet names the hash:net set holding exactly these CIDRs.
func (c *compiler) netSet(members []string, fam int) string {
	c.record(func(c *compiler) { c.netSet(members, fam) })
	name := setName(setKindNets, fam, members...)
	if c.made[name] == nil {
		c.made[name] = &Set{Name: name, Type: SetHashNet, Family: families[fam], Members: members}
	}
	return c.use(name)
}

// ifaceMembers are the members of a hash:net,iface set of one family
// holding "<address>,<veth>" for every address of that family of the
// endpoints, sorted.
func (c *compiler) ifaceMembers(fam int, eps []*endpoint) []string {
	var m []string
	for _, ep := range eps {
		for _, r := range ep.ranks {
			if c.addrFam[r] == fam {
				m = append(m, c.addrs[r]+","+ep.iface)
			}
		}
	}
	slices.Sort(m)
	return m
}

// addIfaceSet adds the hash:net,iface set name of one family with the
// members m (ifaceMembers).
func (c *compiler) addIfaceSet(name string, fam int, m []string) {
	c.sets[name] = &Set{Name: name, Type: SetHashNetIface, Family: families[fam], Members: m}
}

// namedSet names the hash:ip,port set of the addresses and ports of one
// port name (all protocols: the rule's -p picks one) in one family. An
// egress rule's destination may be any pod: its set holds every pod's
// entries (setKindNamed). An ingress rule only ever sees a packet out to a
// local pod's veth with that pod's address (TABBY-NP-TO-POD dispatches by
// address and veth), so its set holds the local pods' entries alone
// (setKindLocal): a few per local pod rather than a few per pod of the
// cluster, and pods elsewhere never change it. Each is made only when a
// rule of its direction names the port.
func (c *compiler) namedSet(port string, fam int, ingress bool) string {
	c.record(func(c *compiler) { c.namedSet(port, fam, ingress) })
	kind := byte(setKindNamed)
	if ingress {
		kind = setKindLocal
	}
	name := setName(kind, fam, port)
	if c.made[name] == nil {
		c.made[name] = &Set{Name: name, Type: SetHashIPPort, Family: families[fam], Members: c.namedMembers(name, port, fam, ingress)}
	}
	return c.use(name)
}

// namedMembers are the members of the named port set name: from memory
// when the endpoints (and so c.named) are the last compile's.
func (c *compiler) namedMembers(name, port string, fam int, ingress bool) []string {
	if c.memo != nil && c.reused {
		if m, ok := c.memo.named[name]; ok {
			c.nextNamed[name] = m
			return m
		}
	}
	var m []string
	for _, e := range c.named[port] {
		if ingress && !e.local {
			continue
		}
		suffix := "," + e.proto + ":" + strconv.Itoa(int(e.port))
		for _, r := range e.ranks {
			if c.addrFam[r] == fam {
				m = append(m, c.addrs[r]+suffix)
			}
		}
	}
	slices.Sort(m)
	m = slices.Compact(m)
	if c.memo != nil {
		c.nextNamed[name] = m
	}
	return m
}
