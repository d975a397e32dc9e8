package podtopologyspread

import (
	"context"
	"fmt"
	"math/rand"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// TestCountCacheFollowsSnapshots is a differential test of the count cache:
// one long-lived plugin answers a random sequence of snapshots, each
// sharing most NodeInfos with the one before (as the extender's cache's
// do) and replacing, adding or removing some; a fresh plugin per snapshot
// (nothing cached) must give the same filter and score answers.
func TestCountCacheFollowsSnapshots(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	zones := []string{"z1", "z2", "z3"}
	apps := []string{"a", "b"}
	namespaces := []string{"default", "other"}
	pods := 0
	newPod := func(node string) *framework.PodInfo {
		pods++
		p := makePod(fmt.Sprintf("p%d", pods)).ns(namespaces[rng.Intn(2)]).node(node).label("app", apps[rng.Intn(2)])
		if rng.Intn(10) == 0 {
			p.terminating()
		}
		return framework.NewPodInfo(p.obj())
	}
	newNode := func(name string, npods int) *framework.NodeInfo {
		n := hostNode(name).label("zone", zones[rng.Intn(3)])
		if rng.Intn(8) == 0 {
			n.taints(taints)
		}
		ni := framework.NewNodeInfo(n.obj())
		for range npods {
			ni.AddPod(newPod(name))
		}
		return ni
	}
	var list []*framework.NodeInfo
	for i := range 40 {
		list = append(list, newNode(fmt.Sprintf("node-%02d", i), rng.Intn(6)))
	}
	sortList := func(l []*framework.NodeInfo) {
		slices.SortFunc(l, func(a, b *framework.NodeInfo) int {
			switch {
			case a.Node.Name < b.Node.Name:
				return -1
			case a.Node.Name > b.Node.Name:
				return 1
			}
			return 0
		})
	}

	testPods := []*v1.Pod{
		// Counts only the nodes of zone z1 (nodeAffinityPolicy Honor):
		// a partial table, which "hard" then completes.
		makePod("affinity").ns("default").label("app", "a").nodeAffinity("zone", v1.NodeSelectorOpIn, "z1").
			spread(1, "zone", v1.DoNotSchedule, matchLabels("app", "a"), nil, nil, nil, nil).
			spread(1, "zone", v1.ScheduleAnyway, matchLabels("app", "a"), nil, nil, nil, nil).obj(),
		makePod("hard").ns("default").label("app", "a").
			spread(1, "zone", v1.DoNotSchedule, matchLabels("app", "a"), nil, nil, &honor, nil).
			spread(1, v1.LabelHostname, v1.DoNotSchedule, matchLabels("app", "a"), nil, nil, nil, nil).obj(),
		makePod("soft").ns("default").label("app", "b").
			spread(1, "zone", v1.ScheduleAnyway, matchLabels("app", "b"), nil, nil, nil, nil).
			spread(2, v1.LabelHostname, v1.ScheduleAnyway, matchLabels("app", "b"), nil, nil, nil, nil).obj(),
		makePod("other-ns").ns("other").label("app", "a").
			spread(1, "zone", v1.DoNotSchedule, matchLabels("app", "a"), nil, nil, nil, nil).
			spread(1, v1.LabelHostname, v1.ScheduleAnyway, matchLabels("app", "a"), nil, nil, nil, nil).obj(),
	}
	answers := func(pl *Plugin, snap framework.Snapshot, pod *v1.Pod) ([]string, []int64) {
		ctx := context.Background()
		var filter []string
		check, err := pl.PreFilter(ctx, snap, pod)
		if err != nil {
			t.Fatal(err)
		}
		for _, ni := range snap.List() {
			r := "ok"
			if check != nil {
				if st := check(ni); st != nil {
					r = st.Reason
				}
			}
			filter = append(filter, ni.Node.Name+": "+r)
		}
		scores, err := pl.Score(ctx, snap, pod, snap.List())
		if err != nil {
			t.Fatal(err)
		}
		return filter, scores
	}

	cached := New()
	for step := range 60 {
		next := slices.Clone(list)
		for range 1 + rng.Intn(3) {
			j := rng.Intn(len(next))
			switch op := rng.Intn(6); {
			case op < 3: // a pod bound to or gone from the node
				old := next[j]
				ni := framework.NewNodeInfo(old.Node, old.Pods...)
				if op == 0 && len(old.Pods) > 0 {
					ni = framework.NewNodeInfo(old.Node, old.Pods[1:]...)
				} else {
					ni.AddPod(newPod(old.Node.Name))
				}
				next[j] = ni
			case op == 3: // relabelled: same pods, new Node
				old := next[j]
				n := old.Node.DeepCopy()
				n.Labels["zone"] = zones[rng.Intn(3)]
				next[j] = framework.NewNodeInfo(n, old.Pods...)
			case op == 4 && len(next) > 5: // node gone
				next = slices.Delete(next, j, j+1)
			default: // node added
				next = append(next, newNode(fmt.Sprintf("node-%02d-%d", j, step), rng.Intn(6)))
			}
		}
		sortList(next)
		list = next
		snap := newListSnapshot(list)
		for _, pod := range testPods {
			fresh := New()
			fresh.workers = 1
			wantF, wantS := answers(fresh, snap, pod)
			gotF, gotS := answers(cached, snap, pod)
			if diff := cmp.Diff(wantF, gotF); diff != "" {
				t.Fatalf("step %d, pod %s: filter (-fresh +cached):\n%s", step, pod.Name, diff)
			}
			if diff := cmp.Diff(wantS, gotS); diff != "" {
				t.Fatalf("step %d, pod %s: scores (-fresh +cached):\n%s", step, pod.Name, diff)
			}
		}
	}
	if n := len(cached.counts.tables); n != 3 {
		t.Errorf("%d count tables, want 3 (default/app=a, default/app=b, other/app=a)", n)
	}
}

// TestCountCacheRecountsOnlyChanges checks what the cache saves: the same
// snapshot again counts nothing, a snapshot with one NodeInfo replaced
// counts that node only, and the count follows the new NodeInfo.
func TestCountCacheRecountsOnlyChanges(t *testing.T) {
	var list []*framework.NodeInfo
	for i := range 10 {
		name := fmt.Sprintf("node-%d", i)
		list = append(list, framework.NewNodeInfo(hostNode(name).obj(), framework.NewPodInfo(fooPod("p-"+name, name))))
	}
	pod := makePod("p").label("foo", "").spread(1, v1.LabelHostname, v1.DoNotSchedule, fooSelector, nil, nil, nil, nil).obj()
	pl := New()
	filter := func(snap framework.Snapshot) map[string]bool {
		check, err := pl.PreFilter(context.Background(), snap, pod)
		if err != nil {
			t.Fatal(err)
		}
		pass := map[string]bool{}
		for _, ni := range snap.List() {
			pass[ni.Node.Name] = check(ni) == nil
		}
		return pass
	}
	recounted := func(want int64, what string) {
		t.Helper()
		if got := pl.counts.recounted.Swap(0); got != want {
			t.Errorf("%s: %d nodes counted, want %d", what, got, want)
		}
	}

	a := newListSnapshot(list)
	filter(a)
	recounted(10, "first snapshot")
	filter(a)
	recounted(0, "same snapshot")

	// node-3 gains a matching pod: it alone no longer fits (2+1-1 > 1).
	next := slices.Clone(list)
	next[3] = framework.NewNodeInfo(list[3].Node, append(slices.Clone(list[3].Pods), framework.NewPodInfo(fooPod("p-extra", "node-3")))...)
	pass := filter(newListSnapshot(next))
	recounted(1, "one NodeInfo replaced")
	for name, ok := range pass {
		if ok == (name == "node-3") {
			t.Errorf("%s passes: %v", name, ok)
		}
	}

	// Back to the first snapshot's NodeInfos: node-3's old one is
	// recounted (the cache follows the last snapshot only).
	pass = filter(a)
	recounted(1, "back to the first snapshot")
	if !pass["node-3"] {
		t.Error("node-3 fails on the first snapshot again")
	}

	// Only the nodes a pod's constraints count are counted: a pod with
	// another selector and node affinity to two nodes counts two, the
	// same selector without affinity the other eight.
	pl = New()
	sel := matchLabels("app", "x")
	two := makePod("two").nodeAffinity(v1.LabelHostname, v1.NodeSelectorOpIn, "node-1", "node-2").
		spread(1, v1.LabelHostname, v1.DoNotSchedule, sel, nil, nil, nil, nil).obj()
	all := makePod("all").spread(1, v1.LabelHostname, v1.DoNotSchedule, sel, nil, nil, nil, nil).obj()
	for _, c := range []struct {
		pod  *v1.Pod
		want int64
	}{{two, 2}, {all, 8}, {two, 0}, {all, 0}} {
		if _, err := pl.PreFilter(context.Background(), a, c.pod); err != nil {
			t.Fatal(err)
		}
		recounted(c.want, c.pod.Name)
	}
}

// TestCountCacheBounded checks the cache keeps at most maxTables selectors.
func TestCountCacheBounded(t *testing.T) {
	snap := newListSnapshot([]*framework.NodeInfo{framework.NewNodeInfo(hostNode("node-a").obj(), framework.NewPodInfo(fooPod("p", "node-a")))})
	pl := New()
	for i := range 3 * maxTables {
		pod := makePod("p").label("app", fmt.Sprint(i)).
			spread(1, v1.LabelHostname, v1.DoNotSchedule, matchLabels("app", fmt.Sprint(i)), nil, nil, nil, nil).obj()
		if _, err := pl.PreFilter(context.Background(), snap, pod); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(pl.counts.tables); n != maxTables {
		t.Errorf("%d tables, want %d", n, maxTables)
	}
	// The most recent selector is kept.
	if pl.counts.tables["\x00app="+fmt.Sprint(3*maxTables-1)] == nil {
		t.Error("the last selector's table is gone")
	}
}
