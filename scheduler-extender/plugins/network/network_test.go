package network

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

func pool(name, cidr string, blockSize int, selector map[string]string) *tabbyv1.IPPool {
	p := &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: tabbyv1.IPPoolSpec{CIDR: cidr, BlockSize: blockSize}}
	if selector != nil {
		p.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: selector}
	}
	return p
}

func block(cidr, node string, free int) Block {
	return Block{CIDR: netip.MustParsePrefix(cidr), Node: node, Free: free}
}

func nodes() []*framework.NodeInfo {
	mk := func(name string, l map[string]string) *framework.NodeInfo {
		return framework.NewNodeInfo(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}})
	}
	return []*framework.NodeInfo{mk("a", map[string]string{"rack": "1"}), mk("b", map[string]string{"rack": "2"}), mk("c", nil)}
}

func podAnn(ann map[string]string) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p", Annotations: ann}}
}

// outcome runs filter and score over nodes a, b, c and renders each as its
// score or "X:" and the start of its reason.
func outcome(t *testing.T, pl *Plugin, snap framework.Snapshot, pod *v1.Pod) []string {
	t.Helper()
	ns := nodes()
	check, err := pl.PreFilter(context.Background(), snap, pod)
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	scores, err := pl.Score(context.Background(), snap, pod, ns)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for i, n := range ns {
		if check == nil {
			out = append(out, "pass")
			continue
		}
		if st := check(n); st != nil {
			code := "X"
			if st.Code == framework.Unschedulable {
				code = "x"
			}
			out = append(out, code+": "+st.Reason)
			continue
		}
		out = append(out, map[int64]string{ScoreOwnBlock: "addr", ScoreBorrow: "borrow"}[scores[i]])
	}
	return out
}

func TestPlace(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	defaults := tabbyv1.IPAMConfigurationSpec{MaxBlocksPerHost: tabbyv1.DefaultMaxBlocksPerHost}
	// 10.0.0.0/24 in /26 blocks: four blocks.
	full := []Block{block("10.0.0.0/26", "a", 0), block("10.0.0.64/26", "b", 3), block("10.0.0.128/26", "b", 0), block("10.0.0.192/26", "c", 0)}
	for _, tc := range []struct {
		name string
		in   Inputs
		pod  *v1.Pod
		want []string // a, b, c
	}{
		{"no borrowing needed: own blocks or a claim",
			Inputs{Pools: []*tabbyv1.IPPool{pool("default", "10.0.0.0/16", 26, nil)}, Blocks: []Block{block("10.0.0.0/26", "a", 5), block("10.0.0.64/26", "b", 0)}, Config: defaults},
			podAnn(nil), []string{"addr", "addr", "addr"}},
		{"a pool whose nodeSelector excludes the node",
			Inputs{Pools: []*tabbyv1.IPPool{pool("rack1", "10.0.0.0/16", 26, map[string]string{"rack": "1"})}, Config: defaults},
			podAnn(nil), []string{"addr", `X: node(s) had no tabby IPv4 pool the pod may use (pool rack1: its nodeSelector "rack=1" does not match)`, `X: node(s) had no tabby IPv4 pool the pod may use (pool rack1: its nodeSelector "rack=1" does not match)`}},
		{"the pod's requested pool decides, not the others",
			Inputs{Pools: []*tabbyv1.IPPool{pool("default", "10.0.0.0/16", 26, nil), pool("rack2", "10.1.0.0/16", 26, map[string]string{"rack": "2"})}, Config: defaults},
			podAnn(map[string]string{tabbyv1.AnnotationIPv4Pools: `["rack2"]`}), []string{"X: node(s) had no tabby IPv4 pool", "addr", "X: node(s) had no tabby IPv4 pool"}},
		{"a pool that does not exist fails every node with a clear error",
			Inputs{Pools: []*tabbyv1.IPPool{pool("default", "10.0.0.0/16", 26, nil)}, Config: defaults},
			podAnn(map[string]string{tabbyv1.AnnotationIPv4Pools: `["nope"]`}), []string{`X: tabby: the pod asks for IPv4 pool "nope", which does not exist`, `X: tabby: the pod asks for IPv4 pool "nope", which does not exist`, `X: tabby: the pod asks for IPv4 pool "nope", which does not exist`}},
		{"a broken annotation is an error",
			Inputs{Pools: []*tabbyv1.IPPool{pool("default", "10.0.0.0/16", 26, nil)}, Config: defaults},
			podAnn(map[string]string{tabbyv1.AnnotationIPv4Pools: `rack2`}), []string{"X: tabby: pod default/p: annotation tabby.io/ipv4pools must be a JSON list", "X: tabby: pod default/p: annotation tabby.io/ipv4pools must be a JSON list", "X: tabby: pod default/p: annotation tabby.io/ipv4pools must be a JSON list"}},
		{"all blocks claimed: own free, else borrow",
			Inputs{Pools: []*tabbyv1.IPPool{pool("small", "10.0.0.0/24", 26, nil)}, Blocks: full, Config: defaults},
			podAnn(nil), []string{"borrow", "addr", "borrow"}},
		{"all blocks claimed and strict affinity: no address",
			Inputs{Pools: []*tabbyv1.IPPool{pool("small", "10.0.0.0/24", 26, nil)}, Blocks: full, Config: tabbyv1.IPAMConfigurationSpec{StrictAffinity: true, MaxBlocksPerHost: 20}},
			podAnn(nil), []string{"x: node(s) had no free tabby IPv4 address for the pod: their blocks in pool(s) small are full, the pools have no unclaimed block left, and borrowing is off (IPAMConfiguration strictAffinity)", "addr", "x: node(s) had no free tabby IPv4 address"}},
		{"the block limit stops claiming",
			Inputs{Pools: []*tabbyv1.IPPool{pool("default", "10.0.0.0/16", 26, nil)}, Blocks: []Block{block("10.0.0.0/26", "a", 0)}, Config: tabbyv1.IPAMConfigurationSpec{StrictAffinity: true, MaxBlocksPerHost: 1}},
			podAnn(nil), []string{"x: node(s) had no free tabby IPv4 address for the pod: their blocks in pool(s) default are full, they hold the most blocks a node may (IPAMConfiguration maxBlocksPerHost=1), and borrowing is off", "addr", "addr"}},
		{"every block full anywhere, borrowing allowed: nothing to borrow",
			Inputs{Pools: []*tabbyv1.IPPool{pool("small", "10.0.0.0/25", 26, nil)}, Blocks: []Block{block("10.0.0.0/26", "a", 0), block("10.0.0.64/26", "b", 0)}, Config: defaults},
			podAnn(nil), []string{"x: node(s) had no free tabby IPv4 address for the pod: their blocks in pool(s) small are full, the pools have no unclaimed block left, and no other node's block has a free address to borrow", "x: node(s)", "x: node(s)"}},
		{"disabled pools are not used",
			Inputs{Pools: []*tabbyv1.IPPool{func() *tabbyv1.IPPool { p := pool("off", "10.0.0.0/16", 26, nil); p.Spec.Disabled = true; return p }()}, Config: defaults},
			podAnn(nil), []string{"X: tabby: there is no enabled IPv4 IPPool: create one", "X: tabby: there is no enabled IPv4 IPPool: create one", "X: tabby: there is no enabled IPv4 IPPool: create one"}},
		{"exact addresses: only the pool holding them must admit the node",
			Inputs{Pools: []*tabbyv1.IPPool{pool("rack1", "10.0.0.0/16", 26, map[string]string{"rack": "1"})}, Blocks: []Block{block("10.0.0.0/26", "b", 0)}, Config: defaults},
			podAnn(map[string]string{tabbyv1.AnnotationIPAddrs: `["10.0.0.7"]`}), []string{"addr", "X: node(s) had no tabby IPv4 pool", "X: node(s) had no tabby IPv4 pool"}},
		{"tabbyd heartbeats: missing and lapsed",
			Inputs{Pools: []*tabbyv1.IPPool{pool("default", "10.0.0.0/16", 26, nil)}, Config: defaults,
				Heartbeats: map[string]time.Time{"a": now.Add(time.Second), "b": now.Add(-90 * time.Second)}, Now: now},
			podAnn(nil), []string{"addr", "X: node(s) had tabbyd not ready (its heartbeat Lease lapsed)", "X: node(s) had no tabbyd running (no heartbeat Lease)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in
			pl := &Plugin{Inputs: func() *Inputs { return &in }}
			got := outcome(t, pl, framework.NewSnapshot(nil, nil, nil), tc.pod)
			if len(got) != len(tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tc.want[i]) {
					t.Errorf("node %d: got %q, want it to start with %q", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestNamespaceAnnotation(t *testing.T) {
	in := Inputs{Pools: []*tabbyv1.IPPool{pool("default", "10.0.0.0/16", 26, nil), pool("rack2", "10.1.0.0/16", 26, map[string]string{"rack": "2"})},
		Config: tabbyv1.IPAMConfigurationSpec{MaxBlocksPerHost: 20}}
	ns := &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default", Annotations: map[string]string{tabbyv1.AnnotationIPv4Pools: `["rack2"]`}}}
	snap := framework.NewSnapshot(nil, nil, []*v1.Namespace{ns})
	got := outcome(t, &Plugin{Inputs: func() *Inputs { return &in }}, snap, podAnn(nil))
	if got[1] != "addr" || !strings.HasPrefix(got[0], "X: ") || !strings.HasPrefix(got[2], "X: ") {
		t.Errorf("the namespace's pool annotation was not honoured: %q", got)
	}
}

func TestBlockOf(t *testing.T) {
	b := &tabbyv1.IPAMBlock{Spec: tabbyv1.IPAMBlockSpec{CIDR: "10.0.0.64/26", Affinity: "host:n1", Unallocated: []int{1, 2}}}
	got, ok := BlockOf(b)
	if want := block("10.0.0.64/26", "n1", 2); !ok || got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	b.Spec.Deleted, b.Spec.Affinity = true, ""
	if got, _ := BlockOf(b); got.Free != 0 || got.Node != "" {
		t.Errorf("a deleted block without affinity: %+v", got)
	}
}

// TestPodsWithoutAddressRequest: a hostNetwork pod (tabbyd's own, for one)
// needs neither an address nor a tabbyd; a pod whose request cannot be met
// anywhere still learns which nodes lack a tabbyd.
func TestPodsWithoutAddressRequest(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	in := Inputs{Config: tabbyv1.IPAMConfigurationSpec{MaxBlocksPerHost: 20}, Heartbeats: map[string]time.Time{"a": now.Add(time.Minute)}, Now: now}
	pl := &Plugin{Inputs: func() *Inputs { return &in }}
	host := podAnn(nil)
	host.Spec.HostNetwork = true
	if got := outcome(t, pl, framework.NewSnapshot(nil, nil, nil), host); got[0] != "pass" || got[1] != "pass" || got[2] != "pass" {
		t.Errorf("a hostNetwork pod: %q, want every node to pass", got)
	}
	got := outcome(t, pl, framework.NewSnapshot(nil, nil, nil), podAnn(nil))
	want := []string{"X: tabby: there is no enabled IPv4 IPPool", "X: " + ReasonNoTabbyd, "X: " + ReasonNoTabbyd}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("no pool at all, node %d: %q, want %q", i, got[i], want[i])
		}
	}
}

// TestWatcherVersions: what the plugin works out from pools and blocks is
// reused while the Watcher's state is the same, and redone when a block
// changes.
func TestWatcherVersions(t *testing.T) {
	w := NewWatcher()
	w.SetPool(pool("default", "10.0.0.0/24", 26, nil))
	w.SetBlock(&tabbyv1.IPAMBlock{ObjectMeta: metav1.ObjectMeta{Name: "b1"}, Spec: tabbyv1.IPAMBlockSpec{CIDR: "10.0.0.0/26", Affinity: "host:a", Unallocated: nil}})
	pl := &Plugin{Inputs: w.Inputs}
	snap := framework.NewSnapshot(nil, nil, nil)
	if got := outcome(t, pl, snap, podAnn(nil)); got[0] != "addr" {
		t.Fatalf("a's block is full: %q", got)
	}
	if v1, v2 := w.Inputs().Version, w.Inputs().Version; v1 != v2 {
		t.Errorf("the same state got versions %v and %v", v1, v2)
	}
	w.SetBlock(&tabbyv1.IPAMBlock{ObjectMeta: metav1.ObjectMeta{Name: "b1"}, Spec: tabbyv1.IPAMBlockSpec{CIDR: "10.0.0.0/26", Affinity: "host:a", Unallocated: []int{3}}})
	if got := outcome(t, pl, snap, podAnn(nil)); got[0] != "addr" {
		t.Errorf("a's block has a free address now: %q", got)
	}
}

// TestScoreReusesFilter: prioritize right after filter reuses what filter
// worked out for the same pod and network state (here: although the
// heartbeats lapsed since, which the filter checks and a fresh score would
// see), and works it out again when the pod (resourceVersion) or the
// network state (Version) changed.
func TestScoreReusesFilter(t *testing.T) {
	defaults := tabbyv1.IPAMConfigurationSpec{MaxBlocksPerHost: tabbyv1.DefaultMaxBlocksPerHost}
	// 10.0.0.0/24 in /26 blocks, all claimed: b has a free address, a and
	// c would borrow.
	full := []Block{block("10.0.0.0/26", "a", 0), block("10.0.0.64/26", "b", 3), block("10.0.0.128/26", "b", 0), block("10.0.0.192/26", "c", 0)}
	lapse := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	beats := map[string]time.Time{"a": lapse, "b": lapse, "c": lapse}
	inputs := func(version int, now time.Time) *Inputs {
		return &Inputs{Pools: []*tabbyv1.IPPool{pool("small", "10.0.0.0/24", 26, nil)}, Blocks: full, Config: defaults,
			Heartbeats: beats, Now: now, Version: version}
	}
	in := inputs(1, lapse.Add(-time.Second))
	pl := &Plugin{Inputs: func() *Inputs { return in }}
	ns := nodes()
	pod := podAnn(nil)
	pod.UID, pod.ResourceVersion = "uid-p", "7"
	check, err := pl.PreFilter(context.Background(), nil, pod)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if st := check(n); st != nil {
			t.Fatalf("%s: %s", n.Node.Name, st.Reason)
		}
	}
	score := func(pod *v1.Pod) []int64 {
		t.Helper()
		s, err := pl.Score(context.Background(), nil, pod, ns)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	in = inputs(1, lapse.Add(time.Second))
	if got, want := score(pod), []int64{ScoreBorrow, ScoreOwnBlock, ScoreBorrow}; !slices.Equal(got, want) {
		t.Errorf("same pod and Version: scores %v, want filter's %v", got, want)
	}
	lapsed := []int64{0, 0, 0}
	changed := pod.DeepCopy()
	changed.ResourceVersion = "8"
	if got := score(changed); !slices.Equal(got, lapsed) {
		t.Errorf("pod changed: scores %v, want worked out again %v", got, lapsed)
	}
	in = inputs(2, lapse.Add(time.Second))
	if got := score(pod); !slices.Equal(got, lapsed) {
		t.Errorf("network changed: scores %v, want worked out again %v", got, lapsed)
	}
}
