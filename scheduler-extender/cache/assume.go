package cache

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// kube-scheduler schedules one pod at a time, but binds each in a goroutine
// once its scheduling cycle has assumed the pod in kube-scheduler's own
// cache, which the extender cannot see; the next pod's filter request can
// reach the extender before the previous pod's bind request, and long
// before the watch shows the binding. So the cache tracks two things:
//
//   - placements in flight: a pod the extender passed nodes for may be
//     placed on one of them. A later request for another pod first waits
//     (AwaitPlacements) until each such placement is known: the pod was
//     assumed by a bind request, the watch shows it bound or gone, or it
//     was filtered again (its cycle ended without a placement).
//   - assumed pods: the extender binds (kube-scheduler's bindVerb) and
//     records the pod on its node before the Binding is created, as
//     kube-scheduler's cache assumes. The watch's view of the pod, once it
//     shows it bound or gone, replaces the assumption; a failed binding
//     forgets it; one the watch does not confirm within AssumedTTL of a
//     successful binding expires.

// AssumedTTL is how long an assumed pod whose binding succeeded counts
// without the watch showing it bound (the watch normally does within
// milliseconds; past this it has lost events and will relist).
const AssumedTTL = 30 * time.Second

// inflight is a pod the extender passed nodes for and whose placement is
// not known yet.
type inflight struct {
	pod   *v1.Pod
	since time.Time
	done  chan struct{} // closed once the placement is known
}

// Placing records that kube-scheduler may now place pod on one of the nodes
// the extender passed (passing false: none passed, so it will not). A pod
// filtered again ends its earlier placement in flight: kube-scheduler
// filters a pod again only once its earlier cycle ended.
func (c *Cache) Placing(pod *v1.Pod, passing bool) {
	if pod.UID == "" {
		return // not a pod of the API server: nothing will bind it
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.settle(pod.UID)
	if passing {
		c.inflight[pod.UID] = &inflight{pod: pod, since: time.Now(), done: make(chan struct{})}
	}
}

// settle ends pod uid's placement in flight; c.mu is held.
func (c *Cache) settle(uid types.UID) {
	if f := c.inflight[uid]; f != nil {
		close(f.done)
		delete(c.inflight, uid)
	}
}

// AwaitResult is what AwaitPlacements waited for.
type AwaitResult struct {
	// Waited is the placements in flight it waited for (Overdue among
	// them).
	Waited int
	// Overdue names the pods whose placement was still unknown max after
	// the extender passed nodes for them; they are no longer waited for.
	Overdue []string
}

// AwaitPlacements waits until every placement in flight but pod's own is
// known, each at most max after the extender passed nodes for it, or until
// ctx ends.
func (c *Cache) AwaitPlacements(ctx context.Context, pod *v1.Pod, max time.Duration) (AwaitResult, error) {
	return c.InFlight(pod).Wait(ctx, max)
}

// InFlight is a set of placements in flight.
type InFlight struct {
	c    *Cache
	list []*inflight
}

// InFlight is the placements in flight now but pod's own.
func (c *Cache) InFlight(pod *v1.Pod) InFlight {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := InFlight{c: c}
	for uid, f := range c.inflight {
		if uid != pod.UID {
			w.list = append(w.list, f)
		}
	}
	return w
}

// Wait waits until each placement is known, at most max after the
// extender passed nodes for it, or until ctx ends.
func (w InFlight) Wait(ctx context.Context, max time.Duration) (AwaitResult, error) {
	var res AwaitResult
	for _, f := range w.list {
		res.Waited++
		t := time.NewTimer(time.Until(f.since.Add(max)))
		select {
		case <-f.done:
		case <-t.C:
			w.c.mu.Lock()
			if w.c.inflight[f.pod.UID] == f {
				w.c.settle(f.pod.UID)
			}
			w.c.mu.Unlock()
			res.Overdue = append(res.Overdue, f.pod.Namespace+"/"+f.pod.Name)
		case <-ctx.Done():
			t.Stop()
			return res, context.Cause(ctx)
		}
		t.Stop()
	}
	return res, nil
}

// AssumePod records that the pod namespace/name with uid is being bound to
// node, before the Binding is made. It is false when the cache knows no such
// pod (the binding may go ahead; the watch will show it). It fails when the
// watch already shows the pod bound to another node.
func (c *Cache) AssumePod(namespace, name string, uid types.UID, node string) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var filtered *v1.Pod
	if f := c.inflight[uid]; f != nil {
		filtered = f.pod
	}
	c.settle(uid)
	if cur, ok := c.pods[uid]; ok {
		if cur.node == node {
			return false, nil // bound already, or assumed by an earlier bind
		}
		if !cur.assumed {
			return false, fmt.Errorf("pod %s/%s is bound to node %s already", namespace, name, cur.node)
		}
		c.remove(cur.node, uid)
		delete(c.pods, uid)
	}
	p := filtered
	if p == nil {
		p = c.watched(namespace, name, uid)
	}
	if p == nil {
		return false, nil
	}
	p = p.DeepCopy()
	p.Spec.NodeName = node
	c.place(p, node, framework.NewPodInfo(p), true)
	c.assumed[uid] = time.Time{}
	return true, nil
}

// watched is the pod namespace/name as the watch shows it, if it has uid
// (nil when the watch does not know it, or knows only a pod of that name
// with another UID: deleted and created again).
func (c *Cache) watched(namespace, name string, uid types.UID) *v1.Pod {
	if c.podLister == nil {
		return nil
	}
	p, err := c.podLister.Pods(namespace).Get(name)
	if err != nil || p.UID != uid {
		return nil
	}
	return p
}

// FinishBinding starts the expiry of pod uid's assumption: its Binding was
// made, so the watch will show it.
func (c *Cache) FinishBinding(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.assumed[uid]; ok {
		c.assumed[uid] = time.Now().Add(AssumedTTL)
	}
}

// ForgetPod drops pod uid's assumption on node: its binding failed.
func (c *Cache) ForgetPod(uid types.UID, node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.pods[uid]; ok && cur.assumed && cur.node == node {
		c.remove(node, uid)
		delete(c.pods, uid)
		delete(c.assumed, uid)
		c.snap = nil
	}
}

// expire drops the assumptions past their expiry; c.mu is held.
func (c *Cache) expire(now time.Time) {
	for uid, exp := range c.assumed {
		if exp.IsZero() || now.Before(exp) {
			continue
		}
		if cur, ok := c.pods[uid]; ok && cur.assumed {
			c.remove(cur.node, uid)
			delete(c.pods, uid)
			c.snap = nil
		}
		delete(c.assumed, uid)
	}
}

// Assumed counts the pods assumed and not yet shown bound by the watch.
func (c *Cache) Assumed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.assumed)
}
