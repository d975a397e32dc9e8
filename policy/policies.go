package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// cpolicy is a NetworkPolicy checked and ready to emit.
type cpolicy struct {
	ns, name, key string
	chains        [directions]string // the names of its chains
	sel           labels.Selector
	ingress       bool
	egress        bool
	in, eg        []*crule         // the valid rules of the directions in effect
	used          [directions]bool // selects a local pod, by direction
	// rules are the rules of its chains by direction and family; none
	// when it is over the limits.
	rules [directions][2][][]string
	// memo is what an Incremental keeps of the policy (nil without one).
	memo *policyMemo
}

// direction is the direction of traffic a policy chain or a dispatch
// signature is about, from the selected pod's side; it indexes the
// per-direction arrays.
type direction int

const (
	dirIngress direction = iota
	dirEgress
	directions = 2 // how many there are, for arrays
)

// allDirections are the directions in the order chains are emitted.
var allDirections = [directions]direction{dirIngress, dirEgress}

// peerMatch is the ipset match flag of the peer's address in this
// direction: the source of ingress traffic, the destination of egress.
func (d direction) peerMatch() string {
	if d == dirEgress {
		return "dst"
	}
	return "src"
}

// crule is one ingress or egress rule.
type crule struct {
	allPeers bool
	// podGroups are the rule's selector peers in at most two groups, each
	// emitted as its own hash:ip set: first the peers in the policy's own
	// namespace (podSelector alone), then the namespaceSelector peers. A
	// group's key names its set, and namespaceSelector peers' keys do not
	// mention the policy's namespace, so policies of every namespace with
	// the same namespaceSelector peers share one set instead of each
	// holding its own copy of the wide part.
	podGroups []podGroup
	blocks    []ipBlock
	nets      *[2][]string // hash:net members per family, exact; computed when emitted
	allPorts  bool
	ports     []portSpec
}

// podGroup is a list of selector peers matched by one set.
type podGroup struct {
	key   string    // the peers' keys joined: what the set's name hashes
	peers []podPeer // sorted by key
}

type podPeer struct {
	key    string
	ns     string          // the policy's namespace when nsSel is nil
	nsSel  labels.Selector // nil: only ns
	nsKey  string
	podSel labels.Selector // never nil
}

type ipBlock struct {
	cidr   netip.Prefix
	except []netip.Prefix
}

type portSpec struct {
	proto  string // tcp, udp, sctp
	all    bool   // every port of proto
	lo, hi int32  // numeric, hi == lo for one port
	name   string // a named port
}

func (c *compiler) loadPolicies() {
	type raw struct {
		p   *networkingv1.NetworkPolicy
		key string
	}
	var rs []raw
	for _, p := range c.in.Policies {
		if p == nil {
			continue
		}
		rs = append(rs, raw{p, p.Namespace + "/" + p.Name})
	}
	slices.SortStableFunc(rs, func(a, b raw) int { return strings.Compare(a.key, b.key) })
	for i, r := range rs {
		if i > 0 && rs[i-1].key == r.key {
			continue
		}
		if cp := c.checkedPolicy(r.p); cp != nil {
			c.policies = append(c.policies, cp)
		}
	}
}

// checkPolicy validates a policy as the API server would and compiles what
// is valid; it reports the rest.
func (c *compiler) checkPolicy(p *networkingv1.NetworkPolicy) *cpolicy {
	report := func(msgs []string, consequence string) {
		c.problem(KindNetworkPolicy, p.Namespace, p.Name, strings.Join(msgs, "; ")+": "+consequence)
	}
	if p.Namespace == "" {
		report([]string{"metadata.namespace is empty"}, "the policy is not enforced; create it in a namespace")
		return nil
	}
	sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
	if err != nil {
		report([]string{"spec.podSelector: " + err.Error()}, "the policy is not enforced until spec.podSelector is fixed")
		return nil
	}
	cp := &cpolicy{ns: p.Namespace, name: p.Name, key: p.Namespace + "/" + p.Name, sel: sel}
	cp.chains = [directions]string{chainName(kindPolicyIngress, cp.key), chainName(kindPolicyEgress, cp.key)}

	var msgs []string
	cp.ingress, cp.egress, msgs = PolicyTypes(p)
	if len(msgs) > 0 {
		report(msgs, fmt.Sprintf("the policy is enforced for %s", strings.Join(cp.types(), " and ")))
	}

	var bad []string
	if cp.ingress {
		rules := make([]ruleIn, len(p.Spec.Ingress))
		for i, r := range p.Spec.Ingress {
			rules[i] = ruleIn{r.From, r.Ports}
		}
		cp.in = c.checkRules(p.Namespace, "spec.ingress", "from", rules, &bad)
	}
	if cp.egress {
		rules := make([]ruleIn, len(p.Spec.Egress))
		for i, r := range p.Spec.Egress {
			rules[i] = ruleIn{r.To, r.Ports}
		}
		cp.eg = c.checkRules(p.Namespace, "spec.egress", "to", rules, &bad)
	}
	if len(bad) > 0 {
		c.problem(KindNetworkPolicy, p.Namespace, p.Name, strings.Join(bad, "; "))
	}
	return cp
}

// ruleIn is an ingress or egress rule: its peers (from or to) and ports.
type ruleIn struct {
	peers []networkingv1.NetworkPolicyPeer
	ports []networkingv1.NetworkPolicyPort
}

// checkRules compiles the valid rules of one direction (field, whose
// peers are under peerField); an invalid rule is left out, so it allows
// nothing, and its errors are added to bad.
func (c *compiler) checkRules(ns, field, peerField string, rules []ruleIn, bad *[]string) []*crule {
	var out []*crule
	for i, r := range rules {
		path := fmt.Sprintf("%s[%d]", field, i)
		cr, errs := c.checkRule(ns, path, peerField, r.peers, r.ports)
		if len(errs) > 0 {
			*bad = append(*bad, errs...)
			*bad = append(*bad, path+" allows nothing until fixed (the policy's other rules are enforced)")
			continue
		}
		out = append(out, cr)
	}
	return out
}

// PolicyTypes are the directions a NetworkPolicy isolates, as the
// compiler enforces it: its valid policyTypes, or when it lists none,
// Ingress always and Egress when it has egress rules, as the API defaults
// them. problems name the entries it ignores.
func PolicyTypes(p *networkingv1.NetworkPolicy) (ingress, egress bool, problems []string) {
	if len(p.Spec.PolicyTypes) > 2 {
		problems = append(problems, "spec.policyTypes: may not list more than two policyTypes")
	}
	for i, t := range p.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		default:
			problems = append(problems, fmt.Sprintf("spec.policyTypes[%d]: %q is not Ingress or Egress", i, t))
		}
	}
	if !ingress && !egress {
		return true, len(p.Spec.Egress) > 0, problems
	}
	return ingress, egress, problems
}

func (p *cpolicy) types() []string {
	var t []string
	if p.ingress {
		t = append(t, "Ingress")
	}
	if p.egress {
		t = append(t, "Egress")
	}
	return t
}

func (c *compiler) checkRule(ns, path, peerField string, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) (*crule, []string) {
	cr := &crule{allPeers: len(peers) == 0, allPorts: len(ports) == 0}
	var errs []string
	seenPeer := map[string]bool{}
	var podPeers []podPeer
	for i, peer := range peers {
		pp := fmt.Sprintf("%s.%s[%d]", path, peerField, i)
		n := 0
		if peer.PodSelector != nil {
			n++
		}
		if peer.NamespaceSelector != nil {
			n++
		}
		if peer.IPBlock != nil {
			n++
		}
		switch {
		case n == 0:
			errs = append(errs, pp+": must specify a peer (podSelector, namespaceSelector or ipBlock)")
			continue
		case n > 1 && peer.IPBlock != nil:
			errs = append(errs, pp+": may not specify both ipBlock and another peer")
			continue
		}
		if peer.IPBlock != nil {
			b, e := checkIPBlock(pp+".ipBlock", peer.IPBlock)
			errs = append(errs, e...)
			if len(e) == 0 {
				cr.blocks = append(cr.blocks, b)
			}
			continue
		}
		x := podPeer{ns: ns, podSel: labels.Everything()}
		var podKey string
		if peer.PodSelector != nil {
			s, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
			if err != nil {
				errs = append(errs, pp+".podSelector: "+err.Error())
				continue
			}
			x.podSel, podKey = s, s.String()
		}
		if peer.NamespaceSelector != nil {
			s, err := metav1.LabelSelectorAsSelector(peer.NamespaceSelector)
			if err != nil {
				errs = append(errs, pp+".namespaceSelector: "+err.Error())
				continue
			}
			x.nsSel, x.nsKey, x.ns = s, s.String(), ""
			x.key = "nssel\x00" + x.nsKey + "\x00pods\x00" + podKey
		} else {
			x.key = "ns\x00" + ns + "\x00pods\x00" + podKey
		}
		if !seenPeer[x.key] {
			seenPeer[x.key] = true
			podPeers = append(podPeers, x)
		}
	}
	for i, port := range ports {
		ps, e := checkPort(fmt.Sprintf("%s.ports[%d]", path, i), port)
		errs = append(errs, e...)
		if len(e) == 0 {
			cr.ports = append(cr.ports, ps)
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	cr.podGroups = groupPeers(podPeers)
	return cr, nil
}

// groupPeers sorts the peers by key and splits them into the same-namespace
// group and the namespaceSelector group, leaving out an empty one.
func groupPeers(peers []podPeer) []podGroup {
	slices.SortFunc(peers, func(a, b podPeer) int { return strings.Compare(a.key, b.key) })
	var local, wide []podPeer
	for _, x := range peers {
		if x.nsSel == nil {
			local = append(local, x)
		} else {
			wide = append(wide, x)
		}
	}
	var out []podGroup
	for _, g := range [][]podPeer{local, wide} {
		if len(g) == 0 {
			continue
		}
		keys := make([]string, len(g))
		for i, x := range g {
			keys[i] = x.key
		}
		out = append(out, podGroup{key: strings.Join(keys, "\x01"), peers: g})
	}
	return out
}

func checkIPBlock(path string, b *networkingv1.IPBlock) (ipBlock, []string) {
	var errs []string
	if b.CIDR == "" {
		return ipBlock{}, []string{path + ".cidr: required, e.g. 10.0.0.0/8"}
	}
	cidr, ok := parseCIDR(b.CIDR)
	if !ok {
		return ipBlock{}, []string{fmt.Sprintf("%s.cidr: %q is not a CIDR such as 10.0.0.0/8 or fd00::/64", path, b.CIDR)}
	}
	out := ipBlock{cidr: cidr}
	for i, e := range b.Except {
		ep := fmt.Sprintf("%s.except[%d]", path, i)
		x, ok := parseCIDR(e)
		if !ok {
			errs = append(errs, fmt.Sprintf("%s: %q is not a CIDR such as 10.1.0.0/16", ep, e))
			continue
		}
		if x.Addr().Is4() != cidr.Addr().Is4() || !cidr.Contains(x.Addr()) || x.Bits() <= cidr.Bits() {
			errs = append(errs, fmt.Sprintf("%s: %q must be a strict subset of cidr %q", ep, e, b.CIDR))
			continue
		}
		out.except = append(out.except, x)
	}
	return out, errs
}

func checkPort(path string, p networkingv1.NetworkPolicyPort) (portSpec, []string) {
	var errs []string
	var ps portSpec
	proto := corev1.ProtocolTCP
	if p.Protocol != nil {
		proto = *p.Protocol
	}
	name, ok := protoName(proto)
	if !ok || proto == "" {
		errs = append(errs, fmt.Sprintf("%s.protocol: %q is not TCP, UDP or SCTP", path, proto))
	}
	ps.proto = name
	switch {
	case p.Port == nil:
		ps.all = true
		if p.EndPort != nil {
			errs = append(errs, path+".endPort: may not be specified when port is not specified")
		}
	case p.Port.Type == intstr.Int:
		ps.lo, ps.hi = p.Port.IntVal, p.Port.IntVal
		for _, m := range validation.IsValidPortNum(int(p.Port.IntVal)) {
			errs = append(errs, fmt.Sprintf("%s.port: %d: %s", path, p.Port.IntVal, m))
		}
		if p.EndPort != nil {
			ps.hi = *p.EndPort
			if *p.EndPort < p.Port.IntVal {
				errs = append(errs, fmt.Sprintf("%s.endPort: %d must be greater than or equal to port %d", path, *p.EndPort, p.Port.IntVal))
			}
			for _, m := range validation.IsValidPortNum(int(*p.EndPort)) {
				errs = append(errs, fmt.Sprintf("%s.endPort: %d: %s", path, *p.EndPort, m))
			}
		}
	case p.Port.Type == intstr.String:
		ps.name = p.Port.StrVal
		for _, m := range validation.IsValidPortName(p.Port.StrVal) {
			errs = append(errs, fmt.Sprintf("%s.port: %q is not a port number or a valid port name: %s", path, p.Port.StrVal, m))
		}
		if p.EndPort != nil {
			errs = append(errs, fmt.Sprintf("%s.endPort: may not be specified when port is a name (%q)", path, p.Port.StrVal))
		}
	default:
		errs = append(errs, fmt.Sprintf("%s.port: neither a number nor a name", path))
	}
	return ps, errs
}
