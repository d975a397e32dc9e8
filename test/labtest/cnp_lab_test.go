package labtest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestClusterNetworkPolicyTiers checks tabby's ClusterNetworkPolicy on
// real pods of a 2-node lab (the NetworkPolicy model: namespaces x, y, z,
// pods a, b, c, TCP and UDP on 80 and 81, same-node and cross-node
// paths), with the CRD and RBAC tabby.yaml installs and policies applied
// with kubectl as a user would: an Admin Deny overrides a NetworkPolicy's
// allow, an Admin Pass defers to the NetworkPolicy, and a Baseline Deny
// applies exactly where no NetworkPolicy selects the pod. (The SIG's own
// suite, TestCNPConformance, needs SCTP in the kernel.)
func TestClusterNetworkPolicyTiers(t *testing.T) {
	l := Up(t, "--nodes", "2")
	if out, code := l.Kubectl("get", "crd", "clusternetworkpolicies.policy.networking.k8s.io"); code != 0 {
		t.Fatalf("tabby.yaml did not install the ClusterNetworkPolicy CRD: %s", out)
	}
	m := NewNetpolModel(t, l, []string{"node1", "node2"})
	if !m.ValidateWithin(t, "no policy: all open", m.NewReachability(true), 60*time.Second) {
		t.Fatal("the model's pods do not reach each other without any policy")
	}
	x, y := NamespacePeer("x"), NamespacePeer("y")
	xa := PodPeer("x/a")
	apply := func(t *testing.T, docs ...string) {
		t.Helper()
		f := filepath.Join(t.TempDir(), "cnp.yaml")
		if err := os.WriteFile(f, []byte(strings.Join(docs, "\n---\n")), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, code := l.Kubectl("apply", "-f", f); code != 0 {
			t.Fatalf("kubectl apply: %s", out)
		}
	}
	scenarios := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"admin-deny-overrides-networkpolicy-allow", func(t *testing.T) {
			m.CreatePolicy(t, "x", npPolicy("allow-all", map[string]string{}, npIngress(npFrom(nil))))
			apply(t, cnpYAML("deny-y-to-x", "Admin", 10, "x", "Deny", "y"))
			m.Validate(t, "y cannot reach x although x allows all", m.NewReachability(true).Expect(y, x, false))
		}},
		{"admin-pass-defers-to-networkpolicy", func(t *testing.T) {
			m.CreatePolicy(t, "x", npPolicy("from-y", map[string]string{}, npIngress(npFrom(npPeers(npNsSel(npLabels("kubernetes.io/metadata.name", "y")))))))
			apply(t, cnpYAML("pass-y-to-x", "Admin", 5, "x", "Pass", "y"),
				cnpYAML("deny-all-to-x", "Admin", 10, "x", "Deny", ""))
			m.Validate(t, "only y reaches x: passed to the NetworkPolicy", m.NewReachability(true).ExpectAllIngress(x, false).Expect(y, x, true))
		}},
		{"baseline-deny-where-no-networkpolicy", func(t *testing.T) {
			m.CreatePolicy(t, "x", npPolicy("allow-all-to-a", map[string]string{"pod": "a"}, npIngress(npFrom(nil))))
			apply(t, cnpYAML("baseline-isolate", "Baseline", 50, "", "Deny", ""))
			m.Validate(t, "only x/a, which a NetworkPolicy selects, is reachable", m.NewReachability(false).ExpectAllIngress(xa, true))
		}},
	}
	failed := 0
	for _, sc := range scenarios {
		if !t.Run(sc.name, func(t *testing.T) {
			m.Reset(t)
			if out, code := l.Kubectl("delete", "clusternetworkpolicies", "--all"); code != 0 {
				t.Fatalf("kubectl delete: %s", out)
			}
			if !m.Validate(t, "reset: all open", m.NewReachability(true)) {
				t.Fatal("the previous scenario's policies are still enforced after their deletion")
			}
			sc.run(t)
		}) {
			failed++
		}
	}
	t.Logf("%d ClusterNetworkPolicy scenarios, %d failed", len(scenarios), failed)
}

// cnpYAML is a ClusterNetworkPolicy with one ingress rule: action on
// traffic to the pods of namespace to from those of namespace from ("": of
// every namespace).
func cnpYAML(name, tier string, priority int, to, action, from string) string {
	sel := func(ns string) string {
		if ns == "" {
			return "{}"
		}
		return fmt.Sprintf("{matchLabels: {kubernetes.io/metadata.name: %q}}", ns) // quoted: YAML reads a bare y as true
	}
	return fmt.Sprintf(`apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: %s}
spec:
  tier: %s
  priority: %d
  subject: {namespaces: %s}
  ingress:
  - action: %s
    from: [{namespaces: %s}]
`, name, tier, priority, sel(to), action, sel(from))
}
