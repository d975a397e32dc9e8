package schedcompare

import (
	"context"
	"os"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/backend/cache"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	plfeature "k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/interpodaffinity"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodeaffinity"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/podtopologyspread"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/tainttoleration"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	"k8s.io/kubernetes/pkg/scheduler/metrics"
)

// upstream is kube-scheduler v1.35's four plugins the extender replaces,
// with their default arguments and weights, over one cluster.
type upstream struct {
	snap    *cache.Snapshot
	filters []fwk.FilterPlugin
	scores  []weighted
}

// scorer is a plugin with PreScore and Score (all four have both).
type scorer interface {
	fwk.PreScorePlugin
	fwk.ScorePlugin
}

type weighted struct {
	plugin scorer
	weight int64
}

// newUpstream builds the plugins as kube-scheduler's default profile does
// (feature gates at their v1.35 defaults) over the cluster's pods, nodes
// and namespaces.
func newUpstream(ctx context.Context, t testing.TB, nodes []*v1.Node, pods []*v1.Pod, namespaces []*v1.Namespace) *upstream {
	snap := cache.NewSnapshot(pods, nodes)
	fts := plfeature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	fh, err := frameworkruntime.NewFramework(ctx, nil, nil,
		frameworkruntime.WithSnapshotSharedLister(snap), frameworkruntime.WithInformerFactory(informersFor(ctx, namespaces)))
	if err != nil {
		t.Fatal(err)
	}
	setup := func(f frameworkruntime.PluginFactoryWithFts[fwk.Plugin], args runtime.Object) fwk.Plugin {
		p, err := frameworkruntime.FactoryAdapter(fts, f)(ctx, args, fh)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	ta := setup(tainttoleration.New, nil)
	na := setup(nodeaffinity.New, &config.NodeAffinityArgs{})
	pts := setup(podtopologyspread.New, &config.PodTopologySpreadArgs{DefaultingType: config.SystemDefaulting})
	ipa := setup(interpodaffinity.New, &config.InterPodAffinityArgs{HardPodAffinityWeight: 1})
	u := &upstream{snap: snap}
	// kube-scheduler v1.35's filter order and default score weights.
	for _, p := range []fwk.Plugin{ta, na, pts, ipa} {
		u.filters = append(u.filters, p.(fwk.FilterPlugin))
	}
	u.scores = []weighted{{ta.(scorer), 3}, {na.(scorer), 2}, {pts.(scorer), 2}, {ipa.(scorer), 2}}
	return u
}

var shared struct {
	sync.Once
	factory clientinformers.SharedInformerFactory
}

// informersFor is one informer factory for every cluster, over the
// namespaces (the same in each) and no workloads: InterPodAffinity lists
// namespaces, PodTopologySpread the workloads of a pod's owners (random
// pods have none). Its listers are registered and synced once, as waiting
// for a sync per cluster costs a tenth of a second.
func informersFor(ctx context.Context, namespaces []*v1.Namespace) clientinformers.SharedInformerFactory {
	shared.Do(func() {
		var objs []runtime.Object
		for _, ns := range namespaces {
			objs = append(objs, ns)
		}
		f := clientinformers.NewSharedInformerFactory(fake.NewClientset(objs...), 0)
		f.Core().V1().Namespaces().Lister()
		f.Core().V1().Services().Lister()
		f.Core().V1().ReplicationControllers().Lister()
		f.Apps().V1().ReplicaSets().Lister()
		f.Apps().V1().StatefulSets().Lister()
		f.Start(ctx.Done())
		f.WaitForCacheSync(ctx.Done())
		shared.factory = f
	})
	return shared.factory
}

// feasible runs PreFilter and Filter as kube-scheduler's framework does
// (a Skip skips the plugin's Filter, a PreFilter failure fails every node,
// a PreFilterResult narrows the nodes) and returns the nodes that pass, in
// the snapshot's order.
func (u *upstream) feasible(ctx context.Context, t testing.TB, pod *v1.Pod) (*framework.CycleState, []fwk.NodeInfo) {
	state := framework.NewCycleState()
	all, err := u.snap.NodeInfos().List()
	if err != nil {
		t.Fatal(err)
	}
	var run []fwk.FilterPlugin
	var allowed map[string]bool
	for _, p := range u.filters {
		pre, ok := p.(fwk.PreFilterPlugin)
		if !ok {
			run = append(run, p)
			continue
		}
		res, st := pre.PreFilter(ctx, state, pod, all)
		switch {
		case st.IsSkip():
			continue
		case !st.IsSuccess():
			return state, nil
		}
		if !res.AllNodes() {
			next := map[string]bool{}
			for n := range res.NodeNames {
				if allowed == nil || allowed[n] {
					next[n] = true
				}
			}
			allowed = next
		}
		run = append(run, p)
	}
	var out []fwk.NodeInfo
nodes:
	for _, ni := range all {
		if allowed != nil && !allowed[ni.Node().Name] {
			continue
		}
		for _, p := range run {
			if st := p.Filter(ctx, state, pod, ni); !st.IsSuccess() {
				continue nodes
			}
		}
		out = append(out, ni)
	}
	return state, out
}

// totals are kube-scheduler's node scores from these plugins: each
// plugin's PreScore (Skip leaves it out), Score and NormalizeScore, times
// its weight, summed, as RunScorePlugins does.
func (u *upstream) totals(ctx context.Context, t testing.TB, state *framework.CycleState, pod *v1.Pod, nodes []fwk.NodeInfo) map[string]int64 {
	out := make(map[string]int64, len(nodes))
	for _, ni := range nodes {
		out[ni.Node().Name] = 0
	}
	for _, w := range u.scores {
		st := w.plugin.PreScore(ctx, state, pod, nodes)
		if st.IsSkip() {
			continue
		}
		if !st.IsSuccess() {
			t.Fatalf("upstream %s PreScore: %v", w.plugin.Name(), st.AsError())
		}
		scores := make(fwk.NodeScoreList, len(nodes))
		for i, ni := range nodes {
			s, st := w.plugin.Score(ctx, state, pod, ni)
			if !st.IsSuccess() {
				t.Fatalf("upstream %s Score: %v", w.plugin.Name(), st.AsError())
			}
			scores[i] = fwk.NodeScore{Name: ni.Node().Name, Score: s}
		}
		if ext := w.plugin.ScoreExtensions(); ext != nil {
			if st := ext.NormalizeScore(ctx, state, pod, scores); !st.IsSuccess() {
				t.Fatalf("upstream %s NormalizeScore: %v", w.plugin.Name(), st.AsError())
			}
		}
		for _, s := range scores {
			if s.Score < 0 || s.Score > fwk.MaxNodeScore {
				t.Fatalf("upstream %s scored %s %d, outside 0..100", w.plugin.Name(), s.Name, s.Score)
			}
			out[s.Name] += w.weight * s.Score
		}
	}
	return out
}

// TestMain registers kube-scheduler's metrics, which its plugins' parallel
// loops record into, as kube-scheduler does at start.
func TestMain(m *testing.M) {
	metrics.Register()
	os.Exit(m.Run())
}
