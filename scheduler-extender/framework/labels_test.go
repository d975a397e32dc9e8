package framework

import (
	"math/rand/v2"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// The compiled selector answers as labels.Selector.Matches does, on
// random label sets and selectors (every operator a label selector
// has), nil and empty selectors, and selectors it does not compile.
func TestCompiledSelectorMatchesLabelsSelector(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 35))
	keys := []string{"app", "tier", "env", "team"}
	vals := []string{"", "a", "b", "c"}
	pick := func(s []string) string { return s[r.IntN(len(s))] }
	randLabels := func() map[string]string {
		m := map[string]string{}
		for _, k := range keys {
			if r.IntN(2) == 0 {
				m[k] = pick(vals)
			}
		}
		return m
	}
	ops := []metav1.LabelSelectorOperator{metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn, metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist}
	randSelector := func() *metav1.LabelSelector {
		if r.IntN(10) == 0 {
			return nil
		}
		ls := &metav1.LabelSelector{}
		for range r.IntN(3) {
			if ls.MatchLabels == nil {
				ls.MatchLabels = map[string]string{}
			}
			ls.MatchLabels[pick(keys)] = pick(vals)
		}
		for range r.IntN(3) {
			req := metav1.LabelSelectorRequirement{Key: pick(keys), Operator: ops[r.IntN(len(ops))]}
			if req.Operator == metav1.LabelSelectorOpIn || req.Operator == metav1.LabelSelectorOpNotIn {
				for range 1 + r.IntN(3) {
					req.Values = append(req.Values, pick(vals))
				}
			}
			ls.MatchExpressions = append(ls.MatchExpressions, req)
		}
		return ls
	}
	for range 5000 {
		ls := randSelector()
		sel, err := metav1.LabelSelectorAsSelector(ls)
		if err != nil {
			t.Fatal(err)
		}
		c := CompileSelector(sel)
		for range 5 {
			m := randLabels()
			p := NewPodInfo(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: m}})
			if got, want := c.Matches(p), sel.Matches(labels.Set(m)); got != want {
				t.Fatalf("selector %v on %v: compiled %v, labels.Selector %v", sel, m, got, want)
			}
		}
	}
	// Gt and Lt (not in label selectors, but in labels.Parse) fall back to
	// the selector itself.
	gt, err := labels.Parse("replicas>3,app=web")
	if err != nil {
		t.Fatal(err)
	}
	c := CompileSelector(gt)
	for _, tc := range []struct {
		labels map[string]string
		want   bool
	}{
		{map[string]string{"replicas": "4", "app": "web"}, true},
		{map[string]string{"replicas": "3", "app": "web"}, false},
		{map[string]string{"app": "web"}, false},
	} {
		if got := c.Matches(NewPodInfo(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Labels: tc.labels}})); got != tc.want {
			t.Errorf("replicas>3,app=web on %v: %v", tc.labels, got)
		}
	}
}
