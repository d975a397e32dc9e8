package interpodaffinity

import (
	"context"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

type scoreCase struct {
	name       string
	pod        *v1.Pod
	pods       []*v1.Pod
	nodes      []*v1.Node
	namespaces []*v1.Namespace
	args       *Args // nil: upstream's defaults
	want       []int64
	wantErr    string
}

// scoreNodes scores the nodes as the framework does: the request's nodes,
// paired with what the snapshot knows of them.
func scoreNodes(t *testing.T, pl *Plugin, snap framework.Snapshot, pod *v1.Pod, nodes []*v1.Node) ([]int64, error) {
	t.Helper()
	infos := make([]*framework.NodeInfo, len(nodes))
	for i, n := range nodes {
		if infos[i] = snap.Get(n.Name); infos[i] == nil {
			infos[i] = framework.NewNodeInfo(n)
		}
	}
	return pl.Score(context.Background(), snap, pod, infos)
}

func runScoreCases(t *testing.T, cases []scoreCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pl := New()
			if tc.args != nil {
				var err error
				if pl, err = NewWithArgs(*tc.args); err != nil {
					t.Fatal(err)
				}
			}
			snap := framework.NewSnapshot(tc.nodes, tc.pods, tc.namespaces)
			got, err := scoreNodes(t, pl, snap, tc.pod, tc.nodes)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Score error %v, want one with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Score: %v", err)
			}
			want := tc.want
			if want == nil {
				want = make([]int64, len(tc.nodes))
			}
			if !slices.Equal(got, want) {
				t.Errorf("scores %v, want %v", got, want)
			}
		})
	}
}

func weightedAffinity(anti bool, weight int32, t v1.PodAffinityTerm) *v1.Affinity {
	w := []v1.WeightedPodAffinityTerm{{Weight: weight, PodAffinityTerm: t}}
	if anti {
		return &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: w}}
	}
	return &v1.Affinity{PodAffinity: &v1.PodAffinity{PreferredDuringSchedulingIgnoredDuringExecution: w}}
}

// Upstream's TestPreferredAffinity (scoring_test.go, v1.35.4).
func TestPreferredAffinity(t *testing.T) {
	labelRgChina := map[string]string{"region": "China"}
	labelRgIndia := map[string]string{"region": "India"}
	labelAzAz1 := map[string]string{"az": "az1"}
	labelAzAz2 := map[string]string{"az": "az2"}
	labelRgChinaAzAz1 := map[string]string{"region": "China", "az": "az1"}
	s1 := map[string]string{"security": "S1"}
	s2 := map[string]string{"security": "S2"}
	security := func(op metav1.LabelSelectorOperator, vals ...string) *metav1.LabelSelector {
		return sel(req("security", op, vals...))
	}
	stayWithS1InRegion := weightedAffinity(false, 5, v1.PodAffinityTerm{LabelSelector: security(metav1.LabelSelectorOpIn, "S1"), TopologyKey: "region"})
	stayWithS2InRegion := weightedAffinity(false, 6, v1.PodAffinityTerm{LabelSelector: security(metav1.LabelSelectorOpIn, "S2"), TopologyKey: "region"})
	affinity3 := &v1.Affinity{PodAffinity: &v1.PodAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []v1.WeightedPodAffinityTerm{
		{Weight: 8, PodAffinityTerm: v1.PodAffinityTerm{
			LabelSelector: sel(req("security", metav1.LabelSelectorOpNotIn, "S1"), req("security", metav1.LabelSelectorOpIn, "S2")),
			TopologyKey:   "region",
		}},
		{Weight: 2, PodAffinityTerm: v1.PodAffinityTerm{
			LabelSelector: sel(req("security", metav1.LabelSelectorOpExists), req("wrongkey", metav1.LabelSelectorOpDoesNotExist)),
			TopologyKey:   "region",
		}},
	}}}
	hardAffinity := &v1.Affinity{PodAffinity: &v1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{
		{LabelSelector: security(metav1.LabelSelectorOpIn, "S1", "value2"), TopologyKey: "region"},
		{LabelSelector: sel(req("security", metav1.LabelSelectorOpExists), req("wrongkey", metav1.LabelSelectorOpDoesNotExist)), TopologyKey: "region"},
	}}}
	awayFromS1InAz := weightedAffinity(true, 5, v1.PodAffinityTerm{LabelSelector: security(metav1.LabelSelectorOpIn, "S1"), TopologyKey: "az"})
	awayFromS2InAz := weightedAffinity(true, 5, v1.PodAffinityTerm{LabelSelector: security(metav1.LabelSelectorOpIn, "S2"), TopologyKey: "az"})
	stayWithS1InRegionAwayFromS2InAz := &v1.Affinity{
		PodAffinity: &v1.PodAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []v1.WeightedPodAffinityTerm{
			{Weight: 8, PodAffinityTerm: v1.PodAffinityTerm{LabelSelector: security(metav1.LabelSelectorOpIn, "S1"), TopologyKey: "region"}},
		}},
		PodAntiAffinity: &v1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []v1.WeightedPodAffinityTerm{
			{Weight: 5, PodAffinityTerm: v1.PodAffinityTerm{LabelSelector: security(metav1.LabelSelectorOpIn, "S2"), TopologyKey: "az"}},
		}},
	}
	nsTerm := v1.PodAffinityTerm{
		LabelSelector:     security(metav1.LabelSelectorOpIn, "S1"),
		TopologyKey:       "region",
		Namespaces:        []string{"subteam2.team2"},
		NamespaceSelector: sel(req("team", metav1.LabelSelectorOpIn, "team1")),
	}
	affinityNamespaceSelector := weightedAffinity(false, 5, nsTerm)
	antiAffinityNamespaceSelector := weightedAffinity(true, 5, nsTerm)
	badTerm := func(topologyKey string) v1.PodAffinityTerm {
		return v1.PodAffinityTerm{LabelSelector: security(metav1.LabelSelectorOpIn, "{{.bad-value.}}"), TopologyKey: topologyKey}
	}
	invalidAffinityLabels := weightedAffinity(false, 8, badTerm("region"))
	invalidAntiAffinityLabels := weightedAffinity(true, 5, badTerm("az"))
	on := func(node string, labels map[string]string, a *v1.Affinity) *v1.Pod {
		return mkPod().node(node).labels(labels).affinity(a).obj()
	}
	inNS := func(ns, node string) *v1.Pod { return mkPod().ns(ns).node(node).labels(s1).obj() }
	const max = framework.MaxNodeScore
	ignoreExisting := &Args{HardPodAffinityWeight: 1, IgnorePreferredTermsOfExistingPods: true}

	runScoreCases(t, []scoreCase{
		{
			name: "all nodes are same priority as Affinity is nil",
			pod:  mkPod().labels(s1).obj(),
			nodes: []*v1.Node{
				mkNode("node1", labelRgChina), mkNode("node2", labelRgIndia), mkNode("node3", labelAzAz1),
			},
		},
		{
			name: "Affinity: pod that matches topology key & pods in nodes will get high score comparing to others" +
				"which doesn't match either pods in nodes or in topology key",
			pod:   mkPod().labels(s1).affinity(stayWithS1InRegion).obj(),
			pods:  []*v1.Pod{on("node1", s1, nil), on("node2", s2, nil), on("node3", s1, nil)},
			nodes: []*v1.Node{mkNode("node1", labelRgChina), mkNode("node2", labelRgIndia), mkNode("node3", labelAzAz1)},
			want:  []int64{max, 0, 0},
		},
		{
			name:  "All the nodes that have the same topology key & label value with one of them has an existing pod that match the affinity rules, have the same score",
			pod:   mkPod().affinity(stayWithS1InRegion).obj(),
			pods:  []*v1.Pod{on("node1", s1, nil)},
			nodes: []*v1.Node{mkNode("node1", labelRgChina), mkNode("node2", labelRgChinaAzAz1), mkNode("node3", labelRgIndia)},
			want:  []int64{max, max, 0},
		},
		{
			name: "Affinity: nodes in one region has more matching pods comparing to other region, so the region which has more matches will get high score",
			pod:  mkPod().labels(s1).affinity(stayWithS2InRegion).obj(),
			pods: []*v1.Pod{
				on("node1", s2, nil), on("node1", s2, nil), on("node2", s2, nil),
				on("node3", s2, nil), on("node4", s2, nil), on("node5", s2, nil),
			},
			nodes: []*v1.Node{
				mkNode("node1", labelRgChina), mkNode("node2", labelRgIndia), mkNode("node3", labelRgChina),
				mkNode("node4", labelRgChina), mkNode("node5", labelRgIndia),
			},
			want: []int64{max, 0, max, max, 0},
		},
		{
			name:  "Affinity: different Label operators and values for pod affinity scheduling preference, including some match failures ",
			pod:   mkPod().labels(s1).affinity(affinity3).obj(),
			pods:  []*v1.Pod{on("node1", s1, nil), on("node2", s2, nil), on("node3", s1, nil)},
			nodes: []*v1.Node{mkNode("node1", labelRgChina), mkNode("node2", labelRgIndia), mkNode("node3", labelAzAz1)},
			want:  []int64{20, max, 0},
		},
		{
			name:  "Affinity symmetry: considered only the preferredDuringSchedulingIgnoredDuringExecution in pod affinity symmetry",
			pod:   mkPod().labels(s2).obj(),
			pods:  []*v1.Pod{on("node1", s1, stayWithS1InRegion), on("node2", s2, stayWithS2InRegion)},
			nodes: []*v1.Node{mkNode("node1", labelRgChina), mkNode("node2", labelRgIndia), mkNode("node3", labelAzAz1)},
			want:  []int64{0, max, 0},
		},
		{
			name:       "Affinity symmetry with namespace selector",
			pod:        mkPod().ns("subteam1.team1").labels(s1).obj(),
			pods:       []*v1.Pod{on("node1", s1, affinityNamespaceSelector), on("node2", s2, stayWithS2InRegion)},
			nodes:      []*v1.Node{mkNode("node1", labelRgChina), mkNode("node2", labelRgIndia), mkNode("node3", labelAzAz1)},
			namespaces: teamNamespaces(),
			want:       []int64{max, 0, 0},
		},
		{
			name:       "AntiAffinity symmetry with namespace selector",
			pod:        mkPod().ns("subteam1.team1").labels(s1).obj(),
			pods:       []*v1.Pod{on("node1", s1, antiAffinityNamespaceSelector), on("node2", s2, stayWithS2InRegion)},
			nodes:      []*v1.Node{mkNode("node1", labelRgChina), mkNode("node2", labelRgIndia), mkNode("node3", labelAzAz1)},
			namespaces: teamNamespaces(),
			want:       []int64{0, max, max},
		},
		{
			name:  "Affinity symmetry: considered RequiredDuringSchedulingIgnoredDuringExecution in pod affinity symmetry",
			pod:   mkPod().labels(s1).obj(),
			pods:  []*v1.Pod{on("node1", s1, hardAffinity), on("node2", s2, hardAffinity)},
			nodes: []*v1.Node{mkNode("node1", labelRgChina), mkNode("node2", labelRgIndia), mkNode("node3", labelAzAz1)},
			want:  []int64{max, max, 0},
		},
		{
			name:  "Anti Affinity: pod that does not match existing pods in node will get high score ",
			pod:   mkPod().labels(s1).affinity(awayFromS1InAz).obj(),
			pods:  []*v1.Pod{on("node1", s1, nil), on("node2", s2, nil)},
			nodes: []*v1.Node{mkNode("node1", labelAzAz1), mkNode("node2", labelRgChina)},
			want:  []int64{0, max},
		},
		{
			name:  "Anti Affinity: pod that does not match topology key & match the pods in nodes will get higher score comparing to others ",
			pod:   mkPod().labels(s1).affinity(awayFromS1InAz).obj(),
			pods:  []*v1.Pod{on("node1", s1, nil), on("node2", s1, nil)},
			nodes: []*v1.Node{mkNode("node1", labelAzAz1), mkNode("node2", labelRgChina)},
			want:  []int64{0, max},
		},
		{
			name:  "Anti Affinity: one node has more matching pods comparing to other node, so the node which has more unmatches will get high score",
			pod:   mkPod().labels(s1).affinity(awayFromS1InAz).obj(),
			pods:  []*v1.Pod{on("node1", s1, nil), on("node1", s1, nil), on("node2", s2, nil)},
			nodes: []*v1.Node{mkNode("node1", labelAzAz1), mkNode("node2", labelRgIndia)},
			want:  []int64{0, max},
		},
		{
			name:  "Anti Affinity symmetry: the existing pods in node which has anti affinity match will get high score",
			pod:   mkPod().labels(s2).obj(),
			pods:  []*v1.Pod{on("node1", s1, awayFromS2InAz), on("node2", s2, awayFromS1InAz)},
			nodes: []*v1.Node{mkNode("node1", labelAzAz1), mkNode("node2", labelAzAz2)},
			want:  []int64{0, max},
		},
		{
			name:  "Affinity and Anti Affinity: considered only preferredDuringSchedulingIgnoredDuringExecution in both pod affinity & anti affinity",
			pod:   mkPod().labels(s1).affinity(stayWithS1InRegionAwayFromS2InAz).obj(),
			pods:  []*v1.Pod{on("node1", s1, nil), on("node2", s1, nil)},
			nodes: []*v1.Node{mkNode("node1", labelRgChina), mkNode("node2", labelAzAz1)},
			want:  []int64{max, 0},
		},
		{
			name: "Affinity and Anti Affinity: considering both affinity and anti-affinity, the pod to schedule and existing pods have the same labels",
			pod:  mkPod().labels(s1).affinity(stayWithS1InRegionAwayFromS2InAz).obj(),
			pods: []*v1.Pod{
				on("node1", s1, nil), on("node1", s1, nil), on("node2", s1, nil), on("node3", s1, nil),
				on("node3", s1, nil), on("node4", s1, nil), on("node5", s1, nil),
			},
			nodes: []*v1.Node{
				mkNode("node1", labelRgChinaAzAz1), mkNode("node2", labelRgIndia), mkNode("node3", labelRgChina),
				mkNode("node4", labelRgChina), mkNode("node5", labelRgIndia),
			},
			want: []int64{max, 0, max, max, 0},
		},
		{
			name: "Affinity and Anti Affinity and symmetry: considered only preferredDuringSchedulingIgnoredDuringExecution in both pod affinity & anti affinity & symmetry",
			pod:  mkPod().labels(s1).affinity(stayWithS1InRegionAwayFromS2InAz).obj(),
			pods: []*v1.Pod{
				on("node1", s1, nil), on("node2", s2, nil),
				on("node3", nil, stayWithS1InRegionAwayFromS2InAz), on("node4", nil, awayFromS1InAz),
			},
			nodes: []*v1.Node{
				mkNode("node1", labelRgChina), mkNode("node2", labelAzAz1), mkNode("node3", labelRgIndia), mkNode("node4", labelAzAz2),
			},
			want: []int64{max, 0, max, 0},
		},
		{
			name:  "Avoid panic when partial nodes in a topology don't have pods with affinity",
			pod:   mkPod().labels(s1).obj(),
			pods:  []*v1.Pod{on("node1", s1, nil), on("node2", nil, stayWithS1InRegionAwayFromS2InAz)},
			nodes: []*v1.Node{mkNode("node1", labelRgChina), mkNode("node2", labelRgChina)},
			want:  []int64{0, 0},
		},
		{
			name:    "invalid Affinity fails PreScore",
			pod:     mkPod().affinity(invalidAffinityLabels).obj(),
			nodes:   []*v1.Node{mkNode("node1", labelRgChina), mkNode("node2", labelRgChina)},
			wantErr: `Invalid value: "{{.bad-value.}}"`,
		},
		{
			name:    "invalid AntiAffinity fails PreScore",
			pod:     mkPod().affinity(invalidAntiAffinityLabels).obj(),
			nodes:   []*v1.Node{mkNode("node1", labelRgChina), mkNode("node2", labelRgChina)},
			wantErr: `Invalid value: "{{.bad-value.}}"`,
		},
		{
			name: "Affinity with pods matching NamespaceSelector",
			pod:  mkPod().ns("subteam1.team1").labels(s1).affinity(affinityNamespaceSelector).obj(),
			pods: []*v1.Pod{
				inNS("subteam1.team1", "node1"), inNS("subteam1.team1", "node1"),
				inNS("subteam1.team2", "node1"), inNS("subteam2.team1", "node2"),
			},
			nodes:      []*v1.Node{mkNode("node1", labelRgChina), mkNode("node2", labelRgIndia)},
			namespaces: teamNamespaces(),
			want:       []int64{max, 0},
		},
		{
			name: "Affinity with pods matching both NamespaceSelector and Namespaces fields",
			pod:  mkPod().ns("subteam1.team1").labels(s1).affinity(affinityNamespaceSelector).obj(),
			pods: []*v1.Pod{
				inNS("subteam1.team1", "node1"), inNS("subteam1.team1", "node1"),
				inNS("subteam2.team2", "node1"), inNS("subteam2.team1", "node2"),
			},
			nodes:      []*v1.Node{mkNode("node1", labelRgChina), mkNode("node2", labelRgIndia)},
			namespaces: teamNamespaces(),
			want:       []int64{max, 0},
		},
		{
			name: "Anti-affinity with pods matching NamespaceSelector",
			pod:  mkPod().ns("subteam1.team1").labels(s1).affinity(antiAffinityNamespaceSelector).obj(),
			pods: []*v1.Pod{
				inNS("subteam1.team1", "node1"), inNS("subteam1.team1", "node1"),
				inNS("subteam1.team2", "node1"), inNS("subteam2.team1", "node2"),
			},
			nodes:      []*v1.Node{mkNode("node1", labelRgChina), mkNode("node2", labelRgIndia)},
			namespaces: teamNamespaces(),
			want:       []int64{0, max},
		},
		{
			name: "Anti-affinity with pods matching both NamespaceSelector and Namespaces fields",
			pod:  mkPod().ns("subteam1.team1").labels(s1).affinity(antiAffinityNamespaceSelector).obj(),
			pods: []*v1.Pod{
				inNS("subteam1.team1", "node1"), inNS("subteam1.team1", "node1"),
				inNS("subteam2.team2", "node1"), inNS("subteam2.team1", "node2"),
			},
			nodes:      []*v1.Node{mkNode("node1", labelRgChina), mkNode("node2", labelRgIndia)},
			namespaces: teamNamespaces(),
			want:       []int64{0, max},
		},
		{
			name:  "Ignore preferred terms of existing pods",
			pod:   mkPod().labels(s2).obj(),
			pods:  []*v1.Pod{on("node1", s1, stayWithS1InRegionAwayFromS2InAz), on("node2", s2, stayWithS2InRegion)},
			nodes: []*v1.Node{mkNode("node1", labelRgChina), mkNode("node2", labelRgIndia)},
			args:  ignoreExisting,
			want:  []int64{0, 0},
		},
		{
			name:  "Do not ignore preferred terms of existing pods",
			pod:   mkPod().labels(s2).obj(),
			pods:  []*v1.Pod{on("node1", s1, stayWithS1InRegionAwayFromS2InAz), on("node2", s2, stayWithS2InRegion)},
			nodes: []*v1.Node{mkNode("node1", labelRgChina), mkNode("node2", labelRgIndia)},
			want:  []int64{0, max},
		},
		{
			name:  "No nodes to score",
			pod:   mkPod().labels(s2).obj(),
			nodes: []*v1.Node{},
			want:  []int64{},
		},
	})
}

// Upstream's TestPreferredAffinityWithHardPodAffinitySymmetricWeight
// (scoring_test.go, v1.35.4).
func TestPreferredAffinityWithHardPodAffinitySymmetricWeight(t *testing.T) {
	podLabelServiceS1 := map[string]string{"service": "S1"}
	hardPodAffinity := &v1.Affinity{PodAffinity: &v1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{
		LabelSelector:     sel(req("service", metav1.LabelSelectorOpIn, "S1")),
		Namespaces:        []string{"", "subteam2.team2"},
		NamespaceSelector: sel(req("team", metav1.LabelSelectorOpIn, "team1")),
		TopologyKey:       "region",
	}}}}
	pods := []*v1.Pod{
		mkPod().node("node1").affinity(hardPodAffinity).obj(),
		mkPod().node("node2").affinity(hardPodAffinity).obj(),
	}
	nodes := []*v1.Node{
		mkNode("node1", map[string]string{"region": "China"}),
		mkNode("node2", map[string]string{"region": "India"}),
		mkNode("node3", map[string]string{"az": "az1"}),
	}
	const max = framework.MaxNodeScore
	defaults, zero := DefaultArgs(), Args{HardPodAffinityWeight: 0}
	runScoreCases(t, []scoreCase{
		{
			name: "with default weight", args: &defaults, want: []int64{max, max, 0},
			pod: mkPod().labels(podLabelServiceS1).obj(), pods: pods, nodes: nodes, namespaces: teamNamespaces(),
		},
		{
			name: "with zero weight", args: &zero,
			pod: mkPod().labels(podLabelServiceS1).obj(), pods: pods, nodes: nodes, namespaces: teamNamespaces(),
		},
		{
			name: "with no matching namespace", args: &defaults,
			pod: mkPod().ns("subteam1.team2").labels(podLabelServiceS1).obj(), pods: pods, nodes: nodes, namespaces: teamNamespaces(),
		},
		{
			name: "with matching NamespaceSelector", args: &defaults, want: []int64{max, max, 0},
			pod: mkPod().ns("subteam1.team1").labels(podLabelServiceS1).obj(), pods: pods, nodes: nodes, namespaces: teamNamespaces(),
		},
		{
			name: "with matching Namespaces", args: &defaults, want: []int64{max, max, 0},
			pod: mkPod().ns("subteam2.team2").labels(podLabelServiceS1).obj(), pods: pods, nodes: nodes, namespaces: teamNamespaces(),
		},
	})
}

func TestNewWithArgs(t *testing.T) {
	for _, w := range []int32{-1, 101} {
		if _, err := NewWithArgs(Args{HardPodAffinityWeight: w}); err == nil || !strings.Contains(err.Error(), "not in valid range [0, 100]") {
			t.Errorf("weight %d: error %v, want a range error", w, err)
		}
	}
	for _, w := range []int32{0, 1, 100} {
		if _, err := NewWithArgs(Args{HardPodAffinityWeight: w}); err != nil {
			t.Errorf("weight %d: %v", w, err)
		}
	}
	if New().Name() != "InterPodAffinity" {
		t.Errorf("Name() = %q", New().Name())
	}
}
