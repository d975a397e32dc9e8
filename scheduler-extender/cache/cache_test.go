package cache

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

func node(name string) *v1.Node { return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}} }

func pod(uid, node string, phase v1.PodPhase, anti bool) *v1.Pod {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Name: uid, Namespace: "ns"}, Spec: v1.PodSpec{NodeName: node}, Status: v1.PodStatus{Phase: phase}}
	if anti {
		p.Spec.Affinity = &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{TopologyKey: "k"}}}}
	}
	return p
}

// pods lists the pod names a snapshot has on a node ("-" for no node).
func pods(s framework.Snapshot, name string) []string {
	ni := s.Get(name)
	if ni == nil {
		return []string{"-"}
	}
	out := []string{}
	for _, p := range ni.Pods {
		out = append(out, p.Pod.Name)
	}
	return out
}

func eq(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if len(want) == 0 {
		want = []string{}
	}
	if len(got) != len(want) {
		t.Errorf("%s: %v, want %v", what, got, want)
		return
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("%s: %v, want %v", what, got, want)
			return
		}
	}
}

func TestCache(t *testing.T) {
	c := New()
	// A pod bound to a node the cache has not seen yet waits for it.
	c.SetPod(pod("early", "n1", v1.PodPending, false))
	if s := c.Snapshot(); s.Get("n1") != nil || len(s.List()) != 0 {
		t.Fatalf("a node known only from its pods is in the snapshot: %v", s.List())
	}
	c.SetNode(node("n1"))
	c.SetNode(node("n2"))
	c.SetPod(pod("a", "n1", v1.PodRunning, true))
	c.SetPod(pod("unbound", "", v1.PodPending, false))
	before := c.Snapshot()
	eq(t, "n1", pods(before, "n1"), "early", "a")
	if got := len(before.Get("n1").PodsWithRequiredAntiAffinity); got != 1 {
		t.Errorf("pods with required anti-affinity on n1: %d", got)
	}
	if c.Snapshot() != before {
		t.Error("a snapshot with no event since is rebuilt")
	}

	// Moving, finishing and deleting pods leaves the old snapshot as it was.
	c.SetPod(pod("a", "n2", v1.PodRunning, true))
	c.SetPod(pod("early", "n1", v1.PodSucceeded, false))
	after := c.Snapshot()
	eq(t, "n1 after", pods(after, "n1"))
	eq(t, "n2 after", pods(after, "n2"), "a")
	eq(t, "n1 before", pods(before, "n1"), "early", "a")
	eq(t, "n2 before", pods(before, "n2"))
	if got := len(after.Get("n1").PodsWithRequiredAntiAffinity); got != 0 {
		t.Errorf("n1 still lists a moved pod with anti-affinity: %d", got)
	}

	c.DeletePod("a")
	c.DeleteNode("n1")
	s := c.Snapshot()
	eq(t, "n2 after delete", pods(s, "n2"))
	eq(t, "n1 deleted", pods(s, "n1"), "-")
	if len(s.List()) != 1 || s.List()[0].Node.Name != "n2" {
		t.Errorf("list after deleting n1: %v", s.List())
	}
	if n, ok := c.Node("n2"); !ok || n.Name != "n2" {
		t.Error("the node cache lost n2")
	}
	if _, ok := c.Node("n1"); ok {
		t.Error("the node cache still has n1")
	}
	// Adding and deleting nodes leaves the old snapshot as it was too.
	c.SetNode(node("n3"))
	c.DeleteNode("n2")
	if s.Get("n3") != nil || s.Get("n2") == nil {
		t.Errorf("adding n3 and deleting n2 changed a snapshot: n3 %v, n2 %v", s.Get("n3"), s.Get("n2"))
	}
	if now := c.Snapshot(); now.Get("n3") == nil || now.Get("n2") != nil {
		t.Errorf("a snapshot after adding n3 and deleting n2: n3 %v, n2 %v", now.Get("n3"), now.Get("n2"))
	}
	c.SetNode(node("n2"))
	c.SetNamespace(&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns", Labels: map[string]string{"a": "b"}}})
	if ns := c.Snapshot().Namespace("ns"); ns == nil || ns.Labels["a"] != "b" {
		t.Error("namespace not in the snapshot")
	}
	c.DeleteNamespace("ns")
	if c.Snapshot().Namespace("ns") != nil {
		t.Error("deleted namespace still in the snapshot")
	}
}

// TestNodes: names resolve in order; unknown nodes, and nodes known only
// by their pods, are missing.
func TestNodes(t *testing.T) {
	c := New()
	c.SetNode(node("a"))
	c.SetNode(node("b"))
	c.SetPod(pod("p", "ghost", v1.PodRunning, false))
	var missing []string
	got := []string{}
	for _, n := range c.Nodes([]string{"b", "x", "a", "ghost"}, nil, func(name string) { missing = append(missing, name) }) {
		got = append(got, n.Name)
	}
	eq(t, "resolved", got, "b", "a")
	eq(t, "missing", missing, "x", "ghost")
}
