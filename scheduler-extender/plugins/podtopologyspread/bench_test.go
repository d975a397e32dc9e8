package podtopologyspread

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// benchCluster is 5,000 nodes in 10 zones (kubernetes.io/hostname and
// topology.kubernetes.io/zone) with 50,000 pods, 10 per node, in two
// namespaces; a tenth of the pods match the pod's selector, about one per
// node (pods i*5000+j, j the node, are labelled app-i), an eighth of them
// in another namespace.
func benchCluster() (framework.Snapshot, []*framework.NodeInfo) {
	const nodes, pods, zones = 5000, 50000, 10
	ns := make([]*v1.Node, nodes)
	for i := range ns {
		name := fmt.Sprintf("node-%d", i)
		ns[i] = makeNode(name).label(v1.LabelHostname, name).label(v1.LabelTopologyZone, fmt.Sprintf("zone-%d", i%zones)).obj()
	}
	ps := make([]*v1.Pod, pods)
	for i := range ps {
		p := makePod(fmt.Sprintf("pod-%d", i)).ns("default").node(fmt.Sprintf("node-%d", i%nodes)).
			label("app", fmt.Sprintf("app-%d", (i/nodes)%10)).label("tier", "web")
		if i%7 == 0 {
			p.ns("other")
		}
		ps[i] = p.obj()
	}
	snap := framework.NewSnapshot(ns, ps, nil)
	return snap, snap.List()
}

func benchPod(zone, host v1.UnsatisfiableConstraintAction) *v1.Pod {
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "app-3"}}
	return makePod("new").ns("default").label("app", "app-3").label("tier", "web").
		spread(1, v1.LabelTopologyZone, zone, sel, nil, nil, nil, nil).
		spread(1, v1.LabelHostname, host, sel, nil, nil, nil, nil).obj()
}

// BenchmarkFilterScore is one pod's PreFilter, the filter of every node and
// the score of every node, as an extender's filter and prioritize requests
// with all 5,000 nodes passing kube-scheduler's own filters:
//
//   - cold: a new plugin per op, nothing counted before (the first pod of a
//     workload); filter and score of one op share the count.
//   - changed: the plugin kept, each op on a snapshot with one NodeInfo
//     replaced (a pod of the workload was just bound), the steady state of
//     a Deployment's pods.
//   - same: the plugin kept, the snapshot unchanged.
func BenchmarkFilterScore(b *testing.B) {
	base, infos := benchCluster()
	ctx := context.Background()
	// Two snapshots one bound pod apart, sharing every other NodeInfo.
	a := newListSnapshot(base.List())
	changed := slices.Clone(a.list)
	old := changed[17]
	changed[17] = framework.NewNodeInfo(old.Node, append(slices.Clone(old.Pods),
		framework.NewPodInfo(makePod("bound").ns("default").node(old.Node.Name).label("app", "app-3").obj()))...)
	snaps := []framework.Snapshot{a, newListSnapshot(changed)}
	for _, bc := range []struct {
		name       string
		zone, host v1.UnsatisfiableConstraintAction
	}{
		{"hard-zone+hard-hostname", v1.DoNotSchedule, v1.DoNotSchedule},
		{"soft-zone+soft-hostname", v1.ScheduleAnyway, v1.ScheduleAnyway},
		{"hard-zone+soft-hostname", v1.DoNotSchedule, v1.ScheduleAnyway},
	} {
		pod := benchPod(bc.zone, bc.host)
		run := func(b *testing.B, cache string, filter, score bool) {
			pl := New()
			b.ReportAllocs()
			cpu0 := cpuTime()
			i := 0
			for b.Loop() {
				snap := snaps[0]
				switch cache {
				case "cold":
					pl = New()
				case "changed":
					snap = snaps[i%2]
				}
				i++
				if filter {
					check, err := pl.PreFilter(ctx, snap, pod)
					if err != nil {
						b.Fatal(err)
					}
					if check != nil {
						for _, ni := range infos {
							_ = check(ni)
						}
					}
				}
				if score {
					if _, err := pl.Score(ctx, snap, pod, infos); err != nil {
						b.Fatal(err)
					}
				}
			}
			// CPU time of the process per op: what the work costs on a
			// shared machine, where ns/op (wall) also counts waiting.
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
		}
		for _, cache := range []string{"cold", "changed", "same"} {
			b.Run(bc.name+"/"+cache+"/filter+score", func(b *testing.B) { run(b, cache, true, true) })
		}
		b.Run(bc.name+"/cold/filter", func(b *testing.B) { run(b, "cold", true, false) })
		b.Run(bc.name+"/cold/score", func(b *testing.B) { run(b, "cold", false, true) })
	}
}

// cpuTime is the process's user and system CPU time in nanoseconds.
func cpuTime() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// TestBenchClusterSpreads checks the benchmark's cluster gives the answers
// its shape implies, so the benchmark measures real work: the counts are
// right, and some nodes pass, not all.
func TestBenchClusterSpreads(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 50,000-pod snapshot")
	}
	snap, infos := benchCluster()
	s, err := New().preFilterState(snap, benchPod(v1.DoNotSchedule, v1.DoNotSchedule))
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, c := range s.counts[0] {
		total += c
	}
	want := 0 // pods 15,000..19,999 not in "other"
	for i := 15000; i < 20000; i++ {
		if i%7 != 0 {
			want++
		}
	}
	if total != want {
		t.Errorf("%d matching pods counted by zone, want %d", total, want)
	}
	if len(s.counts[0]) != 10 || len(s.counts[1]) != 5000 {
		t.Errorf("%d zones and %d hostnames, want 10 and 5000", len(s.counts[0]), len(s.counts[1]))
	}
	passing := 0
	for _, ni := range infos {
		if s.filter(ni) == nil {
			passing++
		}
	}
	if passing == 0 || passing == len(infos) {
		t.Errorf("%d of %d nodes pass, want some but not all", passing, len(infos))
	}
	t.Logf("%d matching pods, %d of %d nodes pass", total, passing, len(infos))
}

// TestParallelMatchesSerial checks the parallel passes give the serial
// answers on the benchmark's cluster (run with -race).
func TestParallelMatchesSerial(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 50,000-pod snapshot")
	}
	snap, infos := benchCluster()
	ctx := context.Background()
	serial := New()
	serial.workers = 1
	parallel := New()
	parallel.workers = 4
	for _, pod := range []*v1.Pod{
		benchPod(v1.DoNotSchedule, v1.DoNotSchedule),
		benchPod(v1.ScheduleAnyway, v1.ScheduleAnyway),
		benchPod(v1.DoNotSchedule, v1.ScheduleAnyway),
	} {
		sc, err := serial.PreFilter(ctx, snap, pod)
		if err != nil {
			t.Fatal(err)
		}
		pc, err := parallel.PreFilter(ctx, snap, pod)
		if err != nil {
			t.Fatal(err)
		}
		if (sc == nil) != (pc == nil) {
			t.Fatal("serial and parallel disagree on skipping the filter")
		}
		if sc != nil {
			for _, ni := range infos {
				if s, p := sc(ni), pc(ni); (s == nil) != (p == nil) || s != nil && *s != *p {
					t.Fatalf("%s: serial %v, parallel %v", ni.Node.Name, s, p)
				}
			}
		}
		ss, err := serial.Score(ctx, snap, pod, infos)
		if err != nil {
			t.Fatal(err)
		}
		ps, err := parallel.Score(ctx, snap, pod, infos)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(ss, ps); diff != "" {
			t.Errorf("scores (-serial +parallel):\n%s", diff)
		}
	}
}
