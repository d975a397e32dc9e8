package policy

import (
	"fmt"
	"math/rand"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// A generator of worlds from a stream of choices: math/rand for the
// randomized comparison with the reference semantics, the fuzzer's bytes
// for FuzzCompile. With valid set it only makes what the API server
// accepts; without, it also makes garbage.

type chooser struct {
	b []byte
	r *rand.Rand
}

func (c *chooser) n(k int) int {
	if k <= 1 {
		return 0
	}
	if c.r != nil {
		return c.r.Intn(k)
	}
	if len(c.b) == 0 {
		return 0
	}
	v := int(c.b[0]) % k
	c.b = c.b[1:]
	return v
}

func pick[T any](c *chooser, xs ...T) T { return xs[c.n(len(xs))] }

type gen struct {
	c     *chooser
	valid bool
}

func (g *gen) labelMap(keys []string, vals []string) map[string]string {
	m := map[string]string{}
	for i := g.c.n(3); i > 0; i-- {
		m[pick(g.c, keys...)] = pick(g.c, vals...)
	}
	return m
}

var (
	podKeys = []string{"pod", "role", "app"}
	podVals = []string{"a", "b", "c", "client", "server"}
	nsKeys  = []string{"ns", "team", "kubernetes.io/metadata.name"}
	nsVals  = []string{"x", "y", "z", "blue", "red"}
)

func (g *gen) selector(keys, vals []string) *metav1.LabelSelector {
	switch g.c.n(5) {
	case 0:
		return &metav1.LabelSelector{}
	case 1, 2:
		return &metav1.LabelSelector{MatchLabels: g.labelMap(keys, vals)}
	}
	s := &metav1.LabelSelector{}
	for i := g.c.n(3); i >= 0; i-- {
		op := pick(g.c, metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn, metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist)
		var vs []string
		if op == metav1.LabelSelectorOpIn || op == metav1.LabelSelectorOpNotIn {
			for j := g.c.n(2); j >= 0; j-- {
				vs = append(vs, pick(g.c, vals...))
			}
		}
		if !g.valid && g.c.n(4) == 0 {
			op = pick[metav1.LabelSelectorOperator](g.c, "Like", "In", "Exists")
			vs = pick(g.c, nil, []string{"bad value!"}, []string{"a"})
		}
		key := pick(g.c, keys...)
		if !g.valid && g.c.n(6) == 0 {
			key = pick(g.c, "", "bad key!", "x/y/z")
		}
		s.MatchExpressions = append(s.MatchExpressions, metav1.LabelSelectorRequirement{Key: key, Operator: op, Values: vs})
	}
	return s
}

var (
	// validCIDRs nest and overlap around the pods' addresses (10.0.ns.10+i,
	// fd00::ns:10+i) and the outside one (192.168.7.7, 2001:db8::7), so a
	// rule's ipBlocks and excepts often hold or hide each other.
	validCIDRs = []string{"10.0.0.0/8", "10.0.0.0/16", "10.0.1.0/24", "10.0.1.11/32", "10.0.0.0/23", "0.0.0.0/0", "192.168.0.0/16", "10.0.2.10/31",
		"0.0.0.0/1", "128.0.0.0/1", "10.0.0.8/29", "10.0.1.12/30", "10.0.2.0/24",
		"fd00::/64", "fd00::1:0/112", "fd00::1:11/128", "::/0", "2001:db8::/32", "fd00::/8",
		"8000::/1", "::/1", "fd00::1:8/125", "fd00::2:0/112"}
	badCIDRs = []string{"", "10.0.0.0/33", "10.0.0.0", "fd00::/129", "garbage", "010.000.000.000/8", "10.0.0.1/8", "::ffff:10.0.0.0/104", "1.2.3.4/-1"}
)

func (g *gen) ipBlock() *networkingv1.IPBlock {
	cidr := pick(g.c, validCIDRs...)
	if !g.valid && g.c.n(4) == 0 {
		cidr = pick(g.c, badCIDRs...)
	}
	b := &networkingv1.IPBlock{CIDR: cidr}
	for i := g.c.n(5); i > 0; i-- {
		e := pick(g.c, validCIDRs...)
		if !g.valid && g.c.n(4) == 0 {
			e = pick(g.c, badCIDRs...)
		}
		if g.valid {
			p := netip.MustParsePrefix(cidr)
			x := netip.MustParsePrefix(e)
			if p.Addr().Is4() != x.Addr().Is4() || !p.Contains(x.Addr()) || x.Bits() <= p.Bits() {
				continue
			}
		}
		b.Except = append(b.Except, e)
	}
	return b
}

func (g *gen) peer() networkingv1.NetworkPolicyPeer {
	var p networkingv1.NetworkPolicyPeer
	switch g.c.n(5) {
	case 0:
		p.PodSelector = g.selector(podKeys, podVals)
	case 1:
		p.NamespaceSelector = g.selector(nsKeys, nsVals)
	case 2:
		p.PodSelector = g.selector(podKeys, podVals)
		p.NamespaceSelector = g.selector(nsKeys, nsVals)
	default:
		p.IPBlock = g.ipBlock()
	}
	if !g.valid && g.c.n(8) == 0 {
		p = pick(g.c, networkingv1.NetworkPolicyPeer{}, networkingv1.NetworkPolicyPeer{IPBlock: g.ipBlock(), PodSelector: &metav1.LabelSelector{}})
	}
	return p
}

var portNames = []string{"web", "dns", "sc", "serve-80-tcp", "nothere"}

func (g *gen) port() networkingv1.NetworkPolicyPort {
	var p networkingv1.NetworkPolicyPort
	if g.c.n(4) > 0 {
		p.Protocol = protoPtr(pick(g.c, "TCP", "UDP", "SCTP"))
		if !g.valid && g.c.n(5) == 0 {
			p.Protocol = protoPtr(pick(g.c, "", "ICMP", "tcp"))
		}
	}
	switch g.c.n(5) {
	case 0:
	case 1:
		v := intstr.FromString(pick(g.c, portNames...))
		if !g.valid && g.c.n(3) == 0 {
			v = intstr.FromString(pick(g.c, "", "80", "Bad_Name", "a-very-long-port-name"))
		}
		p.Port = &v
	default:
		v := intstr.FromInt32(int32(pick(g.c, 79, 80, 81)))
		if !g.valid && g.c.n(4) == 0 {
			v = intstr.FromInt32(int32(pick(g.c, 0, -1, 65536, 65535)))
		}
		p.Port = &v
		if g.c.n(2) == 0 {
			e := v.IntVal + int32(g.c.n(3))
			if !g.valid && g.c.n(3) == 0 {
				e = int32(pick(g.c, 0, 70000, 65535))
			}
			p.EndPort = &e
		}
	}
	if !g.valid && g.c.n(10) == 0 {
		e := int32(90)
		p.EndPort = &e
	}
	return p
}

func (g *gen) rule() ([]networkingv1.NetworkPolicyPeer, []networkingv1.NetworkPolicyPort) {
	var peers []networkingv1.NetworkPolicyPeer
	var ports []networkingv1.NetworkPolicyPort
	for i := g.c.n(3); i > 0; i-- {
		peers = append(peers, g.peer())
	}
	for i := g.c.n(3); i > 0; i-- {
		ports = append(ports, g.port())
	}
	return peers, ports
}

func (g *gen) policy(i int) *networkingv1.NetworkPolicy {
	ns := pick(g.c, nsNames...)
	if !g.valid && g.c.n(10) == 0 {
		ns = ""
	}
	p := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("p%d", i)}}
	p.Spec.PodSelector = *g.selector(podKeys, podVals)
	switch g.c.n(4) {
	case 1:
		p.Spec.PolicyTypes = []networkingv1.PolicyType{tIn}
	case 2:
		p.Spec.PolicyTypes = []networkingv1.PolicyType{tEg}
	case 3:
		p.Spec.PolicyTypes = []networkingv1.PolicyType{tIn, tEg}
	}
	if !g.valid && g.c.n(8) == 0 {
		p.Spec.PolicyTypes = append(p.Spec.PolicyTypes, "Sideways")
	}
	for i := g.c.n(3); i > 0; i-- {
		peers, ports := g.rule()
		p.Spec.Ingress = append(p.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: peers, Ports: ports})
	}
	for i := g.c.n(3); i > 0; i-- {
		peers, ports := g.rule()
		p.Spec.Egress = append(p.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: peers, Ports: ports})
	}
	return p
}

func (g *gen) world() *world {
	w := &world{nsLabels: map[string]map[string]string{}, nodes: []string{"n1", "n2"}}
	w.noV6 = g.c.n(4) == 0
	for i, ns := range nsNames {
		w.nsLabels[ns] = g.labelMap(nsKeys[:2], nsVals)
		for j := g.c.n(4); j >= 0; j-- {
			p := &tpod{
				ns: ns, name: fmt.Sprintf("p%d", j),
				labels: g.labelMap(podKeys, podVals),
				v4:     netip.AddrFrom4([4]byte{10, 0, byte(i), byte(10 + j)}),
				v6:     netip.MustParseAddr(fmt.Sprintf("fd00::%d:%d", i, 10+j)),
				node:   pick(g.c, "n1", "n2"),
			}
			if w.noV6 {
				p.v6 = netip.Addr{}
			}
			for _, np := range []corev1.ContainerPort{
				{Name: "web", ContainerPort: int32(pick(g.c, 80, 81)), Protocol: corev1.ProtocolTCP},
				{Name: "dns", ContainerPort: 80, Protocol: corev1.ProtocolUDP},
				{Name: "sc", ContainerPort: 81, Protocol: corev1.ProtocolSCTP},
				{Name: "serve-80-tcp", ContainerPort: 80},
			} {
				if g.c.n(2) == 0 {
					p.ports = append(p.ports, np)
				}
			}
			w.pods = append(w.pods, p)
		}
	}
	w.ext = &tpod{ext: true, v4: netip.MustParseAddr("192.168.7.7"), v6: netip.MustParseAddr("2001:db8::7")}
	for i := g.c.n(5); i >= 0; i-- {
		w.policies = append(w.policies, g.policy(i))
	}
	// ClusterNetworkPolicies come last, so the pods and NetworkPolicies
	// of a seed are what they were before there were any.
	g.nodes(w)
	g.addCNPs(w)
	return w
}

// addCNPs adds up to four ClusterNetworkPolicies.
func (g *gen) addCNPs(w *world) {
	for i := g.c.n(5); i > 0; i-- {
		w.cnps = append(w.cnps, g.cnp(len(w.cnps)))
	}
}

func newRand(seed int) *rand.Rand { return rand.New(rand.NewSource(int64(seed))) }

// compare checks every connection of a world against the reference
// semantics, for both families, through the compiled rules of both nodes.
func compare(t testing.TB, w *world) {
	t.Helper()
	c := w.compile(t)
	for n, rs := range c.rs {
		if len(rs.Problems) > 0 {
			t.Fatalf("node %s: problems with valid policies: %+v", n, rs.Problems)
		}
	}
	fams := 2
	if w.noV6 {
		fams = 1
	}
	for _, proto := range []string{"tcp", "udp", "sctp"} {
		for _, port := range []int{79, 80, 81, 82} {
			for fam := 0; fam < fams; fam++ {
				if d := w.diff(w.expected(t, proto, port, fam), c.observe(t, proto, port, fam)); d != "" {
					t.Fatalf("%s/%d %s: %s\npolicies: %s", proto, port, families[fam], d, describe(w))
				}
			}
		}
	}
}

func describe(w *world) string {
	s := ""
	for _, p := range w.policies {
		s += fmt.Sprintf("\n  %s/%s %+v", p.Namespace, p.Name, p.Spec)
	}
	for _, p := range w.cnps {
		s += fmt.Sprintf("\n  cnp %s %+v", p.Name, p.Spec)
	}
	for _, p := range w.pods {
		s += fmt.Sprintf("\n  pod %s %v %s %v", p.key(), p.labels, p.node, p.ports)
	}
	for ns, l := range w.nsLabels {
		s += fmt.Sprintf("\n  ns %s %v", ns, l)
	}
	return s
}

// TestRandomWorldsAgainstReference compiles random valid worlds and checks
// every connection against the reference semantics.
func TestRandomWorldsAgainstReference(t *testing.T) {
	n := 400
	if testing.Short() {
		n = 50
	}
	kept := 0
	for seed := 0; seed < n; seed++ {
		g := &gen{c: &chooser{r: rand.New(rand.NewSource(int64(seed)))}, valid: true}
		w := g.world()
		if seed%2 == 1 {
			kept += w.keepOthers(rand.New(rand.NewSource(int64(seed))))
		}
		t.Run(fmt.Sprint(seed), func(t *testing.T) { compare(t, w) })
	}
	if kept == 0 {
		t.Error("no world kept a combination no local pod has: the test of Input.Keep tests nothing")
	}
}

// keepOthers sets w.keep to the Signatures of two other worlds' Rulesets,
// with the same policies: every pod on another node, and the pods' labels
// dealt out again. So the compile keeps combinations no local pod has, as
// tabbyd's keeps those its pods had minutes ago. It returns how many of
// them no local pod of w has: what the reference test then checks stays
// without effect.
func (w *world) keepOthers(r *rand.Rand) int {
	moved, relabelled := make([]*tpod, len(w.pods)), make([]*tpod, len(w.pods))
	for i, p := range w.pods {
		m := *p
		m.node = w.nodes[(slices.Index(w.nodes, p.node)+1)%len(w.nodes)]
		moved[i] = &m
		l := *p
		l.labels = w.pods[r.Intn(len(w.pods))].labels
		relabelled[i] = &l
	}
	w.keep = map[string][]Signature{}
	alt := *w
	idle := 0
	for _, n := range w.nodes {
		alt.keep = nil
		alt.pods = w.pods
		live := map[string]bool{}
		for _, s := range Compile(alt.input(n)).Signatures {
			live[s.Family+" "+s.Chain] = true
		}
		seen := map[string]bool{}
		for _, pods := range [][]*tpod{moved, relabelled} {
			alt.pods = pods
			for _, s := range Compile(alt.input(n)).Signatures {
				if k := s.Family + " " + s.Chain; !seen[k] {
					seen[k] = true
					w.keep[n] = append(w.keep[n], s)
					if !live[k] {
						idle++
					}
				}
			}
		}
	}
	return idle
}
