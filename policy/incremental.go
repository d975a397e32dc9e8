package policy

import (
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
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
//     while every endpoint has the addresses it had.
//
// What depends on several objects is worked out afresh every time, and
// is cheap: which policies select which local pods, the members of every
// set (a set of selector peers is a scan of label groups, not of pods),
// the limits, the dispatch. So a pod, label or namespace change costs
// the sets and signatures it touches plus a pass over groups, and a
// policy change costs that policy. The result is always the Ruleset
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
	c.nextPods = make(map[*corev1.Pod]*podMemo, len(in.Endpoints))
	rs := c.run()
	x.policies, x.pods = c.nextPolicies, c.nextPods
	return rs
}

// Forget drops everything Incremental keeps: the next Compile starts
// from nothing.
func (x *Incremental) Forget() { x.policies, x.pods, x.ranked, x.sorted = nil, nil, nil, nil }

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
	m := &podMemo{key: pod.Namespace + "/" + pod.Name, group: labelKey(pod.Namespace, pod.Labels), ports: namedPorts(pod)}
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
