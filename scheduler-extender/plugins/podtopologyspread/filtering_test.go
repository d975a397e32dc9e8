package podtopologyspread

import (
	"context"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// The cases here are upstream v1.35.4's filtering_test.go (TestPreFilterState,
// TestSingleConstraint, TestMultipleConstraints) with upstream's expected
// values. Cases that only exercise a feature gate turned off (NodeInclusionPolicy
// is GA and locked on in v1.35, MatchLabelKeys is on by default) are left out.

// zoneNodes are upstream's usual four nodes: node-a and node-b in zone1,
// node-x and node-y in zone2, each labelled node=<name>.
func zoneNodes() []*v1.Node {
	return []*v1.Node{
		makeNode("node-a").label("zone", "zone1").label("node", "node-a").obj(),
		makeNode("node-b").label("zone", "zone1").label("node", "node-b").obj(),
		makeNode("node-x").label("zone", "zone2").label("node", "node-x").obj(),
		makeNode("node-y").label("zone", "zone2").label("node", "node-y").obj(),
	}
}

// fooPod is a pod labelled foo="" bound to node.
func fooPod(name, node string) *v1.Pod { return makePod(name).node(node).label("foo", "").obj() }

// selString tells a selector matching nothing from an empty one (both
// print as "").
func selString(s labels.Selector) string {
	if _, ok := s.Requirements(); !ok {
		return "<nothing>"
	}
	return s.String()
}

func mustSelector(t *testing.T, ls *metav1.LabelSelector) string {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		t.Fatal(err)
	}
	return selString(s)
}

// wantConstraint is a parsed constraint, its selector as a string.
type wantConstraint struct {
	MaxSkew       int32
	TopologyKey   string
	Selector      string
	MinDomains    int32
	HonorAffinity bool
	HonorTaints   bool
}

func gotConstraints(cs []constraint) []wantConstraint {
	var out []wantConstraint
	for _, c := range cs {
		out = append(out, wantConstraint{c.MaxSkew, c.TopologyKey, selString(c.Selector), c.MinDomains, c.HonorAffinity, c.HonorTaints})
	}
	return out
}

// defaults is a constraint with upstream's defaults (minDomains 1,
// nodeAffinityPolicy Honor, nodeTaintsPolicy Ignore).
func defaults(maxSkew int32, key, sel string) wantConstraint {
	return wantConstraint{MaxSkew: maxSkew, TopologyKey: key, Selector: sel, MinDomains: 1, HonorAffinity: true}
}

func TestPreFilterState(t *testing.T) {
	foo := mustSelector(t, fooSelector)
	bar := mustSelector(t, barSelector)
	const none = math.MaxInt32 // upstream's critical path of no domain
	tests := []struct {
		name               string
		pod                *v1.Pod
		nodes              []*v1.Node
		existingPods       []*v1.Pod
		objs               []any
		defaultConstraints []v1.TopologySpreadConstraint
		skip               bool // upstream: PreFilter returns Skip
		wantConstraints    []wantConstraint
		wantCounts         []map[string]int
		wantMin            []int // CriticalPaths[i][0].MatchNum
	}{
		{
			name:            "clean cluster with one spreadConstraint",
			pod:             makePod("p").label("foo", "").spread(5, "zone", v1.DoNotSchedule, matchLabels("foo", "bar"), nil, nil, nil, nil).obj(),
			nodes:           zoneNodes(),
			wantConstraints: []wantConstraint{defaults(5, "zone", "foo=bar")},
			wantCounts:      []map[string]int{{"zone1": 0, "zone2": 0}},
			wantMin:         []int{0},
		},
		{
			name:  "normal case with one spreadConstraint",
			pod:   makePod("p").label("foo", "").spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes: zoneNodes(),
			existingPods: []*v1.Pod{
				fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a"), fooPod("p-b1", "node-b"),
				fooPod("p-y1", "node-y"), fooPod("p-y2", "node-y"),
			},
			wantConstraints: []wantConstraint{defaults(1, "zone", foo)},
			wantCounts:      []map[string]int{{"zone1": 3, "zone2": 2}},
			wantMin:         []int{2},
		},
		{
			name:  "normal case with null label selector",
			pod:   makePod("p").label("foo", "").spread(1, "zone", v1.DoNotSchedule, nil, nil, nil, nil, nil).obj(),
			nodes: zoneNodes(),
			existingPods: []*v1.Pod{
				fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a"), fooPod("p-b1", "node-b"),
				fooPod("p-y1", "node-y"), fooPod("p-y2", "node-y"),
			},
			wantConstraints: []wantConstraint{defaults(1, "zone", "<nothing>")},
			wantCounts:      []map[string]int{{"zone1": 0, "zone2": 0}},
			wantMin:         []int{0},
		},
		{
			name: "normal case with one spreadConstraint, on a 3-zone cluster",
			pod:  makePod("p").label("foo", "").spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes: append(zoneNodes(),
				makeNode("node-o").label("zone", "zone3").label("node", "node-o").obj(),
				makeNode("node-p").label("zone", "zone3").label("node", "node-p").obj()),
			existingPods: []*v1.Pod{
				fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a"), fooPod("p-b1", "node-b"),
				fooPod("p-y1", "node-y"), fooPod("p-y2", "node-y"),
			},
			wantConstraints: []wantConstraint{defaults(1, "zone", foo)},
			wantCounts:      []map[string]int{{"zone1": 3, "zone2": 2, "zone3": 0}},
			wantMin:         []int{0},
		},
		{
			name:  "namespace mismatch doesn't count",
			pod:   makePod("p").label("foo", "").spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes: zoneNodes(),
			existingPods: []*v1.Pod{
				fooPod("p-a1", "node-a"), makePod("p-a2").ns("ns1").node("node-a").label("foo", "").obj(),
				fooPod("p-b1", "node-b"), makePod("p-y1").ns("ns2").node("node-y").label("foo", "").obj(),
				fooPod("p-y2", "node-y"),
			},
			wantConstraints: []wantConstraint{defaults(1, "zone", foo)},
			wantCounts:      []map[string]int{{"zone1": 2, "zone2": 1}},
			wantMin:         []int{1},
		},
		{
			name: "normal case with two spreadConstraints",
			pod: makePod("p").label("foo", "").
				spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).
				spread(1, "node", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes: zoneNodes(),
			existingPods: []*v1.Pod{
				fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a"), fooPod("p-b1", "node-b"),
				fooPod("p-y1", "node-y"), fooPod("p-y2", "node-y"), fooPod("p-y3", "node-y"), fooPod("p-y4", "node-y"),
			},
			wantConstraints: []wantConstraint{defaults(1, "zone", foo), defaults(1, "node", foo)},
			wantCounts: []map[string]int{
				{"zone1": 3, "zone2": 4},
				{"node-a": 2, "node-b": 1, "node-x": 0, "node-y": 4},
			},
			wantMin: []int{3, 0},
		},
		{
			name: "soft spreadConstraints should be bypassed",
			pod: makePod("p").label("foo", "").
				spread(1, "zone", v1.ScheduleAnyway, fooSelector, nil, nil, nil, nil).
				spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).
				spread(1, "node", v1.ScheduleAnyway, fooSelector, nil, nil, nil, nil).
				spread(1, "node", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes: []*v1.Node{
				makeNode("node-a").label("zone", "zone1").label("node", "node-a").obj(),
				makeNode("node-b").label("zone", "zone1").label("node", "node-b").obj(),
				makeNode("node-y").label("zone", "zone2").label("node", "node-y").obj(),
			},
			existingPods: []*v1.Pod{
				fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a"), fooPod("p-b1", "node-b"),
				fooPod("p-y1", "node-y"), fooPod("p-y2", "node-y"), fooPod("p-y3", "node-y"), fooPod("p-y4", "node-y"),
			},
			wantConstraints: []wantConstraint{defaults(1, "zone", foo), defaults(1, "node", foo)},
			wantCounts:      []map[string]int{{"zone1": 3, "zone2": 4}, {"node-a": 2, "node-b": 1, "node-y": 4}},
			wantMin:         []int{3, 1},
		},
		{
			name: "different labelSelectors - simple version",
			pod: makePod("p").label("foo", "").label("bar", "").
				spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).
				spread(1, "node", v1.DoNotSchedule, barSelector, nil, nil, nil, nil).obj(),
			nodes: []*v1.Node{
				makeNode("node-a").label("zone", "zone1").label("node", "node-a").obj(),
				makeNode("node-b").label("zone", "zone1").label("node", "node-b").obj(),
				makeNode("node-y").label("zone", "zone2").label("node", "node-y").obj(),
			},
			existingPods: []*v1.Pod{
				fooPod("p-a", "node-a"), makePod("p-b").node("node-b").label("bar", "").obj(),
			},
			wantConstraints: []wantConstraint{defaults(1, "zone", foo), defaults(1, "node", bar)},
			wantCounts:      []map[string]int{{"zone1": 1, "zone2": 0}, {"node-a": 0, "node-b": 1, "node-y": 0}},
			wantMin:         []int{0, 0},
		},
		{
			name: "different labelSelectors - complex pods",
			pod: makePod("p").label("foo", "").label("bar", "").
				spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).
				spread(1, "node", v1.DoNotSchedule, barSelector, nil, nil, nil, nil).obj(),
			nodes: []*v1.Node{
				makeNode("node-a").label("zone", "zone1").label("node", "node-a").obj(),
				makeNode("node-b").label("zone", "zone1").label("node", "node-b").obj(),
				makeNode("node-y").label("zone", "zone2").label("node", "node-y").obj(),
			},
			existingPods: []*v1.Pod{
				fooPod("p-a1", "node-a"), makePod("p-a2").node("node-a").label("foo", "").label("bar", "").obj(),
				fooPod("p-b1", "node-b"), fooPod("p-y1", "node-y"),
				makePod("p-y2").node("node-y").label("foo", "").label("bar", "").obj(),
				fooPod("p-y3", "node-y"), makePod("p-y4").node("node-y").label("foo", "").label("bar", "").obj(),
			},
			wantConstraints: []wantConstraint{defaults(1, "zone", foo), defaults(1, "node", bar)},
			wantCounts:      []map[string]int{{"zone1": 3, "zone2": 4}, {"node-a": 1, "node-b": 0, "node-y": 2}},
			wantMin:         []int{3, 0},
		},
		{
			name: "two spreadConstraints, and with podAffinity",
			pod: makePod("p").label("foo", "").nodeAffinity("node", v1.NodeSelectorOpNotIn, "node-x").
				spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).
				spread(1, "node", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes: zoneNodes(),
			existingPods: []*v1.Pod{
				fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a"), fooPod("p-b1", "node-b"),
				fooPod("p-y1", "node-y"), fooPod("p-y2", "node-y"), fooPod("p-y3", "node-y"), fooPod("p-y4", "node-y"),
			},
			wantConstraints: []wantConstraint{defaults(1, "zone", foo), defaults(1, "node", foo)},
			wantCounts:      []map[string]int{{"zone1": 3, "zone2": 4}, {"node-a": 2, "node-b": 1, "node-y": 4}},
			wantMin:         []int{3, 1},
		},
		{
			name: "default constraints and a service",
			pod:  makePod("p").label("foo", "bar").label("baz", "kar").obj(),
			defaultConstraints: []v1.TopologySpreadConstraint{
				{MaxSkew: 3, TopologyKey: "node", WhenUnsatisfiable: v1.DoNotSchedule},
				{MaxSkew: 2, TopologyKey: "node", WhenUnsatisfiable: v1.ScheduleAnyway},
				{MaxSkew: 5, TopologyKey: "rack", WhenUnsatisfiable: v1.DoNotSchedule},
			},
			objs:            []any{&v1.Service{Spec: v1.ServiceSpec{Selector: map[string]string{"foo": "bar"}}}},
			wantConstraints: []wantConstraint{defaults(3, "node", "foo=bar"), defaults(5, "rack", "foo=bar")},
			wantCounts:      []map[string]int{{}, {}},
			wantMin:         []int{none, none},
		},
		{
			name: "default constraints and a service that doesn't match",
			pod:  makePod("p").label("foo", "bar").obj(),
			defaultConstraints: []v1.TopologySpreadConstraint{
				{MaxSkew: 3, TopologyKey: "node", WhenUnsatisfiable: v1.DoNotSchedule},
			},
			objs: []any{&v1.Service{Spec: v1.ServiceSpec{Selector: map[string]string{"baz": "kep"}}}},
			skip: true,
		},
		{
			name: "default constraints and a service, but pod has constraints",
			pod: makePod("p").label("foo", "bar").label("baz", "tar").
				spread(1, "zone", v1.DoNotSchedule, matchLabels("baz", "tar"), nil, nil, nil, nil).
				spread(2, "planet", v1.ScheduleAnyway, matchLabels("fot", "rok"), nil, nil, nil, nil).obj(),
			defaultConstraints: []v1.TopologySpreadConstraint{
				{MaxSkew: 2, TopologyKey: "node", WhenUnsatisfiable: v1.DoNotSchedule},
			},
			objs:            []any{&v1.Service{Spec: v1.ServiceSpec{Selector: map[string]string{"foo": "bar"}}}},
			wantConstraints: []wantConstraint{defaults(1, "zone", "baz=tar")},
			wantCounts:      []map[string]int{{}},
			wantMin:         []int{none},
		},
		{
			name: "default soft constraints and a service",
			pod:  makePod("p").label("foo", "bar").obj(),
			defaultConstraints: []v1.TopologySpreadConstraint{
				{MaxSkew: 2, TopologyKey: "node", WhenUnsatisfiable: v1.ScheduleAnyway},
			},
			objs: []any{&v1.Service{Spec: v1.ServiceSpec{Selector: map[string]string{"foo": "bar"}}}},
			skip: true,
		},
		{
			name: "NodeAffinityPolicy honored with labelSelectors",
			pod: makePod("p").label("foo", "").nodeSelector(map[string]string{"foo": ""}).
				spread(1, "node", v1.DoNotSchedule, barSelector, nil, nil, nil, nil).obj(),
			nodes: inclusionNodes(false),
			existingPods: []*v1.Pod{
				makePod("p-a").node("node-a").label("bar", "").obj(), makePod("p-b").node("node-b").label("bar", "").obj(),
				makePod("p-c").node("node-b").label("bar", "").obj(), makePod("p-d").node("node-c").obj(),
			},
			wantConstraints: []wantConstraint{defaults(1, "node", bar)},
			wantCounts:      []map[string]int{{"node-a": 1, "node-b": 2}},
			wantMin:         []int{1},
		},
		{
			name: "NodeAffinityPolicy ignored with labelSelectors",
			pod: makePod("p").label("foo", "").nodeSelector(map[string]string{"foo": ""}).
				spread(1, "node", v1.DoNotSchedule, barSelector, nil, &ignore, nil, nil).obj(),
			nodes: inclusionNodes(false),
			existingPods: []*v1.Pod{
				makePod("p-a").node("node-a").label("bar", "").obj(), makePod("p-b").node("node-b").label("bar", "").obj(),
				makePod("p-c").node("node-b").label("bar", "").obj(), makePod("p-d").node("node-c").obj(),
			},
			wantConstraints: []wantConstraint{{1, "node", bar, 1, false, false}},
			wantCounts:      []map[string]int{{"node-a": 1, "node-b": 2, "node-c": 0}},
			wantMin:         []int{0},
		},
		{
			name: "NodeAffinityPolicy honored with nodeAffinity",
			pod: makePod("p").label("foo", "").nodeAffinity("foo", v1.NodeSelectorOpIn, "").
				spread(1, "node", v1.DoNotSchedule, barSelector, nil, nil, nil, nil).obj(),
			nodes: inclusionNodes(false),
			existingPods: []*v1.Pod{
				makePod("p-a").node("node-a").label("bar", "").obj(), makePod("p-c").node("node-b").label("bar", "").obj(),
				makePod("p-d").node("node-b").label("bar", "").obj(), makePod("p-e").node("node-c").obj(),
			},
			wantConstraints: []wantConstraint{defaults(1, "node", bar)},
			wantCounts:      []map[string]int{{"node-a": 1, "node-b": 2}},
			wantMin:         []int{1},
		},
		{
			name: "NodeAffinityPolicy ignored with nodeAffinity",
			pod: makePod("p").label("foo", "").nodeAffinity("foo", v1.NodeSelectorOpIn, "").
				spread(1, "node", v1.DoNotSchedule, barSelector, nil, &ignore, nil, nil).obj(),
			nodes: inclusionNodes(false),
			existingPods: []*v1.Pod{
				makePod("p-a").node("node-a").label("bar", "").obj(), makePod("p-b").node("node-b").label("bar", "").obj(),
				makePod("p-c").node("node-b").label("bar", "").obj(), makePod("p-d").node("node-c").obj(),
			},
			wantConstraints: []wantConstraint{{1, "node", bar, 1, false, false}},
			wantCounts:      []map[string]int{{"node-a": 1, "node-b": 2, "node-c": 0}},
			wantMin:         []int{0},
		},
		{
			name:  "NodeTaintsPolicy ignored",
			pod:   makePod("p").label("foo", "").spread(1, "node", v1.DoNotSchedule, barSelector, nil, nil, nil, nil).obj(),
			nodes: inclusionNodes(true),
			existingPods: []*v1.Pod{
				makePod("p-a").node("node-a").label("bar", "").obj(), makePod("p-b").node("node-b").label("bar", "").obj(),
				makePod("p-c").node("node-b").label("bar", "").obj(), makePod("p-d").node("node-c").obj(),
			},
			wantConstraints: []wantConstraint{defaults(1, "node", bar)},
			wantCounts:      []map[string]int{{"node-a": 1, "node-b": 2, "node-c": 0}},
			wantMin:         []int{0},
		},
		{
			name:  "NodeTaintsPolicy honored",
			pod:   makePod("p").label("foo", "").spread(1, "node", v1.DoNotSchedule, barSelector, nil, nil, &honor, nil).obj(),
			nodes: inclusionNodes(true),
			existingPods: []*v1.Pod{
				makePod("p-a").node("node-a").label("bar", "").obj(), makePod("p-b").node("node-b").label("bar", "").obj(),
				makePod("p-c").node("node-b").label("bar", "").obj(), makePod("p-d").node("node-c").obj(),
			},
			wantConstraints: []wantConstraint{{1, "node", bar, 1, true, true}},
			wantCounts:      []map[string]int{{"node-a": 1, "node-b": 2}},
			wantMin:         []int{1},
		},
		{
			name: "NodeTaintsPolicy honored with tolerated taints",
			pod: makePod("p").label("foo", "").toleration(v1.TaintNodeUnschedulable).
				spread(1, "node", v1.DoNotSchedule, barSelector, nil, nil, &honor, nil).obj(),
			nodes: inclusionNodes(true),
			existingPods: []*v1.Pod{
				makePod("p-a").node("node-a").label("bar", "").obj(), makePod("p-b").node("node-b").label("bar", "").obj(),
				makePod("p-c").node("node-b").label("bar", "").obj(), makePod("p-d").node("node-c").obj(),
			},
			wantConstraints: []wantConstraint{{1, "node", bar, 1, true, true}},
			wantCounts:      []map[string]int{{"node-a": 1, "node-b": 2, "node-c": 0}},
			wantMin:         []int{0},
		},
		{
			name: "two node inclusion Constraints, zone: honor/ignore, node: ignore/ignore",
			pod: makePod("p").label("foo", "").nodeSelector(map[string]string{"foo": ""}).
				spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).
				spread(1, "node", v1.DoNotSchedule, fooSelector, nil, &ignore, nil, nil).obj(),
			nodes: []*v1.Node{
				makeNode("node-a").label("zone", "zone1").label("node", "node-a").label("foo", "").obj(),
				makeNode("node-b").label("zone", "zone1").label("node", "node-b").obj(),
				makeNode("node-x").label("zone", "zone2").label("node", "node-x").label("foo", "").obj(),
			},
			existingPods:    []*v1.Pod{fooPod("p-b1", "node-b"), fooPod("p-b2", "node-b"), fooPod("p-x1", "node-x")},
			wantConstraints: []wantConstraint{defaults(1, "zone", foo), {1, "node", foo, 1, false, false}},
			wantCounts:      []map[string]int{{"zone1": 0, "zone2": 1}, {"node-a": 0, "node-b": 2, "node-x": 1}},
			wantMin:         []int{0, 0},
		},
		{
			name: "two node inclusion Constraints, zone: honor/honor, node: honor/ignore",
			pod: makePod("p").label("foo", "").
				spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, &honor, nil).
				spread(1, "node", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes: []*v1.Node{
				makeNode("node-a").label("zone", "zone1").label("node", "node-a").label("foo", "").obj(),
				makeNode("node-b").label("zone", "zone1").label("node", "node-b").taints(taints).obj(),
				makeNode("node-x").label("zone", "zone2").label("node", "node-x").label("foo", "").obj(),
			},
			existingPods:    []*v1.Pod{fooPod("p-b1", "node-b"), fooPod("p-b2", "node-b"), fooPod("p-x1", "node-x")},
			wantConstraints: []wantConstraint{{1, "zone", foo, 1, true, true}, defaults(1, "node", foo)},
			wantCounts:      []map[string]int{{"zone1": 0, "zone2": 1}, {"node-a": 0, "node-b": 2, "node-x": 1}},
			wantMin:         []int{0, 0},
		},
		{
			name: "two node inclusion Constraints, zone: honor/ignore, node: honor/ignore",
			pod: makePod("p").label("foo", "").nodeSelector(map[string]string{"foo": ""}).
				spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).
				spread(1, "node", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes: []*v1.Node{
				makeNode("node-a").label("zone", "zone1").label("node", "node-a").obj(),
				makeNode("node-b").label("zone", "zone1").label("node", "node-b").label("foo", "").taints(taints).obj(),
				makeNode("node-x").label("zone", "zone2").label("node", "node-x").label("foo", "").obj(),
				makeNode("node-y").label("zone", "zone2").label("node", "node-y").obj(),
			},
			existingPods:    []*v1.Pod{fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a"), fooPod("p-x1", "node-x"), fooPod("p-y1", "node-y")},
			wantConstraints: []wantConstraint{defaults(1, "zone", foo), defaults(1, "node", foo)},
			wantCounts:      []map[string]int{{"zone1": 0, "zone2": 1}, {"node-b": 0, "node-x": 1}},
			wantMin:         []int{0, 0},
		},
		{
			name: "two node inclusion Constraints, zone: ignore/ignore, node: honor/honor",
			pod: makePod("p").label("foo", "").nodeSelector(map[string]string{"foo": ""}).
				spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, &ignore, nil, nil).
				spread(1, "node", v1.DoNotSchedule, fooSelector, nil, nil, &honor, nil).obj(),
			nodes: []*v1.Node{
				makeNode("node-a").label("zone", "zone1").label("node", "node-a").obj(),
				makeNode("node-b").label("zone", "zone1").label("node", "node-b").label("foo", "").taints(taints).obj(),
				makeNode("node-x").label("zone", "zone2").label("node", "node-x").label("foo", "").obj(),
				makeNode("node-y").label("zone", "zone2").label("node", "node-y").label("foo", "").obj(),
			},
			existingPods: []*v1.Pod{
				fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a"), fooPod("p-x1", "node-x"), fooPod("p-x2", "node-x"), fooPod("p-y1", "node-y"),
			},
			wantConstraints: []wantConstraint{{1, "zone", foo, 1, false, false}, {1, "node", foo, 1, true, true}},
			wantCounts:      []map[string]int{{"zone1": 2, "zone2": 3}, {"node-x": 2, "node-y": 1}},
			wantMin:         []int{2, 1},
		},
		{
			name:  "matchLabelKeys ANDed with LabelSelector when LabelSelector isn't empty",
			pod:   makePod("p").label("foo", "").label("bar", "a").spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, []string{"bar"}).obj(),
			nodes: zoneNodes(),
			existingPods: []*v1.Pod{
				fooPod("p-a1", "node-a"), makePod("p-a2").node("node-a").label("foo", "").label("bar", "a").obj(),
				fooPod("p-b1", "node-b"), makePod("p-y1").node("node-y").label("foo", "").label("bar", "a").obj(),
				makePod("p-y2").node("node-y").label("bar", "").obj(),
			},
			wantConstraints: []wantConstraint{defaults(1, "zone", mustSelector(t, &metav1.LabelSelector{
				MatchLabels:      map[string]string{"bar": "a"},
				MatchExpressions: fooSelector.MatchExpressions,
			}))},
			wantCounts: []map[string]int{{"zone1": 1, "zone2": 1}},
			wantMin:    []int{1},
		},
		{
			name:  "matchLabelKeys ANDed with LabelSelector when LabelSelector is empty",
			pod:   makePod("p").label("foo", "a").spread(1, "zone", v1.DoNotSchedule, &metav1.LabelSelector{}, nil, nil, nil, []string{"foo"}).obj(),
			nodes: zoneNodes(),
			existingPods: []*v1.Pod{
				makePod("p-a1").node("node-a").label("foo", "a").obj(), makePod("p-a2").node("node-a").label("foo", "a").obj(),
				makePod("p-b1").node("node-b").label("foo", "a").obj(), makePod("p-y1").node("node-y").label("foo", "a").obj(),
				makePod("p-y2").node("node-y").label("foo", "a").obj(),
			},
			wantConstraints: []wantConstraint{defaults(1, "zone", "foo=a")},
			wantCounts:      []map[string]int{{"zone1": 3, "zone2": 2}},
			wantMin:         []int{2},
		},
		{
			name:  "key in matchLabelKeys is ignored when LabelSelector is nil when feature gate enabled",
			pod:   makePod("p").label("foo", "").spread(1, "zone", v1.DoNotSchedule, nil, nil, nil, nil, []string{"bar"}).obj(),
			nodes: zoneNodes(),
			existingPods: []*v1.Pod{
				makePod("p-a1").node("node-a").label("foo", "a").obj(), makePod("p-a2").node("node-a").label("foo", "a").obj(),
				makePod("p-b1").node("node-b").label("foo", "a").obj(), makePod("p-y1").node("node-y").label("foo", "a").obj(),
				makePod("p-y2").node("node-y").label("foo", "a").obj(),
			},
			wantConstraints: []wantConstraint{defaults(1, "zone", "<nothing>")},
			wantCounts:      []map[string]int{{"zone1": 0, "zone2": 0}},
			wantMin:         []int{0},
		},
		{
			name:  "key in matchLabelKeys is ignored when it isn't exist in pod.labels",
			pod:   makePod("p").label("foo", "").spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, []string{"bar"}).obj(),
			nodes: zoneNodes(),
			existingPods: []*v1.Pod{
				makePod("p-a1").node("node-a").label("foo", "a").obj(), makePod("p-a2").node("node-a").label("foo", "a").obj(),
				makePod("p-b1").node("node-b").label("foo", "a").obj(), makePod("p-y1").node("node-y").label("foo", "a").obj(),
				makePod("p-y2").node("node-y").label("foo", "a").obj(),
			},
			wantConstraints: []wantConstraint{defaults(1, "zone", foo)},
			wantCounts:      []map[string]int{{"zone1": 3, "zone2": 2}},
			wantMin:         []int{2},
		},
		{
			name: "two spreadConstraints with the same topologyKey",
			pod: makePod("p").label("foo", "").label("bar", "").
				spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).
				spread(1, "zone", v1.DoNotSchedule, barSelector, nil, nil, nil, nil).obj(),
			nodes: zoneNodes(),
			existingPods: []*v1.Pod{
				makePod("p-a1").node("node-a").label("foo", "").label("bar", "").obj(),
				fooPod("p-b1", "node-b"),
				makePod("p-x1").node("node-x").label("bar", "").obj(),
				makePod("p-y1").node("node-y").label("foo", "").label("bar", "").obj(),
				makePod("p-y2").node("node-y").label("bar", "").obj(),
			},
			wantConstraints: []wantConstraint{defaults(1, "zone", foo), defaults(1, "zone", bar)},
			wantCounts:      []map[string]int{{"zone1": 2, "zone2": 1}, {"zone1": 1, "zone2": 3}},
			wantMin:         []int{1, 1},
		},
		{
			name:  "skip if not specified",
			pod:   makePod("p").label("foo", "").obj(),
			nodes: []*v1.Node{makeNode("node-a").label("zone", "zone1").label("node", "node-a").obj()},
			skip:  true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pl, err := NewWithArgs(Args{DefaultConstraints: tt.defaultConstraints, DefaultingType: ListDefaulting})
			if err != nil {
				t.Fatal(err)
			}
			s, err := pl.preFilterState(snapshot(tt.nodes, tt.existingPods, tt.objs...), tt.pod)
			if err != nil {
				t.Fatal(err)
			}
			if tt.skip {
				if s != nil {
					t.Fatalf("want Skip (no constraints), got %+v", gotConstraints(s.constraints))
				}
				return
			}
			if s == nil {
				t.Fatal("got Skip, want a state")
			}
			if diff := cmp.Diff(tt.wantConstraints, gotConstraints(s.constraints)); diff != "" {
				t.Errorf("constraints (-want +got):\n%s", diff)
			}
			counts := make([]map[string]int, len(s.counts))
			for i, m := range s.counts {
				counts[i] = map[string]int{}
				for v, n := range m {
					counts[i][v.Value()] = n
				}
			}
			if diff := cmp.Diff(tt.wantCounts, counts); diff != "" {
				t.Errorf("counts per domain (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantMin, s.minCount); diff != "" {
				t.Errorf("minimum per constraint (-want +got):\n%s", diff)
			}
		})
	}
}

// inclusionNodes are upstream's nodes of the node inclusion policy cases:
// node-a and node-b labelled foo; node-c labelled bar, with a NoSchedule
// taint when tainted.
func inclusionNodes(tainted bool) []*v1.Node {
	c := makeNode("node-c").label("node", "node-c").label("bar", "")
	if tainted {
		c.taints(taints)
		return []*v1.Node{
			makeNode("node-a").label("node", "node-a").obj(),
			makeNode("node-b").label("node", "node-b").obj(),
			c.obj(),
		}
	}
	return []*v1.Node{
		makeNode("node-a").label("node", "node-a").label("foo", "").obj(),
		makeNode("node-b").label("node", "node-b").label("foo", "").obj(),
		c.obj(),
	}
}

const (
	ok    framework.Code = 0
	unsch                = framework.Unschedulable
	unres                = framework.UnschedulableAndUnresolvable
)

type filterCase struct {
	name         string
	pod          *v1.Pod
	nodes        []*v1.Node
	existingPods []*v1.Pod
	want         map[string]framework.Code
}

func runFilterCases(t *testing.T, tests []filterCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			snap := snapshot(tt.nodes, tt.existingPods)
			check, err := New().PreFilter(context.Background(), snap, tt.pod)
			if err != nil {
				t.Fatal(err)
			}
			if check == nil {
				t.Fatal("PreFilter skipped a pod with DoNotSchedule constraints")
			}
			got := map[string]framework.Code{}
			for _, n := range tt.nodes {
				st := check(snap.Get(n.Name))
				switch {
				case st == nil:
					got[n.Name] = ok
				case st.Code == unres && st.Reason == ErrReasonNodeLabelNotMatch,
					st.Code == unsch && st.Reason == ErrReasonConstraintsNotMatch:
					got[n.Name] = st.Code
				default:
					t.Errorf("%s: unexpected status %+v", n.Name, st)
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("status codes (-want +got, 0 = Success, 1 = Unschedulable, 2 = UnschedulableAndUnresolvable):\n%s", diff)
			}
		})
	}
}

func codes(a, b, x, y framework.Code) map[string]framework.Code {
	return map[string]framework.Code{"node-a": a, "node-b": b, "node-x": x, "node-y": y}
}

func TestSingleConstraint(t *testing.T) {
	spread2103 := []*v1.Pod{ // across nodes 2/1/0/3
		fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a"), fooPod("p-b1", "node-b"),
		fooPod("p-y1", "node-y"), fooPod("p-y2", "node-y"), fooPod("p-y3", "node-y"),
	}
	nodesABC := []*v1.Node{
		makeNode("node-a").label("node", "node-a").obj(),
		makeNode("node-b").label("node", "node-b").obj(),
		makeNode("node-c").label("node", "node-c").obj(),
	}
	pods221 := []*v1.Pod{
		fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a"), fooPod("p-b1", "node-b"), fooPod("p-b2", "node-b"), fooPod("p-c1", "node-c"),
	}
	pods21 := []*v1.Pod{fooPod("p-b1", "node-a"), fooPod("p-b2", "node-b"), fooPod("p-y1", "node-y")}
	abxyFoo := []*v1.Node{ // node-a, b, x labelled foo; node-y not
		makeNode("node-a").label("node", "node-a").label("foo", "").obj(),
		makeNode("node-b").label("node", "node-b").label("foo", "").obj(),
		makeNode("node-x").label("node", "node-x").label("foo", "").obj(),
		makeNode("node-y").label("node", "node-y").obj(),
	}
	abxyTainted := []*v1.Node{ // node-y tainted
		makeNode("node-a").label("node", "node-a").label("foo", "").obj(),
		makeNode("node-b").label("node", "node-b").label("foo", "").obj(),
		makeNode("node-x").label("node", "node-x").label("foo", "").obj(),
		makeNode("node-y").label("node", "node-y").taints(taints).obj(),
	}
	inclusionPods := []*v1.Pod{fooPod("p-b1", "node-a"), fooPod("p-b2", "node-b"), fooPod("p-y1", "node-y")}
	runFilterCases(t, []filterCase{
		{
			name:  "no existing pods",
			pod:   makePod("p").label("foo", "").spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes: zoneNodes(),
			want:  codes(ok, ok, ok, ok),
		},
		{
			name:  "no existing pods, incoming pod doesn't match itself",
			pod:   makePod("p").label("foo", "").spread(1, "zone", v1.DoNotSchedule, barSelector, nil, nil, nil, nil).obj(),
			nodes: zoneNodes(),
			want:  codes(ok, ok, ok, ok),
		},
		{
			name:  "existing pods in a different namespace do not count",
			pod:   makePod("p").label("foo", "").spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes: zoneNodes(),
			existingPods: []*v1.Pod{
				makePod("p-a1").ns("ns1").node("node-a").label("foo", "").obj(),
				makePod("p-b1").ns("ns2").node("node-a").label("foo", "").obj(),
				fooPod("p-x1", "node-x"), fooPod("p-y1", "node-y"),
			},
			want: codes(ok, ok, unsch, unsch),
		},
		{
			name:         "existing pods do not match null selector",
			pod:          makePod("p").label("foo", "").spread(1, "zone", v1.DoNotSchedule, nil, nil, nil, nil, nil).obj(),
			nodes:        zoneNodes(),
			existingPods: []*v1.Pod{fooPod("p-x1", "node-x"), fooPod("p-y1", "node-y")},
			want:         codes(ok, ok, ok, ok),
		},
		{
			name:         "pods spread across zones as 3/3, all nodes fit",
			pod:          makePod("p").label("foo", "").spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes:        zoneNodes(),
			existingPods: spread2103,
			want:         codes(ok, ok, ok, ok),
		},
		{
			name: "pods spread across zones as 1/2 due to absence of label 'zone' on node-b",
			pod:  makePod("p").label("foo", "").spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes: []*v1.Node{
				makeNode("node-a").label("zone", "zone1").label("node", "node-a").obj(),
				makeNode("node-b").label("zon", "zone1").label("node", "node-b").obj(),
				makeNode("node-x").label("zone", "zone2").label("node", "node-x").obj(),
				makeNode("node-y").label("zone", "zone2").label("node", "node-y").obj(),
			},
			existingPods: []*v1.Pod{fooPod("p-a1", "node-a"), fooPod("p-b1", "node-b"), fooPod("p-x1", "node-x"), fooPod("p-y1", "node-y")},
			want:         codes(ok, unres, unsch, unsch),
		},
		{
			name: "pod cannot be scheduled as all nodes don't have label 'rack'",
			pod:  makePod("p").label("foo", "").spread(1, "rack", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes: []*v1.Node{
				makeNode("node-a").label("zone", "zone1").label("node", "node-a").obj(),
				makeNode("node-x").label("zone", "zone2").label("node", "node-x").obj(),
			},
			want: map[string]framework.Code{"node-a": unres, "node-x": unres},
		},
		{
			name:         "pods spread across nodes as 2/1/0/3, only node-x fits",
			pod:          makePod("p").label("foo", "").spread(1, "node", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes:        zoneNodes(),
			existingPods: spread2103,
			want:         codes(unsch, unsch, ok, unsch),
		},
		{
			name:         "pods spread across nodes as 2/1/0/3, maxSkew is 2, node-b and node-x fit",
			pod:          makePod("p").label("foo", "").spread(2, "node", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes:        zoneNodes(),
			existingPods: spread2103,
			want:         codes(unsch, ok, ok, unsch),
		},
		{
			name:         "pods spread across nodes as 2/1/0/3, but pod doesn't match itself",
			pod:          makePod("p").label("bar", "").spread(1, "node", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes:        zoneNodes(),
			existingPods: spread2103,
			want:         codes(unsch, ok, ok, unsch),
		},
		{
			// Only node-a and node-y count (2/~1~/~0~/3); node-b and
			// node-x pass as NodeAffinity is not run here.
			name: "incoming pod has nodeAffinity, pods spread as 2/~1~/~0~/3, hence node-a fits",
			pod: makePod("p").label("foo", "").nodeAffinity("node", v1.NodeSelectorOpIn, "node-a", "node-y").
				spread(1, "node", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes:        zoneNodes(),
			existingPods: spread2103,
			want:         codes(ok, ok, ok, unsch),
		},
		{
			name: "terminating Pods should be excluded",
			pod:  makePod("p").label("foo", "").spread(1, "node", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes: []*v1.Node{
				makeNode("node-a").label("node", "node-a").obj(),
				makeNode("node-b").label("node", "node-b").obj(),
			},
			existingPods: []*v1.Pod{
				makePod("p-a").node("node-a").label("foo", "").terminating().obj(),
				fooPod("p-b", "node-b"),
			},
			want: map[string]framework.Code{"node-a": ok, "node-b": unsch},
		},
		{
			name: "incoming pod has nodeAffinity, pods spread as 0/~2~/0/1, hence node-a fits",
			pod: makePod("p").label("foo", "").nodeAffinity("node", v1.NodeSelectorOpNotIn, "node-b").
				spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes:        zoneNodes(),
			existingPods: []*v1.Pod{fooPod("p-b1", "node-b"), fooPod("p-b2", "node-b"), fooPod("p-y1", "node-y")},
			want:         codes(ok, ok, unsch, unsch),
		},
		{
			name:         "pods spread across nodes as 2/2/1, maxSkew is 2, and the number of domains < minDomains, then the third node fits",
			pod:          makePod("p").label("foo", "").spread(2, "node", v1.DoNotSchedule, fooSelector, ptr[int32](4), nil, nil, nil).obj(),
			nodes:        nodesABC,
			existingPods: pods221,
			want:         map[string]framework.Code{"node-a": unsch, "node-b": unsch, "node-c": ok},
		},
		{
			name:         "pods spread across nodes as 2/2/1, maxSkew is 2, and the number of domains > minDomains, then the all nodes fit",
			pod:          makePod("p").label("foo", "").spread(2, "node", v1.DoNotSchedule, fooSelector, ptr[int32](2), nil, nil, nil).obj(),
			nodes:        nodesABC,
			existingPods: pods221,
			want:         map[string]framework.Code{"node-a": ok, "node-b": ok, "node-c": ok},
		},
		{
			name:         "pods spread across zone as 2/1, maxSkew is 2 and the number of domains < minDomains, then the third and fourth nodes fit",
			pod:          makePod("p").label("foo", "").spread(2, "zone", v1.DoNotSchedule, fooSelector, ptr[int32](3), nil, nil, nil).obj(),
			nodes:        zoneNodes(),
			existingPods: pods21,
			want:         codes(unsch, unsch, ok, ok),
		},
		{
			name:         "pods spread across zone as 2/1, maxSkew is 2 and the number of domains > minDomains, then the all nodes fit",
			pod:          makePod("p").label("foo", "").spread(2, "zone", v1.DoNotSchedule, fooSelector, ptr[int32](1), nil, nil, nil).obj(),
			nodes:        zoneNodes(),
			existingPods: pods21,
			want:         codes(ok, ok, ok, ok),
		},
		{
			// 1/1/0/~0~; node-y passes as NodeAffinity is not run here.
			name: "NodeAffinityPolicy honored with labelSelectors",
			pod: makePod("p").label("foo", "").nodeSelector(map[string]string{"foo": ""}).
				spread(1, "node", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes:        abxyFoo,
			existingPods: inclusionPods,
			want:         codes(unsch, unsch, ok, ok),
		},
		{
			// 1/1/0/~1~
			name: "NodeAffinityPolicy ignored with labelSelectors",
			pod: makePod("p").label("foo", "").nodeSelector(map[string]string{"foo": ""}).
				spread(1, "node", v1.DoNotSchedule, fooSelector, nil, &ignore, nil, nil).obj(),
			nodes:        abxyFoo,
			existingPods: inclusionPods,
			want:         codes(unsch, unsch, ok, unsch),
		},
		{
			name: "NodeAffinityPolicy honored with nodeAffinity",
			pod: makePod("p").label("foo", "").nodeAffinity("foo", v1.NodeSelectorOpIn, "").
				spread(1, "node", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes:        abxyFoo,
			existingPods: inclusionPods,
			want:         codes(unsch, unsch, ok, ok),
		},
		{
			name: "NodeAffinityPolicy ignored with nodeAffinity",
			pod: makePod("p").label("foo", "").nodeAffinity("foo", v1.NodeSelectorOpIn, "").
				spread(1, "node", v1.DoNotSchedule, fooSelector, nil, &ignore, nil, nil).obj(),
			nodes:        abxyFoo,
			existingPods: inclusionPods,
			want:         codes(unsch, unsch, ok, unsch),
		},
		{
			// 1/1/0/~0~; node-y passes as TaintToleration is not run here.
			name:         "NodeTaintsPolicy honored",
			pod:          makePod("p").label("foo", "").spread(1, "node", v1.DoNotSchedule, fooSelector, nil, nil, &honor, nil).obj(),
			nodes:        abxyTainted,
			existingPods: inclusionPods,
			want:         codes(unsch, unsch, ok, ok),
		},
		{
			name:         "NodeTaintsPolicy ignored",
			pod:          makePod("p").label("foo", "").spread(1, "node", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes:        abxyTainted,
			existingPods: inclusionPods,
			want:         codes(unsch, unsch, ok, unsch),
		},
		{
			// Not upstream's: the matchLabelKeys of the PreFilterState
			// case, through the filter. Counting only bar=a pods spreads
			// them 1/1, so with the pod matching itself every node fits;
			// without matchLabelKeys 3/1 would exclude zone1.
			name:  "matchLabelKeys narrow the selector to the pod's values",
			pod:   makePod("p").label("foo", "").label("bar", "a").spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, []string{"bar"}).obj(),
			nodes: zoneNodes(),
			existingPods: []*v1.Pod{
				fooPod("p-a1", "node-a"), makePod("p-a2").node("node-a").label("foo", "").label("bar", "a").obj(),
				fooPod("p-b1", "node-b"), makePod("p-y1").node("node-y").label("foo", "").label("bar", "a").obj(),
			},
			want: codes(ok, ok, ok, ok),
		},
		{
			name:  "without matchLabelKeys the same pods exclude zone1",
			pod:   makePod("p").label("foo", "").label("bar", "a").spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes: zoneNodes(),
			existingPods: []*v1.Pod{
				fooPod("p-a1", "node-a"), makePod("p-a2").node("node-a").label("foo", "").label("bar", "a").obj(),
				fooPod("p-b1", "node-b"), makePod("p-y1").node("node-y").label("foo", "").label("bar", "a").obj(),
			},
			want: codes(unsch, unsch, ok, ok),
		},
	})
}

func TestMultipleConstraints(t *testing.T) {
	zoneAndNode := func(p *podW, zoneSel, nodeSel *metav1.LabelSelector) *v1.Pod {
		return p.spread(1, "zone", v1.DoNotSchedule, zoneSel, nil, nil, nil, nil).
			spread(1, "node", v1.DoNotSchedule, nodeSel, nil, nil, nil, nil).obj()
	}
	fb := func(name, node string) *v1.Pod {
		return makePod(name).node(node).label("foo", "").label("bar", "").obj()
	}
	bar := func(name, node string) *v1.Pod { return makePod(name).node(node).label("bar", "").obj() }
	runFilterCases(t, []filterCase{
		{
			name:  "two Constraints on zone and node, spreads = [3/3, 2/1/0/3]",
			pod:   zoneAndNode(makePod("p").label("foo", ""), fooSelector, fooSelector),
			nodes: zoneNodes(),
			existingPods: []*v1.Pod{
				fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a"), fooPod("p-b1", "node-b"),
				fooPod("p-y1", "node-y"), fooPod("p-y2", "node-y"), fooPod("p-y3", "node-y"),
			},
			want: codes(unsch, unsch, ok, unsch),
		},
		{
			name:  "two Constraints on zone and node, spreads = [3/4, 2/1/0/4]",
			pod:   zoneAndNode(makePod("p").label("foo", ""), fooSelector, fooSelector),
			nodes: zoneNodes(),
			existingPods: []*v1.Pod{
				fooPod("p-a1", "node-a"), fooPod("p-a2", "node-a"), fooPod("p-b1", "node-b"),
				fooPod("p-y1", "node-y"), fooPod("p-y2", "node-y"), fooPod("p-y3", "node-y"), fooPod("p-y4", "node-y"),
			},
			want: codes(unsch, unsch, unsch, unsch),
		},
		{
			name:         "Constraints hold different labelSelectors, spreads = [1/0, 1/0/0/1]",
			pod:          zoneAndNode(makePod("p").label("foo", "").label("bar", ""), fooSelector, barSelector),
			nodes:        zoneNodes(),
			existingPods: []*v1.Pod{fooPod("p-a1", "node-a"), bar("p-y1", "node-y")},
			want:         codes(unsch, unsch, ok, unsch),
		},
		{
			name:         "Constraints hold different labelSelectors, spreads = [1/0, 0/0/1/1]",
			pod:          zoneAndNode(makePod("p").label("foo", "").label("bar", ""), fooSelector, barSelector),
			nodes:        zoneNodes(),
			existingPods: []*v1.Pod{fooPod("p-a1", "node-a"), bar("p-x1", "node-x"), bar("p-y1", "node-y")},
			want:         codes(unsch, unsch, unsch, unsch),
		},
		{
			name:  "Constraints hold different labelSelectors, spreads = [2/3, 1/0/0/1]",
			pod:   zoneAndNode(makePod("p").label("foo", "").label("bar", ""), fooSelector, barSelector),
			nodes: zoneNodes(),
			existingPods: []*v1.Pod{
				fooPod("p-a1", "node-a"), fb("p-a2", "node-a"), fooPod("p-y1", "node-y"), fb("p-y2", "node-y"), fooPod("p-y3", "node-y"),
			},
			want: codes(unsch, ok, unsch, unsch),
		},
		{
			name:         "Constraints hold different labelSelectors but pod doesn't match itself on 'zone' constraint",
			pod:          zoneAndNode(makePod("p").label("bar", ""), fooSelector, barSelector),
			nodes:        zoneNodes(),
			existingPods: []*v1.Pod{fooPod("p-a1", "node-a"), bar("p-x1", "node-x"), bar("p-y1", "node-y")},
			want:         codes(ok, ok, unsch, unsch),
		},
		{
			name: "two Constraints on zone and node, absence of label 'node' on node-x, spreads = [1/1, 1/0/0/1]",
			pod:  zoneAndNode(makePod("p").label("foo", ""), fooSelector, fooSelector),
			nodes: []*v1.Node{
				makeNode("node-a").label("zone", "zone1").label("node", "node-a").obj(),
				makeNode("node-b").label("zone", "zone1").label("node", "node-b").obj(),
				makeNode("node-x").label("zone", "zone2").obj(),
				makeNode("node-y").label("zone", "zone2").label("node", "node-y").obj(),
			},
			existingPods: []*v1.Pod{fooPod("p-a1", "node-a"), fooPod("p-y3", "node-y")},
			want:         codes(unsch, ok, unres, unsch),
		},
		{
			name: "two node inclusion Constraints, zone: honor/ignore, node: ignore/ignore",
			pod: makePod("p").label("foo", "").nodeSelector(map[string]string{"foo": ""}).
				spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).
				spread(1, "node", v1.DoNotSchedule, fooSelector, nil, &ignore, nil, nil).obj(),
			nodes: []*v1.Node{
				makeNode("node-a").label("zone", "zone1").label("node", "node-a").label("foo", "").obj(),
				makeNode("node-b").label("zone", "zone1").label("node", "node-b").label("foo", "").obj(),
				makeNode("node-x").label("zone", "zone2").label("node", "node-x").label("foo", "").obj(),
				makeNode("node-y").label("zone", "zone2").label("node", "node-y").obj(),
			},
			existingPods: []*v1.Pod{fooPod("p-a1", "node-a"), fooPod("p-b1", "node-b"), fooPod("p-y1", "node-y")},
			want:         codes(unsch, unsch, ok, unsch),
		},
		{
			name: "two node inclusion Constraints, zone: honor/honor, node: honor/ignore",
			pod: makePod("p").label("foo", "").
				spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, &honor, nil).
				spread(1, "node", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes: []*v1.Node{
				makeNode("node-a").label("zone", "zone1").label("node", "node-a").label("foo", "").obj(),
				makeNode("node-b").label("zone", "zone1").label("node", "node-b").label("foo", "").obj(),
				makeNode("node-x").label("zone", "zone2").label("node", "node-x").label("foo", "").obj(),
				makeNode("node-y").label("zone", "zone2").label("node", "node-y").taints(taints).obj(),
			},
			existingPods: []*v1.Pod{fooPod("p-a1", "node-a"), fooPod("p-b1", "node-b"), fooPod("p-y1", "node-y")},
			want:         codes(unsch, unsch, ok, unsch),
		},
		{
			name: "two node inclusion Constraints, zone: honor/ignore, node: honor/ignore",
			pod: makePod("p").label("foo", "").nodeSelector(map[string]string{"foo": ""}).
				spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).
				spread(1, "node", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes: []*v1.Node{
				makeNode("node-a").label("zone", "zone1").label("node", "node-a").label("foo", "").obj(),
				makeNode("node-b").label("zone", "zone1").label("node", "node-b").obj(),
				makeNode("node-x").label("zone", "zone2").label("node", "node-x").label("foo", "").obj(),
				makeNode("node-y").label("zone", "zone2").label("node", "node-y").label("foo", "").taints(taints).obj(),
			},
			existingPods: []*v1.Pod{fooPod("p-a1", "node-a"), fooPod("p-b1", "node-b"), fooPod("p-y1", "node-y")},
			want:         codes(unsch, ok, ok, unsch),
		},
		{
			name: "two node inclusion Constraints, zone: honor/honor, node: ignore/ignore",
			pod: makePod("p").label("foo", "").nodeSelector(map[string]string{"foo": ""}).
				spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, &honor, nil).
				spread(1, "node", v1.DoNotSchedule, fooSelector, nil, &ignore, nil, nil).obj(),
			nodes: []*v1.Node{
				makeNode("node-a").label("zone", "zone1").label("node", "node-a").label("foo", "").obj(),
				makeNode("node-b").label("zone", "zone1").label("node", "node-b").obj(),
				makeNode("node-x").label("zone", "zone2").label("node", "node-x").label("foo", "").obj(),
				makeNode("node-y").label("zone", "zone2").label("node", "node-y").label("foo", "").taints(taints).obj(),
			},
			existingPods: []*v1.Pod{fooPod("p-a1", "node-a"), fooPod("p-b1", "node-b"), fooPod("p-y1", "node-y")},
			want:         codes(unsch, unsch, ok, unsch),
		},
		{
			name: "two Constraints on zone, spreads = [3/3, 2/1]",
			pod: makePod("p").label("foo", "").label("bar", "").
				spread(1, "zone", v1.DoNotSchedule, barSelector, nil, nil, nil, nil).
				spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes: zoneNodes(),
			existingPods: []*v1.Pod{
				fb("p-a1", "node-a"), fooPod("p-a2", "node-a"), fb("p-b1", "node-b"),
				fooPod("p-y1", "node-y"), fb("p-y2", "node-y"), fooPod("p-y3", "node-y"),
			},
			want: codes(unsch, unsch, ok, ok),
		},
		{
			name: "two Constraints on zone, spreads = [3/4, 2/1]",
			pod: makePod("p").label("foo", "").label("bar", "").
				spread(1, "zone", v1.DoNotSchedule, barSelector, nil, nil, nil, nil).
				spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj(),
			nodes: zoneNodes(),
			existingPods: []*v1.Pod{
				fb("p-a1", "node-a"), fooPod("p-a2", "node-a"), fb("p-b1", "node-b"),
				fooPod("p-y1", "node-y"), fb("p-y2", "node-y"), fooPod("p-y3", "node-y"), fooPod("p-y4", "node-y"),
			},
			want: codes(unsch, unsch, unsch, unsch),
		},
	})
}

// TestFilterReasons runs the plugin in framework.Framework: the reasons
// kube-scheduler sees, word for word, in the right list.
func TestFilterReasons(t *testing.T) {
	nodes := []*v1.Node{
		makeNode("node-a").label("zone", "zone1").obj(),
		makeNode("node-b").label("zone", "zone2").obj(),
		makeNode("node-c").obj(),
	}
	snap := snapshot(nodes, []*v1.Pod{fooPod("p-a1", "node-a")})
	f := &framework.Framework{
		Snapshot: func() framework.Snapshot { return snap },
		Filters:  []framework.FilterPlugin{New()},
	}
	pod := makePod("p").label("foo", "").spread(1, "zone", v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj()
	res := f.Filter(context.Background(), pod, nodes)
	if len(res.Passing) != 1 || res.Passing[0].Name != "node-b" {
		t.Errorf("passing %v, want only node-b", res.Passing)
	}
	if diff := cmp.Diff(map[string]string{"node-a": "node(s) didn't match pod topology spread constraints"}, res.Failed); diff != "" {
		t.Errorf("FailedNodes (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]string{"node-c": "node(s) didn't match pod topology spread constraints (missing required label)"}, res.Unresolvable); diff != "" {
		t.Errorf("FailedAndUnresolvableNodes (-want +got):\n%s", diff)
	}

	// A pod without constraints (and no workloads to default from) passes
	// everywhere, even nodes without the keys.
	res = f.Filter(context.Background(), makePod("bare").label("foo", "").obj(), nodes)
	if len(res.Passing) != 3 {
		t.Errorf("a pod without constraints: passing %d nodes, want 3 (failed %v, unresolvable %v)", len(res.Passing), res.Failed, res.Unresolvable)
	}

	// An invalid selector is the pod's error, on every node.
	bad := makePod("bad").spread(1, "zone", v1.DoNotSchedule, &metav1.LabelSelector{
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "foo", Operator: "Bogus"}},
	}, nil, nil, nil, nil).obj()
	res = f.Filter(context.Background(), bad, nodes)
	if len(res.Unresolvable) != 3 {
		t.Fatalf("invalid selector: unresolvable %v, want all 3 nodes", res.Unresolvable)
	}
	if r := res.Unresolvable["node-a"]; r == "" || r[:len("get constraints from pod: obtaining pod's hard topology spread constraints: ")] != "get constraints from pod: obtaining pod's hard topology spread constraints: " {
		t.Errorf("invalid selector reason %q", r)
	}
}

func TestNewWithArgs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    Args
		wantErr bool
	}{
		{"empty is system defaulting", Args{}, false},
		{"list without constraints", Args{DefaultingType: ListDefaulting}, false},
		{"list with constraints", Args{DefaultingType: ListDefaulting, DefaultConstraints: []v1.TopologySpreadConstraint{
			{MaxSkew: 1, TopologyKey: "zone", WhenUnsatisfiable: v1.DoNotSchedule},
			{MaxSkew: 1, TopologyKey: "zone", WhenUnsatisfiable: v1.ScheduleAnyway},
		}}, false},
		{"system with constraints", Args{DefaultingType: SystemDefaulting, DefaultConstraints: []v1.TopologySpreadConstraint{
			{MaxSkew: 1, TopologyKey: "zone", WhenUnsatisfiable: v1.DoNotSchedule},
		}}, true},
		{"unknown defaulting type", Args{DefaultingType: "Sometimes"}, true},
		{"maxSkew 0", Args{DefaultingType: ListDefaulting, DefaultConstraints: []v1.TopologySpreadConstraint{
			{MaxSkew: 0, TopologyKey: "zone", WhenUnsatisfiable: v1.DoNotSchedule},
		}}, true},
		{"no topologyKey", Args{DefaultingType: ListDefaulting, DefaultConstraints: []v1.TopologySpreadConstraint{
			{MaxSkew: 1, WhenUnsatisfiable: v1.DoNotSchedule},
		}}, true},
		{"bad whenUnsatisfiable", Args{DefaultingType: ListDefaulting, DefaultConstraints: []v1.TopologySpreadConstraint{
			{MaxSkew: 1, TopologyKey: "zone", WhenUnsatisfiable: "Maybe"},
		}}, true},
		{"a selector", Args{DefaultingType: ListDefaulting, DefaultConstraints: []v1.TopologySpreadConstraint{
			{MaxSkew: 1, TopologyKey: "zone", WhenUnsatisfiable: v1.DoNotSchedule, LabelSelector: fooSelector},
		}}, true},
		{"duplicate", Args{DefaultingType: ListDefaulting, DefaultConstraints: []v1.TopologySpreadConstraint{
			{MaxSkew: 1, TopologyKey: "zone", WhenUnsatisfiable: v1.DoNotSchedule},
			{MaxSkew: 2, TopologyKey: "zone", WhenUnsatisfiable: v1.DoNotSchedule},
		}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewWithArgs(tc.args)
			if (err != nil) != tc.wantErr {
				t.Errorf("err %v, want error %v", err, tc.wantErr)
			}
			if err != nil {
				t.Log(err)
			}
		})
	}
}
