package podtopologyspread

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// The cases here are upstream v1.35.4's scoring_test.go (TestPreScoreSkip,
// TestPreScoreStateEmptyNodes, TestPodTopologySpreadScore) with upstream's
// expected values, less the cases of feature gates turned off.

// hostNode is a node labelled kubernetes.io/hostname=<name>.
func hostNode(name string) *nodeW { return makeNode(name).label(v1.LabelHostname, name) }

// zoneHost is a node with zone and hostname labels.
func zoneHost(name, zone string) *v1.Node { return hostNode(name).label("zone", zone).obj() }

func infos(snap framework.Snapshot, nodes []*v1.Node) []*framework.NodeInfo {
	out := make([]*framework.NodeInfo, len(nodes))
	for i, n := range nodes {
		out[i] = snap.Get(n.Name)
	}
	return out
}

func rs(name string, sel *metav1.LabelSelector) *appsv1.ReplicaSet {
	return &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Spec: appsv1.ReplicaSetSpec{Selector: sel}}
}

func TestPreScoreSkip(t *testing.T) {
	tests := []struct {
		name  string
		pod   *v1.Pod
		nodes []*v1.Node
		objs  []any
		args  Args
	}{
		{
			name:  "the pod doesn't have soft topology spread Constraints",
			pod:   makePod("p").ns("default").obj(),
			args:  Args{DefaultingType: ListDefaulting},
			nodes: []*v1.Node{hostNode("node-a").obj(), hostNode("node-b").obj()},
		},
		{
			name: "default constraints and a replicaset that doesn't match",
			pod:  makePod("p").ns("default").label("foo", "bar").label("baz", "sup").owner("rs2", "apps/v1", "ReplicaSet").obj(),
			args: Args{DefaultingType: ListDefaulting, DefaultConstraints: []v1.TopologySpreadConstraint{
				{MaxSkew: 2, TopologyKey: "planet", WhenUnsatisfiable: v1.ScheduleAnyway},
			}},
			nodes: []*v1.Node{makeNode("node-a").label("planet", "mars").obj()},
			objs:  []any{rs("rs1", exists("tar"))},
		},
		{
			// Not upstream's: the system defaults for a bare pod.
			name:  "system defaults and a pod no workload selects",
			pod:   makePod("p").ns("default").label("foo", "bar").obj(),
			args:  Args{},
			nodes: []*v1.Node{zoneHost("node-a", "zone1")},
			objs:  []any{rs("rs1", exists("foo"))},
		},
		{
			// Not upstream's: without a WorkloadLister there is nothing
			// to default from.
			name:  "system defaults without workloads in the snapshot",
			pod:   makePod("p").ns("default").label("foo", "bar").owner("rs1", "apps/v1", "ReplicaSet").obj(),
			args:  Args{},
			nodes: []*v1.Node{zoneHost("node-a", "zone1")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pl, err := NewWithArgs(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			snap := snapshot(tt.nodes, nil, tt.objs...)
			s, err := pl.preScoreState(snap, tt.pod, infos(snap, tt.nodes))
			if err != nil {
				t.Fatal(err)
			}
			if s != nil {
				t.Fatalf("want Skip, got constraints %+v", gotConstraints(s.constraints))
			}
			scores, err := pl.Score(context.Background(), snap, tt.pod, infos(snap, tt.nodes))
			if err != nil {
				t.Fatal(err)
			}
			for i, sc := range scores {
				if sc != 0 {
					t.Errorf("skipped pod scores %d on %s, want 0", sc, tt.nodes[i].Name)
				}
			}
		})
	}
}

func TestPreScoreStateEmptyNodes(t *testing.T) {
	foo := mustSelector(t, fooSelector)
	bar := mustSelector(t, barSelector)
	tests := []struct {
		name            string
		pod             *v1.Pod
		nodes           []*v1.Node
		objs            []any
		args            Args
		wantConstraints []wantConstraint
		wantIgnored     []string
		wantCounts      []map[string]int64
		wantWeights     []float64
	}{
		{
			name: "normal case",
			pod: makePod("p").label("foo", "").
				spread(1, "zone", v1.ScheduleAnyway, fooSelector, nil, nil, nil, nil).
				spread(1, v1.LabelHostname, v1.ScheduleAnyway, fooSelector, nil, nil, nil, nil).obj(),
			nodes:           []*v1.Node{zoneHost("node-a", "zone1"), zoneHost("node-b", "zone1"), zoneHost("node-x", "zone2")},
			args:            Args{DefaultingType: ListDefaulting},
			wantConstraints: []wantConstraint{defaults(1, "zone", foo), defaults(1, v1.LabelHostname, foo)},
			wantCounts:      []map[string]int64{{"zone1": 0, "zone2": 0}, {}},
			wantWeights:     []float64{topologyNormalizingWeight(2), topologyNormalizingWeight(3)},
		},
		{
			name:            "null selector",
			pod:             makePod("p").label("foo", "").spread(1, "zone", v1.ScheduleAnyway, nil, nil, nil, nil, nil).obj(),
			nodes:           []*v1.Node{zoneHost("node-a", "zone1"), zoneHost("node-b", "zone1"), zoneHost("node-x", "zone2")},
			args:            Args{DefaultingType: ListDefaulting},
			wantConstraints: []wantConstraint{defaults(1, "zone", "<nothing>")},
			wantCounts:      []map[string]int64{{"zone1": 0, "zone2": 0}},
			wantWeights:     []float64{topologyNormalizingWeight(2)},
		},
		{
			name: "node-x doesn't have label zone",
			pod: makePod("p").label("foo", "").
				spread(1, "zone", v1.ScheduleAnyway, fooSelector, nil, nil, nil, nil).
				spread(1, v1.LabelHostname, v1.ScheduleAnyway, barSelector, nil, nil, nil, nil).obj(),
			nodes:           []*v1.Node{zoneHost("node-a", "zone1"), zoneHost("node-b", "zone1"), hostNode("node-x").obj()},
			args:            Args{DefaultingType: ListDefaulting},
			wantConstraints: []wantConstraint{defaults(1, "zone", foo), defaults(1, v1.LabelHostname, bar)},
			wantIgnored:     []string{"node-x"},
			wantCounts:      []map[string]int64{{"zone1": 0}, {}},
			wantWeights:     []float64{topologyNormalizingWeight(1), topologyNormalizingWeight(2)},
		},
		{
			name: "system default constraints and a replicaset",
			pod:  makePod("p").ns("default").label("foo", "tar").label("baz", "sup").owner("rs1", "apps/v1", "ReplicaSet").obj(),
			args: Args{DefaultingType: SystemDefaulting},
			nodes: []*v1.Node{
				hostNode("node-a").label(v1.LabelTopologyZone, "mars").obj(),
				hostNode("node-b").label(v1.LabelTopologyZone, "mars").obj(),
				// Nodes with no zone are not excluded: they are the zone "".
				hostNode("node-c").obj(),
				hostNode("node-d").obj(),
			},
			objs:            []any{rs("rs1", fooSelector)},
			wantConstraints: []wantConstraint{defaults(3, v1.LabelHostname, foo), defaults(5, v1.LabelTopologyZone, foo)},
			wantCounts:      []map[string]int64{{}, {"mars": 0, "": 0}},
			wantWeights:     []float64{topologyNormalizingWeight(4), topologyNormalizingWeight(2)},
		},
		{
			name: "default constraints and a replicaset",
			pod:  makePod("p").ns("default").label("foo", "tar").label("baz", "sup").owner("rs1", "apps/v1", "ReplicaSet").obj(),
			args: Args{DefaultingType: ListDefaulting, DefaultConstraints: []v1.TopologySpreadConstraint{
				{MaxSkew: 1, TopologyKey: v1.LabelHostname, WhenUnsatisfiable: v1.ScheduleAnyway},
				{MaxSkew: 2, TopologyKey: "rack", WhenUnsatisfiable: v1.DoNotSchedule},
				{MaxSkew: 2, TopologyKey: "planet", WhenUnsatisfiable: v1.ScheduleAnyway},
			}},
			nodes:           []*v1.Node{hostNode("node-a").label("rack", "rack1").label("planet", "mars").obj()},
			objs:            []any{rs("rs1", fooSelector)},
			wantConstraints: []wantConstraint{defaults(1, v1.LabelHostname, foo), defaults(2, "planet", foo)},
			wantCounts:      []map[string]int64{{}, {"mars": 0}},
			wantWeights:     []float64{topologyNormalizingWeight(1), topologyNormalizingWeight(1)},
		},
		{
			name: "default constraints and a replicaset, but pod has constraints",
			pod: makePod("p").ns("default").label("foo", "bar").label("baz", "sup").owner("rs1", "apps/v1", "ReplicaSet").
				spread(1, "zone", v1.DoNotSchedule, barSelector, nil, nil, nil, nil).
				spread(2, "planet", v1.ScheduleAnyway, matchLabels("baz", "sup"), nil, nil, nil, nil).obj(),
			args: Args{DefaultingType: ListDefaulting, DefaultConstraints: []v1.TopologySpreadConstraint{
				{MaxSkew: 2, TopologyKey: "galaxy", WhenUnsatisfiable: v1.ScheduleAnyway},
			}},
			nodes:           []*v1.Node{makeNode("node-a").label("planet", "mars").label("galaxy", "andromeda").obj()},
			objs:            []any{rs("rs1", fooSelector)},
			wantConstraints: []wantConstraint{defaults(2, "planet", "baz=sup")},
			wantCounts:      []map[string]int64{{"mars": 0}},
			wantWeights:     []float64{topologyNormalizingWeight(1)},
		},
		{
			name: "NodeAffinityPolicy honored with labelSelectors",
			pod: makePod("p").label("foo", "").nodeSelector(map[string]string{"foo": ""}).
				spread(1, "zone", v1.ScheduleAnyway, barSelector, nil, nil, nil, nil).obj(),
			nodes: []*v1.Node{
				hostNode("node-a").label("zone", "zone1").label("foo", "").obj(),
				hostNode("node-b").label("zone", "zone1").label("foo", "").obj(),
				zoneHost("node-x", "zone2"),
			},
			args:            Args{DefaultingType: ListDefaulting},
			wantConstraints: []wantConstraint{defaults(1, "zone", bar)},
			wantCounts:      []map[string]int64{{"zone1": 0, "zone2": 0}},
			wantWeights:     []float64{topologyNormalizingWeight(2)},
		},
		{
			name: "NodeAffinityPolicy ignored with nodeAffinity",
			pod: makePod("p").label("foo", "").nodeAffinity("foo", v1.NodeSelectorOpIn, "").
				spread(1, "zone", v1.ScheduleAnyway, barSelector, nil, &ignore, nil, nil).obj(),
			nodes: []*v1.Node{
				hostNode("node-a").label("zone", "zone1").label("foo", "").obj(),
				hostNode("node-b").label("zone", "zone1").label("foo", "").obj(),
				zoneHost("node-x", "zone2"),
			},
			args:            Args{DefaultingType: ListDefaulting},
			wantConstraints: []wantConstraint{{1, "zone", bar, 1, false, false}},
			wantCounts:      []map[string]int64{{"zone1": 0, "zone2": 0}},
			wantWeights:     []float64{topologyNormalizingWeight(2)},
		},
		{
			name: "NodeTaintsPolicy honored",
			pod:  makePod("p").label("foo", "").spread(1, "zone", v1.ScheduleAnyway, barSelector, nil, nil, &honor, nil).obj(),
			nodes: []*v1.Node{
				hostNode("node-a").label("zone", "zone1").label("foo", "").obj(),
				hostNode("node-b").label("zone", "zone1").label("foo", "").obj(),
				hostNode("node-x").label("zone", "zone2").taints(taints).obj(),
			},
			args:            Args{DefaultingType: ListDefaulting},
			wantConstraints: []wantConstraint{{1, "zone", bar, 1, true, true}},
			wantCounts:      []map[string]int64{{"zone1": 0, "zone2": 0}},
			wantWeights:     []float64{topologyNormalizingWeight(2)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pl, err := NewWithArgs(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			snap := snapshot(tt.nodes, nil, tt.objs...)
			s, err := pl.preScoreState(snap, tt.pod, infos(snap, tt.nodes))
			if err != nil {
				t.Fatal(err)
			}
			if s == nil {
				t.Fatal("got Skip, want a state")
			}
			if diff := cmp.Diff(tt.wantConstraints, gotConstraints(s.constraints)); diff != "" {
				t.Errorf("constraints (-want +got):\n%s", diff)
			}
			var ignored []string
			for j, ig := range s.ignored {
				if ig {
					ignored = append(ignored, tt.nodes[j].Name)
				}
			}
			if diff := cmp.Diff(tt.wantIgnored, ignored); diff != "" {
				t.Errorf("ignored nodes (-want +got):\n%s", diff)
			}
			counts := make([]map[string]int64, len(s.counts))
			for i, m := range s.counts {
				// hostname (nil): counted per node, upstream's {}
				counts[i] = map[string]int64{}
				for v, n := range m {
					counts[i][v.Value()] = n
				}
			}
			if diff := cmp.Diff(tt.wantCounts, counts); diff != "" {
				t.Errorf("counts (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantWeights, s.weights); diff != "" {
				t.Errorf("weights (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPodTopologySpreadScore(t *testing.T) {
	// Legend, as upstream: X/Y are the matching pods of candidate nodes;
	// ~Y~ a node that is not a candidate; ?Y? a candidate missing a key.
	fb := func(name, node string) *v1.Pod {
		return makePod(name).node(node).label("foo", "").label("bar", "").obj()
	}
	bar := func(name, node string) *v1.Pod { return makePod(name).node(node).label("bar", "").obj() }
	pods2103 := []*v1.Pod{
		fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a"), fooPod("p-b1", "node-b"),
		fooPod("p-d1", "node-d"), fooPod("p-d2", "node-d"), fooPod("p-d3", "node-d"),
	}
	pods4321 := []*v1.Pod{
		fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a"), fooPod("p-a3", "node-a"), fooPod("p-a4", "node-a"),
		fooPod("p-b1", "node-b"), fooPod("p-b2", "node-b"), fooPod("p-b3", "node-b"),
		fooPod("p-c1", "node-c"), fooPod("p-c2", "node-c"), fooPod("p-d1", "node-d"),
	}
	pods4213 := []*v1.Pod{
		fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a"), fooPod("p-a3", "node-a"), fooPod("p-a4", "node-a"),
		fooPod("p-b1", "node-b"), fooPod("p-b2", "node-b"), fooPod("p-x1", "node-x"),
		fooPod("p-y1", "node-y"), fooPod("p-y2", "node-y"), fooPod("p-y3", "node-y"),
	}
	abcd := func() []*v1.Node {
		return []*v1.Node{hostNode("node-a").obj(), hostNode("node-b").obj(), hostNode("node-c").obj(), hostNode("node-d").obj()}
	}
	abcNode := []*v1.Node{
		makeNode("node-a").label("node", "node-a").label("foo", "").obj(),
		makeNode("node-b").label("node", "node-b").label("foo", "").obj(),
		makeNode("node-c").label("node", "node-c").obj(),
	}
	abcTainted := []*v1.Node{
		makeNode("node-a").label("node", "node-a").obj(),
		makeNode("node-b").label("node", "node-b").obj(),
		makeNode("node-c").label("node", "node-c").taints(taints).obj(),
	}
	inclusionPods := []*v1.Pod{fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a"), fooPod("p-b1", "node-b"), fooPod("p-c1", "node-c")}
	hostSpread := func(maxSkew int32, sel *metav1.LabelSelector) *v1.Pod {
		return makePod("p").label("foo", "").spread(maxSkew, v1.LabelHostname, v1.ScheduleAnyway, sel, nil, nil, nil, nil).obj()
	}
	tests := []struct {
		name         string
		pod          *v1.Pod
		existingPods []*v1.Pod
		nodes        []*v1.Node
		failedNodes  []*v1.Node // nodes + failedNodes = all nodes
		objs         []any
		want         []int64
	}{
		{
			name:  "one constraint on node, no existing pods",
			pod:   hostSpread(1, fooSelector),
			nodes: []*v1.Node{hostNode("node-a").obj(), hostNode("node-b").obj()},
			want:  []int64{100, 100},
		},
		{
			name:         "one constraint on node, only one node is candidate",
			pod:          hostSpread(1, fooSelector),
			existingPods: []*v1.Pod{fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a"), fooPod("p-b1", "node-b")},
			nodes:        []*v1.Node{hostNode("node-a").obj()},
			failedNodes:  []*v1.Node{hostNode("node-b").obj()},
			want:         []int64{100},
		},
		{
			name:         "one constraint on node, all nodes have the same number of matching pods",
			pod:          hostSpread(1, fooSelector),
			existingPods: []*v1.Pod{fooPod("p-a1", "node-a"), fooPod("p-b1", "node-b")},
			nodes:        []*v1.Node{hostNode("node-a").obj(), hostNode("node-b").obj()},
			want:         []int64{100, 100},
		},
		{
			name:         "one constraint on node, all 4 nodes are candidates",
			pod:          hostSpread(1, fooSelector),
			existingPods: pods2103,
			nodes:        abcd(),
			want:         []int64{20, 60, 100, 0},
		},
		{
			name:         "one constraint on node, null selector",
			pod:          hostSpread(1, nil),
			existingPods: pods2103,
			nodes:        abcd(),
			want:         []int64{100, 100, 100, 100},
		},
		{
			name:         "one constraint on node, all 4 nodes are candidates, maxSkew=2",
			pod:          hostSpread(2, fooSelector),
			existingPods: pods2103,
			nodes:        abcd(),
			want:         []int64{33, 66, 100, 16},
		},
		{
			name:         "one constraint on node, all 4 nodes are candidates, maxSkew=3",
			pod:          hostSpread(3, fooSelector),
			existingPods: pods4321,
			nodes:        abcd(),
			want:         []int64{44, 66, 77, 100},
		},
		{
			name:         "system defaulting, nodes don't have zone, pods match service",
			pod:          makePod("p").label("foo", "").obj(),
			existingPods: pods4321,
			nodes:        abcd(),
			objs:         []any{&v1.Service{Spec: v1.ServiceSpec{Selector: map[string]string{"foo": ""}}}},
			// Same scores as with one hostname constraint of maxSkew 3.
			want: []int64{44, 66, 77, 100},
		},
		{
			name:         "one constraint on node, 3 out of 4 nodes are candidates",
			pod:          hostSpread(1, fooSelector),
			existingPods: pods4213,
			nodes:        []*v1.Node{hostNode("node-a").obj(), hostNode("node-b").obj(), hostNode("node-x").obj()},
			failedNodes:  []*v1.Node{hostNode("node-y").obj()},
			want:         []int64{33, 83, 100},
		},
		{
			name:         "one constraint on node, 3 out of 4 nodes are candidates, one node doesn't match topology key",
			pod:          hostSpread(1, fooSelector),
			existingPods: pods4213,
			nodes:        []*v1.Node{hostNode("node-a").obj(), makeNode("node-b").label("n", "node-b").obj(), hostNode("node-x").obj()},
			failedNodes:  []*v1.Node{hostNode("node-y").obj()},
			want:         []int64{16, 0, 100},
		},
		{
			name:         "one constraint on zone, 3 out of 4 nodes are candidates",
			pod:          makePod("p").label("foo", "").spread(1, "zone", v1.ScheduleAnyway, fooSelector, nil, nil, nil, nil).obj(),
			existingPods: pods4213,
			nodes:        []*v1.Node{zoneHost("node-a", "zone1"), zoneHost("node-b", "zone1"), zoneHost("node-x", "zone2")},
			failedNodes:  []*v1.Node{zoneHost("node-y", "zone2")},
			want:         []int64{75, 75, 100},
		},
		{
			name: "two Constraints on zone and node, 2 out of 4 nodes are candidates",
			pod: makePod("p").label("foo", "").
				spread(1, "zone", v1.ScheduleAnyway, fooSelector, nil, nil, nil, nil).
				spread(1, v1.LabelHostname, v1.ScheduleAnyway, fooSelector, nil, nil, nil, nil).obj(),
			existingPods: []*v1.Pod{
				fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a"), fooPod("p-b1", "node-b"),
				fooPod("p-x1", "node-x"), fooPod("p-x2", "node-x"),
				fooPod("p-y1", "node-y"), fooPod("p-y2", "node-y"), fooPod("p-y3", "node-y"), fooPod("p-y4", "node-y"),
			},
			nodes:       []*v1.Node{zoneHost("node-a", "zone1"), zoneHost("node-x", "zone2")},
			failedNodes: []*v1.Node{zoneHost("node-b", "zone1"), zoneHost("node-y", "zone2")},
			want:        []int64{100, 63},
		},
		{
			name: "two Constraints on zone, 2 out of 4 nodes are candidates",
			pod: makePod("p").label("foo", "").label("bar", "").
				spread(1, "zone", v1.ScheduleAnyway, fooSelector, nil, nil, nil, nil).
				spread(1, "zone", v1.ScheduleAnyway, barSelector, nil, nil, nil, nil).obj(),
			existingPods: []*v1.Pod{
				fb("p-a1", "node-a"), fooPod("p-a2", "node-a"), fb("p-b1", "node-b"),
				fooPod("p-y1", "node-y"), fb("p-y2", "node-y"), fooPod("p-y3", "node-y"),
			},
			nodes:       []*v1.Node{makeNode("node-a").label("zone", "zone1").obj(), makeNode("node-x").label("zone", "zone2").obj()},
			failedNodes: []*v1.Node{makeNode("node-b").label("zone", "zone1").obj(), makeNode("node-y").label("zone", "zone2").obj()},
			want:        []int64{85, 100},
		},
		{
			// zone (foo): 2/2/1/1; hostname (bar): 0/1/0/1.
			name: "two Constraints on zone and node, with different labelSelectors",
			pod: makePod("p").label("foo", "").label("bar", "").
				spread(1, "zone", v1.ScheduleAnyway, fooSelector, nil, nil, nil, nil).
				spread(1, v1.LabelHostname, v1.ScheduleAnyway, barSelector, nil, nil, nil, nil).obj(),
			existingPods: []*v1.Pod{fooPod("p-a1", "node-a"), fb("p-b1", "node-b"), fooPod("p-y1", "node-y"), bar("p-y2", "node-y")},
			nodes:        []*v1.Node{zoneHost("node-a", "zone1"), zoneHost("node-b", "zone1"), zoneHost("node-x", "zone2"), zoneHost("node-y", "zone2")},
			want:         []int64{60, 20, 100, 60},
		},
		{
			// zone (foo): 0/0/2/2; hostname (bar): 0/1/0/1.
			name: "two Constraints on zone and node, with different labelSelectors, some nodes have 0 pods",
			pod: makePod("p").label("foo", "").label("bar", "").
				spread(1, "zone", v1.ScheduleAnyway, fooSelector, nil, nil, nil, nil).
				spread(1, v1.LabelHostname, v1.ScheduleAnyway, barSelector, nil, nil, nil, nil).obj(),
			existingPods: []*v1.Pod{bar("p-b1", "node-b"), fooPod("p-x1", "node-x"), fb("p-y1", "node-y")},
			nodes:        []*v1.Node{zoneHost("node-a", "zone1"), zoneHost("node-b", "zone1"), zoneHost("node-x", "zone2"), zoneHost("node-y", "zone2")},
			want:         []int64{100, 60, 40, 0},
		},
		{
			// zone (foo): 2/2/1/~1~; hostname (bar): 0/1/0/~1~.
			name: "two Constraints on zone and node, with different labelSelectors, 3 out of 4 nodes are candidates",
			pod: makePod("p").label("foo", "").label("bar", "").
				spread(1, "zone", v1.ScheduleAnyway, fooSelector, nil, nil, nil, nil).
				spread(1, v1.LabelHostname, v1.ScheduleAnyway, barSelector, nil, nil, nil, nil).obj(),
			existingPods: []*v1.Pod{fooPod("p-a1", "node-a"), fb("p-b1", "node-b"), fooPod("p-y1", "node-y"), bar("p-y2", "node-y")},
			nodes:        []*v1.Node{zoneHost("node-a", "zone1"), zoneHost("node-b", "zone1"), zoneHost("node-x", "zone2")},
			failedNodes:  []*v1.Node{zoneHost("node-y", "zone2")},
			want:         []int64{50, 25, 100},
		},
		{
			name: "existing pods in a different namespace do not count",
			pod:  hostSpread(1, fooSelector),
			existingPods: []*v1.Pod{
				makePod("p-a1").ns("ns1").node("node-a").label("foo", "").obj(),
				fooPod("p-a2", "node-a"), fooPod("p-b1", "node-b"), fooPod("p-b2", "node-b"),
			},
			nodes: []*v1.Node{hostNode("node-a").obj(), hostNode("node-b").obj()},
			want:  []int64{100, 33},
		},
		{
			name:         "terminating Pods should be excluded",
			pod:          hostSpread(1, fooSelector),
			existingPods: []*v1.Pod{makePod("p-a").node("node-a").label("foo", "").terminating().obj(), fooPod("p-b", "node-b")},
			nodes:        []*v1.Node{hostNode("node-a").obj(), hostNode("node-b").obj()},
			want:         []int64{100, 0},
		},
		{
			// Artificial, as upstream: the API server rejects minDomains
			// with ScheduleAnyway.
			name:         "minDomains has no effect when ScheduleAnyway",
			pod:          makePod("p").label("foo", "").spread(2, "node", v1.ScheduleAnyway, fooSelector, ptr[int32](10), nil, nil, nil).obj(),
			existingPods: []*v1.Pod{fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a"), fooPod("p-b1", "node-b"), fooPod("p-b2", "node-b"), fooPod("p-c1", "node-c")},
			nodes: []*v1.Node{
				makeNode("node-a").label("node", "node-a").obj(),
				makeNode("node-b").label("node", "node-b").obj(),
				makeNode("node-c").label("node", "node-c").obj(),
			},
			want: []int64{75, 75, 100},
		},
		{
			name: "NodeAffinityPolicy honoed with labelSelectors",
			pod: makePod("p").label("foo", "").nodeSelector(map[string]string{"foo": ""}).
				spread(1, "node", v1.ScheduleAnyway, fooSelector, nil, nil, nil, nil).obj(),
			nodes:        abcNode,
			existingPods: inclusionPods,
			want:         []int64{0, 33, 100},
		},
		{
			name: "NodeAffinityPolicy ignored with labelSelectors",
			pod: makePod("p").label("foo", "").nodeSelector(map[string]string{"foo": ""}).
				spread(1, "node", v1.ScheduleAnyway, fooSelector, nil, &ignore, nil, nil).obj(),
			nodes:        abcNode,
			existingPods: inclusionPods,
			want:         []int64{66, 100, 100},
		},
		{
			name: "NodeAffinityPolicy honoed with nodeAffinity",
			pod: makePod("p").label("foo", "").nodeAffinity("foo", v1.NodeSelectorOpIn, "").
				spread(1, "node", v1.ScheduleAnyway, fooSelector, nil, nil, nil, nil).obj(),
			nodes:        abcNode,
			existingPods: inclusionPods,
			want:         []int64{0, 33, 100},
		},
		{
			name: "NodeAffinityPolicy ignored with nodeAffinity",
			pod: makePod("p").label("foo", "").nodeAffinity("foo", v1.NodeSelectorOpIn, "").
				spread(1, "node", v1.ScheduleAnyway, fooSelector, nil, &ignore, nil, nil).obj(),
			nodes:        abcNode,
			existingPods: inclusionPods,
			want:         []int64{66, 100, 100},
		},
		{
			name:         "NodeTaintsPolicy honored",
			pod:          makePod("p").label("foo", "").spread(1, "node", v1.ScheduleAnyway, fooSelector, nil, nil, &honor, nil).obj(),
			nodes:        abcTainted,
			existingPods: inclusionPods,
			want:         []int64{0, 33, 100},
		},
		{
			name:         "NodeTaintsPolicy ignored",
			pod:          makePod("p").label("foo", "").spread(1, "node", v1.ScheduleAnyway, fooSelector, nil, nil, nil, nil).obj(),
			nodes:        abcTainted,
			existingPods: inclusionPods,
			want:         []int64{66, 100, 100},
		},
		{
			name: "matchLabelKeys ANDed with LabelSelector when LabelSelector is empty",
			pod: makePod("p").label("foo", "").label("bar", "").
				spread(1, "zone", v1.ScheduleAnyway, &metav1.LabelSelector{}, nil, nil, nil, []string{"foo"}).
				spread(1, v1.LabelHostname, v1.ScheduleAnyway, &metav1.LabelSelector{}, nil, nil, nil, []string{"bar"}).obj(),
			existingPods: []*v1.Pod{fooPod("p-a1", "node-a"), fb("p-b1", "node-b"), fooPod("p-y1", "node-c"), bar("p-y2", "node-c")},
			nodes:        []*v1.Node{zoneHost("node-a", "zone1"), zoneHost("node-b", "zone1"), zoneHost("node-c", "zone2"), zoneHost("node-d", "zone2")},
			want:         []int64{60, 20, 60, 100},
		},
		{
			name: "matchLabelKeys ANDed with LabelSelector when LabelSelector isn't empty",
			pod: makePod("p").label("foo", "").label("bar", "").label("baz", "").
				spread(1, "zone", v1.ScheduleAnyway, fooSelector, nil, nil, nil, nil).
				spread(1, v1.LabelHostname, v1.ScheduleAnyway, barSelector, nil, nil, nil, []string{"baz"}).obj(),
			existingPods: []*v1.Pod{
				fooPod("p-a1", "node-a"),
				makePod("p-b1").node("node-b").label("foo", "").label("bar", "").label("baz", "").obj(),
				fooPod("p-c1", "node-c"), bar("p-c2", "node-c"),
				makePod("p-d3").node("node-c").label("bar", "").label("baz", "").obj(),
			},
			nodes: []*v1.Node{zoneHost("node-a", "zone1"), zoneHost("node-b", "zone1"), zoneHost("node-c", "zone2"), zoneHost("node-d", "zone2")},
			want:  []int64{60, 20, 60, 100},
		},
		{
			// Not upstream's: an empty labelSelector ({}) without
			// matchLabelKeys counts no pod in v1.35 (countPodsMatchSelector
			// returns 0 for an empty selector), so every node ties.
			name:         "empty labelSelector counts nothing",
			pod:          makePod("p").label("foo", "").spread(1, v1.LabelHostname, v1.ScheduleAnyway, &metav1.LabelSelector{}, nil, nil, nil, nil).obj(),
			existingPods: pods2103,
			nodes:        abcd(),
			want:         []int64{100, 100, 100, 100},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			all := append(append([]*v1.Node{}, tt.nodes...), tt.failedNodes...)
			snap := snapshot(all, tt.existingPods, tt.objs...)
			got, err := New().Score(context.Background(), snap, tt.pod, infos(snap, tt.nodes))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("scores (-want +got):\n%s", diff)
			}
		})
	}
}

// TestScoreInFramework checks the plugin's scores reach the extender's
// 0..10 through framework.Framework with upstream's weight 2, and that a
// node the snapshot does not know (no pods) scores.
func TestScoreInFramework(t *testing.T) {
	nodes := []*v1.Node{hostNode("node-a").obj(), hostNode("node-b").obj(), hostNode("node-c").obj()}
	snap := snapshot(nodes[:2], []*v1.Pod{fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a"), fooPod("p-b1", "node-b")})
	f := &framework.Framework{
		Snapshot: func() framework.Snapshot { return snap },
		Scores:   []framework.WeightedScore{{Plugin: New(), Weight: 2}},
	}
	pod := makePod("p").label("foo", "").spread(1, v1.LabelHostname, v1.ScheduleAnyway, fooSelector, nil, nil, nil, nil).obj()
	got, err := f.Prioritize(context.Background(), pod, nodes)
	if err != nil {
		t.Fatal(err)
	}
	// Raw: log(5)*2 = 3, log(5)*1 = 2, 0 -> 100*(3+0-s)/3: 0, 33, 100.
	want := map[string]int64{"node-a": 0, "node-b": 3, "node-c": 10}
	for _, hp := range got {
		if hp.Score != want[hp.Host] {
			t.Errorf("%s scored %d, want %d", hp.Host, hp.Score, want[hp.Host])
		}
	}
}

// TestScoreRequestNodeInfos checks hostname counts come from the request's
// NodeInfos, as upstream's Score counts the pods of the NodeInfo it is
// given: the snapshot's when they are the snapshot's (the framework's copy
// for a request Node shares its pods), the request's own otherwise.
func TestScoreRequestNodeInfos(t *testing.T) {
	a, b := hostNode("node-a").obj(), hostNode("node-b").obj()
	snap := snapshot([]*v1.Node{a, b}, []*v1.Pod{fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a")})
	pod := makePod("p").label("foo", "").spread(1, v1.LabelHostname, v1.ScheduleAnyway, fooSelector, nil, nil, nil, nil).obj()

	// A copy with another Node object (nodeCacheCapable false) shares
	// the snapshot's pods: node-a has 2 matching pods, node-b none.
	sa := *snap.Get("node-a")
	sa.Node = hostNode("node-a").obj()
	got, err := New().Score(context.Background(), snap, pod, []*framework.NodeInfo{&sa, snap.Get("node-b")})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int64{0, 100}, got); diff != "" {
		t.Errorf("scores (-want +got):\n%s", diff)
	}

	// NodeInfos of their own: node-a empty, node-b with 3 matching pods.
	own := []*framework.NodeInfo{
		framework.NewNodeInfo(a),
		framework.NewNodeInfo(b, framework.NewPodInfo(fooPod("x1", "node-b")), framework.NewPodInfo(fooPod("x2", "node-b")), framework.NewPodInfo(fooPod("x3", "node-b"))),
	}
	got, err = New().Score(context.Background(), snap, pod, own)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int64{100, 0}, got); diff != "" {
		t.Errorf("scores (-want +got):\n%s", diff)
	}
}
