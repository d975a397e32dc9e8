package schedcompare

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
	"github.com/tabbynet/tabby/scheduler-extender/plugins"
)

var (
	seeds = flag.Int("seeds", 0, "random clusters to compare (0: 400 fixed seeds, 100 with -short)")
	seed0 = flag.Uint64("seed0", 1, "first seed; clusters use seed0 .. seed0+seeds-1")
)

// TestAgainstUpstream places a random pod in each of many random clusters
// with the extender's plugins (tabby's network plugin left out: it has no
// upstream counterpart) and with kube-scheduler v1.35's own, and requires:
// the same feasible nodes; the nodes upstream's weighted total scores
// highest are exactly those the extender scores highest (so kube-scheduler
// picks among the same nodes); and the extender's 0..10 keeps upstream's
// order (a node upstream scores higher never gets less).
func TestAgainstUpstream(t *testing.T) {
	n := *seeds
	if n == 0 {
		n = 400
		if testing.Short() {
			n = 100
		}
	}
	ctx := context.Background()
	var agree, scored int
	for s := *seed0; s < *seed0+uint64(n); s++ {
		c := randomCluster(rand.New(rand.NewPCG(s, 13)))
		ok, hadScores := compare(ctx, t, s, c)
		if hadScores {
			scored++
			if ok {
				agree++
			}
		}
	}
	t.Logf("top choice: %d of %d clusters with feasible nodes agree (%.1f%%)", agree, scored, 100*float64(agree)/float64(max(scored, 1)))
}

// compare checks one cluster and says whether the top choices agree and
// whether any node was feasible.
func compare(ctx context.Context, t *testing.T, seed uint64, c cluster) (agree, scored bool) {
	t.Helper()
	up := newUpstream(ctx, t, c.nodes, c.pods, c.namespaces)
	state, feasible := up.feasible(ctx, t, c.pod)
	snap := framework.NewSnapshot(c.nodes, c.pods, c.namespaces)
	ext := plugins.Default(func() framework.Snapshot { return snap }, nil)
	fr := ext.Filter(ctx, c.pod, c.nodes)
	if got, want := nodeNames(fr.Passing), infoNames(feasible); !slices.Equal(got, want) {
		t.Errorf("seed %d: feasible nodes: extender %v, upstream %v (failed: %v %v)", seed, got, want, fr.Failed, fr.Unresolvable)
		return false, false
	}
	if len(feasible) == 0 {
		return true, false
	}
	totals := up.totals(ctx, t, state, c.pod, feasible)
	hp, err := ext.Prioritize(ctx, c.pod, fr.Passing)
	if err != nil {
		t.Fatalf("seed %d: extender prioritize: %v", seed, err)
	}
	got := map[string]int64{}
	for _, h := range hp {
		got[h.Host] = h.Score
	}
	if tu, te := top(totals), top(got); !slices.Equal(tu, te) {
		t.Errorf("seed %d: upstream's highest %v, extender's highest %v\n  upstream totals %v\n  extender scores %v", seed, tu, te, totals, got)
		return false, true
	}
	for a, ta := range totals {
		for b, tb := range totals {
			if ta > tb && got[a] < got[b] {
				t.Errorf("seed %d: upstream scores %s %d above %s %d, extender %d below %d", seed, a, ta, b, tb, got[a], got[b])
				return false, true
			}
		}
	}
	return true, true
}

// top is the sorted names of the highest-scored nodes.
func top(scores map[string]int64) []string {
	best := slices.Max(slices.Collect(maps.Values(scores)))
	var out []string
	for n, s := range scores {
		if s == best {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

func nodeNames(nodes []*v1.Node) []string {
	out := []string{}
	for _, n := range nodes {
		out = append(out, n.Name)
	}
	slices.Sort(out)
	return out
}

func infoNames(nodes []fwk.NodeInfo) []string {
	out := []string{}
	for _, n := range nodes {
		out = append(out, n.Node().Name)
	}
	slices.Sort(out)
	return out
}

type cluster struct {
	nodes      []*v1.Node
	pods       []*v1.Pod
	namespaces []*v1.Namespace
	pod        *v1.Pod // the one being placed
}

var (
	apps       = []string{"web", "db", "cache", "batch"}
	zones      = []string{"z1", "z2", "z3"}
	disks      = []string{"ssd", "hdd"}
	nsNames    = []string{"default", "team-a", "team-b"}
	taintKeys  = []string{"spot", "gpu", "maint"}
	topologies = []string{v1.LabelHostname, v1.LabelTopologyZone}
)

// randomCluster is 3 to 12 nodes in up to three zones (some without a
// zone label), with PreferNoSchedule and sometimes NoSchedule taints, 0 to
// 6 running pods each, some with (anti-)affinity of their own, and a pod
// to place with random preferred and required rules of every kind the
// four plugins score or filter by.
func randomCluster(r *rand.Rand) cluster {
	var c cluster
	for i, name := range nsNames {
		c.namespaces = append(c.namespaces, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"team": fmt.Sprint(i % 2)}}})
	}
	for i := range 3 + r.IntN(10) {
		name := fmt.Sprintf("node-%02d", i)
		labels := map[string]string{v1.LabelHostname: name, "disk": pick(r, disks)}
		if r.IntN(8) != 0 {
			labels[v1.LabelTopologyZone] = pick(r, zones)
		}
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
		for _, k := range taintKeys {
			switch r.IntN(6) {
			case 0, 1:
				n.Spec.Taints = append(n.Spec.Taints, v1.Taint{Key: k, Value: "x", Effect: v1.TaintEffectPreferNoSchedule})
			case 2:
				if r.IntN(3) == 0 {
					n.Spec.Taints = append(n.Spec.Taints, v1.Taint{Key: k, Effect: v1.TaintEffectNoSchedule})
				}
			}
		}
		c.nodes = append(c.nodes, n)
		for j := range r.IntN(7) {
			p := randomPod(r, fmt.Sprintf("p-%d-%d", i, j), false)
			p.Spec.NodeName = name
			c.pods = append(c.pods, p)
		}
	}
	c.pod = randomPod(r, "incoming", true)
	return c
}

func pick[T any](r *rand.Rand, from []T) T { return from[r.IntN(len(from))] }

func selector(r *rand.Rand) *metav1.LabelSelector {
	if r.IntN(4) == 0 {
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{pick(r, apps), pick(r, apps)}}}}
	}
	return &metav1.LabelSelector{MatchLabels: map[string]string{"app": pick(r, apps)}}
}

func term(r *rand.Rand) v1.PodAffinityTerm {
	t := v1.PodAffinityTerm{TopologyKey: pick(r, topologies), LabelSelector: selector(r)}
	switch r.IntN(5) {
	case 0:
		t.Namespaces = []string{pick(r, nsNames)}
	case 1:
		t.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprint(r.IntN(2))}}
	}
	return t
}

// randomPod is a pod of a random app and namespace; incoming pods get
// more rules (preferred node affinity, tolerations, spread), running ones
// only (anti-)affinity, which upstream also scores from their side.
func randomPod(r *rand.Rand, name string, incoming bool) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: pick(r, nsNames), UID: types.UID(name),
		Labels: map[string]string{"app": pick(r, apps)}}}
	p.Status.Phase = v1.PodRunning
	aff := &v1.Affinity{}
	odds := 6
	if incoming {
		odds = 2
	}
	if r.IntN(odds) == 0 {
		aff.PodAffinity = &v1.PodAffinity{}
		for range 1 + r.IntN(2) {
			aff.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution = append(aff.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution,
				v1.WeightedPodAffinityTerm{Weight: 1 + r.Int32N(100), PodAffinityTerm: term(r)})
		}
		if !incoming && r.IntN(3) == 0 {
			aff.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution = []v1.PodAffinityTerm{term(r)}
		}
	}
	if r.IntN(odds) == 0 {
		aff.PodAntiAffinity = &v1.PodAntiAffinity{}
		for range 1 + r.IntN(2) {
			aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution = append(aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution,
				v1.WeightedPodAffinityTerm{Weight: 1 + r.Int32N(100), PodAffinityTerm: term(r)})
		}
		if r.IntN(4) == 0 {
			aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution = []v1.PodAffinityTerm{term(r)}
		}
	}
	if incoming {
		if r.IntN(2) == 0 {
			aff.NodeAffinity = &v1.NodeAffinity{}
			for range 1 + r.IntN(3) {
				req := v1.NodeSelectorRequirement{Key: "disk", Operator: v1.NodeSelectorOpIn, Values: []string{pick(r, disks)}}
				if r.IntN(2) == 0 {
					req = v1.NodeSelectorRequirement{Key: v1.LabelTopologyZone, Operator: v1.NodeSelectorOpIn, Values: []string{pick(r, zones), pick(r, zones)}}
				}
				aff.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution = append(aff.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution,
					v1.PreferredSchedulingTerm{Weight: 1 + r.Int32N(100), Preference: v1.NodeSelectorTerm{MatchExpressions: []v1.NodeSelectorRequirement{req}}})
			}
			if r.IntN(5) == 0 {
				aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{
					{MatchExpressions: []v1.NodeSelectorRequirement{{Key: v1.LabelTopologyZone, Operator: v1.NodeSelectorOpNotIn, Values: []string{pick(r, zones)}}}}}}
			}
		}
		for _, k := range taintKeys {
			if r.IntN(3) == 0 {
				p.Spec.Tolerations = append(p.Spec.Tolerations, v1.Toleration{Key: k, Operator: v1.TolerationOpExists})
			}
		}
		for range r.IntN(3) {
			when := v1.ScheduleAnyway
			if r.IntN(4) == 0 {
				when = v1.DoNotSchedule
			}
			p.Spec.TopologySpreadConstraints = append(p.Spec.TopologySpreadConstraints, v1.TopologySpreadConstraint{
				MaxSkew: 1 + r.Int32N(3), TopologyKey: pick(r, topologies), WhenUnsatisfiable: when, LabelSelector: selector(r)})
		}
	}
	if aff.PodAffinity != nil || aff.PodAntiAffinity != nil || aff.NodeAffinity != nil {
		p.Spec.Affinity = aff
	}
	return p
}
