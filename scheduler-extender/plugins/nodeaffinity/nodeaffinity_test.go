package nodeaffinity

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
	"github.com/tabbynet/tabby/scheduler-extender/plugins/nodename"
)

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

// TestFilter has kube-scheduler v1.35's NodeName and NodeAffinity plugins as
// the expectation: a node either passes or fails unresolvably with the
// first failing plugin's reason (NodeName runs before NodeAffinity).
func TestFilter(t *testing.T) {
	withSelector := func(p *v1.Pod, sel map[string]string) *v1.Pod { p.Spec.NodeSelector = sel; return p }
	withNodeName := func(p *v1.Pod, n string) *v1.Pod { p.Spec.NodeName = n; return p }
	const (
		nn = nodename.ErrReason
		na = ErrReasonPod
	)
	tests := []struct {
		name string
		pod  *v1.Pod
		want map[string]string // failed node -> reason; the rest pass
	}{
		{"no constraints", &v1.Pod{}, nil},
		{"nodeName", withNodeName(&v1.Pod{}, "n2"), map[string]string{"n1": nn, "n3": nn, "n4": nn, "n5": nn}},
		{"nodeName of no node", withNodeName(&v1.Pod{}, "gone"), map[string]string{"n1": nn, "n2": nn, "n3": nn, "n4": nn, "n5": nn}},
		{"nodeName checked before affinity", withNodeName(requiredPod(exprs(req("zone", v1.NodeSelectorOpIn, "a"))), "n2"),
			map[string]string{"n1": nn, "n2": na, "n3": nn, "n4": nn, "n5": nn}},
		{"nodeSelector", withSelector(&v1.Pod{}, map[string]string{"zone": "a"}), map[string]string{"n2": na, "n3": na, "n4": na, "n5": na}},
		{"nodeSelector keys ANDed", withSelector(&v1.Pod{}, map[string]string{"zone": "a", "gpu": "8"}),
			map[string]string{"n1": na, "n2": na, "n3": na, "n4": na, "n5": na}},
		{"nodeSelector and affinity both apply", withSelector(requiredPod(exprs(req("zone", v1.NodeSelectorOpIn, "a", "b"))), map[string]string{"gpu": "8"}),
			map[string]string{"n1": na, "n3": na, "n4": na, "n5": na}},
		{"In", requiredPod(exprs(req("zone", v1.NodeSelectorOpIn, "a", "c"))), map[string]string{"n2": na, "n4": na, "n5": na}},
		{"NotIn matches nodes without the label", requiredPod(exprs(req("zone", v1.NodeSelectorOpNotIn, "a"))), map[string]string{"n1": na}},
		{"Exists", requiredPod(exprs(req("gpu", v1.NodeSelectorOpExists))), map[string]string{"n3": na, "n4": na}},
		{"DoesNotExist", requiredPod(exprs(req("gpu", v1.NodeSelectorOpDoesNotExist))), map[string]string{"n1": na, "n2": na, "n5": na}},
		{"Gt is strict; non-integer and missing labels fail", requiredPod(exprs(req("gpu", v1.NodeSelectorOpGt, "2"))),
			map[string]string{"n1": na, "n3": na, "n4": na, "n5": na}},
		{"Lt is strict", requiredPod(exprs(req("gpu", v1.NodeSelectorOpLt, "8"))), map[string]string{"n2": na, "n3": na, "n4": na, "n5": na}},
		{"expressions ANDed", requiredPod(exprs(req("gpu", v1.NodeSelectorOpExists), req("zone", v1.NodeSelectorOpIn, "b"))),
			map[string]string{"n1": na, "n3": na, "n4": na, "n5": na}},
		{"terms ORed", requiredPod(exprs(req("zone", v1.NodeSelectorOpIn, "a")), exprs(req("zone", v1.NodeSelectorOpDoesNotExist))),
			map[string]string{"n2": na, "n3": na}},
		{"matchFields metadata.name In", requiredPod(fields(req("metadata.name", v1.NodeSelectorOpIn, "n3"))),
			map[string]string{"n1": na, "n2": na, "n4": na, "n5": na}},
		{"matchFields terms ORed", requiredPod(fields(req("metadata.name", v1.NodeSelectorOpIn, "n3")), fields(req("metadata.name", v1.NodeSelectorOpIn, "n4"))),
			map[string]string{"n1": na, "n2": na, "n5": na}},
		{"matchFields In with two values does not parse (upstream: must have one element)",
			requiredPod(fields(req("metadata.name", v1.NodeSelectorOpIn, "n3", "n4"))),
			map[string]string{"n1": na, "n2": na, "n3": na, "n4": na, "n5": na}},
		{"matchFields metadata.name NotIn", requiredPod(fields(req("metadata.name", v1.NodeSelectorOpNotIn, "n3"))), map[string]string{"n3": na}},
		{"matchFields and matchExpressions in one term ANDed",
			requiredPod(v1.NodeSelectorTerm{
				MatchExpressions: []v1.NodeSelectorRequirement{req("gpu", v1.NodeSelectorOpExists)},
				MatchFields:      []v1.NodeSelectorRequirement{req("metadata.name", v1.NodeSelectorOpNotIn, "n1")},
			}),
			map[string]string{"n1": na, "n3": na, "n4": na}},
		{"no terms match nothing", requiredPod(), map[string]string{"n1": na, "n2": na, "n3": na, "n4": na, "n5": na}},
		{"an empty term matches nothing", requiredPod(v1.NodeSelectorTerm{}), map[string]string{"n1": na, "n2": na, "n3": na, "n4": na, "n5": na}},
		{"an empty term ORed with a real one", requiredPod(v1.NodeSelectorTerm{}, exprs(req("zone", v1.NodeSelectorOpIn, "c"))),
			map[string]string{"n1": na, "n2": na, "n4": na, "n5": na}},
		{"a term that does not parse matches nothing, others still do",
			requiredPod(exprs(req("zone", "Near", "a")), exprs(req("zone", v1.NodeSelectorOpIn, "b"))),
			map[string]string{"n1": na, "n3": na, "n4": na, "n5": na}},
		{"matchFields on another field does not parse", requiredPod(fields(req("metadata.uid", v1.NodeSelectorOpIn, "x"))),
			map[string]string{"n1": na, "n2": na, "n3": na, "n4": na, "n5": na}},
		{"Gt with a non-integer value does not parse", requiredPod(exprs(req("gpu", v1.NodeSelectorOpGt, "lots"))),
			map[string]string{"n1": na, "n2": na, "n3": na, "n4": na, "n5": na}},
		{"preferred affinity does not filter", &v1.Pod{Spec: v1.PodSpec{Affinity: &v1.Affinity{NodeAffinity: &v1.NodeAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []v1.PreferredSchedulingTerm{{Weight: 5, Preference: exprs(req("zone", v1.NodeSelectorOpIn, "a"))}},
		}}}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nodes := testNodes()
			fw := &framework.Framework{
				Snapshot: func() framework.Snapshot { return framework.NewSnapshot(nodes, nil, nil) },
				Filters:  []framework.FilterPlugin{nodename.Plugin{}, Plugin{}},
			}
			res := fw.Filter(context.Background(), tt.pod, nodes)
			if len(res.Failed) != 0 {
				t.Errorf("Failed = %v; these plugins only fail unresolvably", res.Failed)
			}
			want := tt.want
			if want == nil {
				want = map[string]string{}
			}
			if d := cmp.Diff(want, res.Unresolvable); d != "" {
				t.Errorf("Unresolvable (-want +got):\n%s", d)
			}
			var wantPass, gotPass []string
			for _, n := range nodes {
				if _, failed := want[n.Name]; !failed {
					wantPass = append(wantPass, n.Name)
				}
			}
			for _, n := range res.Passing {
				gotPass = append(gotPass, n.Name)
			}
			if d := cmp.Diff(wantPass, gotPass); d != "" {
				t.Errorf("Passing (-want +got):\n%s", d)
			}
		})
	}
}

func preferredPod(terms ...v1.PreferredSchedulingTerm) *v1.Pod {
	return &v1.Pod{Spec: v1.PodSpec{Affinity: &v1.Affinity{NodeAffinity: &v1.NodeAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: terms,
	}}}}
}

func pref(w int32, term v1.NodeSelectorTerm) v1.PreferredSchedulingTerm {
	return v1.PreferredSchedulingTerm{Weight: w, Preference: term}
}

// TestScore: the NodeAffinity plugin's Score (sum of the weights of
// matching preferred terms) normalised as helper.DefaultNormalizeScore does.
func TestScore(t *testing.T) {
	tests := []struct {
		name    string
		pod     *v1.Pod
		want    []int64 // n1..n5
		wantErr bool
	}{
		{"no affinity", &v1.Pod{}, []int64{0, 0, 0, 0, 0}, false},
		{"required only", requiredPod(exprs(req("zone", v1.NodeSelectorOpIn, "a"))), []int64{0, 0, 0, 0, 0}, false},
		{"one term", preferredPod(pref(3, exprs(req("zone", v1.NodeSelectorOpIn, "b")))), []int64{0, 100, 0, 0, 0}, false},
		{"weights add up and are max-normalised", preferredPod(
			pref(3, exprs(req("gpu", v1.NodeSelectorOpExists))),
			pref(4, exprs(req("zone", v1.NodeSelectorOpIn, "b", "c"))),
		), []int64{100 * 3 / 7, 100, 100 * 4 / 7, 0, 100 * 3 / 7}, false},
		{"normalised scores round down", preferredPod(
			pref(1, exprs(req("zone", v1.NodeSelectorOpIn, "a"))),
			pref(2, exprs(req("zone", v1.NodeSelectorOpIn, "b"))),
			pref(100, fields(req("metadata.name", v1.NodeSelectorOpIn, "n4"))),
		), []int64{1, 2, 0, 100, 0}, false},
		{"matching nothing scores 0 everywhere", preferredPod(pref(50, exprs(req("zone", v1.NodeSelectorOpIn, "z")))), []int64{0, 0, 0, 0, 0}, false},
		{"zero weight and empty preference are skipped", preferredPod(
			pref(0, exprs(req("zone", v1.NodeSelectorOpIn, "a"))),
			pref(9, v1.NodeSelectorTerm{}),
			pref(1, exprs(req("zone", v1.NodeSelectorOpIn, "c"))),
		), []int64{0, 0, 100, 0, 0}, false},
		{"a term that does not parse is an error", preferredPod(pref(1, exprs(req("zone", "Near", "a")))), nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nodes := testNodes()
			infos := make([]*framework.NodeInfo, len(nodes))
			for i, n := range nodes {
				infos[i] = framework.NewNodeInfo(n)
			}
			got, err := Plugin{}.Score(context.Background(), nil, tt.pod, infos)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("scores (-want +got):\n%s", d)
			}
		})
	}
}
