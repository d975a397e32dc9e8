package netpol

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	cnpv1 "github.com/tabbynet/tabby/api/cnp/v1beta1"
	"github.com/tabbynet/tabby/policy"
)

// TestDecodeClusterPolicies: objects decode field for field; one whose
// numbers do not fit (a priority of 2^40 would truncate to 0 through a
// plain reflection conversion) or whose fields have the wrong type is a
// problem naming the field, and the others still decode.
func TestDecodeClusterPolicies(t *testing.T) {
	obj := func(name string, spec map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "policy.networking.k8s.io/v1beta1", "kind": "ClusterNetworkPolicy",
			"metadata": map[string]any{"name": name}, "spec": spec}}
	}
	subject := map[string]any{"pods": map[string]any{"namespaceSelector": map[string]any{}, "podSelector": map[string]any{"matchLabels": map[string]any{"app": "db"}}}}
	good := obj("good", map[string]any{"tier": "Baseline", "priority": int64(7), "subject": subject,
		"egress": []any{map[string]any{"name": "web", "action": "Accept", "to": []any{map[string]any{"networks": []any{"10.0.0.0/8"}}},
			"protocols": []any{map[string]any{"tcp": map[string]any{"destinationPort": map[string]any{"range": map[string]any{"start": int64(80), "end": int64(90)}}}}}}}})
	huge := obj("huge", map[string]any{"tier": "Admin", "priority": int64(1) << 40, "subject": subject})
	typed := obj("typed", map[string]any{"tier": "Admin", "priority": "first", "subject": subject})
	ps, problems := DecodeClusterPolicies([]*unstructured.Unstructured{huge, good, nil, typed})
	if len(ps) != 1 || ps[0].Name != "good" {
		t.Fatalf("decoded %v, want only good", ps)
	}
	s := ps[0].Spec
	if s.Tier != cnpv1.BaselineTier || s.Priority != 7 || s.Subject.Pods.PodSelector.MatchLabels["app"] != "db" ||
		s.Egress[0].Name != "web" || s.Egress[0].To[0].Networks[0] != "10.0.0.0/8" || s.Egress[0].Protocols[0].TCP.DestinationPort.Range.End != 90 {
		t.Errorf("decoded %+v", s)
	}
	if len(problems) != 2 {
		t.Fatalf("problems %+v, want 2", problems)
	}
	for i, name := range []string{"huge", "typed"} {
		p := problems[i]
		if p.Kind != policy.KindClusterNetworkPolicy || p.Name != name || !strings.Contains(p.Message, "spec.priority") ||
			!strings.Contains(p.Message, "not enforced until fixed") {
			t.Errorf("problem %+v", p)
		}
	}
}
