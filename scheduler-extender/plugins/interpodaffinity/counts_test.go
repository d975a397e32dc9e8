package interpodaffinity

import (
	"context"
	"maps"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

func mustState(t *testing.T, pods []*v1.Pod, nodes []*v1.Node, pod *v1.Pod) *preFilterState {
	t.Helper()
	s, err := New().preFilter(context.Background(), framework.NewSnapshot(nodes, pods, nil), pod)
	if err != nil {
		t.Fatalf("preFilter: %v", err)
	}
	if s == nil {
		t.Fatal("preFilter skipped")
	}
	return s
}

// counts are pairCounts by the label's strings, as tests write them.
type counts map[[2]string]int64

func equalCounts(got pairCounts, want counts) bool {
	plain := counts{}
	for p, n := range got {
		plain[[2]string{p.Key.Value(), p.Value.Value()}] = n
	}
	return len(got) == len(want) && maps.Equal(plain, want)
}

// Upstream's TestGetTPMapMatchingIncomingAffinityAntiAffinity
// (filtering_test.go, v1.35.4): the counts of running pods the incoming
// pod's required terms select.
func TestIncomingAffinityAntiAffinityCounts(t *testing.T) {
	newPod := func(labels ...string) *v1.Pod {
		b := mkPod().name("normal").node("nodeA")
		for _, l := range labels {
			b.label(l, "")
		}
		return b.obj()
	}
	normalPodA := newPod("aaa")
	normalPodB := newPod("bbb")
	normalPodAB := newPod("aaa", "bbb")
	nodeA := mkNode("nodeA", map[string]string{"hostname": "nodeA"})
	hostA := [2]string{"hostname", "nodeA"}

	tests := []struct {
		name         string
		existingPods []*v1.Pod
		pod          *v1.Pod
		wantAffinity counts
		wantAnti     counts
	}{
		{
			name:         "no pod has label that violates incoming pod's affinity and anti-affinity",
			existingPods: []*v1.Pod{normalPodB},
			pod:          mkPod().name("aaa-anti").exists(reqAffinity, "aaa", "hostname").exists(reqAnti, "aaa", "hostname").obj(),
		},
		{
			name:         "existing pod matches incoming pod's affinity and anti-affinity - single term case",
			existingPods: []*v1.Pod{normalPodA},
			pod:          mkPod().name("affi-antiaffi").exists(reqAffinity, "aaa", "hostname").exists(reqAnti, "aaa", "hostname").obj(),
			wantAffinity: counts{hostA: 1},
			wantAnti:     counts{hostA: 1},
		},
		{
			name:         "existing pod matches incoming pod's affinity and anti-affinity - multiple terms case",
			existingPods: []*v1.Pod{normalPodAB},
			pod: mkPod().name("affi-antiaffi").exists(reqAffinity, "aaa", "hostname").
				exists(reqAffinity, "bbb", "hostname").exists(reqAnti, "aaa", "hostname").obj(),
			wantAffinity: counts{hostA: 2}, // one for each term
			wantAnti:     counts{hostA: 1},
		},
		{
			name:         "existing pod not match incoming pod's affinity but matches anti-affinity",
			existingPods: []*v1.Pod{normalPodA},
			pod: mkPod().name("affi-antiaffi").exists(reqAffinity, "aaa", "hostname").
				exists(reqAffinity, "bbb", "hostname").
				exists(reqAnti, "aaa", "hostname").
				exists(reqAnti, "bbb", "hostname").obj(),
			wantAnti: counts{hostA: 1},
		},
		{
			name:         "incoming pod's anti-affinity has more than one term - existing pod violates partial term - case 1",
			existingPods: []*v1.Pod{normalPodAB},
			pod: mkPod().name("anaffi-antiaffiti").exists(reqAffinity, "aaa", "hostname").
				exists(reqAffinity, "ccc", "hostname").
				exists(reqAnti, "aaa", "hostname").
				exists(reqAnti, "ccc", "hostname").obj(),
			wantAnti: counts{hostA: 1},
		},
		{
			name:         "incoming pod's anti-affinity has more than one term - existing pod violates partial term - case 2",
			existingPods: []*v1.Pod{normalPodB},
			pod: mkPod().name("affi-antiaffi").exists(reqAffinity, "aaa", "hostname").
				exists(reqAffinity, "bbb", "hostname").
				exists(reqAnti, "aaa", "hostname").
				exists(reqAnti, "bbb", "hostname").obj(),
			wantAnti: counts{hostA: 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := mustState(t, tc.existingPods, []*v1.Node{nodeA}, tc.pod)
			if !equalCounts(s.affinityCounts, tc.wantAffinity) {
				t.Errorf("affinityCounts = %v, want %v", s.affinityCounts, tc.wantAffinity)
			}
			if !equalCounts(s.antiAffinityCounts, tc.wantAnti) {
				t.Errorf("antiAffinityCounts = %v, want %v", s.antiAffinityCounts, tc.wantAnti)
			}
		})
	}
	// Upstream's "nil test" and "no-op" cases: a pod without terms and no
	// running anti-affinity has nothing to check.
	for _, pods := range [][]*v1.Pod{nil, {normalPodA}} {
		s, err := New().preFilter(context.Background(), framework.NewSnapshot([]*v1.Node{nodeA}, pods, nil), mkPod().name("aaa-normal").obj())
		if s != nil || err != nil {
			t.Errorf("pod without terms among %d pods: state %+v, error %v; want a skip", len(pods), s, err)
		}
	}
}

// The states upstream's TestPreFilterStateAddRemovePod (filtering_test.go,
// v1.35.4) expects once the added pod runs, and the existing
// anti-affinity counts it implies.
func TestPreFilterStateCounts(t *testing.T) {
	label1 := map[string]string{"region": "r1", "zone": "z11"}
	label2 := map[string]string{"region": "r1", "zone": "z12"}
	label3 := map[string]string{"region": "r2", "zone": "z21"}
	selector1 := map[string]string{"foo": "bar"}
	fooBar := v1.PodAffinityTerm{LabelSelector: sel(req("foo", metav1.LabelSelectorOpIn, "bar")), TopologyKey: "region"}
	complexTerms := []v1.PodAffinityTerm{
		{LabelSelector: sel(req("foo", metav1.LabelSelectorOpIn, "bar", "buzz")), TopologyKey: "region"},
		{LabelSelector: sel(req("service", metav1.LabelSelectorOpNotIn, "bar", "security", "test")), TopologyKey: "zone"},
	}
	antiAffinityFooBar := &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{fooBar}}
	antiAffinityComplex := &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: complexTerms}
	affinityComplex := &v1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: complexTerms}
	nodes := []*v1.Node{mkNode("nodeA", label1), mkNode("nodeB", label2), mkNode("nodeC", label3)}
	p1 := mkPod().name("p1").labels(selector1).node("nodeA").obj()

	tests := []struct {
		name         string
		pendingPod   *v1.Pod
		pods         []*v1.Pod
		wantAnti     counts
		wantAffinity counts
		wantExisting counts
	}{
		{
			name:       "anti-affinity terms",
			pendingPod: mkPod().name("pending").labels(selector1).affinity(&v1.Affinity{PodAntiAffinity: antiAffinityFooBar}).obj(),
			pods: []*v1.Pod{
				p1,
				mkPod().name("p2").node("nodeC").affinity(&v1.Affinity{PodAntiAffinity: antiAffinityFooBar}).obj(),
				mkPod().name("addedPod").labels(selector1).node("nodeB").affinity(&v1.Affinity{PodAntiAffinity: antiAffinityFooBar}).obj(),
			},
			wantAnti: counts{{"region", "r1"}: 2},
			// p2 (region r2) and addedPod (region r1) select the pending pod.
			wantExisting: counts{{"region", "r1"}: 1, {"region", "r2"}: 1},
		},
		{
			name:       "complex anti-affinity terms",
			pendingPod: mkPod().name("pending").labels(selector1).affinity(&v1.Affinity{PodAntiAffinity: antiAffinityComplex}).obj(),
			pods: []*v1.Pod{
				p1,
				mkPod().name("p2").node("nodeC").affinity(&v1.Affinity{PodAntiAffinity: antiAffinityFooBar}).obj(),
				mkPod().name("addedPod").labels(selector1).node("nodeA").affinity(&v1.Affinity{PodAntiAffinity: antiAffinityComplex}).obj(),
			},
			wantAnti: counts{
				{"region", "r1"}: 2,
				{"zone", "z11"}:  2,
				{"zone", "z21"}:  1,
			},
			wantExisting: counts{{"region", "r2"}: 1, {"region", "r1"}: 1, {"zone", "z11"}: 1},
		},
		{
			name:       "affinity and anti-affinity terms",
			pendingPod: mkPod().name("pending").labels(selector1).affinity(&v1.Affinity{PodAffinity: affinityComplex}).obj(),
			pods: []*v1.Pod{
				p1,
				mkPod().name("p2").node("nodeC").affinity(&v1.Affinity{PodAntiAffinity: antiAffinityFooBar, PodAffinity: affinityComplex}).obj(),
				mkPod().name("addedPod").labels(selector1).node("nodeA").affinity(&v1.Affinity{PodAntiAffinity: antiAffinityComplex}).obj(),
			},
			wantAffinity: counts{
				{"region", "r1"}: 2,
				{"zone", "z11"}:  2,
			},
			wantExisting: counts{{"region", "r2"}: 1, {"region", "r1"}: 1, {"zone", "z11"}: 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := mustState(t, tc.pods, nodes, tc.pendingPod)
			if !equalCounts(s.antiAffinityCounts, tc.wantAnti) {
				t.Errorf("antiAffinityCounts = %v, want %v", s.antiAffinityCounts, tc.wantAnti)
			}
			if !equalCounts(s.affinityCounts, tc.wantAffinity) {
				t.Errorf("affinityCounts = %v, want %v", s.affinityCounts, tc.wantAffinity)
			}
			if !equalCounts(s.existingAntiAffinityCounts, tc.wantExisting) {
				t.Errorf("existingAntiAffinityCounts = %v, want %v", s.existingAntiAffinityCounts, tc.wantExisting)
			}
		})
	}
}
