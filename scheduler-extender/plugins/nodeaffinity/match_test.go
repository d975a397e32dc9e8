package nodeaffinity

import (
	"fmt"
	"math/rand/v2"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// TestRequiredMatchesUpstream compares the compiled matcher with upstream's
// RequiredNodeAffinity on random pods and nodes: keys, values and operators
// from a small vocabulary (invalid ones included), nodeSelectors,
// matchFields and empty terms.
func TestRequiredMatchesUpstream(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	keys := []string{"zone", "gpu", "rack", "bad key!"}
	vals := []string{"a", "b", "2", "8", "x"}
	ops := []v1.NodeSelectorOperator{v1.NodeSelectorOpIn, v1.NodeSelectorOpNotIn, v1.NodeSelectorOpExists, v1.NodeSelectorOpDoesNotExist, v1.NodeSelectorOpGt, v1.NodeSelectorOpLt, "Near"}
	pick := func(l []string, n int) []string {
		var out []string
		for range n {
			out = append(out, l[rng.IntN(len(l))])
		}
		return out
	}
	var nodes []*v1.Node
	for i := range 40 {
		n := &v1.Node{}
		n.Name = fmt.Sprintf("n%d", i%5)
		n.Labels = map[string]string{}
		for _, k := range pick(keys[:3], rng.IntN(4)) {
			n.Labels[k] = vals[rng.IntN(len(vals))]
		}
		nodes = append(nodes, n)
	}
	for i := range 3000 {
		pod := &v1.Pod{}
		if rng.IntN(3) == 0 {
			pod.Spec.NodeSelector = map[string]string{keys[rng.IntN(3)]: vals[rng.IntN(len(vals))]}
		}
		if rng.IntN(5) != 0 {
			sel := &v1.NodeSelector{}
			for range rng.IntN(4) {
				var term v1.NodeSelectorTerm
				for range rng.IntN(3) {
					term.MatchExpressions = append(term.MatchExpressions, v1.NodeSelectorRequirement{
						Key: keys[rng.IntN(len(keys))], Operator: ops[rng.IntN(len(ops))], Values: pick(vals, rng.IntN(3))})
				}
				if rng.IntN(4) == 0 {
					term.MatchFields = append(term.MatchFields, v1.NodeSelectorRequirement{
						Key: "metadata.name", Operator: ops[rng.IntN(2)], Values: pick([]string{"n1", "n2", "n3"}, 1+rng.IntN(2))})
				}
				sel.NodeSelectorTerms = append(sel.NodeSelectorTerms, term)
			}
			pod.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: sel}}
		}
		want := nodeaffinity.GetRequiredNodeAffinity(pod)
		got := CompileRequired(pod)
		for _, n := range nodes {
			w, _ := want.Match(n)
			// The node's labels interned once (as the cache does), and
			// a NodeInfo whose Node was set without them.
			for _, ni := range []*framework.NodeInfo{framework.NewNodeInfo(n), {Node: n}} {
				if g := got.Match(ni); g != w {
					t.Fatalf("pod %d %+v on node %s %v: got %v, upstream %v", i, pod.Spec, n.Name, n.Labels, g, w)
				}
			}
		}
	}
}
