package policy

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ---- building policies ----

type specOpt func(*networkingv1.NetworkPolicySpec)

func pol(ns, name string, podSel metav1.LabelSelector, opts ...specOpt) *networkingv1.NetworkPolicy {
	p := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: networkingv1.NetworkPolicySpec{PodSelector: podSel}}
	for _, o := range opts {
		o(&p.Spec)
	}
	return p
}

func ml(kv ...string) metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return metav1.LabelSelector{MatchLabels: m}
}

func mlp(kv ...string) *metav1.LabelSelector { s := ml(kv...); return &s }

func expr(key string, op metav1.LabelSelectorOperator, vals ...string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: op, Values: vals}}}
}

func types(ts ...networkingv1.PolicyType) specOpt {
	return func(s *networkingv1.NetworkPolicySpec) { s.PolicyTypes = ts }
}

const (
	tIn = networkingv1.PolicyTypeIngress
	tEg = networkingv1.PolicyTypeEgress
)

type peers = []networkingv1.NetworkPolicyPeer
type port = networkingv1.NetworkPolicyPort

func ingress(from peers, ports ...port) specOpt {
	return func(s *networkingv1.NetworkPolicySpec) {
		s.Ingress = append(s.Ingress, networkingv1.NetworkPolicyIngressRule{From: from, Ports: ports})
	}
}

func egress(to peers, ports ...port) specOpt {
	return func(s *networkingv1.NetworkPolicySpec) {
		s.Egress = append(s.Egress, networkingv1.NetworkPolicyEgressRule{To: to, Ports: ports})
	}
}

func selPeer(s *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: s}
}

func nsPeer(s *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: s}
}

func bothPeer(ns, pod *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: ns, PodSelector: pod}
}

func ipPeer(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

func protoPtr(p string) *corev1.Protocol { x := corev1.Protocol(p); return &x }

func num(proto string, n int32) port {
	v := intstr.FromInt32(n)
	return port{Protocol: protoPtr(proto), Port: &v}
}

func rng(proto string, lo, hi int32) port {
	p := num(proto, lo)
	p.EndPort = &hi
	return p
}

func named(proto, name string) port {
	v := intstr.FromString(name)
	return port{Protocol: protoPtr(proto), Port: &v}
}

func anyPort(proto string) port { return port{Protocol: protoPtr(proto)} }

// ---- scenarios ----

type probe struct {
	proto string
	port  int
	fam   int // 0 IPv4, 1 IPv6, -1 both
	want  func(w *world) truth
}

type step struct {
	mutate func(w *world)
	probes []probe
}

type scenario struct {
	name  string
	steps []step
}

func set(ps ...*networkingv1.NetworkPolicy) func(w *world) {
	return func(w *world) { w.policies = ps }
}

// one is a scenario of one step: these policies, these probes.
func one(name string, ps []*networkingv1.NetworkPolicy, probes ...probe) scenario {
	return scenario{name: name, steps: []step{{mutate: set(ps...), probes: probes}}}
}

func nps(ps ...*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy { return ps }

// pr makes a probe for both families whose truth starts all allowed and
// then applies from/to/value triples.
func pr(proto string, port int, edits ...any) probe {
	return prFam(-1, proto, port, edits...)
}

func prFam(fam int, proto string, port int, edits ...any) probe {
	return probe{proto: proto, port: port, fam: fam, want: func(w *world) truth {
		tt := w.truthAll(true)
		for i := 0; i+2 < len(edits)+1; i += 3 {
			tt.set(edits[i].(string), edits[i+1].(string), edits[i+2].(bool))
		}
		return tt
	}}
}

var all = metav1.LabelSelector{}

func scenarios() []scenario {
	return []scenario{
		one("default-deny-ingress", nps(pol("x", "deny", all, types(tIn))),
			pr("tcp", 80, "*", "x/*", false), pr("udp", 81, "*", "x/*", false)),
		one("default-deny-egress", nps(pol("x", "deny", all, types(tEg))),
			pr("tcp", 80, "x/*", "*", false), pr("sctp", 81, "x/*", "*", false)),
		one("default-deny-all", nps(pol("x", "deny", all, types(tIn, tEg))),
			pr("tcp", 80, "*", "x/*", false, "x/*", "*", false)),
		one("allow-all-ingress", nps(pol("x", "allow", all, ingress(nil))),
			pr("tcp", 80), pr("udp", 80)),
		one("allow-from-pod-in-server-namespace", nps(pol("x", "p", ml("pod", "a"), ingress(peers{selPeer(mlp("pod", "b"))}))),
			pr("tcp", 80, "*", "x/a", false, "x/b", "x/a", true)),
		one("deny-all-plus-allow-all-for-one-target", nps(
			pol("x", "deny", all, types(tIn)),
			pol("x", "allow-a", ml("pod", "a"), ingress(nil))),
			pr("tcp", 80, "*", "x/*", false, "*", "x/a", true)),
		one("allow-from-all-namespaces", nps(pol("x", "p", all, ingress(peers{nsPeer(&all)}))),
			pr("tcp", 80, "*", "x/*", false, "*/*", "x/*", true)),
		one("allow-only-from-other-namespace-by-namespaceSelector", nps(pol("x", "p", ml("pod", "a"), ingress(peers{nsPeer(mlp("ns", "y"))}))),
			pr("tcp", 80, "*", "x/a", false, "y/*", "x/a", true)),
		one("podSelector-matchExpressions", nps(pol("x", "p", ml("pod", "a"), ingress(peers{selPeer(expr("pod", metav1.LabelSelectorOpIn, "b"))}))),
			pr("tcp", 80, "*", "x/a", false, "x/b", "x/a", true)),
		one("namespaceSelector-matchExpressions", nps(pol("x", "p", ml("pod", "a"), ingress(peers{nsPeer(expr("ns", metav1.LabelSelectorOpIn, "y"))}))),
			pr("tcp", 80, "*", "x/a", false, "y/*", "x/a", true)),
		one("podSelector-or-namespaceSelector", nps(pol("x", "p", ml("pod", "a"), ingress(peers{
			nsPeer(expr("ns", metav1.LabelSelectorOpNotIn, "x")), selPeer(mlp("pod", "b"))}))),
			pr("tcp", 80, "*", "x/a", false, "y/*", "x/a", true, "z/*", "x/a", true, "x/b", "x/a", true)),
		one("podSelector-and-namespaceSelector", nps(pol("x", "p", ml("pod", "a"), ingress(peers{
			bothPeer(expr("ns", metav1.LabelSelectorOpNotIn, "x"), mlp("pod", "b"))}))),
			pr("tcp", 80, "*", "x/a", false, "y/b", "x/a", true, "z/b", "x/a", true)),
		one("multiple-podSelectors-and-namespaceSelectors", nps(pol("x", "p", ml("pod", "a"), ingress(peers{
			bothPeer(expr("ns", metav1.LabelSelectorOpNotIn, "x"), expr("pod", metav1.LabelSelectorOpIn, "b", "c"))}))),
			pr("tcp", 80, "*", "x/a", false, "y/b", "x/a", true, "z/b", "x/a", true, "y/c", "x/a", true, "z/c", "x/a", true)),
		one("any-of-several-podSelectors", nps(pol("x", "p", ml("pod", "a"), ingress(peers{selPeer(mlp("pod", "b")), selPeer(mlp("pod", "c"))}))),
			pr("tcp", 80, "*", "x/a", false, "x/b", "x/a", true, "x/c", "x/a", true)),
		one("pod-in-other-namespace-by-both-selectors", nps(pol("x", "p", ml("pod", "a"), ingress(peers{bothPeer(mlp("ns", "y"), mlp("pod", "a"))}))),
			pr("tcp", 80, "*", "x/a", false, "y/a", "x/a", true)),
		one("ports", nps(pol("x", "p", ml("pod", "a"), ingress(peers{nsPeer(mlp("ns", "y"))}, num("TCP", 81)))),
			pr("tcp", 80, "*", "x/a", false), pr("tcp", 81, "*", "x/a", false, "y/*", "x/a", true)),
		one("stacked-policies-overlapping-podSelectors", nps(
			pol("x", "p80", ml("pod", "a"), ingress(peers{nsPeer(mlp("ns", "y"))}, num("TCP", 80))),
			pol("x", "p81", ml("pod", "a"), ingress(peers{nsPeer(mlp("ns", "y"))}, num("TCP", 81)))),
			pr("tcp", 80, "*", "x/a", false, "y/*", "x/a", true), pr("tcp", 81, "*", "x/a", false, "y/*", "x/a", true),
			pr("udp", 80, "*", "x/a", false)),
		one("ingress-on-one-named-port", nps(pol("x", "p", all, ingress(nil, named("TCP", "serve-81-tcp")))),
			pr("tcp", 81), pr("tcp", 80, "*", "x/*", false), pr("udp", 81, "*", "x/*", false)),
		one("ingress-from-namespace-on-one-named-port", nps(pol("x", "p", all, ingress(peers{nsPeer(mlp("ns", "y"))}, named("TCP", "serve-80-tcp")))),
			pr("tcp", 80, "*", "x/*", false, "y/*", "x/*", true), pr("tcp", 81, "*", "x/*", false)),
		one("egress-on-one-named-port", nps(pol("x", "p", all, types(tEg), egress(nil, named("TCP", "serve-80-tcp")))),
			// ext has no named ports: nothing to resolve the name against.
			pr("tcp", 80, "x/*", "ext", false), pr("tcp", 81, "x/*", "*", false)),
		one("named-port-with-wrong-protocol", nps(pol("x", "p", all, ingress(nil, named("UDP", "serve-80-tcp")))),
			pr("tcp", 80, "*", "x/*", false), pr("udp", 80, "*", "x/*", false)),
		{name: "update-policy", steps: []step{
			{mutate: set(pol("x", "p", ml("pod", "a"), ingress(peers{selPeer(mlp("pod", "b"))}, num("TCP", 80)))),
				probes: []probe{pr("tcp", 80, "*", "x/a", false, "x/b", "x/a", true)}},
			{mutate: set(pol("x", "p", ml("pod", "a"), ingress(peers{selPeer(mlp("pod", "c"))}, num("TCP", 80)))),
				probes: []probe{pr("tcp", 80, "*", "x/a", false, "x/c", "x/a", true)}},
		}},
		{name: "ingress-from-updated-namespace", steps: []step{
			{mutate: set(pol("x", "p", ml("pod", "a"), ingress(peers{nsPeer(mlp("ns2", "updated"))}))),
				probes: []probe{pr("tcp", 80, "*", "x/a", false)}},
			{mutate: func(w *world) { w.nsLabels["y"]["ns2"] = "updated" },
				probes: []probe{pr("tcp", 80, "*", "x/a", false, "y/*", "x/a", true)}},
			{mutate: func(w *world) { delete(w.nsLabels["y"], "ns2") },
				probes: []probe{pr("tcp", 80, "*", "x/a", false)}},
		}},
		{name: "ingress-from-updated-pod", steps: []step{
			{mutate: set(pol("x", "p", ml("pod", "a"), ingress(peers{selPeer(mlp("pod2", "updated"))}))),
				probes: []probe{pr("tcp", 80, "*", "x/a", false)}},
			{mutate: func(w *world) { w.pod("x/b").labels["pod2"] = "updated" },
				probes: []probe{pr("tcp", 80, "*", "x/a", false, "x/b", "x/a", true)}},
		}},
		{name: "deny-ingress-to-updated-pod", steps: []step{
			{mutate: set(pol("x", "p", ml("target", "isolated"), types(tIn))),
				probes: []probe{pr("tcp", 80)}},
			{mutate: func(w *world) { w.pod("x/a").labels["target"] = "isolated" },
				probes: []probe{pr("tcp", 80, "*", "x/a", false)}},
		}},
		one("deny-ingress-from-other-namespaces", nps(pol("x", "p", all, ingress(peers{selPeer(&all)}))),
			pr("tcp", 80, "*", "x/*", false, "x/*", "x/*", true)),
		one("deny-egress-by-podSelector", nps(pol("x", "p", ml("pod", "a"), types(tEg))),
			pr("tcp", 80, "x/a", "*", false)),
		one("ingress-and-egress-together", nps(pol("x", "p", ml("pod", "a"), types(tIn, tEg),
			ingress(peers{selPeer(mlp("pod", "b"))}), egress(peers{selPeer(mlp("pod", "b"))}))),
			pr("tcp", 80, "*", "x/a", false, "x/a", "*", false, "x/b", "x/a", true, "x/a", "x/b", true)),
		one("client-side-egress-deny-wins-over-server-allow", nps(
			pol("x", "client", ml("pod", "a"), types(tEg), egress(peers{nsPeer(mlp("ns", "y"))})),
			pol("z", "server", all, ingress(nil))),
			pr("tcp", 80, "x/a", "*", false, "x/a", "y/*", true)),
		one("egress-to-other-namespace-by-both-selectors", nps(pol("x", "p", ml("pod", "a"), types(tEg), egress(peers{bothPeer(mlp("ns", "y"), mlp("pod", "b"))}))),
			pr("tcp", 80, "x/a", "*", false, "x/a", "y/b", true)),
		one("any-port-of-one-protocol", nps(pol("x", "p", all, ingress(nil, anyPort("TCP")))),
			pr("tcp", 80), pr("tcp", 81), pr("udp", 80, "*", "x/*", false), pr("sctp", 81, "*", "x/*", false)),
		{name: "ingress-allow-all-takes-precedence", steps: []step{
			{mutate: set(pol("x", "p81", ml("pod", "a"), ingress(nil, num("TCP", 81)))),
				probes: []probe{pr("tcp", 80, "*", "x/a", false), pr("tcp", 81)}},
			{mutate: func(w *world) {
				w.policies = append(w.policies, pol("x", "all", ml("pod", "a"), ingress(nil)))
			}, probes: []probe{pr("tcp", 80), pr("tcp", 81)}},
		}},
		{name: "egress-allow-all-takes-precedence", steps: []step{
			{mutate: set(pol("x", "p81", ml("pod", "a"), types(tEg), egress(nil, num("TCP", 81)))),
				probes: []probe{pr("tcp", 80, "x/a", "*", false), pr("tcp", 81)}},
			{mutate: func(w *world) {
				w.policies = append(w.policies, pol("x", "all", ml("pod", "a"), types(tEg), egress(nil)))
			}, probes: []probe{pr("tcp", 80), pr("tcp", 81)}},
		}},
		{name: "policies-stop-applying-when-deleted", steps: []step{
			{mutate: set(pol("x", "deny", all, types(tIn, tEg))),
				probes: []probe{pr("tcp", 80, "*", "x/*", false, "x/*", "*", false)}},
			{mutate: set(), probes: []probe{pr("tcp", 80), pr("udp", 81)}},
		}},
		one("egress-to-server-in-cidr", nps(pol("x", "p", ml("pod", "a"), types(tEg), egress(peers{ipPeer("10.0.1.11/32")}))),
			prFam(0, "tcp", 80, "x/a", "*", false, "x/a", "y/b", true),
			prFam(1, "tcp", 80, "x/a", "*", false)),
		one("egress-to-server-in-cidr-dual-stack", nps(pol("x", "p", ml("pod", "a"), types(tEg), egress(peers{ipPeer("10.0.1.11/32"), ipPeer("fd00::1:11/128")}))),
			pr("tcp", 80, "x/a", "*", false, "x/a", "y/b", true)),
		one("egress-cidr-except", nps(pol("x", "p", ml("pod", "a"), types(tEg), egress(peers{ipPeer("10.0.0.0/16", "10.0.1.11/32")}))),
			prFam(0, "tcp", 80, "x/a", "*", false, "x/a", "*/*", true, "x/a", "y/b", false),
			prFam(1, "tcp", 80, "x/a", "*", false)),
		one("ip-in-both-cidr-and-except-of-other-block-is-allowed", nps(pol("x", "p", ml("pod", "a"), types(tEg), egress(peers{
			ipPeer("10.0.0.0/16", "10.0.1.11/32"), ipPeer("10.0.1.11/32")}))),
			prFam(0, "tcp", 80, "x/a", "ext", false)),
		one("except-covered-by-wider-block", nps(pol("x", "p", ml("pod", "a"), types(tEg), egress(peers{
			ipPeer("10.0.0.0/16", "10.0.1.0/24"), ipPeer("10.0.0.0/8")}))),
			prFam(0, "tcp", 80, "x/a", "ext", false)),
		one("ingress-from-outside-cidr", nps(pol("x", "p", ml("pod", "a"), ingress(peers{ipPeer("192.168.0.0/16"), ipPeer("2001:db8::/32")}))),
			pr("tcp", 80, "*", "x/a", false, "ext", "x/a", true)),
		one("egress-to-internet-only", nps(pol("x", "p", ml("pod", "a"), types(tEg), egress(peers{ipPeer("0.0.0.0/0", "10.0.0.0/8"), ipPeer("::/0", "fd00::/8")}))),
			pr("tcp", 80, "x/a", "*", false, "x/a", "ext", true)),
		one("ingress-and-egress-independent", nps(
			pol("x", "no-egress", ml("pod", "a"), types(tEg)),
			pol("x", "in-from-b", ml("pod", "a"), ingress(peers{selPeer(mlp("pod", "b"))}))),
			pr("tcp", 80, "x/a", "*", false, "*", "x/a", false, "x/b", "x/a", true)),
		one("sctp-is-not-tcp", nps(pol("x", "p", ml("pod", "a"), ingress(nil, num("SCTP", 80)))),
			pr("tcp", 80, "*", "x/a", false), pr("sctp", 80), pr("sctp", 81, "*", "x/a", false)),
		one("udp-only", nps(pol("x", "p", ml("pod", "a"), ingress(nil, num("UDP", 81)))),
			pr("tcp", 81, "*", "x/a", false), pr("udp", 81), pr("udp", 80, "*", "x/a", false)),
		one("sctp-egress", nps(pol("x", "p", ml("pod", "a"), types(tEg), egress(nil, num("SCTP", 81)))),
			pr("sctp", 81), pr("sctp", 80, "x/a", "*", false), pr("tcp", 81, "x/a", "*", false)),
		one("endPort-covers-both", nps(pol("x", "p", ml("pod", "a"), ingress(peers{nsPeer(mlp("ns", "y"))}, rng("TCP", 80, 81)))),
			pr("tcp", 80, "*", "x/a", false, "y/*", "x/a", true), pr("tcp", 81, "*", "x/a", false, "y/*", "x/a", true)),
		one("endPort-partial", nps(pol("x", "p", ml("pod", "a"), ingress(nil, rng("TCP", 81, 90)))),
			pr("tcp", 80, "*", "x/a", false), pr("tcp", 81)),
		one("egress-endPort-udp", nps(pol("x", "p", all, types(tEg), egress(peers{nsPeer(mlp("ns", "z"))}, rng("UDP", 75, 80)))),
			pr("udp", 80, "x/*", "*", false, "x/*", "z/*", true), pr("udp", 81, "x/*", "*", false)),
		one("namespaceSelector-default-name-label", nps(pol("x", "p", ml("pod", "a"), ingress(peers{nsPeer(mlp("kubernetes.io/metadata.name", "y"))}))),
			pr("tcp", 80, "*", "x/a", false, "y/*", "x/a", true)),
		one("namespaceSelector-default-name-label-notin", nps(pol("x", "p", ml("pod", "a"), ingress(peers{nsPeer(expr("kubernetes.io/metadata.name", metav1.LabelSelectorOpNotIn, "y"))}))),
			pr("tcp", 80, "*", "x/a", false, "x/*", "x/a", true, "z/*", "x/a", true)),
		one("empty-ingress-rule-list-with-policyTypes", nps(pol("y", "p", ml("pod", "b"), types(tIn, tEg), ingress(nil))),
			pr("tcp", 80, "y/b", "*", false)),
		one("egress-rules-ignored-when-policyTypes-ingress-only", nps(pol("x", "p", all, types(tIn), ingress(nil), egress(peers{selPeer(mlp("pod", "nobody"))}))),
			pr("tcp", 80)),
		{name: "named-port-resolved-per-target-pod", steps: []step{{
			mutate: func(w *world) {
				for _, p := range w.pods {
					web := int32(80)
					if p.name == "b" {
						web = 81
					}
					p.ports = append(servePorts(), corev1.ContainerPort{Name: "web", ContainerPort: web, Protocol: corev1.ProtocolTCP})
				}
				w.policies = nps(
					pol("x", "in-web", all, ingress(nil, named("TCP", "web"))),
					pol("y", "out-web", ml("pod", "a"), types(tEg), egress(nil, named("TCP", "web"))))
			},
			probes: []probe{
				pr("tcp", 80, "*", "x/b", false, "y/a", "*/b", false, "y/a", "ext", false),
				pr("tcp", 81, "*", "x/a", false, "*", "x/c", false, "y/a", "*", false, "y/a", "*/b", true),
			},
		}}},
		one("policies-of-several-namespaces", nps(
			pol("x", "deny", all, types(tIn)),
			pol("y", "from-x", all, ingress(peers{nsPeer(mlp("ns", "x"))})),
			pol("z", "to-y", all, egress(peers{nsPeer(mlp("ns", "y"))}, num("TCP", 80)))),
			// z's policy has egress rules and no policyTypes: it isolates
			// z for ingress too.
			pr("tcp", 80, "*", "x/*", false, "*", "y/*", false, "*", "z/*", false, "x/*", "y/*", true, "z/*", "*", false),
			pr("tcp", 81, "*", "x/*", false, "*", "y/*", false, "*", "z/*", false, "x/*", "y/*", true, "z/*", "*", false)),
		one("pods-without-labels-and-matchExpressions-exists", nps(pol("x", "p", metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pod", Operator: metav1.LabelSelectorOpDoesNotExist}}}, types(tIn))),
			pr("tcp", 80)),
	}
}

// TestUpstreamTruthTables runs the upstream e2e scenarios through the
// compiled rules of every node with the model, on one node and on two,
// for IPv4 and IPv6; it checks the table each scenario spells out and, for
// every protocol and port, the table of the reference semantics.
func TestUpstreamTruthTables(t *testing.T) {
	scs := scenarios()
	if len(scs) < 30 {
		t.Fatalf("only %d scenarios", len(scs))
	}
	for _, sc := range scs {
		for _, nodes := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/%dnode", sc.name, nodes), func(t *testing.T) {
				w := newXYZ(nodes)
				for si, st := range sc.steps {
					st.mutate(w)
					c := w.compile(t)
					for node, rs := range c.rs {
						if len(rs.Problems) > 0 {
							t.Fatalf("step %d: problems %+v", si, rs.Problems)
						}
						var local []string
						for _, p := range w.pods {
							if p.node == node {
								local = append(local, p.key())
							}
						}
						if fmt.Sprint(local) != fmt.Sprint(rs.Programmed) {
							t.Fatalf("step %d: node %s programmed %v, want %v", si, node, rs.Programmed, local)
						}
					}
					for _, p := range st.probes {
						for fam := range 2 {
							if p.fam >= 0 && p.fam != fam {
								continue
							}
							if d := w.diff(p.want(w), c.observe(t, p.proto, p.port, fam)); d != "" {
								t.Errorf("step %d probe %s/%d %s: %s", si, p.proto, p.port, families[fam], d)
							}
						}
					}
					for _, proto := range []string{"tcp", "udp", "sctp"} {
						for _, port := range []int{80, 81} {
							for fam := range 2 {
								if d := w.diff(w.expected(t, proto, port, fam), c.observe(t, proto, port, fam)); d != "" {
									t.Errorf("step %d %s/%d %s against the reference semantics: %s", si, proto, port, families[fam], d)
								}
							}
						}
					}
				}
			})
		}
	}
}
