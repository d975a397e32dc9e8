package plugins_test

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/scheduler-extender/cache"
	"github.com/tabbynet/tabby/scheduler-extender/plugins"
	"github.com/tabbynet/tabby/scheduler-extender/plugins/network"
	"github.com/tabbynet/tabby/scheduler-extender/plugins/nodeaffinity"
	"github.com/tabbynet/tabby/scheduler-extender/plugins/podtopologyspread"
)

// TestNodeLabelUpdateSeen checks that the cache's per-node state (the
// node's labels, interned when the node enters the cache) follows node
// updates: after a node's labels change, the next filter answers by the
// new labels, also once a pod event has replaced the node's NodeInfo, and
// a snapshot taken before keeps answering by the old ones.
func TestNodeLabelUpdateSeen(t *testing.T) {
	c := cache.New()
	c.SetNamespace(&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default"}})
	setNode := func(labels map[string]string) {
		c.SetNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: labels}})
	}
	fw := plugins.Default(c.Snapshot, nil)
	// The pod wants pool a and spreads over zones.
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "new", Namespace: "default", Labels: map[string]string{"app": "x"}}, Spec: v1.PodSpec{
		NodeSelector: map[string]string{"pool": "a"},
		TopologySpreadConstraints: []v1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: v1.LabelTopologyZone,
			WhenUnsatisfiable: v1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}}},
	}}
	// reason is why n1 fails for the pod ("" when it passes).
	reason := func(step string) string {
		t.Helper()
		n, ok := c.Node("n1")
		if !ok {
			t.Fatalf("%s: n1 not in the cache", step)
		}
		res := fw.Filter(context.Background(), pod, []*v1.Node{n})
		defer fw.Recycle(res)
		return res.Failed["n1"] + res.Unresolvable["n1"]
	}
	check := func(step, want string) {
		t.Helper()
		if got := reason(step); got != want {
			t.Errorf("%s: n1 fails with %q, want %q", step, got, want)
		}
	}

	setNode(map[string]string{"pool": "a", v1.LabelTopologyZone: "z1"})
	check("pool a, zone z1", "")
	before := c.Snapshot()

	setNode(map[string]string{"pool": "b", v1.LabelTopologyZone: "z1"})
	check("pool changed to b", nodeaffinity.ErrReasonPod)
	if ni := before.Get("n1"); ni == nil || !nodeaffinity.CompileRequired(pod).Match(ni) {
		t.Errorf("the snapshot taken before the update no longer matches pool a")
	}

	// A pod event replaces the node's NodeInfo; the labels must follow.
	c.SetPod(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: "default", UID: types.UID("other")},
		Spec: v1.PodSpec{NodeName: "n1"}, Status: v1.PodStatus{Phase: v1.PodRunning}})
	check("after a pod event", nodeaffinity.ErrReasonPod)

	setNode(map[string]string{"pool": "a"})
	check("pool a, zone label removed", podtopologyspread.ErrReasonNodeLabelNotMatch)

	c.DeletePod(types.UID("other"))
	check("after the pod's deletion", podtopologyspread.ErrReasonNodeLabelNotMatch)

	setNode(map[string]string{"pool": "a", v1.LabelTopologyZone: "z2"})
	check("zone label back", "")
}

// TestNodeLabelUpdateSeenByPoolSelector: the network plugin matches a
// pool's nodeSelector against the node's interned labels; a label update
// is seen by the next filter.
func TestNodeLabelUpdateSeenByPoolSelector(t *testing.T) {
	c := cache.New()
	c.SetNamespace(&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default"}})
	in := benchInputs()
	in.Pools = []*tabbyv1.IPPool{{ObjectMeta: metav1.ObjectMeta{Name: "rack1"}, Spec: tabbyv1.IPPoolSpec{CIDR: "10.0.0.0/8",
		NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "1"}}}}}
	fw := plugins.Default(c.Snapshot, &network.Plugin{Inputs: func() *network.Inputs { return in }})
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "new", Namespace: "default", UID: "new"}}
	for i, rack := range []string{"1", "2", "1"} {
		c.SetNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"rack": rack}}})
		n, _ := c.Node("n1")
		res := fw.Filter(context.Background(), pod, []*v1.Node{n})
		passed := len(res.Passing) == 1
		why := res.Unresolvable["n1"]
		fw.Recycle(res)
		if want := rack == "1"; passed != want {
			t.Errorf("step %d, rack=%s: passes %v (%q), want %v", i, rack, passed, why, want)
		}
	}
}
