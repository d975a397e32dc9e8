package cache

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

func TestAssumePod(t *testing.T) {
	c := New()
	c.SetNode(node("n1"))
	c.SetNode(node("n2"))
	p := pod("p", "", v1.PodPending, true)
	c.Placing(p, true)
	if ok, err := c.AssumePod("ns", "p", p.UID, "n1"); !ok || err != nil {
		t.Fatalf("assuming the pod just filtered: %v, %v", ok, err)
	}
	eq(t, "n1 once assumed", pods(c.Snapshot(), "n1"), "p")
	if got := len(c.Snapshot().Get("n1").PodsWithRequiredAntiAffinity); got != 1 {
		t.Errorf("the assumed pod's anti-affinity does not count on n1: %d", got)
	}
	// The watch, behind the binding, still shows it unbound: it stays.
	c.SetPod(p)
	eq(t, "n1 with the watch behind", pods(c.Snapshot(), "n1"), "p")
	// The watch shows it bound elsewhere: the watch wins.
	c.SetPod(pod("p", "n2", v1.PodPending, true))
	s := c.Snapshot()
	eq(t, "n1 once the watch shows it on n2", pods(s, "n1"))
	eq(t, "n2 once the watch shows it", pods(s, "n2"), "p")
	if c.Assumed() != 0 {
		t.Errorf("%d pods still assumed once the watch shows them", c.Assumed())
	}
	// A pod the watch shows bound is not assumed elsewhere.
	if _, err := c.AssumePod("ns", "p", p.UID, "n1"); err == nil {
		t.Error("assuming a pod bound to n2 onto n1 succeeded")
	}
	if ok, err := c.AssumePod("ns", "p", p.UID, "n2"); ok || err != nil {
		t.Errorf("assuming a bound pod where it is bound: %v, %v; want nothing to do", ok, err)
	}
}

func TestForgetAndExpire(t *testing.T) {
	c := New()
	c.SetNode(node("n1"))
	a, b := pod("a", "", v1.PodPending, false), pod("b", "", v1.PodPending, false)
	c.Placing(a, true)
	c.Placing(b, true)
	c.AssumePod("ns", "a", a.UID, "n1")
	c.AssumePod("ns", "b", b.UID, "n1")
	eq(t, "n1", pods(c.Snapshot(), "n1"), "a", "b")
	// a's binding failed; b's was made but the watch never shows it.
	c.ForgetPod(a.UID, "n1")
	c.FinishBinding(b.UID)
	eq(t, "n1 after forgetting a", pods(c.Snapshot(), "n1"), "b")
	c.mu.Lock()
	c.expire(time.Now().Add(AssumedTTL - time.Second))
	c.mu.Unlock()
	eq(t, "n1 before b expires", pods(c.Snapshot(), "n1"), "b")
	c.mu.Lock()
	c.expire(time.Now().Add(AssumedTTL + time.Second))
	c.mu.Unlock()
	eq(t, "n1 after b expired", pods(c.Snapshot(), "n1"))
	if c.Assumed() != 0 {
		t.Errorf("%d pods still assumed", c.Assumed())
	}
	// Forgetting a pod the watch shows bound does nothing.
	c.SetPod(pod("w", "n1", v1.PodRunning, false))
	c.ForgetPod("w", "n1")
	eq(t, "n1 after forgetting a watched pod", pods(c.Snapshot(), "n1"), "w")
	// Deleting an assumed pod forgets it.
	c.Placing(a, true)
	c.AssumePod("ns", "a", a.UID, "n1")
	c.DeletePod(a.UID)
	eq(t, "n1 after deleting assumed a", pods(c.Snapshot(), "n1"), "w")
}

func TestAssumeUnknownOrRecreatedPod(t *testing.T) {
	c := New()
	c.SetNode(node("n1"))
	// Filtered as UID old; deleted and created again (new UID) before
	// kube-scheduler binds the old one.
	c.Placing(pod("old", "", v1.PodPending, false), true)
	if ok, err := c.AssumePod("ns", "p", "new", "n1"); ok || err != nil {
		t.Errorf("assuming a pod the cache does not know: %v, %v; want nothing to do", ok, err)
	}
	eq(t, "n1", pods(c.Snapshot(), "n1"))
}

// await waits in the background for the placements in flight but p's now.
func await(c *Cache, p *v1.Pod, max time.Duration) chan AwaitResult {
	w := c.InFlight(p)
	out := make(chan AwaitResult, 1)
	go func() {
		res, _ := w.Wait(context.Background(), max)
		out <- res
	}()
	return out
}

func TestAwaitPlacements(t *testing.T) {
	c := New()
	c.SetNode(node("n1"))
	first, next := pod("first", "", v1.PodPending, false), pod("next", "", v1.PodPending, false)
	for _, tc := range []struct {
		name string
		// settle makes first's placement known (nil: never).
		settle func()
	}{
		{"bind", func() { c.AssumePod("ns", "first", first.UID, "n1") }},
		{"watch shows it bound", func() { c.SetPod(pod("first", "n1", v1.PodPending, false)) }},
		{"deleted", func() { c.DeletePod(first.UID) }},
		{"filtered again, nothing passed", func() { c.Placing(first, false) }},
		{"filtered again", func() { c.Placing(first, true) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c.DeletePod(first.UID)
			c.Placing(first, true)
			// The pod's own placement is not waited for.
			if res, _ := c.AwaitPlacements(context.Background(), first, time.Minute); res.Waited != 0 {
				t.Errorf("a pod waits for itself: %+v", res)
			}
			done := await(c, next, time.Minute)
			tc.settle()
			res := <-done
			if res.Waited != 1 || len(res.Overdue) != 0 {
				t.Errorf("waited %+v; want 1 placement, known", res)
			}
			if tc.name == "filtered again" {
				return // in flight again
			}
			if res, _ := c.AwaitPlacements(context.Background(), next, time.Minute); res.Waited != 0 {
				t.Errorf("a known placement is waited for again: %+v", res)
			}
		})
	}
	// A placement never made is waited for at most max after its filter,
	// then no more.
	c.DeletePod(first.UID)
	c.DeletePod(next.UID)
	c.Placing(first, true)
	res := <-await(c, next, 10*time.Millisecond)
	if res.Waited != 1 || len(res.Overdue) != 1 || res.Overdue[0] != "ns/first" {
		t.Errorf("waited %+v; want ns/first overdue", res)
	}
	if res, _ := c.AwaitPlacements(context.Background(), next, time.Minute); res.Waited != 0 {
		t.Errorf("an overdue placement is waited for again: %+v", res)
	}
	// Pods without a UID are no pods of the API server: never waited for.
	c.Placing(pod("", "", v1.PodPending, false), true)
	if res, _ := c.AwaitPlacements(context.Background(), next, time.Minute); res.Waited != 0 {
		t.Errorf("a pod without a UID is waited for: %+v", res)
	}
	// A request that ends stops waiting.
	c.Placing(first, true)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.AwaitPlacements(ctx, next, time.Minute); err == nil {
		t.Error("waiting past the request's end")
	}
}
