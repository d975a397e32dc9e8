package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	cnpv1 "github.com/tabbynet/tabby/api/cnp/v1beta1"
)

// ClusterNetworkPolicy (policy.networking.k8s.io/v1beta1) is compiled into
// the same per-pod chains as NetworkPolicy, so the tiers are an order of
// rules, not a second mechanism. A TABBY-NP-E-/I- chain of a pod runs, in
// turn: the Admin tier's policies (by priority, then name), each a chain
// whose first matching rule accepts (sets MarkAllowed), passes (sets
// MarkPass) or drops; every rule of these chains also requires that
// neither mark is set yet, so the first decision of the tier is final
// and a Pass skips the rest of the tier. Accepted returns (the direction
// is allowed); Pass and no match clear the marks and go on to the
// NetworkPolicies selecting the pod as before (one marks: allowed, none:
// drop). Only when no NetworkPolicy selects the pod in that direction
// does the Baseline tier run, the same way; what it leaves undecided is
// allowed, as Kubernetes' default is.

// Problem kind of ClusterNetworkPolicies (cluster-scoped: no Namespace).
const KindClusterNetworkPolicy = "ClusterNetworkPolicy"

// Priority bounds of a ClusterNetworkPolicy, as the API validates them.
const (
	MinCNPPriority = 0
	MaxCNPPriority = 1000
)

// The second mark bit: a ClusterNetworkPolicy chain sets it for a Pass.
const markPassSet = "0x20000/0x30000"

// Marks of the CNP chains: accepted, and the guard "no decision yet".
const (
	markAcceptSet = "0x10000/0x30000"
	markNone      = "0x0/0x30000"
)

// ccnp is a ClusterNetworkPolicy checked and ready to emit.
type ccnp struct {
	name, key string // key is "cnp:" + name: never a NetworkPolicy's "ns/name"
	admin     bool
	priority  int32
	nsSel     labels.Selector
	podSel    labels.Selector
	in, eg    []*cnpRule
	used      [directions]bool
	rules     [directions][2][][]string
}

// cnpRule is a rule with its action; an invalid Deny or Pass rule is
// compiled as a Deny of everything (its fail-closed form), an invalid
// Accept rule is left out.
type cnpRule struct {
	action cnpv1.ClusterNetworkPolicyRuleAction
	r      *crule
}

func (p *ccnp) rulesOf(dir direction) []*cnpRule {
	if dir == dirEgress {
		return p.eg
	}
	return p.in
}

// Comments of the jumps to ClusterNetworkPolicy chains: the tier and the
// name ("cnp-admin:NAME"), never a NetworkPolicy's "namespace/name" (a
// namespace has no ":"). Trace reads the tier off them.
const (
	CommentAdminPrefix    = "cnp-admin:"
	CommentBaselinePrefix = "cnp-baseline:"
)

// comment is the comment of the jumps to the policy's chains.
func (p *ccnp) comment() string {
	if p.admin {
		return comment(CommentAdminPrefix + p.name)
	}
	return comment(CommentBaselinePrefix + p.name)
}

func (p *ccnp) chain(dir direction) string {
	if dir == dirIngress {
		return chainName(kindCNPIngress, p.key)
	}
	return chainName(kindCNPEgress, p.key)
}

// loadClusterPolicies checks every ClusterNetworkPolicy and keeps those
// enforced, Admin first, then by priority and name: the order their
// chains run in. The API leaves the order of equal priorities to the
// implementation; the name makes it stable.
func (c *compiler) loadClusterPolicies() {
	seen := map[string]bool{}
	for _, p := range c.in.ClusterPolicies {
		if p == nil || seen[p.Name] {
			continue
		}
		seen[p.Name] = true
		if cp := c.checkCNP(p); cp != nil {
			c.cnps = append(c.cnps, cp)
		}
	}
	slices.SortFunc(c.cnps, func(a, b *ccnp) int {
		switch {
		case a.admin != b.admin:
			if a.admin {
				return -1
			}
			return 1
		case a.priority != b.priority:
			return int(a.priority - b.priority)
		}
		return strings.Compare(a.name, b.name)
	})
}

func (c *compiler) cnpProblem(name string, msgs []string, consequence string) {
	c.problem(KindClusterNetworkPolicy, "", name, strings.Join(msgs, "; ")+": "+consequence)
}

// checkCNP validates a policy's tier, priority and subject, which decide
// whether and where it applies (the policy is left out when one is
// wrong), then its rules.
func (c *compiler) checkCNP(p *cnpv1.ClusterNetworkPolicy) *ccnp {
	var msgs []string
	if p.Name == "" {
		msgs = append(msgs, "metadata.name is empty")
	}
	admin := p.Spec.Tier == cnpv1.AdminTier
	if !admin && p.Spec.Tier != cnpv1.BaselineTier {
		msgs = append(msgs, fmt.Sprintf("spec.tier: %q is not Admin or Baseline", p.Spec.Tier))
	}
	if p.Spec.Priority < MinCNPPriority || p.Spec.Priority > MaxCNPPriority {
		msgs = append(msgs, fmt.Sprintf("spec.priority: %d is not within %d-%d", p.Spec.Priority, MinCNPPriority, MaxCNPPriority))
	}
	nsSel, podSel, err := subjectSelectors(p.Spec.Subject)
	if err != "" {
		msgs = append(msgs, err)
	}
	if len(msgs) > 0 {
		c.cnpProblem(p.Name, msgs, "the policy is not enforced until fixed")
		return nil
	}
	cp := &ccnp{name: p.Name, key: "cnp:" + p.Name, admin: admin, priority: p.Spec.Priority, nsSel: nsSel, podSel: podSel}
	var bad []string
	for i, r := range p.Spec.Ingress {
		peers := make([]cnpv1.ClusterNetworkPolicyEgressPeer, len(r.From))
		for j, f := range r.From {
			peers[j] = cnpv1.ClusterNetworkPolicyEgressPeer{Namespaces: f.Namespaces, Pods: f.Pods}
		}
		cp.in = c.appendCNPRule(cp.in, fmt.Sprintf("spec.ingress[%d]", i), "from", r.Action, peers, r.Protocols, &bad)
	}
	for i, r := range p.Spec.Egress {
		cp.eg = c.appendCNPRule(cp.eg, fmt.Sprintf("spec.egress[%d]", i), "to", r.Action, r.To, r.Protocols, &bad)
	}
	if len(bad) > 0 {
		c.cnpProblem(p.Name, bad, "the policy's other rules are enforced")
	}
	return cp
}

// subjectSelectors are the namespace and pod selectors of a subject;
// the error says what is wrong ("" when nothing is).
func subjectSelectors(s cnpv1.ClusterNetworkPolicySubject) (nsSel, podSel labels.Selector, msg string) {
	switch {
	case (s.Namespaces == nil) == (s.Pods == nil):
		return nil, nil, "spec.subject: set exactly one of namespaces and pods"
	case s.Namespaces != nil:
		sel, err := metav1.LabelSelectorAsSelector(s.Namespaces)
		if err != nil {
			return nil, nil, "spec.subject.namespaces: " + err.Error()
		}
		return sel, labels.Everything(), ""
	}
	ns, err := metav1.LabelSelectorAsSelector(&s.Pods.NamespaceSelector)
	if err != nil {
		return nil, nil, "spec.subject.pods.namespaceSelector: " + err.Error()
	}
	pod, err := metav1.LabelSelectorAsSelector(&s.Pods.PodSelector)
	if err != nil {
		return nil, nil, "spec.subject.pods.podSelector: " + err.Error()
	}
	return ns, pod, ""
}

// appendCNPRule checks one rule and appends what enforces it: the rule,
// its fail-closed Deny of everything when it is an invalid Deny or Pass
// (or of an unknown action), nothing when it is an invalid Accept.
func (c *compiler) appendCNPRule(out []*cnpRule, path, peerField string, action cnpv1.ClusterNetworkPolicyRuleAction,
	peers []cnpv1.ClusterNetworkPolicyEgressPeer, protos []cnpv1.ClusterNetworkPolicyProtocol, bad *[]string) []*cnpRule {
	var errs []string
	switch action {
	case cnpv1.ActionAccept, cnpv1.ActionDeny, cnpv1.ActionPass:
	default:
		errs = append(errs, fmt.Sprintf("%s.action: %q is not Accept, Deny or Pass", path, action))
	}
	cr, e, notes := c.checkCNPRule(path, peerField, peers, protos)
	errs = append(errs, e...)
	*bad = append(*bad, notes...)
	switch {
	case len(errs) == 0:
		return append(out, &cnpRule{action: action, r: cr})
	case action == cnpv1.ActionAccept:
		*bad = append(*bad, errs...)
		*bad = append(*bad, path+" accepts nothing until fixed")
		return out
	}
	*bad = append(*bad, errs...)
	*bad = append(*bad, path+" denies all traffic it could have matched (fail closed, as the API asks of a Deny or Pass rule it cannot read) until fixed")
	return append(out, &cnpRule{action: cnpv1.ActionDeny, r: &crule{allPeers: true, allPorts: true}})
}

// checkCNPRule compiles a rule's peers and protocols; errs make the rule
// invalid, notes are peers tabby does not enforce (they match nothing).
func (c *compiler) checkCNPRule(path, peerField string, peers []cnpv1.ClusterNetworkPolicyEgressPeer, protos []cnpv1.ClusterNetworkPolicyProtocol) (cr *crule, errs, notes []string) {
	cr = &crule{allPorts: len(protos) == 0}
	if len(peers) == 0 {
		errs = append(errs, fmt.Sprintf("%s.%s: must list at least one peer", path, peerField))
	}
	seen := map[string]bool{}
	var podPeers []podPeer
	for i, peer := range peers {
		pp := fmt.Sprintf("%s.%s[%d]", path, peerField, i)
		x, blocks, e, note := c.checkCNPPeer(pp, peer)
		errs = append(errs, e...)
		if note != "" {
			notes = append(notes, note)
		}
		cr.blocks = append(cr.blocks, blocks...)
		if x != nil && !seen[x.key] {
			seen[x.key] = true
			podPeers = append(podPeers, *x)
		}
	}
	for i, p := range protos {
		ps, e := checkCNPProtocol(fmt.Sprintf("%s.protocols[%d]", path, i), p)
		errs = append(errs, e...)
		cr.ports = append(cr.ports, ps...)
	}
	cr.podGroups = groupPeers(podPeers)
	return cr, errs, notes
}

// checkCNPPeer compiles one peer: a selector peer, or address blocks
// (networks, or the addresses of the selected nodes).
func (c *compiler) checkCNPPeer(pp string, peer cnpv1.ClusterNetworkPolicyEgressPeer) (x *podPeer, blocks []ipBlock, errs []string, note string) {
	n := 0
	for _, set := range []bool{peer.Namespaces != nil, peer.Pods != nil, peer.Nodes != nil, len(peer.Networks) > 0, len(peer.DomainNames) > 0} {
		if set {
			n++
		}
	}
	if n != 1 {
		return nil, nil, []string{pp + ": set exactly one of namespaces, pods, nodes, networks (domainNames is not supported)"}, ""
	}
	selector := func(field string, s *metav1.LabelSelector) labels.Selector {
		sel, err := metav1.LabelSelectorAsSelector(s)
		if err != nil {
			errs = append(errs, pp+"."+field+": "+err.Error())
		}
		return sel
	}
	switch {
	case peer.Namespaces != nil:
		if ns := selector("namespaces", peer.Namespaces); ns != nil {
			x = &podPeer{nsSel: ns, nsKey: ns.String(), podSel: labels.Everything()}
			x.key = "nssel\x00" + x.nsKey + "\x00pods\x00"
		}
	case peer.Pods != nil:
		ns := selector("pods.namespaceSelector", &peer.Pods.NamespaceSelector)
		pod := selector("pods.podSelector", &peer.Pods.PodSelector)
		if ns != nil && pod != nil {
			x = &podPeer{nsSel: ns, nsKey: ns.String(), podSel: pod}
			x.key = "nssel\x00" + x.nsKey + "\x00pods\x00" + pod.String()
		}
	case peer.Nodes != nil:
		if sel := selector("nodes", peer.Nodes); sel != nil {
			blocks = c.nodeBlocks(sel)
		}
	case len(peer.Networks) > 0:
		for i, s := range peer.Networks {
			p, err := netip.ParsePrefix(string(s))
			if err != nil || p != p.Masked() {
				errs = append(errs, fmt.Sprintf("%s.networks[%d]: %q is not a CIDR with no host bits, such as 10.0.0.0/8 or fd00::/8", pp, i, s))
				continue
			}
			blocks = append(blocks, ipBlock{cidr: p})
		}
	default:
		note = pp + ".domainNames: tabby does not enforce domain names: this peer matches nothing"
	}
	return x, blocks, errs, note
}

// nodeBlocks are the addresses (internal and external) of the nodes sel
// selects, each a /32 or /128.
func (c *compiler) nodeBlocks(sel labels.Selector) []ipBlock {
	var out []ipBlock
	for _, n := range c.in.Nodes {
		if n == nil || !sel.Matches(labels.Set(n.Labels)) {
			continue
		}
		for _, a := range n.Status.Addresses {
			if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				ip = ip.Unmap()
				out = append(out, ipBlock{cidr: netip.PrefixFrom(ip, ip.BitLen())})
			}
		}
	}
	return out
}

// checkCNPProtocol compiles one protocols entry: a protocol's port, port
// range or every port, or a named port of any protocol.
func checkCNPProtocol(path string, p cnpv1.ClusterNetworkPolicyProtocol) ([]portSpec, []string) {
	type one struct {
		proto string
		port  *cnpv1.Port
	}
	var set []one
	if p.TCP != nil {
		set = append(set, one{"tcp", p.TCP.DestinationPort})
	}
	if p.UDP != nil {
		set = append(set, one{"udp", p.UDP.DestinationPort})
	}
	if p.SCTP != nil {
		set = append(set, one{"sctp", p.SCTP.DestinationPort})
	}
	if p.DestinationNamedPort != "" {
		set = append(set, one{proto: "named"})
	}
	if len(set) != 1 {
		return nil, []string{path + ": set exactly one of tcp, udp, sctp and destinationNamedPort"}
	}
	o := set[0]
	if o.proto == "named" {
		if msgs := validation.IsValidPortName(p.DestinationNamedPort); len(msgs) > 0 {
			return nil, []string{fmt.Sprintf("%s.destinationNamedPort: %q: %s", path, p.DestinationNamedPort, strings.Join(msgs, ", "))}
		}
		var out []portSpec
		for _, proto := range []string{"tcp", "udp", "sctp"} {
			out = append(out, portSpec{proto: proto, name: p.DestinationNamedPort})
		}
		return out, nil
	}
	pp := path + "." + o.proto + ".destinationPort"
	switch {
	case o.port == nil:
		return []portSpec{{proto: o.proto, all: true}}, nil
	case o.port.Range != nil && o.port.Number != 0:
		return nil, []string{pp + ": set number or range, not both"}
	case o.port.Range != nil:
		lo, hi := o.port.Range.Start, o.port.Range.End
		if lo < 1 || hi > 65535 || lo >= hi {
			return nil, []string{fmt.Sprintf("%s.range: %d-%d is not a range of ports 1-65535 with start below end", pp, lo, hi)}
		}
		return []portSpec{{proto: o.proto, lo: lo, hi: hi}}, nil
	case o.port.Number < 1 || o.port.Number > 65535:
		return nil, []string{fmt.Sprintf("%s.number: %d is not a port 1-65535", pp, o.port.Number)}
	}
	return []portSpec{{proto: o.proto, lo: o.port.Number, hi: o.port.Number}}, nil
}

// selectLocalCNP finds, for every local pod, the ClusterNetworkPolicies
// selecting it, in the order they run (c.cnps is).
func (c *compiler) selectLocalCNP() {
	for _, p := range c.cnps {
		for ns, groups := range c.localNs {
			if !p.nsSel.Matches(c.nsLabelsOf(ns)) {
				continue
			}
			for _, g := range groups {
				if !p.podSel.Matches(g.labels) {
					continue
				}
				for _, ep := range g.eps {
					for _, dir := range allDirections {
						if len(p.rulesOf(dir)) > 0 {
							ep.cnp[dir] = append(ep.cnp[dir], p)
							p.used[dir] = true
						}
					}
				}
			}
		}
	}
}

// cnpChains computes the rules of a policy's chains in the directions in
// which it selects a local pod. Over the limits, it is reported and each
// chain fails closed as the API defines it: it drops everything it has
// not decided yet when the direction has a Deny or Pass rule, and
// matches nothing when it only accepts.
func (c *compiler) cnpChains(p *ccnp) {
	if !p.used[dirIngress] && !p.used[dirEgress] {
		return
	}
	over, limit := c.limitedRules(p.used, &p.rules, func(dir direction, fam int) [][]string {
		return c.cnpRules(p.rulesOf(dir), dir, fam, c.logRule(p.logPrefix(dir)))
	})
	if over == "" {
		return
	}
	c.rs.Problems = append(c.rs.Problems, Problem{Name: p.name, Kind: KindClusterNetworkPolicy, Limit: limit,
		Message: over + ": the policy is not enforced as written: in each direction with a Deny or Pass rule it denies what it could have matched, and accepts nothing (fail closed) until it is made smaller or the limit is raised"})
	for _, dir := range allDirections {
		closed := [][]string{}
		if p.denies(dir) {
			closed = dropRules(closed, []string{"-m", "mark", "--mark", markNone}, c.logRule(p.logPrefix(dir)))
		}
		p.rules[dir] = [2][][]string{closed, closed}
	}
}

// cnpRules are the rules of one CNP chain: each rule's matches, only while
// no earlier rule (of this policy or an earlier one of the tier) decided,
// with its action; a Deny logged first with log, when not nil.
func (c *compiler) cnpRules(rules []*cnpRule, dir direction, fam int, log []string) [][]string {
	out := [][]string{}
	guard := []string{"-m", "mark", "--mark", markNone}
	for _, r := range rules {
		for _, m := range c.ruleMatches(r.r, dir, fam) {
			switch r.action {
			case cnpv1.ActionAccept:
				out = append(out, cat(guard, m, []string{"-j", "MARK", "--set-xmark", markAcceptSet}))
			case cnpv1.ActionPass:
				out = append(out, cat(guard, m, []string{"-j", "MARK", "--set-xmark", markPassSet}))
			default:
				out = dropRules(out, cat(guard, m), log)
			}
		}
	}
	return out
}

// dropRules appends "match -j DROP" to out, after "match log" when log is
// not nil.
func dropRules(out [][]string, match, log []string) [][]string {
	if log != nil {
		out = append(out, cat(match, log))
	}
	return append(out, cat(match, []string{"-j", "DROP"}))
}

// denies says whether the policy's chain in dir may drop: it has a Deny
// (or a Pass, which fails closed as a Deny over the limits).
func (p *ccnp) denies(dir direction) bool {
	for _, r := range p.rulesOf(dir) {
		if r.action != cnpv1.ActionAccept {
			return true
		}
	}
	return false
}

// drops says whether the policy's chain in dir (as computed) drops in
// either family: a Deny whose peers match nothing there makes no rule.
func (p *ccnp) drops(dir direction) bool {
	for _, rules := range p.rules[dir] {
		for _, r := range rules {
			if r[len(r)-1] == "DROP" {
				return true
			}
		}
	}
	return false
}

// logPrefix is the NFLOG prefix of the policy's chain in dir: like a
// per-pod chain's, DeniedLogPrefix and the chain's name without
// PolicyChainPrefix.
func (p *ccnp) logPrefix(dir direction) string {
	return DeniedLogPrefix + strings.TrimPrefix(p.chain(dir), PolicyChainPrefix)
}
