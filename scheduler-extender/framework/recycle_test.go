package framework

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// zonePlugin fails the nodes whose "zone" label is not the pod's, and
// scores a node by the length of its name.
type zonePlugin struct{}

func (zonePlugin) Name() string { return "Zone" }

func (zonePlugin) PreFilter(_ context.Context, _ Snapshot, pod *v1.Pod) (NodeFilter, error) {
	want := pod.Labels["zone"]
	return func(n *NodeInfo) *Status {
		switch z := n.Node.Labels["zone"]; {
		case z == "":
			return Fail(UnschedulableAndUnresolvable, "no zone")
		case z != want:
			return Fail(Unschedulable, "zone %s", z)
		}
		return nil
	}, nil
}

func (zonePlugin) Score(_ context.Context, _ Snapshot, _ *v1.Pod, nodes []*NodeInfo) ([]int64, error) {
	s := NewScores(len(nodes))
	for i, n := range nodes {
		s[i] = int64(len(n.Node.Name)) * 10
	}
	return s, nil
}

// TestRecycledAnswers: answers made from recycled maps and slices are the
// answers fresh ones give, whatever the request before them left there.
func TestRecycledAnswers(t *testing.T) {
	node := func(name, zone string) *v1.Node {
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
		if zone != "" {
			n.Labels["zone"] = zone
		}
		return n
	}
	nodes := []*v1.Node{node("a", "1"), node("bb", "2"), node("ccc", ""), node("dddd", "1"), node("eeeee", "2")}
	snap := NewSnapshot(nodes, nil, nil)
	f := &Framework{Snapshot: func() Snapshot { return snap }, Filters: []FilterPlugin{zonePlugin{}},
		Scores: []WeightedScore{{Plugin: zonePlugin{}, Weight: 1}}}
	pod := func(zone string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: map[string]string{"zone": zone}}}
	}
	type answer struct {
		Passing      []string
		Failed       map[string]string
		Unresolvable map[string]string
		FailedBy     map[string]int
		Scores       extenderv1.HostPriorityList
	}
	ask := func(zone string, nodes []*v1.Node) answer {
		res := f.Filter(context.Background(), pod(zone), nodes)
		a := answer{Failed: map[string]string{}, Unresolvable: map[string]string{}, FailedBy: map[string]int{}}
		for _, n := range res.Passing {
			a.Passing = append(a.Passing, n.Name)
		}
		for k, v := range res.Failed {
			a.Failed[k] = v
		}
		for k, v := range res.Unresolvable {
			a.Unresolvable[k] = v
		}
		for k, v := range res.FailedBy {
			a.FailedBy[k] = v
		}
		scores, err := f.Prioritize(context.Background(), pod(zone), nodes)
		if err != nil {
			t.Fatal(err)
		}
		a.Scores = append(a.Scores, scores...)
		f.Recycle(res)
		f.RecyclePriorities(scores)
		return a
	}
	want := map[string]answer{
		"1 of all": {Passing: []string{"a", "dddd"}, Failed: map[string]string{"bb": "zone 2", "eeeee": "zone 2"},
			Unresolvable: map[string]string{"ccc": "no zone"}, FailedBy: map[string]int{"Zone": 3},
			Scores: extenderv1.HostPriorityList{{Host: "a", Score: 6}, {Host: "bb", Score: 7}, {Host: "ccc", Score: 8},
				{Host: "dddd", Score: 9}, {Host: "eeeee", Score: 10}}},
		"2 of two": {Passing: []string{"bb"}, Failed: map[string]string{"a": "zone 1"},
			Unresolvable: map[string]string{}, FailedBy: map[string]int{"Zone": 1},
			Scores: extenderv1.HostPriorityList{{Host: "a", Score: 9}, {Host: "bb", Score: 10}}},
	}
	// Big then small then big again: each answer only what its own
	// request says.
	for range 3 {
		if d := cmp.Diff(want["1 of all"], ask("1", nodes)); d != "" {
			t.Errorf("all nodes (-want +got):\n%s", d)
		}
		if d := cmp.Diff(want["2 of two"], ask("2", nodes[:2])); d != "" {
			t.Errorf("two nodes (-want +got):\n%s", d)
		}
	}
}
