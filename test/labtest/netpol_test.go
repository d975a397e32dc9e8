package labtest

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// netpolScenario is one test of the upstream NetworkPolicy e2e suite
// (k8s.io/kubernetes test/e2e/network/netpol/network_policy.go), run on
// the full model (9 pods) and checked on the whole matrix: every pod to
// every pod on TCP and UDP ports 80 and 81, plus every node to its own
// pods (always allowed: kubelet probes).
type netpolScenario struct {
	name string
	// upstream is the upstream test's name ("" for a scenario upstream
	// does not have).
	upstream string
	run      func(t *testing.T, m *NetpolModel)
}

// denyIngress and denyEgress are upstream's default-deny policies of a
// namespace (every pod, no rule).
func denyIngress(name string) *networkingv1.NetworkPolicy {
	return npPolicy(name, map[string]string{}, npIngress())
}
func denyEgress(name string) *networkingv1.NetworkPolicy {
	return npPolicy(name, map[string]string{}, npEgress())
}

// largeCIDRFor is upstream's makeLargeCIDRForIP: the /4 holding ip.
func largeCIDRFor(p *NetpolPod) string {
	return netip.PrefixFrom(p.IP, 4).Masked().String()
}

// netpolScenarios are the scenarios, in order.
func netpolScenarios() []netpolScenario {
	const (
		ns    = "ns"                     // the label the model puts on its namespaces (ns=x, ...)
		nsKey = corev1.LabelMetadataName // kubernetes.io/metadata.name, set by the API server
	)
	var (
		x, y, z                = NamespacePeer("x"), NamespacePeer("y"), NamespacePeer("z")
		xa, xb, xc, ya, yb, zb = PodPeer("x/a"), PodPeer("x/b"), PodPeer("x/c"), PodPeer("y/a"), PodPeer("y/b"), PodPeer("z/b")
		zc                     = PodPeer("z/c")
		tcp, udp, sctp         = corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP
		podA                   = map[string]string{"pod": "a"}
		anyPod                 = map[string]string{}
		// allowAllIngress is an ingress rule with no peer and no port.
		allowAllIngress = networkingv1.NetworkPolicyIngressRule{}
	)
	return []netpolScenario{
		{"default-deny-ingress", "should support a 'default-deny-ingress' policy", func(t *testing.T, m *NetpolModel) {
			// Also upstream's UDP ("NetworkPolicy between server and client
			// using UDP") variant of the same name: all four ports are probed.
			m.CreatePolicy(t, "x", denyIngress("deny-ingress"))
			m.Validate(t, "deny ingress to x", m.NewReachability(true).ExpectAllIngress(x, false))
		}},
		{"default-deny-egress", "should deny egress from all pods in a namespace", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", denyEgress("deny-egress-ns-x"))
			m.Validate(t, "deny egress from x", m.NewReachability(true).ExpectAllEgress(x, false))
		}},
		{"default-deny-all", "should support a 'default-deny-all' policy", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("deny-all", anyPod, npIngress(), npEgress()))
			m.Validate(t, "deny all of x", m.NewReachability(true).ExpectAllIngress(x, false).ExpectAllEgress(x, false))
		}},
		{"allow-all-ingress", "should support allow-all policy", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-all", anyPod, npIngress(allowAllIngress)))
			m.Validate(t, "allow all ingress to x", m.NewReachability(true))
		}},
		{"allow-same-namespace", "should deny ingress from pods on other namespaces", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("deny-empty-policy", anyPod, npIngress(npFrom(npPeers(npPodSel(npLabels()))))))
			m.Validate(t, "only x reaches x", m.NewReachability(true).Expect(y, x, false).Expect(z, x, false))
		}},
		{"pod-selector", "should enforce policy to allow traffic from pods within server namespace based on PodSelector", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("x-a-allows-x-b", podA, npIngress(npFrom(npPeers(npPodSel(npLabels("pod", "b")))))))
			m.Validate(t, "only x/b reaches x/a", m.NewReachability(true).ExpectAllIngress(xa, false).Expect(xb, xa, true))
		}},
		{"pod-selector-expressions", "should enforce policy based on PodSelector with MatchExpressions", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("x-a-allows-x-b", podA, npIngress(npFrom(npPeers(npPodSel(npExpr("pod", metav1.LabelSelectorOpIn, "b")))))))
			m.Validate(t, "only x/b reaches x/a", m.NewReachability(true).ExpectAllIngress(xa, false).Expect(xb, xa, true))
		}},
		{"allow-to-target", "should enforce policy to allow ingress traffic for a target", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", denyIngress("deny-all"))
			m.CreatePolicy(t, "x", npPolicy("allow-all-to-a", podA, npIngress(npFrom(npPeers(npPodNsSel(npLabels(), npLabels()))))))
			m.Validate(t, "all reach x/a, none x/b x/c", m.NewReachability(true).ExpectAllIngress(xb, false).ExpectAllIngress(xc, false))
		}},
		{"from-all-namespaces", "should enforce policy to allow ingress traffic from pods in all namespaces", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-from-another-ns", podA, npIngress(npFrom(npPeers(npNsSel(npLabels()))))))
			m.Validate(t, "an empty namespaceSelector matches every namespace", m.NewReachability(true))
		}},
		{"namespace-selector", "should enforce policy to allow traffic only from a different namespace, based on NamespaceSelector", func(t *testing.T, m *NetpolModel) {
			// With the model's own namespace label (ns=y), as upstream did
			// before the default label existed.
			m.CreatePolicy(t, "x", npPolicy("allow-client-a-via-ns-selector", podA, npIngress(npFrom(npPeers(npNsSel(npLabels(ns, "y")))))))
			m.Validate(t, "only y reaches x/a", m.NewReachability(true).Expect(x, xa, false).Expect(z, xa, false))
		}},
		{"namespace-selector-default-label", "should enforce policy to allow traffic based on NamespaceSelector with MatchLabels using default ns label", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-client-a-via-ns-selector-for-immutable-ns-label", podA, npIngress(npFrom(npPeers(npNsSel(npLabels(nsKey, "y")))))))
			m.Validate(t, "only y reaches x/a", m.NewReachability(true).Expect(x, xa, false).Expect(z, xa, false))
		}},
		{"namespace-selector-expressions", "should enforce policy based on NamespaceSelector with MatchExpressions", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-ns-y-match-selector", podA, npIngress(npFrom(npPeers(npNsSel(npExpr(nsKey, metav1.LabelSelectorOpIn, "y")))))))
			m.Validate(t, "only y reaches x/a", m.NewReachability(true).Expect(x, xa, false).Expect(z, xa, false))
		}},
		{"pod-or-namespace-selector", "should enforce policy based on PodSelector or NamespaceSelector", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-ns-y-match-selector", podA, npIngress(npFrom(npPeers(
				npNsSel(npExpr(nsKey, metav1.LabelSelectorOpNotIn, "x")), npPodSel(npLabels("pod", "b")))))))
			m.Validate(t, "other namespaces or x/b reach x/a", m.NewReachability(true).Expect(xc, xa, false))
		}},
		{"pod-and-namespace-selector", "should enforce policy based on PodSelector and NamespaceSelector", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-ns-y-podselector-and-nsselector", podA, npIngress(npFrom(npPeers(
				npPodNsSel(npLabels("pod", "b"), npExpr(nsKey, metav1.LabelSelectorOpNotIn, "x")))))))
			m.Validate(t, "only y/b and z/b reach x/a", m.NewReachability(true).ExpectAllIngress(xa, false).Expect(yb, xa, true).Expect(zb, xa, true))
		}},
		{"multiple-pod-and-namespace-selectors", "should enforce policy based on Multiple PodSelectors and NamespaceSelectors", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-ns-y-z-pod-b-c", podA, npIngress(npFrom(npPeers(
				npPodNsSel(npExpr("pod", metav1.LabelSelectorOpIn, "b", "c"), npExpr(nsKey, metav1.LabelSelectorOpNotIn, "x")))))))
			m.Validate(t, "b and c of y and z reach x/a", m.NewReachability(true).Expect(x, xa, false).Expect(ya, xa, false).Expect(PodPeer("z/a"), xa, false))
		}},
		{"any-pod-selectors", "should enforce policy based on any PodSelectors", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-ns-x-pod-b-c", podA, npIngress(npFrom(npPeers(
				npPodSel(npLabels("pod", "b")), npPodSel(npLabels("pod", "c")))))))
			m.Validate(t, "x/b and x/c reach x/a", m.NewReachability(true).ExpectAllIngress(xa, false).Expect(xb, xa, true).Expect(xc, xa, true))
		}},
		{"pod-in-other-namespace", "should enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-ns-y-pod-a-via-namespace-pod-selector", podA, npIngress(npFrom(npPeers(
				npPodNsSel(npLabels("pod", "a"), npLabels(nsKey, "y")))))))
			m.Validate(t, "only y/a reaches x/a", m.NewReachability(true).ExpectAllIngress(xa, false).Expect(ya, xa, true))
		}},
		{"port-81", "should enforce policy based on Ports", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-client-a-via-ns-selector", podA, npIngress(npFrom(npPeers(npNsSel(npLabels(nsKey, "y"))), npPort(81, tcp)))))
			m.Validate(t, "only y reaches x/a, on TCP 81 only", m.NewReachability(true).ExpectAllIngress(xa, false).Expect(y, xa, true, TCP81))
		}},
		{"udp-port-81", "should enforce policy based on Ports (UDP)", func(t *testing.T, m *NetpolModel) {
			// Upstream: "NetworkPolicy between server and client using UDP
			// should enforce policy based on Ports".
			m.CreatePolicy(t, "x", npPolicy("allow-ingress-on-port-81-ns-x", podA, npIngress(npFrom(npPeers(npNsSel(npLabels(nsKey, "y"))), npPort(81, udp)))))
			m.Validate(t, "only y reaches x/a, on UDP 81 only", m.NewReachability(true).ExpectAllIngress(xa, false).Expect(y, xa, true, UDP81))
		}},
		{"stacked-policies", "should enforce multiple, stacked policies with overlapping podSelectors", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-client-a-via-ns-selector", podA, npIngress(npFrom(npPeers(npNsSel(npLabels(nsKey, "y"))), npPort(81, tcp)))))
			m.Validate(t, "y reaches x/a on TCP 81", m.NewReachability(true).ExpectAllIngress(xa, false).Expect(y, xa, true, TCP81))
			m.CreatePolicy(t, "x", npPolicy("allow-client-a-via-ns-selector-80", podA, npIngress(npFrom(npPeers(npNsSel(npLabels(nsKey, "y"))), npPort(80, tcp)))))
			m.Validate(t, "a second policy unblocks TCP 80", m.NewReachability(true).ExpectAllIngress(xa, false).Expect(y, xa, true, TCP80, TCP81))
		}},
		{"multiple-policies-union", "", func(t *testing.T, m *NetpolModel) {
			// Two policies select x/a with different peers: the union is allowed.
			m.CreatePolicy(t, "x", npPolicy("from-x-b", podA, npIngress(npFrom(npPeers(npPodSel(npLabels("pod", "b")))))))
			m.CreatePolicy(t, "x", npPolicy("from-z", podA, npIngress(npFrom(npPeers(npNsSel(npLabels(nsKey, "z")))))))
			m.Validate(t, "x/b and z reach x/a", m.NewReachability(true).ExpectAllIngress(xa, false).Expect(xb, xa, true).Expect(z, xa, true))
		}},
		{"ingress-named-port", "should allow ingress access on one named port", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-all", anyPod, npIngress(npFrom(nil, npNamedPort("serve-81-tcp", "")))))
			m.Validate(t, "x open on TCP 81 only", m.NewReachability(true).ExpectAllIngress(x, false, TCP80, UDP80, UDP81))
		}},
		{"ingress-named-port-from-namespace", "should allow ingress access from namespace on one named port", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-client-a-via-ns-selector-80", podA, npIngress(npFrom(npPeers(npNsSel(npLabels(nsKey, "y"))), npNamedPort("serve-80-tcp", tcp)))))
			m.Validate(t, "y reaches x/a on TCP 80 only", m.NewReachability(true).ExpectAllIngress(xa, false).Expect(y, xa, true, TCP80))
		}},
		{"egress-named-port", "should allow egress access on one named port", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-egress", anyPod, npEgress(npTo(nil, npNamedPort("serve-80-tcp", "")))))
			m.Validate(t, "x sends on TCP 80 only", m.NewReachability(true).ExpectAllEgress(x, false, TCP81, UDP80, UDP81))
		}},
		{"egress-named-port-udp", "", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-egress-udp-81", podA, npEgress(npTo(nil, npNamedPort("serve-81-udp", udp)))))
			m.Validate(t, "x/a sends on UDP 81 only", m.NewReachability(true).ExpectAllEgress(xa, false, TCP80, TCP81, UDP80))
		}},
		{"endport-ingress", "", func(t *testing.T, m *NetpolModel) {
			// endPort (KEP-2079): TCP 80-81 holds both ends; UDP 81-90 starts
			// above 80.
			m.CreatePolicy(t, "x", npPolicy("allow-ranges-from-y", podA, npIngress(npFrom(npPeers(npNsSel(npLabels(nsKey, "y"))),
				npPortRange(80, 81, tcp), npPortRange(81, 90, udp)))))
			m.Validate(t, "y reaches x/a on TCP 80-81 and UDP 81", m.NewReachability(true).ExpectAllIngress(xa, false).Expect(y, xa, true, TCP80, TCP81, UDP81))
		}},
		{"endport-egress", "", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("egress-ranges", anyPod, npEgress(npTo(nil, npPortRange(79, 80, udp), npPortRange(81, 81, tcp)))))
			m.Validate(t, "x sends on UDP 79-80 and TCP 81-81", m.NewReachability(true).ExpectAllEgress(x, false, TCP80, UDP81))
		}},
		{"any-port-of-protocol", "should enforce ingress policy allowing any port traffic to a server on a specific protocol", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-ingress-by-proto", podA, npIngress(npFrom(nil, npProtoOnly(tcp)))))
			m.Validate(t, "x/a open on TCP only", m.NewReachability(true).ExpectAllIngress(xa, false, UDP80, UDP81))
		}},
		{"udp-only", "should not allow access by TCP when a policy specifies only UDP", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-only-udp-ingress-on-port-81", podA, npIngress(npFrom(nil, npPort(81, udp)))))
			m.Validate(t, "x/a open on UDP 81 only", m.NewReachability(true).ExpectAllIngress(xa, false, TCP80, TCP81, UDP80))
		}},
		{"sctp-is-not-tcp", "should not mistakenly treat 'protocol: SCTP' as 'protocol: TCP', even if the plugin doesn't support SCTP", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", denyIngress("deny-ingress"))
			m.CreatePolicy(t, "x", npPolicy("allow-only-sctp-ingress-on-port-81", podA, npIngress(npFrom(nil, npPort(81, sctp)))))
			m.Validate(t, "x closed to TCP and UDP", m.NewReachability(true).ExpectAllIngress(x, false))
		}},
		{"sctp-isolates", "should properly isolate pods that are selected by a policy allowing SCTP, even if the plugin doesn't support SCTP", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-only-sctp-ingress-on-port-80", podA, npIngress(npFrom(nil, npPort(80, sctp)))))
			m.Validate(t, "x/a closed to TCP and UDP", m.NewReachability(true).ExpectAllIngress(xa, false))
		}},
		{"ingress-allow-all-precedence", "should enforce multiple ingress policies with ingress allow-all policy taking precedence", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-ingress-port-80", anyPod, npIngress(npFrom(nil, npPort(80, "")))))
			m.Validate(t, "x open on TCP 80 only", m.NewReachability(true).ExpectAllIngress(x, false, TCP81, UDP80, UDP81))
			m.CreatePolicy(t, "x", npPolicy("allow-ingress", anyPod, npIngress(allowAllIngress)))
			m.Validate(t, "allow-all opens everything", m.NewReachability(true))
		}},
		{"egress-allow-all-precedence", "should enforce multiple egress policies with egress allow-all policy taking precedence", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-egress-port-80", anyPod, npEgress(npTo(nil, npPort(80, "")))))
			m.Validate(t, "x sends on TCP 80 only", m.NewReachability(true).ExpectAllEgress(x, false, TCP81, UDP80, UDP81))
			m.CreatePolicy(t, "x", npPolicy("allow-egress", anyPod, npEgress(networkingv1.NetworkPolicyEgressRule{})))
			m.Validate(t, "allow-all opens everything", m.NewReachability(true))
		}},
		{"deny-egress-by-pod-selector", "should deny egress from pods based on PodSelector", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("deny-egress-pod-a", podA, npEgress()))
			m.Validate(t, "x/a sends nothing", m.NewReachability(true).ExpectAllEgress(xa, false))
		}},
		{"ingress-and-egress", "should work with Ingress, Egress specified together", func(t *testing.T, m *NetpolModel) {
			np := npPolicy("allow-client-a-via-pod-selector", podA, npIngress(npFrom(npPeers(npPodSel(npLabels("pod", "b"))))), npEgress(npTo(nil, npPort(80, ""))))
			m.CreatePolicy(t, "x", np)
			m.Validate(t, "x/b reaches x/a; x/a sends on TCP 80 only", m.NewReachability(true).
				ExpectAllIngress(xa, false).Expect(xb, xa, true).ExpectAllEgress(xa, false, TCP81, UDP80, UDP81))
		}},
		{"egress-denied-on-client", "should support denying of egress traffic on the client side (even if the server explicitly allows this traffic)", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-to-ns-y-pod-a", podA, npEgress(npTo(npPeers(npPodNsSel(npLabels("pod", "a"), npLabels(nsKey, "y")))))))
			from := npIngress(npFrom(npPeers(npPodNsSel(npLabels("pod", "a"), npLabels(nsKey, "x")))))
			m.CreatePolicy(t, "y", npPolicy("allow-from-xa-on-ya-match-selector", podA, from))
			m.CreatePolicy(t, "y", npPolicy("allow-from-xa-on-yb-match-selector", map[string]string{"pod": "b"}, from))
			m.Validate(t, "x/a reaches y/a only", m.NewReachability(true).
				ExpectAllEgress(xa, false).ExpectAllIngress(ya, false).Expect(xa, ya, true).ExpectAllIngress(yb, false))
		}},
		{"egress-to-pod-in-namespace", "should enforce egress policy allowing traffic to a server in a different namespace based on PodSelector and NamespaceSelector", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-to-ns-y-pod-a", podA, npEgress(npTo(npPeers(npPodNsSel(npLabels("pod", "a"), npLabels(nsKey, "y")))))))
			m.Validate(t, "x/a reaches y/a only", m.NewReachability(true).ExpectAllEgress(xa, false).Expect(xa, ya, true))
		}},
		{"egress-namespace-expressions", "should enforce policy based on NamespaceSelector with MatchExpressions using default ns label", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-ns-y-match-selector-for-immutable-ns-label", podA, npEgress(npTo(npPeers(
				npNsSel(npExpr(nsKey, metav1.LabelSelectorOpNotIn, "y")))))))
			m.Validate(t, "x/a reaches all but y", m.NewReachability(true).Expect(xa, y, false))
		}},
		{"deny-egress-allow-dns-like", "", func(t *testing.T, m *NetpolModel) {
			// The usual pair: default-deny egress, then allow "DNS" to one
			// namespace: UDP and TCP 53 (nothing serves them) and UDP 80, the
			// model's stand-in for a DNS server in namespace z.
			m.CreatePolicy(t, "x", denyEgress("default-deny-egress"))
			m.CreatePolicy(t, "x", npPolicy("allow-dns", anyPod, npEgress(npTo(npPeers(npNsSel(npLabels(nsKey, "z"))),
				npPort(53, udp), npPort(53, tcp), npPort(80, udp)))))
			m.Validate(t, "x sends only UDP 80 to z", m.NewReachability(true).ExpectAllEgress(x, false).Expect(x, z, true, UDP80))
		}},
		{"egress-only-policy-type", "", func(t *testing.T, m *NetpolModel) {
			// policyTypes [Egress] with no egress rule denies all egress; the
			// ingress rules it carries are ignored (ingress stays open).
			np := npPolicy("egress-only", anyPod, npEgress())
			np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{npFrom(npPeers(npPodSel(npLabels("pod", "nomatch"))))}
			m.CreatePolicy(t, "x", np)
			m.Validate(t, "x sends nothing, receives everything", m.NewReachability(true).ExpectAllEgress(x, false))
		}},
		{"default-policy-types", "", func(t *testing.T, m *NetpolModel) {
			// No policyTypes and an egress rule: the API server defaults them
			// to [Ingress Egress], so x/a is isolated both ways.
			np := npPolicy("default-types", podA)
			np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{npTo(npPeers(npNsSel(npLabels(nsKey, "z"))))}
			m.CreatePolicy(t, "x", np)
			m.Validate(t, "x/a receives nothing, sends to z only", m.NewReachability(true).
				ExpectAllIngress(xa, false).ExpectAllEgress(xa, false).Expect(xa, z, true))
		}},
		{"egress-ipblock", "should allow egress access to server in CIDR block", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-client-a-via-cidr-egress-rule", podA, npEgress(npTo(npPeers(npIPBlock(npHostCIDR(m.Pod(t, "y/b"))))))))
			m.Validate(t, "x/a reaches y/b only", m.NewReachability(true).ExpectAllEgress(xa, false).Expect(xa, yb, true))
		}},
		{"egress-ipblock-except", "should enforce except clause while egress access to server in CIDR block", func(t *testing.T, m *NetpolModel) {
			b := m.Pod(t, "x/b")
			m.CreatePolicy(t, "x", npPolicy("allow-client-a-via-cidr-egress-rule", podA, npEgress(npTo(npPeers(npIPBlock(largeCIDRFor(b), npHostCIDR(b)))))))
			m.Validate(t, "x/a reaches all but x/b", m.NewReachability(true).Expect(xa, xb, false))
		}},
		{"ipblock-cidr-and-except-overlap", "should ensure an IP overlapping both npIPBlock.CIDR and npIPBlock.Except is allowed", func(t *testing.T, m *NetpolModel) {
			b := m.Pod(t, "x/b")
			m.CreatePolicy(t, "x", npPolicy("allow-client-a-via-cidr-egress-rule", podA, npEgress(npTo(npPeers(npIPBlock(largeCIDRFor(b), npHostCIDR(b)))))))
			m.Validate(t, "x/a reaches all but x/b", m.NewReachability(true).Expect(xa, xb, false))
			// A second policy allows exactly the excepted address: the union
			// opens it.
			m.CreatePolicy(t, "x", npPolicy("allow-client-a-to-x-b", podA, npEgress(npTo(npPeers(npIPBlock(npHostCIDR(b)))))))
			m.Validate(t, "another policy allows x/b", m.NewReachability(true))
			// Upstream's last step: only x/b allowed.
			m.DeletePolicy(t, "x", "allow-client-a-via-cidr-egress-rule")
			m.Validate(t, "x/a reaches x/b only", m.NewReachability(true).ExpectAllEgress(xa, false).Expect(xa, xb, true))
		}},
		{"ingress-ipblock-except", "", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("from-pod-cidr-but-y-b", podA, npIngress(npFrom(npPeers(
				npIPBlock(m.PodCIDR(), npHostCIDR(m.Pod(t, "y/b"))))))))
			m.Validate(t, "all but y/b reach x/a", m.NewReachability(true).Expect(yb, xa, false))
		}},
		{"ingress-ipblock-pod-ips", "", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("from-y-a-and-z-c", podA, npIngress(npFrom(npPeers(
				npIPBlock(npHostCIDR(m.Pod(t, "y/a"))), npIPBlock(npHostCIDR(m.Pod(t, "z/c"))))))))
			m.Validate(t, "y/a and z/c reach x/a", m.NewReachability(true).ExpectAllIngress(xa, false).Expect(ya, xa, true).Expect(zc, xa, true))
		}},
		{"egress-ipblock-cidr", "", func(t *testing.T, m *NetpolModel) {
			// A CIDR around z/b that holds some pods but not all: the
			// expectation follows the addresses the pods got.
			cidr := someCIDR(t, m, m.Pod(t, "z/b"))
			m.CreatePolicy(t, "x", npPolicy("to-cidr", podA, npEgress(npTo(npPeers(npIPBlock(cidr.String()))))))
			m.Validate(t, "x/a reaches the pods in "+cidr.String(), m.NewReachability(true).ExpectFunc(
				func(from, to *NetpolPod, _ PortProto) (bool, bool) {
					return cidr.Contains(to.IP), from.String() == "x/a"
				}))
		}},
		{"independent-ingress-egress", "should enforce policies to check ingress and egress policies can be controlled independently based on PodSelector", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-egress-for-target", podA, npEgress(networkingv1.NetworkPolicyEgressRule{})))
			m.Validate(t, "egress allow-all changes nothing", m.NewReachability(true))
			m.CreatePolicy(t, "x", npPolicy("deny-ingress-via-label-selector", podA, npIngress()))
			m.Validate(t, "x/a receives nothing", m.NewReachability(true).ExpectAllIngress(xa, false))
		}},
		{"policy-update", "should enforce updated policy", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-all-mutate-to-deny-all", anyPod, npIngress(allowAllIngress)))
			m.Validate(t, "allow all", m.NewReachability(true))
			m.UpdatePolicy(t, "x", "allow-all-mutate-to-deny-all", func(np *networkingv1.NetworkPolicy) {
				np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{}
			})
			m.Validate(t, "updated to deny all", m.NewReachability(true).ExpectAllIngress(x, false))
		}},
		{"policy-update-selector", "", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("deny-one", podA, npIngress()))
			m.Validate(t, "x/a isolated", m.NewReachability(true).ExpectAllIngress(xa, false))
			m.UpdatePolicy(t, "x", "deny-one", func(np *networkingv1.NetworkPolicy) {
				np.Spec.PodSelector = *npLabels("pod", "b")
			})
			m.Validate(t, "x/b isolated instead", m.NewReachability(true).ExpectAllIngress(xb, false))
		}},
		{"policy-delete", "should stop enforcing policies after they are deleted", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("deny-all", anyPod, npIngress(), npEgress()))
			m.Validate(t, "deny all of x", m.NewReachability(true).ExpectAllIngress(x, false).ExpectAllEgress(x, false))
			m.DeleteAllPolicies(t)
			m.Validate(t, "policy deleted: all open", m.NewReachability(true))
		}},
		{"namespace-label-change", "should allow ingress access from updated namespace", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-client-a-via-ns-selector", podA, npIngress(npFrom(npPeers(npNsSel(npLabels("ns2", "updated")))))))
			m.Validate(t, "no namespace matches", m.NewReachability(true).ExpectAllIngress(xa, false))
			m.LabelNamespace(t, "y", map[string]*string{"ns2": ptr.To("updated")})
			m.Validate(t, "y labelled ns2=updated", m.NewReachability(true).ExpectAllIngress(xa, false).Expect(y, xa, true))
			m.LabelNamespace(t, "y", map[string]*string{"ns2": nil})
			m.Validate(t, "label removed again", m.NewReachability(true).ExpectAllIngress(xa, false))
		}},
		{"pod-label-change-peer", "should allow ingress access from updated pod", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("allow-client-a-via-pod-selector", podA, npIngress(npFrom(npPeers(npPodSel(npLabels("pod", "b", "pod2", "updated")))))))
			m.Validate(t, "no pod matches", m.NewReachability(true).ExpectAllIngress(xa, false))
			m.LabelPod(t, "x/b", map[string]*string{"pod2": ptr.To("updated")})
			m.Validate(t, "x/b labelled pod2=updated", m.NewReachability(true).ExpectAllIngress(xa, false).Expect(xb, xa, true))
			m.LabelPod(t, "x/b", map[string]*string{"pod2": nil})
			m.Validate(t, "label removed again", m.NewReachability(true).ExpectAllIngress(xa, false))
		}},
		{"pod-label-change-target", "should deny ingress access to updated pod", func(t *testing.T, m *NetpolModel) {
			m.CreatePolicy(t, "x", npPolicy("deny-ingress-via-label-selector", map[string]string{"target": "isolated"}, npIngress()))
			m.Validate(t, "no pod selected", m.NewReachability(true))
			m.LabelPod(t, "x/a", map[string]*string{"target": ptr.To("isolated")})
			m.Validate(t, "x/a labelled target=isolated", m.NewReachability(true).ExpectAllIngress(xa, false))
			m.LabelPod(t, "x/a", map[string]*string{"target": nil})
			m.Validate(t, "label removed again", m.NewReachability(true))
		}},
	}
}

// someCIDR is a prefix around p's address holding at least two other
// model pods but not every pod.
func someCIDR(t *testing.T, m *NetpolModel, p *NetpolPod) netip.Prefix {
	t.Helper()
	for bits := p.IP.BitLen() - 2; bits >= 8; bits-- {
		cidr := netip.PrefixFrom(p.IP, bits).Masked()
		n := 0
		for _, q := range m.Pods {
			if cidr.Contains(q.IP) {
				n++
			}
		}
		if n >= 3 && n < len(m.Pods) {
			return cidr
		}
	}
	return netip.PrefixFrom(p.IP, p.IP.BitLen())
}

// TestNetworkPolicy runs the upstream NetworkPolicy e2e scenarios as
// truth tables in one 2-node lab: namespaces x, y, z with pods a, b, c
// spread over both nodes (same-node and cross-node paths), real pods of
// the nodes' kubelets, each serving TCP and UDP on 80 and 81 from agnhost
// containers. Every scenario starts from no policy (the matrix all open),
// creates its policies and checks the whole matrix, then the next
// scenario removes them. The lab is dual-stack: every scenario runs over
// IPv4, then again over IPv6 (the pods' IPv6 addresses, IPv6 ipBlocks).
//
// It does not run in parallel with the package's other labs: probes time
// out after a second, and a loaded 2-core machine would make slow answers
// look like denials.
func TestNetworkPolicy(t *testing.T) {
	start := time.Now()
	if err := SCTPSupport(); err != nil {
		t.Logf("SCTP traffic is not probed (upstream's [Feature:SCTPConnectivity]): this kernel has no SCTP (%v); the scenarios with SCTP ports run and check TCP and UDP", err)
	} else {
		t.Logf("SCTP traffic is not probed (upstream's [Feature:SCTPConnectivity]: the model serves TCP and UDP); the scenarios with SCTP ports check TCP and UDP")
	}
	// Dual-stack: the scenarios run over IPv4, then again over IPv6.
	l := Up(t, "--nodes", "2", "--dual-stack")
	m := NewNetpolModel(t, l, []string{"node1", "node2"})
	for _, p := range m.Pods {
		t.Logf("pod %s on %s at %v", p, p.Node, p.IPs)
	}
	t.Logf("model ready %v after start", time.Since(start).Round(time.Millisecond))
	type result struct {
		name string
		ok   bool
		took time.Duration
	}
	var results []result
	for _, family := range []int{4, 6} {
		m.SetFamily(t, family)
		prefix := ""
		if family == 6 {
			prefix = "ipv6/"
		}
		m.Reset(t) // the last family's last world leaves its policies
		// The first matrix waits for routes between the nodes too.
		if !m.ValidateWithin(t, prefix+"no policy: all open", m.NewReachability(true), 60*time.Second) {
			t.Fatalf("the model's pods do not reach each other over IPv%d without any policy", family)
		}
		for i, sc := range netpolScenarios() {
			scStart := time.Now()
			ok := t.Run(prefix+sc.name, func(t *testing.T) {
				if sc.upstream != "" {
					t.Logf("upstream: %q", sc.upstream)
				}
				m.Reset(t)
				if !m.Validate(t, "reset: all open", m.NewReachability(true)) {
					t.Fatal("the previous scenario's policies are still enforced after their deletion")
				}
				sc.run(t, m)
			})
			results = append(results, result{prefix + sc.name, ok, time.Since(scStart)})
			if i == 0 && !ok && m.LastDenied() == 0 {
				t.Fatalf("tabbyd enforces no NetworkPolicy at all: after %q nothing was denied (is the policy controller running in tabbyd?)", sc.name)
			}
		}
		if family == 4 {
			trStart := time.Now()
			ok := t.Run("trace agrees with probes", func(t *testing.T) { TraceAgreesWithProbes(t, m, 1, 6) })
			results = append(results, result{"tabbyctl policy trace vs probes", ok, time.Since(trStart)})
		}
	}
	var b strings.Builder
	failed := 0
	for _, r := range results {
		verdict := "ok"
		if !r.ok {
			verdict = "FAIL"
			failed++
		}
		fmt.Fprintf(&b, "  %-4s %-40s %v\n", verdict, r.name, r.took.Round(100*time.Millisecond))
	}
	t.Logf("%d scenarios, %d failed, %v in all:\n%s", len(results), failed, time.Since(start).Round(time.Second), b.String())
}
