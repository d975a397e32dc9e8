package extender

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
	"github.com/tabbynet/tabby/scheduler-extender/plugins/nodeaffinity"
	"github.com/tabbynet/tabby/scheduler-extender/plugins/nodename"
	"github.com/tabbynet/tabby/scheduler-extender/plugins/tainttoleration"
)

// testScheduler is the framework with the node plugins over an empty
// cluster (the request's nodes are all it knows), scoring by node affinity
// alone so that the scores below are easy to follow.
func testScheduler() Scheduler {
	return &framework.Framework{
		Snapshot: func() framework.Snapshot { return framework.NewSnapshot(nil, nil, nil) },
		Filters:  []framework.FilterPlugin{nodename.Plugin{}, tainttoleration.Plugin{}, nodeaffinity.Plugin{}},
		Scores:   []framework.WeightedScore{{Plugin: nodeaffinity.Plugin{}, Weight: 2}},
	}
}

const reasonNodeAffinity = nodeaffinity.ErrReasonPod

func node(name string, labels map[string]string) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

// testNodes: n1 zone=a gpu=2, n2 zone=b gpu=8, n3 zone=c (no gpu), n4 no labels,
// n5 gpu=many (not an integer).
func testNodes() []*v1.Node {
	return []*v1.Node{
		node("n1", map[string]string{"zone": "a", "gpu": "2"}),
		node("n2", map[string]string{"zone": "b", "gpu": "8"}),
		node("n3", map[string]string{"zone": "c"}),
		node("n4", nil),
		node("n5", map[string]string{"gpu": "many"}),
	}
}

func req(key string, op v1.NodeSelectorOperator, vals ...string) v1.NodeSelectorRequirement {
	return v1.NodeSelectorRequirement{Key: key, Operator: op, Values: vals}
}

func exprs(rs ...v1.NodeSelectorRequirement) v1.NodeSelectorTerm {
	return v1.NodeSelectorTerm{MatchExpressions: rs}
}

func fields(rs ...v1.NodeSelectorRequirement) v1.NodeSelectorTerm {
	return v1.NodeSelectorTerm{MatchFields: rs}
}

func requiredPod(terms ...v1.NodeSelectorTerm) *v1.Pod {
	return &v1.Pod{Spec: v1.PodSpec{Affinity: &v1.Affinity{NodeAffinity: &v1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: terms},
	}}}}
}

func preferredPod(terms ...v1.PreferredSchedulingTerm) *v1.Pod {
	return &v1.Pod{Spec: v1.PodSpec{Affinity: &v1.Affinity{NodeAffinity: &v1.NodeAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: terms,
	}}}}
}

func pref(w int32, term v1.NodeSelectorTerm) v1.PreferredSchedulingTerm {
	return v1.PreferredSchedulingTerm{Weight: w, Preference: term}
}
