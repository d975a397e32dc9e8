package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	cnpv1 "github.com/tabbynet/tabby/api/cnp/v1beta1"
)

// The world of the upstream NetworkPolicy e2e suite: namespaces x, y, z,
// pods a, b, c in each serving TCP, UDP and SCTP on 80 and 81 (named
// serve-80-tcp etc.), and an outside address "ext" behind the underlay.
// Pods sit on one node or are spread over two.

// Pods reach other nodes through tabby.vxlan, the outside through eth0.
const (
	underlay = "eth0"
	overlay  = "tabby.vxlan"
)

type tpod struct {
	ns, name string
	labels   map[string]string
	v4, v6   netip.Addr
	node     string
	ports    []corev1.ContainerPort
	ext      bool // not a pod: an address outside the cluster
}

func (p *tpod) key() string {
	if p.ext {
		return "ext"
	}
	return p.ns + "/" + p.name
}

func (p *tpod) addr(fam int) netip.Addr {
	if fam == 0 {
		return p.v4
	}
	return p.v6
}

func (p *tpod) iface() string { return "tab" + strings.ReplaceAll(p.key(), "/", "") }

type world struct {
	nsLabels map[string]map[string]string
	pods     []*tpod
	ext      *tpod
	policies []*networkingv1.NetworkPolicy
	cnps     []*cnpv1.ClusterNetworkPolicy
	nodes    []string
	// nodeObjs are the Nodes the compiler reads for nodes peers; the
	// reference reads the same addresses.
	nodeObjs []*corev1.Node
	// noV6 leaves the pods IPv4 only.
	noV6 bool
	// limits go into every node's Input, and so does deniedLog.
	limits    Limits
	deniedLog *DeniedLog
	// keep is each node's Input.Keep.
	keep map[string][]Signature
}

var (
	nsNames  = []string{"x", "y", "z"}
	podNames = []string{"a", "b", "c"}
)

func servePorts() []corev1.ContainerPort {
	var ps []corev1.ContainerPort
	for _, port := range []int32{80, 81} {
		for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP} {
			ps = append(ps, corev1.ContainerPort{
				Name:          fmt.Sprintf("serve-%d-%s", port, strings.ToLower(string(proto))),
				ContainerPort: port, Protocol: proto,
			})
		}
	}
	return ps
}

// newXYZ builds the world; nodes is 1 (every pod on n1) or 2 (neighbours
// alternate between n1 and n2, so some pairs are same-node, some not).
func newXYZ(nodes int) *world {
	w := &world{nsLabels: map[string]map[string]string{}}
	for i := 0; i < nodes; i++ {
		w.nodes = append(w.nodes, fmt.Sprintf("n%d", i+1))
	}
	for i, ns := range nsNames {
		w.nsLabels[ns] = map[string]string{"ns": ns}
		for j, name := range podNames {
			w.pods = append(w.pods, &tpod{
				ns: ns, name: name,
				labels: map[string]string{"pod": name},
				v4:     netip.AddrFrom4([4]byte{10, 0, byte(i), byte(10 + j)}),
				v6:     netip.MustParseAddr(fmt.Sprintf("fd00::%d:%d", i, 10+j)),
				node:   w.nodes[(i+j)%nodes],
				ports:  servePorts(),
			})
		}
	}
	w.ext = &tpod{ext: true, v4: netip.MustParseAddr("192.168.7.7"), v6: netip.MustParseAddr("2001:db8::7")}
	return w
}

func (w *world) pod(key string) *tpod {
	if key == "ext" {
		return w.ext
	}
	for _, p := range w.pods {
		if p.key() == key {
			return p
		}
	}
	panic("no pod " + key)
}

func (w *world) input(node string) *Input {
	in := &Input{Node: node, Policies: w.policies, ClusterPolicies: w.cnps, Nodes: w.nodeObjs, Limits: w.limits, DeniedLog: w.deniedLog,
		Keep: w.keep[node]}
	nss := make([]string, 0, len(w.nsLabels))
	for ns := range w.nsLabels {
		nss = append(nss, ns)
	}
	sort.Strings(nss)
	for _, ns := range nss {
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: w.nsLabels[ns]}})
	}
	for _, p := range w.pods {
		e := Endpoint{
			Pod: &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name, Labels: p.labels},
				Spec:       corev1.PodSpec{NodeName: p.node, Containers: []corev1.Container{{Name: "c", Ports: p.ports}}},
			},
			IPs: []netip.Addr{p.v4},
		}
		if !w.noV6 {
			e.IPs = append(e.IPs, p.v6)
		}
		if p.node == node {
			e.HostIface = p.iface()
		}
		in.Endpoints = append(in.Endpoints, e)
	}
	return in
}

// cluster is every node's compiled Ruleset, loaded into the model.
type cluster struct {
	w   *world
	rs  map[string]*Ruleset
	fam [2]map[string]*machine
}

func (w *world) compile(t testing.TB) *cluster {
	t.Helper()
	c := &cluster{w: w, rs: map[string]*Ruleset{}}
	for f := range c.fam {
		c.fam[f] = map[string]*machine{}
	}
	for _, n := range w.nodes {
		rs := Compile(w.input(n))
		checkRuleset(t, rs)
		c.rs[n] = rs
		for f, family := range families {
			m, err := newMachine(rs, family)
			if err != nil {
				t.Fatalf("node %s %s: %v", n, family, err)
			}
			c.fam[f][n] = m
		}
	}
	return c
}

// send delivers a new connection's first packet from one endpoint to
// another through every node on the way and says whether it arrives.
func (c *cluster) send(t testing.TB, from, to *tpod, proto string, port, fam int) bool {
	t.Helper()
	p := pkt{src: from.addr(fam), dst: to.addr(fam), proto: proto, dport: port, ctstate: "NEW"}
	hop := func(node, in, out string) bool {
		q := p
		q.in, q.out = in, out
		v, mark := c.fam[fam][node].forward(q)
		if mark&MarkMask != 0 {
			t.Fatalf("%s -> %s on %s left the mark %#x", from.key(), to.key(), node, mark)
		}
		if v == vReturn {
			t.Fatalf("%s -> %s on %s (%s -> %s): tabby returned pod traffic to FORWARD undecided", from.key(), to.key(), node, in, out)
		}
		return v == vAccept
	}
	switch {
	case from.ext:
		return hop(to.node, underlay, to.iface())
	case to.ext:
		return hop(from.node, from.iface(), underlay)
	case from.node == to.node:
		return hop(from.node, from.iface(), to.iface())
	default:
		return hop(from.node, from.iface(), overlay) && hop(to.node, overlay, to.iface())
	}
}

// ---- the reference semantics, written straight from the API docs ----

func (w *world) nsLabelsOf(ns string) labels.Set {
	l := labels.Set{"kubernetes.io/metadata.name": ns}
	for k, v := range w.nsLabels[ns] {
		l[k] = v
	}
	return l
}

func mustSelector(t testing.TB, s *metav1.LabelSelector) labels.Selector {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		t.Fatalf("selector %v: %v", s, err)
	}
	return sel
}

func (w *world) selects(t testing.TB, np *networkingv1.NetworkPolicy, p *tpod) bool {
	return !p.ext && np.Namespace == p.ns && mustSelector(t, &np.Spec.PodSelector).Matches(labels.Set(p.labels))
}

func hasType(np *networkingv1.NetworkPolicy, typ networkingv1.PolicyType) bool {
	if len(np.Spec.PolicyTypes) == 0 {
		return typ == networkingv1.PolicyTypeIngress || len(np.Spec.Egress) > 0
	}
	for _, x := range np.Spec.PolicyTypes {
		if x == typ {
			return true
		}
	}
	return false
}

func (w *world) peerMatches(t testing.TB, np *networkingv1.NetworkPolicy, peer networkingv1.NetworkPolicyPeer, other *tpod, fam int) bool {
	if peer.IPBlock != nil {
		a := other.addr(fam)
		cidr := netip.MustParsePrefix(peer.IPBlock.CIDR)
		if !cidr.Contains(a) {
			return false
		}
		for _, e := range peer.IPBlock.Except {
			if netip.MustParsePrefix(e).Contains(a) {
				return false
			}
		}
		return true
	}
	if other.ext {
		return false
	}
	if peer.NamespaceSelector != nil {
		if !mustSelector(t, peer.NamespaceSelector).Matches(w.nsLabelsOf(other.ns)) {
			return false
		}
	} else if other.ns != np.Namespace {
		return false
	}
	if peer.PodSelector != nil {
		return mustSelector(t, peer.PodSelector).Matches(labels.Set(other.labels))
	}
	return true
}

func portMatches(p networkingv1.NetworkPolicyPort, target *tpod, proto string, port int) bool {
	want := corev1.ProtocolTCP
	if p.Protocol != nil {
		want = *p.Protocol
	}
	if strings.ToLower(string(want)) != proto {
		return false
	}
	switch {
	case p.Port == nil:
		return true
	case p.Port.Type == intstr.Int:
		hi := p.Port.IntVal
		if p.EndPort != nil {
			hi = *p.EndPort
		}
		return port >= int(p.Port.IntVal) && port <= int(hi)
	default:
		if target.ext {
			return false
		}
		for _, cp := range target.ports {
			cpProto := cp.Protocol
			if cpProto == "" {
				cpProto = corev1.ProtocolTCP
			}
			if cp.Name == p.Port.StrVal && cpProto == want {
				return int(cp.ContainerPort) == port
			}
		}
		return false
	}
}

func (w *world) ruleAllows(t testing.TB, np *networkingv1.NetworkPolicy, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort, other, target *tpod, proto string, port, fam int) bool {
	peerOK := len(peers) == 0
	for _, peer := range peers {
		peerOK = peerOK || w.peerMatches(t, np, peer, other, fam)
	}
	portOK := len(ports) == 0
	for _, p := range ports {
		portOK = portOK || portMatches(p, target, proto, port)
	}
	return peerOK && portOK
}

// oracle is whether Kubernetes allows a new connection from -> to: each
// direction decided by the Admin tier, else by the NetworkPolicies when
// any isolates the pod, else by the Baseline tier, else allowed.
func (w *world) oracle(t testing.TB, from, to *tpod, proto string, port, fam int) bool {
	egIsolated, egOK, inIsolated, inOK := w.npOracle(t, from, to, proto, port, fam)
	return w.tiered(t, true, from, to, proto, port, fam, egIsolated, egOK) &&
		w.tiered(t, false, from, to, proto, port, fam, inIsolated, inOK)
}

// npOracle is what the NetworkPolicies say of each direction: whether any
// isolates the pod, and whether one allows the connection.
func (w *world) npOracle(t testing.TB, from, to *tpod, proto string, port, fam int) (egressIsolated, egressOK, ingressIsolated, ingressOK bool) {
	for _, np := range w.policies {
		if hasType(np, networkingv1.PolicyTypeEgress) && w.selects(t, np, from) {
			egressIsolated = true
			for _, r := range np.Spec.Egress {
				egressOK = egressOK || w.ruleAllows(t, np, r.To, r.Ports, to, to, proto, port, fam)
			}
		}
		if hasType(np, networkingv1.PolicyTypeIngress) && w.selects(t, np, to) {
			ingressIsolated = true
			for _, r := range np.Spec.Ingress {
				ingressOK = ingressOK || w.ruleAllows(t, np, r.From, r.Ports, from, to, proto, port, fam)
			}
		}
	}
	return egressIsolated, egressOK, ingressIsolated, ingressOK
}

// ---- truth tables ----

// truth is a connectivity matrix; self connections are left out (they go
// over the pod's loopback and never reach the node).
type truth map[[2]string]bool

func (w *world) endpoints(withExt bool) []*tpod {
	eps := append([]*tpod{}, w.pods...)
	if withExt {
		eps = append(eps, w.ext)
	}
	return eps
}

func (w *world) truthAll(v bool) truth {
	tt := truth{}
	for _, a := range w.endpoints(true) {
		for _, b := range w.endpoints(true) {
			if a != b && !(a.ext && b.ext) {
				tt[[2]string{a.key(), b.key()}] = v
			}
		}
	}
	return tt
}

// match applies v to every pair whose ends match the patterns: "x/a",
// "x/*", "*/a", "*" (any endpoint), "ext".
func (tt truth) set(from, to string, v bool) truth {
	m := func(pat, key string) bool {
		if pat == "*" || pat == key {
			return true
		}
		pns, pn, ok := strings.Cut(pat, "/")
		kns, kn, ok2 := strings.Cut(key, "/")
		return ok && ok2 && (pns == "*" || pns == kns) && (pn == "*" || pn == kn)
	}
	for k := range tt {
		if m(from, k[0]) && m(to, k[1]) {
			tt[k] = v
		}
	}
	return tt
}

func (c *cluster) observe(t testing.TB, proto string, port, fam int) truth {
	tt := truth{}
	for _, a := range c.w.endpoints(true) {
		for _, b := range c.w.endpoints(true) {
			if a != b && !(a.ext && b.ext) {
				tt[[2]string{a.key(), b.key()}] = c.send(t, a, b, proto, port, fam)
			}
		}
	}
	return tt
}

func (w *world) expected(t testing.TB, proto string, port, fam int) truth {
	tt := truth{}
	for _, a := range w.endpoints(true) {
		for _, b := range w.endpoints(true) {
			if a != b && !(a.ext && b.ext) {
				tt[[2]string{a.key(), b.key()}] = w.oracle(t, a, b, proto, port, fam)
			}
		}
	}
	return tt
}

// diff prints both tables side by side where they differ, in the upstream
// style (rows from, columns to; "." allowed, "X" blocked).
func (w *world) diff(want, got truth) string {
	bad := 0
	for k, v := range want {
		if got[k] != v {
			bad++
		}
	}
	if bad == 0 {
		return ""
	}
	eps := w.endpoints(true)
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d pairs differ (want | got):\n      ", bad, len(want))
	cell := func(tt truth, a, c *tpod) string {
		v, ok := tt[[2]string{a.key(), c.key()}]
		switch {
		case !ok:
			return "-"
		case v:
			return "."
		}
		return "X"
	}
	for _, c := range eps {
		fmt.Fprintf(&b, "%4s", c.key())
	}
	b.WriteString("   |")
	for _, c := range eps {
		fmt.Fprintf(&b, "%4s", c.key())
	}
	b.WriteString("\n")
	for _, a := range eps {
		fmt.Fprintf(&b, "%6s", a.key())
		for _, c := range eps {
			fmt.Fprintf(&b, "%4s", cell(want, a, c))
		}
		b.WriteString("   |")
		for _, c := range eps {
			s := cell(got, a, c)
			if cell(want, a, c) != s {
				s = "!" + s
			}
			fmt.Fprintf(&b, "%4s", s)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// checkRuleset checks the invariants every Ruleset must keep.
func checkRuleset(t testing.TB, rs *Ruleset) {
	t.Helper()
	if err := rulesetInvariants(rs); err != nil {
		t.Fatal(err)
	}
}

func rulesetInvariants(rs *Ruleset) error {
	if rs == nil {
		return fmt.Errorf("nil Ruleset")
	}
	for i, s := range rs.Sets {
		if !strings.HasPrefix(s.Name, SetPrefix) || len(s.Name) > 26 {
			return fmt.Errorf("set name %q: not %s… of at most 26 bytes", s.Name, SetPrefix)
		}
		if s.Family != FamilyIPv4 && s.Family != FamilyIPv6 {
			return fmt.Errorf("set %s family %q", s.Name, s.Family)
		}
		if i > 0 && rs.Sets[i-1].Name >= s.Name {
			return fmt.Errorf("sets not sorted or not unique at %s", s.Name)
		}
		if !sort.StringsAreSorted(s.Members) {
			return fmt.Errorf("set %s members not sorted", s.Name)
		}
		for j := 1; j < len(s.Members); j++ {
			if s.Members[j] == s.Members[j-1] {
				return fmt.Errorf("set %s member %s twice", s.Name, s.Members[j])
			}
		}
		// The kernel keeps one entry per prefix: "P" and "P nomatch"
		// together would be one of them, whichever was added last.
		plain := map[string]bool{}
		for _, m := range s.Members {
			v, _ := strings.CutSuffix(m, " nomatch")
			if plain[v] {
				return fmt.Errorf("set %s holds %s both as a member and as nomatch", s.Name, v)
			}
			plain[v] = true
		}
	}
	for i, c := range rs.Chains {
		if !strings.HasPrefix(c.Name, PolicyChainPrefix) || len(c.Name) > 26 {
			return fmt.Errorf("chain name %q: not %s… of at most 26 bytes", c.Name, PolicyChainPrefix)
		}
		if c.Family != FamilyIPv4 && c.Family != FamilyIPv6 {
			return fmt.Errorf("chain %s family %q", c.Name, c.Family)
		}
		if i > 0 {
			p := rs.Chains[i-1]
			if p.Family > c.Family || p.Family == c.Family && p.Name >= c.Name {
				return fmt.Errorf("chains not sorted or not unique at %s %s", c.Family, c.Name)
			}
		}
		for _, r := range c.Rules {
			for _, a := range r {
				if a == "" || strings.ContainsAny(a, " \t\n\"'\\") {
					return fmt.Errorf("chain %s rule %q: argument %q needs quoting", c.Name, r, a)
				}
			}
		}
	}
	// A local pod's address is in at most one dispatch set per direction
	// and family: that of its policies or that of unselected pods.
	seen := map[string]string{}
	for _, s := range rs.Sets {
		dir := ""
		switch {
		case strings.HasPrefix(s.Name, SetPrefix+string(setKindEgress)) || s.Name == UnselectedSetName(s.Family, true):
			dir = "egress"
		case strings.HasPrefix(s.Name, SetPrefix+string(setKindIngress)) || s.Name == UnselectedSetName(s.Family, false):
			dir = "ingress"
		default:
			continue
		}
		if s.Type != SetHashNetIface {
			return fmt.Errorf("dispatch set %s is a %s", s.Name, s.Type)
		}
		for _, m := range s.Members {
			if other, dup := seen[dir+" "+m]; dup {
				return fmt.Errorf("%s is in the %s dispatch sets %s and %s", m, dir, other, s.Name)
			}
			seen[dir+" "+m] = s.Name
		}
	}
	// Signatures: sorted, each a chain of the Ruleset with a dispatch set
	// holding Pods members, and every TABBY-NP-E-/I- chain listed.
	chains, sets := map[string]bool{}, map[string]Set{}
	for _, c := range rs.Chains {
		chains[c.Family+" "+c.Name] = true
	}
	for _, s := range rs.Sets {
		sets[s.Name] = s
	}
	listed := map[string]bool{}
	for i, sg := range rs.Signatures {
		if i > 0 {
			p := rs.Signatures[i-1]
			if p.Family > sg.Family || p.Family == sg.Family && p.Chain >= sg.Chain {
				return fmt.Errorf("signatures not sorted or not unique at %s %s", sg.Family, sg.Chain)
			}
		}
		if !chains[sg.Family+" "+sg.Chain] {
			return fmt.Errorf("signature %s %s has no chain", sg.Family, sg.Chain)
		}
		listed[sg.Family+" "+sg.Chain] = true
		fam := slices.Index(families[:], sg.Family)
		kind, h := byte(setKindIngress), strings.TrimPrefix(sg.Chain, PolicyChainPrefix+kindPodIngress)
		if sg.Direction == "egress" {
			kind, h = setKindEgress, strings.TrimPrefix(sg.Chain, PolicyChainPrefix+kindPodEgress)
		}
		set, ok := sets[hashedSetName(kind, fam, h)]
		if !ok || len(set.Members) != sg.Pods || len(sg.Policies) == 0 {
			return fmt.Errorf("signature %+v: dispatch set %+v (found %v)", sg, set, ok)
		}
	}
	for _, c := range rs.Chains {
		if (strings.HasPrefix(c.Name, PolicyChainPrefix+kindPodIngress) || strings.HasPrefix(c.Name, PolicyChainPrefix+kindPodEgress)) && !listed[c.Family+" "+c.Name] {
			return fmt.Errorf("chain %s %s is no signature's", c.Family, c.Name)
		}
	}
	// A dispatch bucket's set holds its signatures' members, no more.
	for _, c := range rs.Chains {
		if !isDispatchChain(c.Name) || c.Name == ChainFromPod || c.Name == ChainToPod {
			continue
		}
		var union []string
		for _, r := range c.Rules {
			if t, _ := ruleTarget(r); strings.HasPrefix(t, PolicyChainPrefix+kindPodEgress) || strings.HasPrefix(t, PolicyChainPrefix+kindPodIngress) {
				union = append(union, sets[setOf(r)].Members...)
			}
		}
		slices.Sort(union)
		found := false
		for _, p := range rs.Chains {
			if p.Family != c.Family || !isDispatchChain(p.Name) {
				continue
			}
			for _, r := range p.Rules {
				if t, _ := ruleTarget(r); t == c.Name {
					found = true
					if got := sets[setOf(r)].Members; !slices.Equal(got, union) {
						return fmt.Errorf("bucket %s %s: set %s holds %v, its signatures' sets %v", c.Family, c.Name, setOf(r), got, union)
					}
				}
			}
		}
		if !found {
			return fmt.Errorf("bucket %s %s: no dispatch rule sends to it", c.Family, c.Name)
		}
	}
	if !sort.StringsAreSorted(rs.Programmed) {
		return fmt.Errorf("Programmed not sorted")
	}
	for _, f := range families {
		if _, err := newMachine(rs, f); err != nil {
			return err
		}
	}
	return nil
}
