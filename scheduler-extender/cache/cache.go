// Package cache is tabby-scheduler-extender's view of the cluster: Nodes,
// the Pods bound to them and Namespaces from client-go informers, kept as
// framework.NodeInfos that each request reads as a consistent Snapshot. A
// pod counts on its node from when the extender is asked to bind it there
// (assumed, see assume.go), or else as soon as the watch shows it bound.
package cache

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// Cache keeps NodeInfos up to date from informer events. Each NodeInfo is
// copy-on-write: an event replaces the NodeInfo of the node it touches, so
// a Snapshot handed out stays as it was.
type Cache struct {
	mu         sync.Mutex
	nodes      map[string]*framework.NodeInfo // by node name; Node nil while only pods name it
	pods       map[types.UID]placed
	namespaces map[string]*v1.Namespace
	snap       *framework.MapSnapshot // nil when an event came after it was made
	// shared: nodes is also the map of a snapshot handed out, so it is
	// cloned before it changes (see ownNodes), on the event's path, not
	// on the path of the request that asks for the next snapshot.
	shared bool
	// labels indexes the pods of nodes by label, as they change.
	labels framework.LabelIndex
	// order is the names of nodes, sorted (nil once one was added or
	// removed): a snapshot lists the nodes in it without sorting them
	// again on every pod event.
	order []string

	// inflight holds the placements kube-scheduler may be making, assumed
	// the pods the extender is binding or bound and the watch has not shown
	// bound yet, with when their assumption expires (zero: binding); see
	// assume.go.
	inflight map[types.UID]*inflight
	assumed  map[types.UID]time.Time
	// podLister reads the watch's pods (nil before Start).
	podLister corelisters.PodLister

	// workloads answers for the Services, ReplicationControllers,
	// ReplicaSets and StatefulSets pods belong to (nil before Start).
	workloads *workloads
}

// workloads reads the informers of the objects kube-scheduler derives a
// pod's default topology spread selector from.
type workloads struct {
	services     corelisters.ServiceLister
	controllers  corelisters.ReplicationControllerLister
	replicaSets  appslisters.ReplicaSetLister
	statefulSets appslisters.StatefulSetLister
}

// snapshot is a MapSnapshot that also knows workloads.
type snapshot struct {
	*framework.MapSnapshot
	w *workloads
}

var _ framework.WorkloadLister = snapshot{}

// Services implements framework.WorkloadLister.
func (s snapshot) Services(namespace string) []*v1.Service {
	l, _ := s.w.services.Services(namespace).List(labels.Everything())
	return l
}

// ReplicationController implements framework.WorkloadLister.
func (s snapshot) ReplicationController(namespace, name string) *v1.ReplicationController {
	o, _ := s.w.controllers.ReplicationControllers(namespace).Get(name)
	return o
}

// ReplicaSet implements framework.WorkloadLister.
func (s snapshot) ReplicaSet(namespace, name string) *appsv1.ReplicaSet {
	o, _ := s.w.replicaSets.ReplicaSets(namespace).Get(name)
	return o
}

// StatefulSet implements framework.WorkloadLister.
func (s snapshot) StatefulSet(namespace, name string) *appsv1.StatefulSet {
	o, _ := s.w.statefulSets.StatefulSets(namespace).Get(name)
	return o
}

// placed is where a pod counts.
type placed struct {
	node string
	info *framework.PodInfo
	// assumed: the extender is binding it or bound it there, and the
	// watch has not shown it bound yet.
	assumed bool
}

// New makes an empty Cache; Start fills it from the API server.
func New() *Cache {
	return &Cache{nodes: map[string]*framework.NodeInfo{}, pods: map[types.UID]placed{}, namespaces: map[string]*v1.Namespace{},
		inflight: map[types.UID]*inflight{}, assumed: map[types.UID]time.Time{}}
}

// Start runs informers for Nodes, Pods and Namespaces (and the Services,
// ReplicationControllers, ReplicaSets and StatefulSets of default topology
// spreading) through client and returns once they have synced (or with
// ctx's error). They run until ctx ends.
func (c *Cache) Start(ctx context.Context, client kubernetes.Interface) error {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(stripManagedFields))
	w := &workloads{
		services:     f.Core().V1().Services().Lister(),
		controllers:  f.Core().V1().ReplicationControllers().Lister(),
		replicaSets:  f.Apps().V1().ReplicaSets().Lister(),
		statefulSets: f.Apps().V1().StatefulSets().Lister(),
	}
	handlers := []struct {
		inf toolscache.SharedIndexInformer
		h   toolscache.ResourceEventHandlerFuncs
	}{
		{f.Core().V1().Nodes().Informer(), toolscache.ResourceEventHandlerFuncs{
			AddFunc: func(o any) { c.SetNode(o.(*v1.Node)) }, UpdateFunc: func(_, o any) { c.SetNode(o.(*v1.Node)) },
			DeleteFunc: func(o any) {
				if n, ok := unwrap[*v1.Node](o); ok {
					c.DeleteNode(n.Name)
				}
			}}},
		{f.Core().V1().Pods().Informer(), toolscache.ResourceEventHandlerFuncs{
			AddFunc: func(o any) { c.SetPod(o.(*v1.Pod)) }, UpdateFunc: func(_, o any) { c.SetPod(o.(*v1.Pod)) },
			DeleteFunc: func(o any) {
				if p, ok := unwrap[*v1.Pod](o); ok {
					c.DeletePod(p.UID)
				}
			}}},
		{f.Core().V1().Namespaces().Informer(), toolscache.ResourceEventHandlerFuncs{
			AddFunc: func(o any) { c.SetNamespace(o.(*v1.Namespace)) }, UpdateFunc: func(_, o any) { c.SetNamespace(o.(*v1.Namespace)) },
			DeleteFunc: func(o any) {
				if ns, ok := unwrap[*v1.Namespace](o); ok {
					c.DeleteNamespace(ns.Name)
				}
			}}},
	}
	for _, x := range handlers {
		if _, err := x.inf.AddEventHandler(x.h); err != nil {
			return err
		}
	}
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("the %v informer did not sync: %w", typ, context.Cause(ctx))
		}
	}
	c.mu.Lock()
	c.workloads = w
	c.podLister = f.Core().V1().Pods().Lister()
	c.mu.Unlock()
	return nil
}

// unwrap takes the object out of a delete event, tombstone or not.
func unwrap[T any](o any) (T, bool) {
	if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	t, ok := o.(T)
	return t, ok
}

// stripManagedFields drops what no decision reads, to keep 50,000 pods small.
func stripManagedFields(o any) (any, error) {
	if m, ok := o.(interface {
		SetManagedFields([]metav1.ManagedFieldsEntry)
	}); ok {
		m.SetManagedFields(nil)
	}
	return o, nil
}

// Snapshot is the cluster as it is now; it does not change afterwards
// (what it says of workloads is read when asked).
func (c *Cache) Snapshot() framework.Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expire(time.Now())
	if c.snap == nil {
		namespaces := make(map[string]*v1.Namespace, len(c.namespaces))
		for k, v := range c.namespaces {
			namespaces[k] = v
		}
		if c.order == nil {
			c.order = slices.Sorted(maps.Keys(c.nodes))
		}
		c.snap = framework.SnapshotOf(c.nodes, namespaces, c.labels.Share(), c.order)
		c.shared = true
	}
	if c.workloads != nil {
		return snapshot{c.snap, c.workloads}
	}
	return c.snap
}

// ownNodes makes c.nodes the cache's own before it changes: a snapshot may
// hold it (c.mu is held).
func (c *Cache) ownNodes() {
	if c.shared {
		c.nodes = maps.Clone(c.nodes)
		c.shared = false
	}
}

// Nodes implements the extender's NodesCache: nodes by name, under one
// lock (missing is called with it held, so must not call the cache).
func (c *Cache) Nodes(names []string, out []*v1.Node, missing func(name string)) []*v1.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, name := range names {
		if ni := c.nodes[name]; ni != nil && ni.Node != nil {
			out = append(out, ni.Node)
		} else {
			missing(name)
		}
	}
	return out
}

// Node implements the extender's NodeCache: a node by name.
func (c *Cache) Node(name string) (*v1.Node, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ni := c.nodes[name]; ni != nil && ni.Node != nil {
		return ni.Node, true
	}
	return nil, false
}

// SetNode adds or updates a node.
func (c *Cache) SetNode(n *v1.Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ni := &framework.NodeInfo{}
	if old := c.nodes[n.Name]; old != nil {
		*ni = *old
	} else {
		c.order = nil
	}
	ni.SetNode(n)
	c.ownNodes()
	c.nodes[n.Name] = ni
	c.snap = nil
}

// DeleteNode forgets a node (its pods stay until they are deleted too).
func (c *Cache) DeleteNode(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.nodes[name]
	if old == nil {
		return
	}
	if len(old.Pods) == 0 {
		c.ownNodes()
		delete(c.nodes, name)
		c.order = nil
	} else {
		ni := *old
		ni.SetNode(nil)
		c.ownNodes()
		c.nodes[name] = &ni
	}
	c.snap = nil
}

// SetPod adds or updates a pod: it counts on spec.nodeName until it is
// Succeeded or Failed (a terminating pod still counts, as upstream's cache
// keeps it until it is deleted). The watch showing a pod bound replaces
// the extender's assumption of it; showing it not bound yet does not (the
// watch is behind the binding).
func (c *Cache) SetPod(p *v1.Pod) {
	c.mu.Lock()
	defer c.mu.Unlock()
	node := p.Spec.NodeName
	if framework.Terminal(p) {
		node = ""
	}
	old, had := c.pods[p.UID]
	if had && old.assumed && p.Spec.NodeName == "" && !framework.Terminal(p) {
		return
	}
	if node != "" || framework.Terminal(p) {
		c.settle(p.UID)
	}
	delete(c.assumed, p.UID)
	if had && node == old.node && c.nodes[node] != nil {
		// An update in place (mostly the kubelet's status): the pod
		// keeps its parsed affinity terms (they are immutable) and its
		// place in the label index unless its labels changed.
		info := old.info.Update(p)
		c.replace(node, old.info, info)
		c.pods[p.UID] = placed{node: node, info: info}
		c.snap = nil
		return
	}
	if had {
		c.remove(old.node, p.UID)
	}
	if node == "" {
		delete(c.pods, p.UID)
	} else {
		// The same pod keeps its parsed affinity terms (they are
		// immutable); only its labels are read again.
		var info *framework.PodInfo
		if had {
			info = old.info.Update(p)
		} else {
			info = framework.NewPodInfo(p)
		}
		c.place(p, node, info, false)
	}
	if had || node != "" {
		c.snap = nil
	}
}

// place counts a pod on node; c.mu is held.
func (c *Cache) place(p *v1.Pod, node string, info *framework.PodInfo, assumed bool) {
	c.pods[p.UID] = placed{node: node, info: info, assumed: assumed}
	ni := &framework.NodeInfo{}
	if cur := c.nodes[node]; cur != nil {
		ni = copyNodeInfo(cur)
	} else {
		c.order = nil
	}
	ni.AddPod(info)
	c.ownNodes()
	c.nodes[node] = ni
	c.labels.Add(info, node, 1)
	c.snap = nil
}

// DeletePod forgets a pod, assumed or not.
func (c *Cache) DeletePod(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.settle(uid)
	delete(c.assumed, uid)
	if old, ok := c.pods[uid]; ok {
		c.remove(old.node, uid)
		delete(c.pods, uid)
		c.snap = nil
	}
}

// replace replaces the NodeInfo of node with one where info, an update of
// the same pod, stands for old; c.mu is held.
func (c *Cache) replace(node string, old, info *framework.PodInfo) {
	cur := c.nodes[node]
	ni := &framework.NodeInfo{}
	ni.SetNodeOf(cur)
	for _, p := range cur.Pods {
		if p == old {
			p = info
		}
		ni.AddPod(p)
	}
	c.ownNodes()
	c.nodes[node] = ni
	if !maps.Equal(old.Pod.Labels, info.Pod.Labels) {
		c.labels.Add(old, node, -1)
		c.labels.Add(info, node, 1)
	}
}

// remove replaces the NodeInfo of node with one without the pod.
func (c *Cache) remove(node string, uid types.UID) {
	cur := c.nodes[node]
	if cur == nil {
		return
	}
	ni := &framework.NodeInfo{}
	ni.SetNodeOf(cur)
	for _, p := range cur.Pods {
		if p.Pod.UID != uid {
			ni.AddPod(p)
		} else {
			c.labels.Add(p, node, -1)
		}
	}
	if ni.Node == nil && len(ni.Pods) == 0 {
		c.ownNodes()
		delete(c.nodes, node)
		c.order = nil
		return
	}
	c.ownNodes()
	c.nodes[node] = ni
}

// copyNodeInfo copies the lists so that appending does not reach into a
// NodeInfo a snapshot holds.
func copyNodeInfo(ni *framework.NodeInfo) *framework.NodeInfo {
	c := &framework.NodeInfo{
		Pods:                         append([]*framework.PodInfo(nil), ni.Pods...),
		PodsWithAffinity:             append([]*framework.PodInfo(nil), ni.PodsWithAffinity...),
		PodsWithRequiredAntiAffinity: append([]*framework.PodInfo(nil), ni.PodsWithRequiredAntiAffinity...),
	}
	c.SetNodeOf(ni)
	return c
}

// SetNamespace adds or updates a namespace.
func (c *Cache) SetNamespace(ns *v1.Namespace) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.namespaces[ns.Name] = ns
	c.snap = nil
}

// DeleteNamespace forgets a namespace.
func (c *Cache) DeleteNamespace(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.namespaces, name)
	c.snap = nil
}
