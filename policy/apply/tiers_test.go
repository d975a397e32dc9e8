package apply_test

import (
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cnpv1 "github.com/tabbynet/tabby/api/cnp/v1beta1"
	"github.com/tabbynet/tabby/internal/iptbackend"
	"github.com/tabbynet/tabby/policy"
	"github.com/tabbynet/tabby/policy/apply"
)

// TestCompiledTiers runs the compiler's Ruleset for all three tiers
// against real TCP in the kernel, both families, every backend: pods a
// and b in namespace x, c and d in y. A NetworkPolicy in x allows ingress
// from y; an Admin Pass (priority 5) hands c's traffic to x on to it; an
// Admin Deny (priority 10) drops the rest of y's, overriding the
// NetworkPolicy's allow; a Baseline Deny drops x's traffic to y, where no
// NetworkPolicy selects the pods.
func TestCompiledTiers(t *testing.T) {
	needRoot(t)
	forEachBackend(t, testCompiledTiers)
}

func nsName(name string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": name}}
}

func testCompiledTiers(t *testing.T, b iptbackend.Backend) {
	n := newNode(t, b, apply.Options{})
	n.forwarding()
	a, bb, c, d := n.addPod("a", "taba", 1), n.addPod("b", "tabb", 2), n.addPod("c", "tabc", 3), n.addPod("d", "tabd", 4)
	serve(t, a, bb, c, d)
	in := &policy.Input{Node: "n1", DenyUnlisted: true,
		Policies: []*networkingv1.NetworkPolicy{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "from-y"},
			Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: nsName("y")}}}}},
		}},
		ClusterPolicies: []*cnpv1.ClusterNetworkPolicy{
			{ObjectMeta: metav1.ObjectMeta{Name: "pass-c"}, Spec: cnpv1.ClusterNetworkPolicySpec{
				Tier: cnpv1.AdminTier, Priority: 5, Subject: cnpv1.ClusterNetworkPolicySubject{Namespaces: nsName("x")},
				Ingress: []cnpv1.ClusterNetworkPolicyIngressRule{{Action: cnpv1.ActionPass, From: []cnpv1.ClusterNetworkPolicyIngressPeer{{
					Pods: &cnpv1.NamespacedPod{NamespaceSelector: *nsName("y"), PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "c"}}}}}}},
			}},
			{ObjectMeta: metav1.ObjectMeta{Name: "deny-y"}, Spec: cnpv1.ClusterNetworkPolicySpec{
				Tier: cnpv1.AdminTier, Priority: 10, Subject: cnpv1.ClusterNetworkPolicySubject{Namespaces: nsName("x")},
				Ingress: []cnpv1.ClusterNetworkPolicyIngressRule{{Action: cnpv1.ActionDeny, From: []cnpv1.ClusterNetworkPolicyIngressPeer{{Namespaces: nsName("y")}}}},
			}},
			{ObjectMeta: metav1.ObjectMeta{Name: "baseline-from-x"}, Spec: cnpv1.ClusterNetworkPolicySpec{
				Tier: cnpv1.BaselineTier, Priority: 1, Subject: cnpv1.ClusterNetworkPolicySubject{Namespaces: nsName("y")},
				Ingress: []cnpv1.ClusterNetworkPolicyIngressRule{{Action: cnpv1.ActionDeny, From: []cnpv1.ClusterNetworkPolicyIngressPeer{{Namespaces: nsName("x")}}}},
			}},
		}}
	for _, p := range []struct {
		pod *tpod
		ns  string
	}{{a, "x"}, {bb, "x"}, {c, "y"}, {d, "y"}} {
		in.Endpoints = append(in.Endpoints, policy.Endpoint{
			Pod:       &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.pod.name, Labels: map[string]string{"app": p.pod.name}}},
			IPs:       []netip.Addr{p.pod.v4, p.pod.v6},
			HostIface: p.pod.veth,
		})
	}
	rs := policy.Compile(in)
	if len(rs.Problems) > 0 {
		t.Fatalf("problems: %+v", rs.Problems)
	}
	n.apply(rs)
	if diff := cmpState(n, rs); diff != "" {
		t.Fatal(diff)
	}
	want := []struct {
		from, to *tpod
		ok       bool
		why      string
	}{
		{c, a, true, "Admin Pass, then the NetworkPolicy's allow"},
		{d, a, false, "Admin Deny overrides the NetworkPolicy's allow"},
		{d, bb, false, "Admin Deny overrides the NetworkPolicy's allow"},
		{bb, a, false, "the NetworkPolicy allows only y"},
		{a, c, false, "Baseline Deny: no NetworkPolicy selects c"},
		{bb, d, false, "Baseline Deny: no NetworkPolicy selects d"},
		{d, c, true, "nothing denies y to y"},
	}
	for _, w := range want {
		for fam := range 2 {
			timeout := 5 * time.Second
			if !w.ok {
				timeout = time.Second
			}
			err := connect(w.from, w.to, fam, timeout)
			if w.ok != (err == nil) {
				t.Errorf("%s -> %s (%s): %v, want answered %v (%s)", w.from.name, w.to.name, []string{"IPv4", "IPv6"}[fam], err, w.ok, w.why)
			}
		}
	}
}
