package interpodaffinity

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

func hostNodes(names ...string) []*v1.Node {
	var out []*v1.Node
	for _, n := range names {
		out = append(out, mkNode(n, map[string]string{"kubernetes.io/hostname": n, "zone": "z-" + n}))
	}
	return out
}

const hostname = "kubernetes.io/hostname"

// Pods count while bound and not Succeeded or Failed: a terminating pod
// (deletionTimestamp set, still running) holds its anti-affinity and
// matches others' terms, as in kube-scheduler's cache.
func TestTerminatingAndTerminalPods(t *testing.T) {
	deleting := func(p *v1.Pod) *v1.Pod {
		p.DeletionTimestamp = &metav1.Time{Time: time.Unix(1700000000, 0)}
		return p
	}
	phase := func(p *v1.Pod, ph v1.PodPhase) *v1.Pod { p.Status.Phase = ph; return p }
	nodes := hostNodes("n1", "n2", "n3")
	runFilterCases(t, []filterCase{
		{
			name: "a terminating pod's required anti-affinity still repels",
			pod:  mkPod().label("app", "web").obj(),
			pods: []*v1.Pod{
				deleting(mkPod().node("n1").label("app", "web").in(reqAnti, "app", hostname, "web").obj()),
				phase(mkPod().node("n2").label("app", "web").in(reqAnti, "app", hostname, "web").obj(), v1.PodSucceeded),
				phase(mkPod().node("n3").label("app", "web").in(reqAnti, "app", hostname, "web").obj(), v1.PodRunning),
			},
			nodes: nodes,
			want:  []*framework.Status{existingFail, nil, existingFail},
		},
		{
			name: "a terminating pod matches the incoming pod's anti-affinity; a failed one does not",
			pod:  mkPod().label("app", "web").in(reqAnti, "app", hostname, "web").obj(),
			pods: []*v1.Pod{
				deleting(mkPod().node("n1").label("app", "web").obj()),
				phase(mkPod().node("n2").label("app", "web").obj(), v1.PodFailed),
			},
			nodes: nodes,
			want:  []*framework.Status{antiFail, nil, nil},
		},
		{
			name: "a terminating pod satisfies affinity",
			pod:  mkPod().label("app", "web").in(reqAffinity, "app", hostname, "db").obj(),
			pods: []*v1.Pod{
				deleting(mkPod().node("n2").label("app", "db").obj()),
				phase(mkPod().node("n3").label("app", "db").obj(), v1.PodSucceeded),
			},
			nodes: nodes,
			want:  []*framework.Status{affinityFail, nil, affinityFail},
		},
	})
}

// applyLabelKeys is what the v1.35 API server does to a pod's terms when
// the pod is created (pkg/registry/core/pod/strategy.go,
// mutatePodAffinity): matchLabelKeys become `key In (value)`,
// mismatchLabelKeys `key NotIn (value)`, with the pod's label values; keys
// the pod lacks and terms without a labelSelector are left alone.
func applyLabelKeys(p *v1.Pod) *v1.Pod {
	apply := func(t *v1.PodAffinityTerm) {
		if t.LabelSelector == nil {
			return
		}
		for _, k := range t.MatchLabelKeys {
			if v, ok := p.Labels[k]; ok {
				t.LabelSelector.MatchExpressions = append(t.LabelSelector.MatchExpressions, req(k, metav1.LabelSelectorOpIn, v))
			}
		}
		for _, k := range t.MismatchLabelKeys {
			if v, ok := p.Labels[k]; ok {
				t.LabelSelector.MatchExpressions = append(t.LabelSelector.MatchExpressions, req(k, metav1.LabelSelectorOpNotIn, v))
			}
		}
	}
	if a := p.Spec.Affinity; a != nil {
		if pa := a.PodAffinity; pa != nil {
			for i := range pa.RequiredDuringSchedulingIgnoredDuringExecution {
				apply(&pa.RequiredDuringSchedulingIgnoredDuringExecution[i])
			}
			for i := range pa.PreferredDuringSchedulingIgnoredDuringExecution {
				apply(&pa.PreferredDuringSchedulingIgnoredDuringExecution[i].PodAffinityTerm)
			}
		}
		if pa := a.PodAntiAffinity; pa != nil {
			for i := range pa.RequiredDuringSchedulingIgnoredDuringExecution {
				apply(&pa.RequiredDuringSchedulingIgnoredDuringExecution[i])
			}
			for i := range pa.PreferredDuringSchedulingIgnoredDuringExecution {
				apply(&pa.PreferredDuringSchedulingIgnoredDuringExecution[i].PodAffinityTerm)
			}
		}
	}
	return p
}

// matchLabelKeys and mismatchLabelKeys act through labelSelector, as the
// API server stores it; the plugin, like kube-scheduler v1.35, does not
// merge them itself. (apiserver_test.go checks the merge against a real
// API server.)
func TestMatchLabelKeys(t *testing.T) {
	nodes := hostNodes("n1", "n2", "n3")
	// A rolling update: pods of the old ReplicaSet (hash old) on n1, of
	// the new one (hash new) on n2. The new pods spread by hostname only
	// among themselves.
	spread := func() *v1.Pod {
		return mkPod().label("app", "web").label("pod-template-hash", "new").
			term(reqAnti, v1.PodAffinityTerm{
				LabelSelector:  sel(req("app", metav1.LabelSelectorOpIn, "web")),
				MatchLabelKeys: []string{"pod-template-hash"},
				TopologyKey:    hostname,
			}).obj()
	}
	rollout := []*v1.Pod{
		mkPod().node("n1").label("app", "web").label("pod-template-hash", "old").obj(),
		mkPod().node("n2").label("app", "web").label("pod-template-hash", "new").obj(),
	}
	// Tenants: a pod keeps away from every other tenant's pods on a node
	// (mismatchLabelKeys), and wants to be with its own tenant's pods in
	// a zone (matchLabelKeys).
	tenant := func(name string) *v1.Pod {
		return mkPod().label("tenant", name).
			term(reqAnti, v1.PodAffinityTerm{
				LabelSelector:     sel(req("tenant", metav1.LabelSelectorOpExists)),
				MismatchLabelKeys: []string{"tenant"},
				TopologyKey:       hostname,
			}).
			term(reqAffinity, v1.PodAffinityTerm{
				LabelSelector:  sel(req("tenant", metav1.LabelSelectorOpExists)),
				MatchLabelKeys: []string{"tenant"},
				TopologyKey:    "zone",
			}).obj()
	}
	tenants := []*v1.Pod{
		mkPod().node("n1").label("tenant", "red").obj(),
		mkPod().node("n2").label("tenant", "blue").obj(),
	}
	runFilterCases(t, []filterCase{
		{
			name:  "as stored: the new ReplicaSet's pods repel each other only",
			pod:   applyLabelKeys(spread()),
			pods:  rollout,
			nodes: nodes,
			want:  []*framework.Status{nil, antiFail, nil},
		},
		{
			name:  "not merged (as upstream, the scheduler does not merge): labelSelector alone repels every web pod",
			pod:   spread(),
			pods:  rollout,
			nodes: nodes,
			want:  []*framework.Status{antiFail, antiFail, nil},
		},
		{
			name:  "as stored: a red pod joins red, keeps off blue",
			pod:   applyLabelKeys(tenant("red")),
			pods:  tenants,
			nodes: nodes,
			want:  []*framework.Status{nil, affinityFail, affinityFail},
		},
		{
			name: "as stored: the first green pod may go where no other tenant runs",
			pod:  applyLabelKeys(tenant("green")),
			pods: tenants,
			// n1 and n2: other tenants (anti-affinity); n3: free, and
			// the pod matches its own affinity term (tenant In green).
			nodes: nodes,
			want:  []*framework.Status{antiFail, antiFail, nil},
		},
		{
			name: "as stored: a running red pod's mismatchLabelKeys keep a blue pod off its node",
			pod:  mkPod().label("tenant", "blue").obj(),
			pods: []*v1.Pod{applyLabelKeys(func() *v1.Pod {
				p := tenant("red")
				p.Spec.NodeName = "n1"
				return p
			}())},
			nodes: nodes,
			want:  []*framework.Status{existingFail, nil, nil},
		},
	})
}

// Namespace selectors of running pods' terms match the incoming pod's
// namespace labels; of the incoming pod's terms, the namespaces the
// snapshot holds.
func TestNamespaceSelectors(t *testing.T) {
	nodes := hostNodes("n1", "n2")
	namespaces := []*v1.Namespace{
		mkNamespace("prod-a", map[string]string{"env": "prod"}),
		mkNamespace("prod-b", map[string]string{"env": "prod"}),
		mkNamespace("dev", map[string]string{"env": "dev"}),
	}
	prod := sel(req("env", metav1.LabelSelectorOpIn, "prod"))
	db := sel(req("app", metav1.LabelSelectorOpIn, "db"))
	runFilterCases(t, []filterCase{
		{
			name: "running pod's anti-affinity selects prod namespaces: a prod pod is kept off, a dev pod is not",
			pod:  mkPod().ns("prod-b").label("app", "db").obj(),
			pods: []*v1.Pod{
				mkPod().ns("prod-a").node("n1").term(reqAnti, v1.PodAffinityTerm{LabelSelector: db, NamespaceSelector: prod, TopologyKey: hostname}).obj(),
			},
			nodes:      nodes,
			namespaces: namespaces,
			want:       []*framework.Status{existingFail, nil},
		},
		{
			name: "same, incoming pod in dev",
			pod:  mkPod().ns("dev").label("app", "db").obj(),
			pods: []*v1.Pod{
				mkPod().ns("prod-a").node("n1").term(reqAnti, v1.PodAffinityTerm{LabelSelector: db, NamespaceSelector: prod, TopologyKey: hostname}).obj(),
			},
			nodes:      nodes,
			namespaces: namespaces,
			wantSkip:   true,
			want:       []*framework.Status{nil, nil},
		},
		{
			name: "incoming pod's namespace unknown to the snapshot: its labels are empty, an {} selector still selects it",
			pod:  mkPod().ns("new-ns").label("app", "db").obj(),
			pods: []*v1.Pod{
				mkPod().ns("prod-a").node("n1").term(reqAnti, v1.PodAffinityTerm{LabelSelector: db, NamespaceSelector: prod, TopologyKey: hostname}).obj(),
				mkPod().ns("dev").node("n2").term(reqAnti, v1.PodAffinityTerm{LabelSelector: db, NamespaceSelector: &metav1.LabelSelector{}, TopologyKey: hostname}).obj(),
			},
			nodes:      nodes,
			namespaces: namespaces,
			want:       []*framework.Status{nil, existingFail},
		},
		{
			name: "incoming pod's affinity to db pods in prod namespaces; the db pod in dev does not count",
			pod:  mkPod().ns("dev").term(reqAffinity, v1.PodAffinityTerm{LabelSelector: db, NamespaceSelector: prod, TopologyKey: hostname}).obj(),
			pods: []*v1.Pod{
				mkPod().ns("dev").node("n1").label("app", "db").obj(),
				mkPod().ns("prod-b").node("n2").label("app", "db").obj(),
			},
			nodes:      nodes,
			namespaces: namespaces,
			want:       []*framework.Status{affinityFail, nil},
		},
		{
			name: "a pod in a namespace the snapshot does not know is not selected by a namespaceSelector",
			pod:  mkPod().ns("dev").term(reqAffinity, v1.PodAffinityTerm{LabelSelector: db, NamespaceSelector: prod, TopologyKey: hostname}).obj(),
			pods: []*v1.Pod{
				mkPod().ns("prod-c").node("n2").label("app", "db").obj(),
			},
			nodes:      nodes,
			namespaces: namespaces,
			want:       []*framework.Status{affinityFail, affinityFail},
		},
		{
			name: "first pod of a group across prod namespaces: it matches its own term through its namespace's labels",
			pod:  mkPod().ns("prod-a").label("app", "db").term(reqAffinity, v1.PodAffinityTerm{LabelSelector: db, NamespaceSelector: prod, TopologyKey: hostname}).obj(),
			pods: []*v1.Pod{
				mkPod().ns("dev").node("n1").label("app", "db").obj(),
			},
			nodes:      nodes,
			namespaces: namespaces,
			want:       []*framework.Status{nil, nil},
		},
		{
			name:       "first pod, but its namespace is not one the term selects: no exception",
			pod:        mkPod().ns("dev").label("app", "db").term(reqAffinity, v1.PodAffinityTerm{LabelSelector: db, NamespaceSelector: prod, TopologyKey: hostname}).obj(),
			nodes:      nodes,
			namespaces: namespaces,
			want:       []*framework.Status{affinityFail, affinityFail},
		},
	})
}

// The framework puts affinity failures among the unresolvable nodes and
// anti-affinity failures among the failed ones (preemption may help), and
// scores the nodes the request names, including ones the cache does not
// know yet.
func TestInFramework(t *testing.T) {
	nodes := hostNodes("n1", "n2", "n3", "n4")
	pods := []*v1.Pod{
		mkPod().name("db").node("n1").label("app", "db").obj(),
		mkPod().name("web").node("n2").label("app", "web").obj(),
		mkPod().name("lonely").node("n3").label("app", "lonely").in(reqAnti, "app", hostname, "web").obj(),
		mkPod().name("cache").node("n2").label("app", "cache").obj(),
	}
	snap := framework.NewSnapshot(nodes[:3], pods, nil) // n4 is not in the cache yet
	pl := New()
	fw := &framework.Framework{
		Snapshot: func() framework.Snapshot { return snap },
		Filters:  []framework.FilterPlugin{pl},
		Scores:   []framework.WeightedScore{{Plugin: pl, Weight: 2}},
	}
	// A web pod that must not share a node with another web pod and would
	// like to be near a cache.
	pod := mkPod().name("web-2").label("app", "web").
		in(reqAnti, "app", hostname, "web").
		weighted(prefAffinity, 10, v1.PodAffinityTerm{LabelSelector: sel(req("app", metav1.LabelSelectorOpIn, "cache")), TopologyKey: "zone"}).obj()
	res := fw.Filter(context.Background(), pod, nodes)
	var passing []string
	for _, n := range res.Passing {
		passing = append(passing, n.Name)
	}
	if !slices.Equal(passing, []string{"n1", "n4"}) {
		t.Errorf("passing %v, want [n1 n4]", passing)
	}
	wantFailed := map[string]string{
		"n2": ErrReasonAntiAffinityRulesNotMatch,
		"n3": ErrReasonExistingAntiAffinityRulesNotMatch,
	}
	if !maps.Equal(res.Failed, wantFailed) || len(res.Unresolvable) != 0 {
		t.Errorf("failed %v unresolvable %v, want failed %v", res.Failed, res.Unresolvable, wantFailed)
	}

	// Affinity failures are unresolvable.
	needsDB := mkPod().name("api").in(reqAffinity, "app", hostname, "db").obj()
	res = fw.Filter(context.Background(), needsDB, nodes)
	if len(res.Passing) != 1 || res.Passing[0].Name != "n1" || len(res.Failed) != 0 ||
		!maps.Equal(res.Unresolvable, map[string]string{"n2": ErrReasonAffinityRulesNotMatch, "n3": ErrReasonAffinityRulesNotMatch, "n4": ErrReasonAffinityRulesNotMatch}) {
		t.Errorf("api pod: passing %v failed %v unresolvable %v", res.Passing, res.Failed, res.Unresolvable)
	}

	// Only n2's zone has a cache: over all four nodes n2 gets 10 of 10
	// (the extender's scale); over the passing nodes n1 and n4, neither
	// near a cache, tie at the top: both get 10.
	for _, tc := range []struct {
		nodes []*v1.Node
		want  []int64
	}{
		{nodes, []int64{0, 10, 0, 0}},
		{[]*v1.Node{nodes[0], nodes[3]}, []int64{10, 10}},
	} {
		got, err := fw.Prioritize(context.Background(), pod, tc.nodes)
		if err != nil {
			t.Fatal(err)
		}
		for i, hp := range got {
			if hp.Host != tc.nodes[i].Name || hp.Score != tc.want[i] {
				t.Errorf("prioritize %v, want scores %v", got, tc.want)
				break
			}
		}
	}
}
