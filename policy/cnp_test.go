package policy

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cnpv1 "github.com/tabbynet/tabby/api/cnp/v1beta1"
)

// ---- building ClusterNetworkPolicies ----

type cnpOpt func(*cnpv1.ClusterNetworkPolicySpec)

func cnp(name string, tier cnpv1.Tier, prio int32, subject cnpv1.ClusterNetworkPolicySubject, opts ...cnpOpt) *cnpv1.ClusterNetworkPolicy {
	p := &cnpv1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: cnpv1.ClusterNetworkPolicySpec{Tier: tier, Priority: prio, Subject: subject}}
	for _, o := range opts {
		o(&p.Spec)
	}
	return p
}

const (
	admin    = cnpv1.AdminTier
	baseline = cnpv1.BaselineTier
	accept   = cnpv1.ActionAccept
	deny     = cnpv1.ActionDeny
	pass     = cnpv1.ActionPass
)

func subjNs(s *metav1.LabelSelector) cnpv1.ClusterNetworkPolicySubject {
	return cnpv1.ClusterNetworkPolicySubject{Namespaces: s}
}

func subjPods(ns, pod metav1.LabelSelector) cnpv1.ClusterNetworkPolicySubject {
	return cnpv1.ClusterNetworkPolicySubject{Pods: &cnpv1.NamespacedPod{NamespaceSelector: ns, PodSelector: pod}}
}

type cpeers = []cnpv1.ClusterNetworkPolicyEgressPeer
type cprotos = []cnpv1.ClusterNetworkPolicyProtocol

func cin(action cnpv1.ClusterNetworkPolicyRuleAction, from cpeers, protos ...cnpv1.ClusterNetworkPolicyProtocol) cnpOpt {
	return func(s *cnpv1.ClusterNetworkPolicySpec) {
		r := cnpv1.ClusterNetworkPolicyIngressRule{Action: action, Protocols: protos}
		for _, f := range from {
			r.From = append(r.From, cnpv1.ClusterNetworkPolicyIngressPeer{Namespaces: f.Namespaces, Pods: f.Pods})
		}
		s.Ingress = append(s.Ingress, r)
	}
}

func ceg(action cnpv1.ClusterNetworkPolicyRuleAction, to cpeers, protos ...cnpv1.ClusterNetworkPolicyProtocol) cnpOpt {
	return func(s *cnpv1.ClusterNetworkPolicySpec) {
		s.Egress = append(s.Egress, cnpv1.ClusterNetworkPolicyEgressRule{Action: action, To: to, Protocols: protos})
	}
}

func pNs(s *metav1.LabelSelector) cnpv1.ClusterNetworkPolicyEgressPeer {
	return cnpv1.ClusterNetworkPolicyEgressPeer{Namespaces: s}
}

func pPods(ns, pod metav1.LabelSelector) cnpv1.ClusterNetworkPolicyEgressPeer {
	return cnpv1.ClusterNetworkPolicyEgressPeer{Pods: &cnpv1.NamespacedPod{NamespaceSelector: ns, PodSelector: pod}}
}

func pNets(cidrs ...cnpv1.CIDR) cnpv1.ClusterNetworkPolicyEgressPeer {
	return cnpv1.ClusterNetworkPolicyEgressPeer{Networks: cidrs}
}

func pNodes(s *metav1.LabelSelector) cnpv1.ClusterNetworkPolicyEgressPeer {
	return cnpv1.ClusterNetworkPolicyEgressPeer{Nodes: s}
}

func cTCP(n int32) cnpv1.ClusterNetworkPolicyProtocol {
	return cnpv1.ClusterNetworkPolicyProtocol{TCP: &cnpv1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &cnpv1.Port{Number: n}}}
}

func cTCPRange(lo, hi int32) cnpv1.ClusterNetworkPolicyProtocol {
	return cnpv1.ClusterNetworkPolicyProtocol{TCP: &cnpv1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &cnpv1.Port{Range: &cnpv1.PortRange{Start: lo, End: hi}}}}
}

func cUDP() cnpv1.ClusterNetworkPolicyProtocol {
	return cnpv1.ClusterNetworkPolicyProtocol{UDP: &cnpv1.ClusterNetworkPolicyProtocolUDP{}}
}

func cNamed(name string) cnpv1.ClusterNetworkPolicyProtocol {
	return cnpv1.ClusterNetworkPolicyProtocol{DestinationNamedPort: name}
}

func cnps(ps ...*cnpv1.ClusterNetworkPolicy) []*cnpv1.ClusterNetworkPolicy { return ps }

// tiered is a scenario of NetworkPolicies and ClusterNetworkPolicies
// with the tables the API docs give.
type tiered struct {
	name   string
	nps    []*networkingv1.NetworkPolicy
	cnps   []*cnpv1.ClusterNetworkPolicy
	nodes  []*corev1.Node
	probes []probe
}

func gwNode() *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gw", Labels: map[string]string{"role": "gw"}}}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.7.7"}, {Type: corev1.NodeInternalIP, Address: "2001:db8::7"}}
	return n
}

func tieredScenarios() []tiered {
	nsY, nsZ, nsX := mlp("ns", "y"), mlp("ns", "z"), mlp("ns", "x")
	return []tiered{
		{name: "admin-deny-overrides-networkpolicy-allow",
			nps:    nps(pol("x", "allow-all", all, ingress(nil))),
			cnps:   cnps(cnp("deny-y", admin, 10, subjNs(nsX), cin(deny, cpeers{pNs(nsY)}))),
			probes: []probe{pr("tcp", 80, "y/*", "x/*", false), pr("udp", 81, "y/*", "x/*", false)}},
		{name: "admin-accept-overrides-networkpolicy-deny",
			nps:  nps(pol("x", "deny", all, types(tIn))),
			cnps: cnps(cnp("accept-z", admin, 10, subjNs(nsX), cin(accept, cpeers{pNs(nsZ)}, cTCP(80)))),
			probes: []probe{pr("tcp", 80, "*", "x/*", false, "z/*", "x/*", true),
				pr("tcp", 81, "*", "x/*", false)}},
		{name: "admin-pass-defers-to-networkpolicy",
			nps: nps(pol("x", "from-y-a", all, ingress(peers{bothPeer(nsY, mlp("pod", "a"))}))),
			cnps: cnps(
				cnp("pass-y", admin, 10, subjNs(nsX), cin(pass, cpeers{pNs(nsY)})),
				cnp("deny-all", admin, 20, subjNs(nsX), cin(deny, cpeers{pNs(&all)}))),
			probes: []probe{pr("tcp", 80, "*", "x/*", false, "y/a", "x/*", true)}},
		{name: "admin-pass-without-networkpolicy-goes-to-baseline",
			cnps: cnps(
				cnp("pass-y", admin, 10, subjNs(nsX), cin(pass, cpeers{pNs(nsY)})),
				cnp("deny-all", admin, 20, subjNs(nsX), cin(deny, cpeers{pNs(&all)})),
				cnp("baseline-deny-y", baseline, 10, subjNs(&all), cin(deny, cpeers{pNs(nsY)}))),
			probes: []probe{pr("tcp", 80, "*/*", "x/*", false, "y/*", "*/*", false)}},
		{name: "baseline-applies-only-without-networkpolicy",
			nps: nps(pol("x", "allow-a", ml("pod", "a"), ingress(nil)),
				pol("y", "egress-only", all, types(tEg), egress(nil))),
			cnps:   cnps(cnp("isolate", baseline, 50, subjNs(&all), cin(deny, cpeers{pNs(&all)}))),
			probes: []probe{pr("tcp", 80, "*/*", "*/*", false, "*/*", "x/a", true), pr("sctp", 81, "*/*", "*/*", false, "*/*", "x/a", true)}},
		{name: "baseline-egress-deny-with-accept-first",
			cnps: cnps(cnp("egress", baseline, 0, subjNs(nsX),
				ceg(accept, cpeers{pNs(nsY)}),
				ceg(deny, cpeers{pNets("0.0.0.0/0", "::/0")}))),
			probes: []probe{pr("tcp", 80, "x/*", "*", false, "x/*", "y/*", true)}},
		{name: "admin-deny-beats-baseline-accept",
			cnps: cnps(cnp("deny", admin, 999, subjNs(nsX), ceg(deny, cpeers{pNs(nsY)})),
				cnp("accept", baseline, 0, subjNs(nsX), ceg(accept, cpeers{pNs(nsY)}))),
			probes: []probe{pr("tcp", 80, "x/*", "y/*", false)}},
		{name: "admin-egress-networks",
			cnps: cnps(cnp("web-out", admin, 10, subjNs(nsX), ceg(accept, cpeers{pNets("192.168.0.0/16", "2001:db8::/32")}, cTCP(80))),
				cnp("no-out", admin, 20, subjNs(nsX), ceg(deny, cpeers{pNets("0.0.0.0/0", "::/0")}))),
			probes: []probe{pr("tcp", 80, "x/*", "*", false, "x/*", "ext", true), pr("tcp", 81, "x/*", "*", false)}},
		{name: "rule-order-within-a-policy",
			cnps: cnps(cnp("p", admin, 10, subjNs(nsX),
				cin(accept, cpeers{pPods(*nsY, ml("pod", "a"))}),
				cin(deny, cpeers{pNs(nsY)}))),
			probes: []probe{pr("tcp", 80, "y/*", "x/*", false, "y/a", "x/*", true)}},
		{name: "lower-priority-value-first",
			cnps: cnps(cnp("accept", admin, 20, subjNs(nsX), cin(accept, cpeers{pNs(nsY)})),
				cnp("deny", admin, 10, subjNs(nsX), cin(deny, cpeers{pNs(nsY)}))),
			probes: []probe{pr("tcp", 80, "y/*", "x/*", false)}},
		{name: "equal-priority-by-name",
			cnps: cnps(cnp("b-deny", admin, 10, subjNs(nsX), cin(deny, cpeers{pNs(nsY)})),
				cnp("a-accept", admin, 10, subjNs(nsX), cin(accept, cpeers{pPods(*nsY, ml("pod", "b"))}))),
			probes: []probe{pr("tcp", 80, "y/*", "x/*", false, "y/b", "x/*", true)}},
		{name: "ports-range-named-and-protocol",
			cnps: cnps(cnp("p", admin, 10, subjNs(nsX),
				cin(deny, cpeers{pNs(nsY)}, cTCPRange(80, 81), cNamed("serve-80-udp")),
				cin(deny, cpeers{pNs(nsZ)}, cUDP()))),
			probes: []probe{pr("tcp", 80, "y/*", "x/*", false), pr("tcp", 81, "y/*", "x/*", false),
				pr("udp", 80, "y/*", "x/*", false, "z/*", "x/*", false), pr("udp", 81, "z/*", "x/*", false), pr("sctp", 80)}},
		{name: "egress-to-nodes",
			nodes:  []*corev1.Node{gwNode()},
			cnps:   cnps(cnp("no-gw", admin, 10, subjNs(nsX), ceg(deny, cpeers{pNodes(mlp("role", "gw"))}))),
			probes: []probe{pr("tcp", 80, "x/*", "ext", false), pr("udp", 80, "x/*", "ext", false)}},
		{name: "subject-pods",
			cnps:   cnps(cnp("p", admin, 10, subjPods(*nsX, ml("pod", "a")), cin(deny, cpeers{pNs(&all)}))),
			probes: []probe{pr("tcp", 80, "*/*", "x/a", false)}},
		{name: "admin-egress-accept-still-meets-destination-ingress",
			nps:    nps(pol("y", "deny", all, types(tIn))),
			cnps:   cnps(cnp("out", admin, 10, subjNs(nsX), ceg(accept, cpeers{pNs(nsY)}))),
			probes: []probe{pr("tcp", 80, "*", "y/*", false)}},
	}
}

// TestTieredTruthTables runs ClusterNetworkPolicy scenarios through the
// compiled rules of every node, on one node and two, both families: the
// table each spells out and, for every protocol and port, the reference.
func TestTieredTruthTables(t *testing.T) {
	for _, sc := range tieredScenarios() {
		for _, nodes := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/%dnode", sc.name, nodes), func(t *testing.T) {
				w := newXYZ(nodes)
				w.policies, w.cnps, w.nodeObjs = sc.nps, sc.cnps, sc.nodes
				c := w.compile(t)
				for node, rs := range c.rs {
					if len(rs.Problems) > 0 {
						t.Fatalf("node %s: problems %+v", node, rs.Problems)
					}
				}
				for _, p := range sc.probes {
					for fam := range 2 {
						if d := w.diff(p.want(w), c.observe(t, p.proto, p.port, fam)); d != "" {
							t.Errorf("probe %s/%d %s: %s", p.proto, p.port, families[fam], d)
						}
					}
				}
				for _, proto := range []string{"tcp", "udp", "sctp"} {
					for _, port := range []int{80, 81} {
						for fam := range 2 {
							if d := w.diff(w.expected(t, proto, port, fam), c.observe(t, proto, port, fam)); d != "" {
								t.Errorf("%s/%d %s against the reference: %s", proto, port, families[fam], d)
							}
						}
					}
				}
			})
		}
	}
}

// TestTieredChains pins the layout of a pod's chain with all three tiers:
// Admin jumps, the accepted return and the clearing of a Pass, the
// NetworkPolicies, and no Baseline (a NetworkPolicy selects the pod).
func TestTieredChains(t *testing.T) {
	w := newXYZ(1)
	w.policies = nps(pol("x", "np", all, ingress(nil)))
	w.cnps = cnps(cnp("adm", admin, 1, subjNs(mlp("ns", "x")), cin(pass, cpeers{pNs(mlp("ns", "y"))}, cTCP(80))),
		cnp("base", baseline, 1, subjNs(&all), cin(deny, cpeers{pNs(&all)})))
	rs := Compile(w.input("n1"))
	checkRuleset(t, rs)
	var sig, adm *Chain
	for i, ch := range rs.ChainsFor(FamilyIPv4) {
		if strings.HasPrefix(ch.Name, PolicyChainPrefix+kindPodIngress) && strings.Contains(fmt.Sprint(ch.Rules), "x/np") {
			sig = &rs.ChainsFor(FamilyIPv4)[i]
		}
		if ch.Name == chainName(kindCNPIngress, "cnp:adm") {
			adm = &rs.ChainsFor(FamilyIPv4)[i]
		}
	}
	if sig == nil || adm == nil {
		t.Fatalf("no signature chain of x/np or no chain of adm in %+v", rs.Chains)
	}
	want := [][]string{
		{"-j", "MARK", "--set-xmark", "0x0/0x30000"},
		{"-m", "comment", "--comment", "cnp-admin:adm", "-j", chainName(kindCNPIngress, "cnp:adm")},
		{"-m", "mark", "--mark", "0x10000/0x10000", "-j", "RETURN"},
		{"-j", "MARK", "--set-xmark", "0x0/0x30000"},
		{"-m", "comment", "--comment", "x/np", "-j", chainName(kindPolicyIngress, "x/np")},
		{"-m", "mark", "--mark", "0x10000/0x10000", "-j", "RETURN"},
		{"-j", "DROP"},
	}
	if fmt.Sprint(sig.Rules) != fmt.Sprint(want) {
		t.Errorf("signature chain\n got %q\nwant %q", sig.Rules, want)
	}
	if len(adm.Rules) != 1 || !strings.HasPrefix(strings.Join(adm.Rules[0], " "), "-m mark --mark 0x0/0x30000 -p tcp -m tcp --dport 80 -m set --match-set tabby-np-p4-") ||
		!strings.HasSuffix(strings.Join(adm.Rules[0], " "), " src -j MARK --set-xmark 0x20000/0x30000") {
		t.Errorf("admin chain %q", adm.Rules)
	}
}

// TestCNPProblems: hostile or broken policies are reported with what to
// fix and fail closed as the API defines it, and the rest is enforced.
func TestCNPProblems(t *testing.T) {
	nsX, nsY := mlp("ns", "x"), mlp("ns", "y")
	w := newXYZ(2)
	w.cnps = cnps(
		// Not enforced at all: cannot tell where or when it applies.
		cnp("huge-priority", admin, 1<<30, subjNs(&all), cin(deny, cpeers{pNs(&all)})),
		cnp("no-tier", "Middle", 1, subjNs(&all), cin(deny, cpeers{pNs(&all)})),
		cnp("two-subjects", admin, 1, cnpv1.ClusterNetworkPolicySubject{Namespaces: &all, Pods: &cnpv1.NamespacedPod{}}, cin(deny, cpeers{pNs(&all)})),
		cnp("bad-selector", admin, 1, subjNs(expr("ns", "Like", "x")), cin(deny, cpeers{pNs(&all)})),
		// A Deny with a bad CIDR denies all egress of x (fail closed),
		// after the valid Accept rule before it.
		cnp("bad-cidr", admin, 5, subjNs(nsX), ceg(accept, cpeers{pNs(nsY)}), ceg(deny, cpeers{pNets("10.0.0.1/8")})),
		// An unknown action in y's ingress: the rule, from z, becomes a
		// Deny of all ingress after the Accept from y before it.
		cnp("bad-action", admin, 6, subjNs(nsY), cin(accept, cpeers{pNs(mlp("ns", "y"))}), cin("Allow", cpeers{pNs(mlp("ns", "z"))})),
		// A broken Accept accepts nothing; the Deny after it stands.
		cnp("bad-accept", admin, 7, subjNs(mlp("ns", "z")), cin(accept, cpeers{pNs(&all)}, cnpv1.ClusterNetworkPolicyProtocol{TCP: &cnpv1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &cnpv1.Port{Number: 70000}}}),
			cin(deny, cpeers{pNs(nsX)})),
		cnp("domains", admin, 8, subjNs(mlp("ns", "z")), ceg(accept, cpeers{{DomainNames: []cnpv1.DomainName{"example.com"}}})),
	)
	c := w.compile(t)
	want := map[string]string{
		"huge-priority": "spec.priority: 1073741824 is not within 0-1000: the policy is not enforced until fixed",
		"no-tier":       `spec.tier: "Middle" is not Admin or Baseline`,
		"two-subjects":  "spec.subject: set exactly one of namespaces and pods",
		"bad-selector":  "spec.subject.namespaces: ",
		"bad-cidr":      `spec.egress[1].to[0].networks[0]: "10.0.0.1/8" is not a CIDR with no host bits`,
		"bad-action":    `spec.ingress[1].action: "Allow" is not Accept, Deny or Pass; spec.ingress[1] denies all traffic it could have matched (fail closed`,
		"bad-accept":    "spec.ingress[0].protocols[0].tcp.destinationPort.number: 70000 is not a port 1-65535; spec.ingress[0] accepts nothing until fixed",
		"domains":       "spec.egress[0].to[0].domainNames: tabby does not enforce domain names: this peer matches nothing",
	}
	for node, rs := range c.rs {
		got := map[string]string{}
		for _, p := range rs.Problems {
			if p.Kind != KindClusterNetworkPolicy || p.Namespace != "" {
				t.Errorf("node %s: problem %+v", node, p)
			}
			got[p.Name] += p.Message
		}
		for name, msg := range want {
			if !strings.Contains(got[name], msg) {
				t.Errorf("node %s: problem of %s = %q, want it to hold %q", node, name, got[name], msg)
			}
		}
		if len(got) != len(want) {
			t.Errorf("node %s: problems of %d policies, want %d: %v", node, len(got), len(want), got)
		}
	}
	for fam := range 2 {
		want := w.truthAll(true).
			set("x/*", "*", false).set("x/*", "y/*", true). // bad-cidr
			set("*", "y/*", false).set("y/*", "y/*", true). // bad-action: all but its Accept
			set("x/*", "z/*", false)                        // bad-accept
		if d := w.diff(want, c.observe(t, "tcp", 80, fam)); d != "" {
			t.Errorf("%s: %s", families[fam], d)
		}
	}
}

// TestCNPLimitsFailClosed: a ClusterNetworkPolicy over the limits is
// reported with the flag to raise, and fails closed as the API defines
// it: a direction with a Deny denies everything not decided before it; an
// Accept-only direction accepts nothing; other policies are enforced.
func TestCNPLimitsFailClosed(t *testing.T) {
	w := newXYZ(1)
	w.limits = Limits{SetMembers: 2}
	w.cnps = cnps(
		// Ingress to x: y's three pods in one set, over 2.
		cnp("deny-y", admin, 10, subjNs(mlp("ns", "x")), cin(deny, cpeers{pNs(mlp("ns", "y"))})),
		// Egress of z: accept to x's pods (over), then a Baseline deny
		// of everything decides instead.
		cnp("accept-x", admin, 10, subjNs(mlp("ns", "z")), ceg(accept, cpeers{pNs(mlp("ns", "x"))})),
		cnp("base", baseline, 10, subjNs(mlp("ns", "z")), ceg(deny, cpeers{pNets("0.0.0.0/0", "::/0")})),
		// Within the limits: enforced.
		cnp("deny-ya", admin, 20, subjNs(mlp("ns", "y")), cin(deny, cpeers{pPods(ml("ns", "x"), ml("pod", "a"))})),
	)
	c := w.compile(t)
	over := map[string]string{}
	for _, p := range c.rs["n1"].Problems {
		over[p.Name] = p.Limit
	}
	if len(over) != 2 || over["deny-y"] != FlagMaxSetMembers || over["accept-x"] != FlagMaxSetMembers {
		t.Fatalf("problems %+v, want deny-y and accept-x over --%s", c.rs["n1"].Problems, FlagMaxSetMembers)
	}
	for fam := range 2 {
		want := w.truthAll(true).
			set("*", "x/*", false). // deny-y, closed: all ingress of x
			set("z/*", "*", false). // accept-x accepts nothing, base denies
			set("x/a", "y/*", false)
		if d := w.diff(want, c.observe(t, "tcp", 80, fam)); d != "" {
			t.Errorf("%s: %s", families[fam], d)
		}
	}
}

// TestCNPDeniedLog: with the denied-packet log on, a ClusterNetworkPolicy's
// Deny logs before it drops, under a Denial naming the policy and its
// tier; a Baseline policy with only Accept rules logs nothing.
func TestCNPDeniedLog(t *testing.T) {
	w := newXYZ(1)
	w.deniedLog = &DeniedLog{}
	w.cnps = cnps(cnp("deny-y", admin, 10, subjNs(mlp("ns", "x")), cin(deny, cpeers{pNs(mlp("ns", "y"))})),
		cnp("accept", baseline, 10, subjNs(mlp("ns", "z")), cin(accept, cpeers{pNs(mlp("ns", "y"))})))
	rs := Compile(w.input("n1"))
	if err := denialsLogged(rs); err != nil {
		t.Fatal(err)
	}
	var cnpDenials []Denial
	for _, d := range rs.Denials {
		if strings.HasPrefix(d.Prefix, DeniedLogPrefix+"C") {
			cnpDenials = append(cnpDenials, d)
		}
	}
	if len(cnpDenials) != 1 || cnpDenials[0].Chain != chainName(kindCNPIngress, "cnp:deny-y") || cnpDenials[0].Direction != "ingress" ||
		cnpDenials[0].Reason() != "denied by cnp-admin:deny-y (a Deny rule of this ClusterNetworkPolicy, or one it fails closed on)" {
		t.Errorf("Denials of ClusterNetworkPolicies: %+v", cnpDenials)
	}
	c := w.compile(t)
	for fam := range 2 {
		if d := w.diff(w.truthAll(true).set("y/*", "x/*", false), c.observe(t, "tcp", 80, fam)); d != "" {
			t.Errorf("%s with the log on: %s", families[fam], d)
		}
	}
}
