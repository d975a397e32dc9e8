package policy

import (
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Incremental is Compile with a memory of the previous compile, for a
// caller (tabbyd's NetworkPolicy loop) that compiles the same cluster
// again and again as it changes a little. What the compiler works out of
// one object alone is kept, keyed by the object (its pointer: informers
// hand out a new object for every change and never modify one), and
// reused while the next Input holds the same object:
//
//   - of a NetworkPolicy: its checked form and the problems found in it,
//     and the rules of its chains with the sets they name (the rules do
//     not depend on pods: set names hash selectors, CIDRs and port names);
//   - of a Pod: its label group and its named ports;
//   - of the endpoints' addresses: their ranking (sorted as strings),
//     while every endpoint has the addresses it had;
//   - of the endpoints as a whole: the endpoints, their groups by
//     namespace and labels and their named ports, while the Input lists
//     the same endpoints in the same order, with the same addresses and
//     host veths. A Pod replaced by one with the same name and named
//     ports (a label or annotation change) moves its endpoint to another
//     group instead of the groups being made again;
//   - of the pod sets (a group of selector peers), their members, while
//     the endpoints are kept as above, the namespaces are the same
//     objects, and no endpoint that moved to another group matches a
//     peer of the set before or after;
//   - of the named port sets, their members, while the endpoints are
//     kept as above (a label change moves no named port);
//   - of a signature chain, its rules, while it jumps to the same chains
//     in the same order and the denied-packet log is the same.
//
// What else depends on several objects is worked out afresh every time,
// and is cheap: which policies select which local pods, the members of
// the dispatch sets, the limits, the dispatch. So a
// label change costs the pod sets it touches plus a pass over the local
// pods and the policies, and a policy change costs that policy. The
// result is always the Ruleset
// Compile makes of the same Input (TestIncrementalEqualsCompile checks it
// on random change sequences). Objects no longer in the Input are
// forgotten. An Incremental is not safe for concurrent use, and the
// Rulesets it returns share their unchanged rules: treat them as
// read-only.
type Incremental struct {
	policies map[*networkingv1.NetworkPolicy]*policyMemo
	pods     map[*corev1.Pod]*podMemo
	// ranked is the last compile's addresses, ranked.
	ranked *rankMemo
	// sorted is the last compile's endpoint keys as given, and the
	// order sorting put them in.
	sorted *sortMemo
	// endpoints is what the last compile made of its endpoints.
	endpoints *endpointsMemo
	// members are the last compile's pod sets (by podGroup key), and
	// namespaces its Input's.
	members    map[string]*membersMemo
	namespaces []*corev1.Namespace
	// named are the members of the last compile's named port sets, by
	// set name.
	named map[string][]string
	// sigs are the rules of the last compile's signature chains, by name.
	sigs map[string]*sigMemo
	// reused counts the compiles that took their endpoints from memory.
	reused int
}

type sortMemo struct {
	keys []string
	perm []int
}

// rankMemo is rankAddrs's result for one list of endpoint addresses.
type rankMemo struct {
	ips     []addrRef
	addrs   []string
	addrFam []int
	ranks   [][]int // by endpoint index
}

// NewIncremental returns an Incremental with nothing in memory.
func NewIncremental() *Incremental { return &Incremental{} }

// Compile is Compile(in), reusing what the last call worked out.
func (x *Incremental) Compile(in *Input) *Ruleset {
	if in == nil {
		in = &Input{}
	}
	c := newCompiler(in)
	c.memo = x
	c.nextPolicies = make(map[*networkingv1.NetworkPolicy]*policyMemo, len(in.Policies))
	c.nextNamed = make(map[string][]string, len(x.named))
	c.nextSigs = make(map[string]*sigMemo, len(x.sigs))
	rs := c.run() // loadEndpoints makes c.nextPods and c.nextMembers
	x.policies, x.pods, x.members, x.named, x.sigs = c.nextPolicies, c.nextPods, c.nextMembers, c.nextNamed, c.nextSigs
	return rs
}

// Forget drops everything Incremental keeps: the next Compile starts
// from nothing.
func (x *Incremental) Forget() {
	x.policies, x.pods, x.ranked, x.sorted, x.endpoints = nil, nil, nil, nil, nil
	x.members, x.namespaces, x.named, x.sigs = nil, nil, nil, nil
}

// sigMemo is what a signature chain compiled to, and what it depends on
// beyond its name: the chains it jumps to (the name hashes the policies'
// keys, not their chains) and the log of what it drops.
type sigMemo struct {
	targets []sigTarget
	log     DeniedLog
	logged  bool
	rules   [][]string
}

// sigTarget is one policy a signature chain jumps to.
type sigTarget struct {
	key, chain string
	admin      bool
}

// sigTargets lists what the rules of s depend on, in order.
func sigTargets(s *signature) []sigTarget {
	out := make([]sigTarget, 0, len(s.cnps)+len(s.pols))
	for _, p := range s.cnps {
		out = append(out, sigTarget{key: p.name, chain: p.chain(s.dir), admin: p.admin})
	}
	for _, p := range s.pols {
		out = append(out, sigTarget{key: p.key, chain: p.chain(s.dir)})
	}
	return out
}

// sigRules are the rules of signature s's chain: from memory when it
// jumps to the same chains with the same log as in the last compile.
func (c *compiler) sigRules(s *signature) [][]string {
	if c.memo == nil {
		return s.rules(c.logRule(s.logPrefix()))
	}
	var log DeniedLog
	if c.in.DeniedLog != nil {
		log = *c.in.DeniedLog
	}
	if m := c.nextSigs[s.name]; m != nil {
		return m.rules // the other family's
	}
	targets := sigTargets(s)
	if m := c.memo.sigs[s.name]; m != nil && m.logged == (c.in.DeniedLog != nil) && m.log == log && slices.Equal(m.targets, targets) {
		c.nextSigs[s.name] = m
		return m.rules
	}
	m := &sigMemo{targets: targets, log: log, logged: c.in.DeniedLog != nil, rules: s.rules(c.logRule(s.logPrefix()))}
	c.nextSigs[s.name] = m
	return m.rules
}

// policyMemo is what a NetworkPolicy compiles to on its own.
type policyMemo struct {
	cp       *cpolicy // nil: not enforced at all; else a template
	problems []Problem
	// have says the rules (and sets) of a direction are known.
	have  [directions]bool
	rules [directions][2][][]string
	sets  [directions][2][]setUse
}

// setUse makes (in the compiler at hand) a set a policy's rules name.
type setUse func(c *compiler)

// podMemo is what a Pod compiles to on its own.
type podMemo struct {
	key   string // namespace/name
	group string // labelKey of its namespace and labels
	ports []podPort
}

// checkedPolicy is checkPolicy(p), from memory when p was checked before.
// The cpolicy is a copy the compile may change (used, rules).
func (c *compiler) checkedPolicy(p *networkingv1.NetworkPolicy) *cpolicy {
	if c.memo == nil {
		return c.checkPolicy(p)
	}
	m := c.memo.policies[p]
	if m == nil {
		n := len(c.rs.Problems)
		m = &policyMemo{cp: c.checkPolicy(p), problems: slices.Clone(c.rs.Problems[n:])}
	} else {
		c.rs.Problems = append(c.rs.Problems, m.problems...)
	}
	c.nextPolicies[p] = m
	if m.cp == nil {
		return nil
	}
	cp := *m.cp
	cp.memo = m
	return &cp
}

// policyRulesOf are policyRules of p in dir and fam, with the sets they
// name made and used: from memory when known.
func (c *compiler) policyRulesOf(p *cpolicy, dir direction, fam int) [][]string {
	m := p.memo
	if m == nil {
		return c.policyRules(p.rulesOf(dir), dir, fam)
	}
	if m.have[dir] {
		for _, use := range m.sets[dir][fam] {
			use(c)
		}
		return m.rules[dir][fam]
	}
	c.rec = &m.sets[dir][fam]
	*c.rec = nil
	rules := c.policyRules(p.rulesOf(dir), dir, fam)
	c.rec = nil
	m.rules[dir][fam] = rules
	if fam == len(families)-1 {
		m.have[dir] = true
	}
	return rules
}

// record notes, while a policy's rules are made, how to make a set they
// name again.
func (c *compiler) record(use setUse) {
	if c.rec != nil {
		*c.rec = append(*c.rec, use)
	}
}

// newPodMemo works out what pod compiles to on its own.
func newPodMemo(pod *corev1.Pod) *podMemo {
	return &podMemo{key: pod.Namespace + "/" + pod.Name, group: labelKey(pod.Namespace, pod.Labels), ports: namedPorts(pod)}
}

// podMemoOf is what pod compiles to on its own.
func (c *compiler) podMemoOf(pod *corev1.Pod) *podMemo {
	if c.memo != nil {
		if m := c.memo.pods[pod]; m != nil {
			c.nextPods[pod] = m
			return m
		}
		if m := c.nextPods[pod]; m != nil {
			return m
		}
	}
	m := newPodMemo(pod)
	if c.memo != nil {
		c.nextPods[pod] = m
	}
	return m
}

// rankAddrsOnce is rankAddrs, from memory when the endpoints have the
// same addresses as in the last compile (a label change).
func (c *compiler) rankAddrsOnce(ips []addrRef) {
	if c.memo == nil {
		c.rankAddrs(ips)
		return
	}
	if m := c.memo.ranked; m != nil && len(m.ranks) == len(c.eps) && slices.Equal(m.ips, ips) {
		c.addrs, c.addrFam = m.addrs, m.addrFam
		for i, ep := range c.eps {
			ep.ranks = m.ranks[i]
		}
		return
	}
	c.rankAddrs(ips)
	m := &rankMemo{ips: ips, addrs: c.addrs, addrFam: c.addrFam, ranks: make([][]int, len(c.eps))}
	for i, ep := range c.eps {
		m.ranks[i] = ep.ranks
	}
	c.memo.ranked = m
}

// sortEndpoints sorts the endpoints stably by key: not at all when they
// are sorted already (BuildInput's are), and in the order of the last
// compile when their keys come in the same order as then.
func (c *compiler) sortEndpoints(rs []endpointIn) []endpointIn {
	cmp := func(a, b endpointIn) int { return strings.Compare(a.key, b.key) }
	if slices.IsSortedFunc(rs, cmp) {
		return rs
	}
	if c.memo == nil {
		slices.SortStableFunc(rs, cmp)
		return rs
	}
	keys := make([]string, len(rs))
	for i, r := range rs {
		keys[i] = r.key
	}
	if m := c.memo.sorted; m != nil && slices.Equal(m.keys, keys) {
		out := make([]endpointIn, len(rs))
		for i, j := range m.perm {
			out[i] = rs[j]
		}
		return out
	}
	perm := make([]int, len(rs))
	for i := range perm {
		perm[i] = i
	}
	slices.SortStableFunc(perm, func(a, b int) int { return strings.Compare(keys[a], keys[b]) })
	out := make([]endpointIn, len(rs))
	for i, j := range perm {
		out[i] = rs[j]
	}
	c.memo.sorted = &sortMemo{keys: keys, perm: perm}
	return out
}

// endpointsMemo is what loadEndpoints made of one Input's endpoints.
type endpointsMemo struct {
	in     []Endpoint // Input.Endpoints as given
	byIn   []int      // the index in eps of each of in; -1: not an endpoint (no pod, host network, a duplicate)
	prefix string     // the host veth prefix the locals were found with
	eps    []*endpoint
	locals []*endpoint
	// groups holds every group by key: the local ones under "L"+key.
	groups        map[string]*group
	byNs, localNs map[string][]*group
	named         map[string][]namedEntry
	addrs         []string
	addrFam       []int
	problems      []Problem // what loading the endpoints reported
	namespaces    []string  // of the endpoints
}

// saveEndpoints keeps what loadEndpoints made (byIn, groups and the
// problems it reported) for the next compile.
func (c *compiler) saveEndpoints(byIn []int, groups map[string]*group, problems []Problem) {
	if c.memo == nil {
		return
	}
	m := &endpointsMemo{
		in: slices.Clone(c.in.Endpoints), byIn: byIn, prefix: c.prefix, eps: c.eps, locals: c.locals,
		groups: groups, byNs: c.byNs, localNs: c.localNs, named: c.named, addrs: c.addrs, addrFam: c.addrFam,
		problems: slices.Clone(problems),
	}
	for _, ep := range c.eps {
		if n := len(m.namespaces); n == 0 || m.namespaces[n-1] != ep.ns {
			m.namespaces = append(m.namespaces, ep.ns) // eps are sorted by namespace/name
		}
	}
	c.memo.endpoints = m
}

// reuseEndpoints loads the endpoints from memory when the Input lists the
// same ones as the last compile, in the same order, with the same
// addresses and host veths, and the Pod objects that changed kept their
// name, host networking and named ports. It moves the endpoints of those
// Pods to the groups of their labels now and says whether it could.
func (c *compiler) reuseEndpoints() bool {
	if c.memo == nil || c.memo.endpoints == nil {
		return false
	}
	m := c.memo.endpoints
	if m.prefix != c.prefix || len(m.in) != len(c.in.Endpoints) {
		return false
	}
	var changed []int
	for i := range c.in.Endpoints {
		e, o := &c.in.Endpoints[i], &m.in[i]
		if e.HostIface != o.HostIface || !sameAddrs(e.IPs, o.IPs) {
			return false
		}
		if e.Pod != o.Pod {
			changed = append(changed, i)
		}
	}
	// Checked before anything is changed: a Pod that cannot be moved
	// leaves the memory as it is, and the endpoints are loaded afresh.
	pms := make([]*podMemo, len(changed))
	for k, i := range changed {
		pod, j := c.in.Endpoints[i].Pod, m.byIn[i]
		if j < 0 || pod == nil || pod.Spec.HostNetwork {
			return false
		}
		pm := newPodMemo(pod)
		if ep := m.eps[j]; pm.key != ep.key || !slices.Equal(pm.ports, ep.ports) {
			return false
		}
		pms[k] = pm
	}
	c.nextPods = c.memo.pods
	for k, i := range changed {
		pod, ep := c.in.Endpoints[i].Pod, m.eps[m.byIn[i]]
		delete(c.nextPods, m.in[i].Pod)
		c.nextPods[pod] = pms[k]
		m.in[i].Pod = pod
		old := ep.labels
		ep.pod, ep.labels = pod, labels.Set(pod.Labels)
		if pms[k].group == ep.group {
			continue
		}
		c.moved = append(c.moved, moved{ns: ep.ns, from: old, to: ep.labels})
		leaveGroup(m.groups, m.byNs, ep.group, ep)
		joinGroup(m.groups, m.byNs, pms[k].group, ep)
		if ep.local {
			leaveGroup(m.groups, m.localNs, "L"+ep.group, ep)
			joinGroup(m.groups, m.localNs, "L"+pms[k].group, ep)
		}
		ep.group = pms[k].group
	}
	for _, ep := range m.locals {
		ep.in, ep.eg, ep.cnp = nil, nil, [directions][]*ccnp{}
	}
	c.eps, c.locals, c.byNs, c.localNs, c.named = m.eps, m.locals, m.byNs, m.localNs, m.named
	c.addrs, c.addrFam = m.addrs, m.addrFam
	c.rs.Problems = append(c.rs.Problems, m.problems...)
	for _, ns := range m.namespaces {
		c.nsLabelsOf(ns)
	}
	c.stamp = make([]int, len(c.eps))
	c.memo.reused++
	return true
}

// sameAddrs says whether two lists of addresses are equal; BuildInput
// hands out the same list for a pod whose addresses did not change.
func sameAddrs(a, b []netip.Addr) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 || &a[0] == &b[0] {
		return true
	}
	return slices.Equal(a, b)
}

// leaveGroup takes ep out of groups[key], and drops the group when it is
// left empty.
func leaveGroup(groups map[string]*group, byNs map[string][]*group, key string, ep *endpoint) {
	g := groups[key]
	g.eps = slices.DeleteFunc(g.eps, func(e *endpoint) bool { return e == ep })
	if len(g.eps) > 0 {
		return
	}
	delete(groups, key)
	if byNs[ep.ns] = slices.DeleteFunc(byNs[ep.ns], func(x *group) bool { return x == g }); len(byNs[ep.ns]) == 0 {
		delete(byNs, ep.ns)
	}
}

// moved is an endpoint that reuseEndpoints moved to another group: its
// namespace and its labels before and after.
type moved struct {
	ns       string
	from, to labels.Set
}

// membersMemo is a pod set: the peers it is made of, its names and its
// members by family.
type membersMemo struct {
	peers   []podPeer
	names   [2]string
	members [2][]string
}

// carryMembers keeps, of the last compile's pod sets, those whose members
// this compile's Input cannot have changed: none unless the endpoints
// were reused (c.reused) and the namespaces are the same objects, and of
// those only the sets no moved endpoint (c.moved) belongs to before or
// after. Called once the namespaces and endpoints are loaded.
func (c *compiler) carryMembers() {
	x := c.memo
	c.nextMembers = make(map[string]*membersMemo, len(x.members))
	if !c.reused || !slices.Equal(x.namespaces, c.in.Namespaces) {
		x.members = nil
		x.namespaces = slices.Clone(c.in.Namespaces)
		return
	}
	for key, m := range x.members {
		if slices.ContainsFunc(m.peers, c.peerMoved) {
			delete(x.members, key)
		}
	}
}

// peerMoved says whether an endpoint that moved was or is one of x's.
func (c *compiler) peerMoved(x podPeer) bool {
	for _, mv := range c.moved {
		if x.nsSel == nil && x.ns != mv.ns || x.nsSel != nil && !x.nsSel.Matches(c.nsLabelsOf(mv.ns)) {
			continue
		}
		if x.podSel.Matches(mv.from) || x.podSel.Matches(mv.to) {
			return true
		}
	}
	return false
}

// membersOf is the pod set of g: from memory when carryMembers kept it.
func (c *compiler) membersOf(g *podGroup) *membersMemo {
	if c.memo != nil {
		if m := c.memo.members[g.key]; m != nil {
			c.nextMembers[g.key] = m
			return m
		}
	}
	m := &membersMemo{peers: g.peers, members: c.podMembers(g.peers)}
	for f := range families {
		m.names[f] = setName(setKindPods, f, g.key)
	}
	if c.memo != nil {
		c.nextMembers[g.key] = m
	}
	return m
}
