package tainttoleration

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

func nodeWith(name string, taints ...v1.Taint) *framework.NodeInfo {
	return framework.NewNodeInfo(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.NodeSpec{Taints: taints}})
}

func podWith(tolerations ...v1.Toleration) *v1.Pod {
	return &v1.Pod{Spec: v1.PodSpec{Tolerations: tolerations}}
}

func taint(key, value string, effect v1.TaintEffect) v1.Taint {
	return v1.Taint{Key: key, Value: value, Effect: effect}
}

func tol(key string, op v1.TolerationOperator, value string, effect v1.TaintEffect) v1.Toleration {
	return v1.Toleration{Key: key, Operator: op, Value: value, Effect: effect}
}

// TestFilter follows upstream's TestTaintTolerationFilter (v1.35.4).
func TestFilter(t *testing.T) {
	const no = v1.TaintEffectNoSchedule
	for _, tc := range []struct {
		name string
		pod  *v1.Pod
		node *framework.NodeInfo
		fail bool
	}{
		{"no tolerations, a tainted node", podWith(), nodeWith("n", taint("dedicated", "user1", no)), true},
		{"a dedicated node for user1 (NoSchedule)", podWith(tol("dedicated", v1.TolerationOpEqual, "user1", no)), nodeWith("n", taint("dedicated", "user1", no)), false},
		{"a dedicated node for user2", podWith(tol("dedicated", v1.TolerationOpEqual, "user2", no)), nodeWith("n", taint("dedicated", "user1", no)), true},
		{"Exists tolerates any value", podWith(tol("foo", v1.TolerationOpExists, "", no)), nodeWith("n", taint("foo", "bar", no)), false},
		{"several tolerations, several taints, all tolerated",
			podWith(tol("dedicated", v1.TolerationOpEqual, "user2", no), tol("foo", v1.TolerationOpExists, "", no)),
			nodeWith("n", taint("dedicated", "user2", no), taint("foo", "bar", no)), false},
		{"key and value match but the (non-empty) effect does not",
			podWith(tol("foo", v1.TolerationOpEqual, "bar", v1.TaintEffectPreferNoSchedule)), nodeWith("n", taint("foo", "bar", no)), true},
		{"an empty effect matches every effect", podWith(tol("foo", v1.TolerationOpEqual, "bar", "")), nodeWith("n", taint("foo", "bar", no)), false},
		{"PreferNoSchedule taints do not filter",
			podWith(tol("dedicated", v1.TolerationOpEqual, "user2", no)), nodeWith("n", taint("dedicated", "user1", v1.TaintEffectPreferNoSchedule)), false},
		{"no tolerations, only a PreferNoSchedule taint", podWith(), nodeWith("n", taint("dedicated", "user1", v1.TaintEffectPreferNoSchedule)), false},
		{"NoExecute taints filter", podWith(), nodeWith("n", taint("k", "v", v1.TaintEffectNoExecute)), true},
		{"an empty key with Exists tolerates everything", podWith(tol("", v1.TolerationOpExists, "", "")),
			nodeWith("n", taint("a", "1", no), taint("b", "2", v1.TaintEffectNoExecute)), false},
		{"an empty key with Exists and an effect tolerates only that effect", podWith(tol("", v1.TolerationOpExists, "", no)),
			nodeWith("n", taint("a", "1", no), taint("b", "2", v1.TaintEffectNoExecute)), true},
		{"an empty operator is Equal", podWith(tol("foo", "", "bar", no)), nodeWith("n", taint("foo", "bar", no)), false},
		{"Gt is an alpha feature, off in v1.35: not honoured", podWith(tol("sla", v1.TolerationOperator("Gt"), "900", no)), nodeWith("n", taint("sla", "950", no)), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check, err := Plugin{}.PreFilter(context.Background(), nil, tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			st := check(tc.node)
			if (st != nil) != tc.fail {
				t.Fatalf("status %v, want failure %v", st, tc.fail)
			}
			if st != nil && (st.Code != framework.UnschedulableAndUnresolvable || st.Reason != ErrReason) {
				t.Errorf("status %+v, want UnschedulableAndUnresolvable %q", st, ErrReason)
			}
		})
	}
}

// TestScore follows upstream's TestTaintTolerationScore (v1.35.4).
func TestScore(t *testing.T) {
	const pref = v1.TaintEffectPreferNoSchedule
	for _, tc := range []struct {
		name  string
		pod   *v1.Pod
		nodes []*framework.NodeInfo
		want  []int64
	}{
		{"tolerated taints score higher than intolerable ones",
			podWith(tol("foo", v1.TolerationOpEqual, "bar", pref)),
			[]*framework.NodeInfo{nodeWith("A", taint("foo", "bar", pref)), nodeWith("B", taint("foo", "blah", pref))},
			[]int64{100, 0}},
		{"all taints tolerated: the same score however many",
			podWith(tol("cpu-type", v1.TolerationOpEqual, "arm64", pref), tol("disk-type", v1.TolerationOpEqual, "ssd", pref)),
			[]*framework.NodeInfo{nodeWith("A"), nodeWith("B", taint("cpu-type", "arm64", pref)),
				nodeWith("C", taint("cpu-type", "arm64", pref), taint("disk-type", "ssd", pref))},
			[]int64{100, 100, 100}},
		{"the more intolerable taints, the lower the score",
			podWith(tol("foo", v1.TolerationOpEqual, "bar", pref)),
			[]*framework.NodeInfo{nodeWith("A"), nodeWith("B", taint("cpu-type", "arm64", pref)),
				nodeWith("C", taint("cpu-type", "arm64", pref), taint("disk-type", "ssd", pref))},
			[]int64{100, 50, 0}},
		{"only PreferNoSchedule taints and tolerations count",
			podWith(tol("cpu-type", v1.TolerationOpEqual, "arm64", v1.TaintEffectNoSchedule), tol("disk-type", v1.TolerationOpEqual, "ssd", v1.TaintEffectNoSchedule)),
			[]*framework.NodeInfo{nodeWith("A"), nodeWith("B", taint("cpu-type", "arm64", v1.TaintEffectNoSchedule)),
				nodeWith("C", taint("cpu-type", "arm64", pref), taint("disk-type", "ssd", pref))},
			[]int64{100, 100, 0}},
		{"no taints or tolerations: the untainted node wins",
			podWith(), []*framework.NodeInfo{nodeWith("A"), nodeWith("B", taint("cpu-type", "arm64", pref))},
			[]int64{100, 0}},
		{"a toleration with an empty effect counts for PreferNoSchedule",
			podWith(tol("foo", v1.TolerationOpExists, "", "")),
			[]*framework.NodeInfo{nodeWith("A", taint("foo", "x", pref)), nodeWith("B", taint("bar", "x", pref))},
			[]int64{100, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Plugin{}.Score(context.Background(), nil, tc.pod, tc.nodes)
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("scores (-want +got):\n%s", d)
			}
		})
	}
}
