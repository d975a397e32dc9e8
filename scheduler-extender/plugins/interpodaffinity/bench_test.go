package interpodaffinity

import (
	"context"
	"fmt"
	"syscall"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// benchCluster: nodes with the usual labels (hostname, 10 zones, 3
// regions, os, arch, instance type), 10 pods a node of 1,000 apps in 20
// namespaces; every 20th pod (5%) has required anti-affinity to its own
// app by hostname, every 40th also preferred anti-affinity by zone.
func benchCluster(nNodes, podsPerNode int) ([]*v1.Node, []*v1.Pod, []*v1.Namespace) {
	var namespaces []*v1.Namespace
	for i := range 20 {
		namespaces = append(namespaces, mkNamespace(fmt.Sprintf("ns%d", i), map[string]string{"team": fmt.Sprintf("t%d", i%5)}))
	}
	nodes := make([]*v1.Node, nNodes)
	for i := range nodes {
		name := fmt.Sprintf("node-%05d", i)
		nodes[i] = mkNode(name, map[string]string{
			hostname:                           name,
			"topology.kubernetes.io/zone":      fmt.Sprintf("zone-%d", i%10),
			"topology.kubernetes.io/region":    fmt.Sprintf("region-%d", i%3),
			"kubernetes.io/os":                 "linux",
			"kubernetes.io/arch":               "amd64",
			"node.kubernetes.io/instance-type": "m5.large",
		})
	}
	pods := make([]*v1.Pod, 0, nNodes*podsPerNode)
	for i := range nNodes * podsPerNode {
		app := fmt.Sprintf("app-%d", i%1000)
		b := mkPod().name(fmt.Sprintf("pod-%d", i)).ns(fmt.Sprintf("ns%d", i%1000%20)).
			node(nodes[(i*7919)%nNodes].Name).
			labels(map[string]string{"app": app, "pod-template-hash": "5d8f7c9b4", "tier": "backend"})
		if i%20 == 0 {
			b.in(reqAnti, "app", hostname, app)
		}
		if i%40 == 0 {
			b.weighted(prefAnti, 50, v1.PodAffinityTerm{LabelSelector: sel(req("app", metav1.LabelSelectorOpIn, app)), TopologyKey: "topology.kubernetes.io/zone"})
		}
		pods = append(pods, b.obj())
	}
	return nodes, pods, namespaces
}

// BenchmarkFilterScore is one pod's Filter (PreFilter and the check of
// every node) and Score (of the passing nodes) with 5,000 nodes and 50,000
// running pods. The incoming pod has one required anti-affinity term (its
// app, by hostname) and one preferred affinity term (another app, by
// zone): in its own namespace ("own-namespace", the usual case: only that
// namespace's pods have their labels matched), or with namespaceSelectors,
// {} for the anti-affinity and team=t2 for the affinity ("selectors":
// every pod's labels are matched).
func BenchmarkFilterScore(b *testing.B) {
	nodes, pods, namespaces := benchCluster(5000, 10)
	snap := framework.NewSnapshot(nodes, pods, namespaces)
	ownNS := mkPod().name("incoming").ns("ns7").labels(map[string]string{"app": "app-7", "tier": "backend"}).
		in(reqAnti, "app", hostname, "app-7").
		weighted(prefAffinity, 100, v1.PodAffinityTerm{LabelSelector: sel(req("app", metav1.LabelSelectorOpIn, "app-8")), TopologyKey: "topology.kubernetes.io/zone"}).obj()
	selectors := mkPod().name("incoming").ns("ns7").labels(map[string]string{"app": "app-7", "tier": "backend"}).
		term(reqAnti, v1.PodAffinityTerm{LabelSelector: sel(req("app", metav1.LabelSelectorOpIn, "app-7")), TopologyKey: hostname, NamespaceSelector: &metav1.LabelSelector{}}).
		weighted(prefAffinity, 100, v1.PodAffinityTerm{LabelSelector: sel(req("app", metav1.LabelSelectorOpIn, "app-8")), TopologyKey: "topology.kubernetes.io/zone",
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "t2"}}}).obj()
	infos := snap.List()
	for _, tc := range []struct {
		name string
		pod  *v1.Pod
	}{{"own-namespace", ownNS}, {"selectors", selectors}} {
		for _, workers := range []int{0, 1} {
			name := tc.name + "/workers=GOMAXPROCS"
			if workers == 1 {
				name = tc.name + "/workers=1"
			}
			b.Run(name, func(b *testing.B) {
				pl := New()
				pl.workers = workers
				ctx := context.Background()
				passing := make([]*framework.NodeInfo, 0, len(infos))
				var failed int
				b.ReportAllocs()
				cpu0 := cpuTime()
				for b.Loop() {
					check, err := pl.PreFilter(ctx, snap, tc.pod)
					if err != nil || check == nil {
						b.Fatalf("PreFilter: %v (check %v)", err, check != nil)
					}
					passing, failed = passing[:0], 0
					for _, ni := range infos {
						if check(ni) == nil {
							passing = append(passing, ni)
						} else {
							failed++
						}
					}
					if _, err := pl.Score(ctx, snap, tc.pod, passing); err != nil {
						b.Fatal(err)
					}
				}
				// CPU time (all threads, GC included) per op: on a busy
				// machine it says more than the wall time.
				b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
				b.ReportMetric(float64(failed), "failed-nodes")
			})
		}
	}
}

// cpuTime is the process's user and system CPU time in nanoseconds.
func cpuTime() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
