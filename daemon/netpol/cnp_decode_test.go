package netpol

import (
	"fmt"
	"math/rand"
	"reflect"
	"slices"
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

// TestInputBuilderClusterPolicies: an InputBuilder decodes as
// DecodeClusterPolicies does, on random sequences of objects added,
// replaced (with good or undecodable specs) and removed; an object it
// had before gives the same policy object again; what it remembers stays
// within its bound and is swept.
func TestInputBuilderClusterPolicies(t *testing.T) {
	obj := func(name string, priority any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "policy.networking.k8s.io/v1beta1", "kind": "ClusterNetworkPolicy",
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"tier": "Admin", "priority": priority,
				"subject": map[string]any{"namespaces": map[string]any{}}}}}
	}
	swept := false
	for seed := range 100 {
		r := rand.New(rand.NewSource(int64(seed)))
		var b InputBuilder
		var objs []*unstructured.Unstructured
		last := map[*unstructured.Unstructured]*cnpv1.ClusterNetworkPolicy{}
		for step := range 40 {
			switch k := r.Intn(4); {
			case k == 0 || len(objs) == 0:
				objs = append(objs, obj(fmt.Sprintf("c%d", r.Intn(30)), int64(r.Intn(1000))))
			case k == 1:
				i := r.Intn(len(objs))
				priority := any(int64(r.Intn(1000)))
				if r.Intn(3) == 0 {
					priority = "first" // does not decode
				}
				objs[i] = obj(objs[i].GetName(), priority)
			case k == 2:
				i := r.Intn(len(objs))
				objs = slices.Delete(objs, i, i+1)
			}
			given := slices.Clone(objs)
			r.Shuffle(len(given), func(i, j int) { given[i], given[j] = given[j], given[i] })
			before := len(b.cnps)
			got, gotBad := b.ClusterPolicies(given)
			want, wantBad := DecodeClusterPolicies(given)
			if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(gotBad, wantBad) {
				t.Fatalf("seed %d step %d: got %v %v, want %v %v", seed, step, got, gotBad, want, wantBad)
			}
			now := map[*unstructured.Unstructured]*cnpv1.ClusterNetworkPolicy{}
			for _, o := range given {
				for _, p := range got {
					if e := b.cnps[o]; e != nil && e.policy == p {
						now[o] = p
					}
				}
			}
			for o, p := range now {
				if q, ok := last[o]; ok && q != p {
					t.Fatalf("seed %d step %d: object %s decoded again", seed, step, o.GetName())
				}
			}
			last = now
			if most := len(given) + len(given)/8 + 64; len(b.cnps) > most {
				t.Fatalf("seed %d step %d: %d objects remembered, more than %d", seed, step, len(b.cnps), most)
			}
			swept = swept || len(b.cnps) < before
		}
	}
	var b InputBuilder
	for round := range 20 {
		objs := make([]*unstructured.Unstructured, 8)
		for i := range objs {
			objs[i] = obj(fmt.Sprintf("c%d", i), int64(round))
		}
		before := len(b.cnps)
		b.ClusterPolicies(objs)
		swept = forgotTo(t, "objects", round, before, len(b.cnps), len(objs)) || swept
	}
	if !swept {
		t.Error("never forgot an object")
	}
}
