package gc

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
)

// reader gives a pass its Snapshot. What it reads may be stale: a pass
// only picks candidates from it; every release is confirmed with fresh
// reads from the API server and made with compare-and-swap.
type reader interface {
	snapshot(ctx context.Context) (*Snapshot, error)
}

// apiReader lists everything from the API server (consistent lists): one
// pass on demand (GC.Pass).
type apiReader struct{ ds *datastore.Client }

func (r apiReader) snapshot(ctx context.Context) (*Snapshot, error) {
	s := &Snapshot{Pods: map[PodKey]*corev1.Pod{}, Nodes: map[string]bool{}}
	all := metav1.ListOptions{}
	bl, err := r.ds.IPAMBlocks.List(ctx, all)
	if err != nil {
		return nil, fmt.Errorf("listing IPAM blocks: %w", err)
	}
	for i := range bl.Items {
		s.Blocks = append(s.Blocks, &bl.Items[i])
	}
	al, err := r.ds.BlockAffinities.List(ctx, all)
	if err != nil {
		return nil, fmt.Errorf("listing block affinities: %w", err)
	}
	for i := range al.Items {
		s.Affinities = append(s.Affinities, &al.Items[i])
	}
	hl, err := r.ds.IPAMHandles.List(ctx, all)
	if err != nil {
		return nil, fmt.Errorf("listing IPAM handles: %w", err)
	}
	for i := range hl.Items {
		s.Handles = append(s.Handles, &hl.Items[i])
	}
	pl, err := r.ds.IPPools.List(ctx, all)
	if err != nil {
		return nil, fmt.Errorf("listing IP pools: %w", err)
	}
	for i := range pl.Items {
		s.Pools = append(s.Pools, &pl.Items[i])
	}
	nl, err := r.ds.Nodes.List(ctx, all)
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	for _, n := range nl.Items {
		s.Nodes[n.Name] = true
	}
	podl, err := r.ds.Pods("").List(ctx, all)
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	for i := range podl.Items {
		p := &podl.Items[i]
		s.Pods[PodKey{p.Namespace, p.Name}] = p
	}
	return s, nil
}

// informers are the caches a leader's passes read (Run).
type informers struct {
	ds                                              *datastore.Client
	blocks, affinities, handles, pools, nodes, pods cache.SharedIndexInformer
}

func informer[L runtime.Object](example runtime.Object, c datastore.ListWatcher[L], transform cache.TransformFunc) cache.SharedIndexInformer {
	inf := datastore.NewInformer(example, c, nil, nil)
	if transform != nil {
		_ = inf.SetTransform(transform)
	}
	return inf
}

// slimPod keeps what the collector reads of a pod: its name, phase and
// addresses (a cluster's pods can be many).
func slimPod(o any) (any, error) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return o, nil
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			CreationTimestamp: p.CreationTimestamp, DeletionTimestamp: p.DeletionTimestamp},
		Spec:   corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs},
	}, nil
}

// slimNode keeps a node's name: the collector only asks whether it exists.
func slimNode(o any) (any, error) {
	n, ok := o.(*corev1.Node)
	if !ok {
		return o, nil
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion}}, nil
}

func newInformers(ds *datastore.Client) *informers {
	return &informers{
		ds:         ds,
		blocks:     informer(&tabbyv1.IPAMBlock{}, ds.IPAMBlocks, nil),
		affinities: informer(&tabbyv1.BlockAffinity{}, ds.BlockAffinities, nil),
		handles:    informer(&tabbyv1.IPAMHandle{}, ds.IPAMHandles, nil),
		pools:      informer(&tabbyv1.IPPool{}, ds.IPPools, nil),
		nodes:      informer(&corev1.Node{}, ds.Nodes, slimNode),
		pods:       informer(&corev1.Pod{}, ds.Pods(""), slimPod),
	}
}

func (c *informers) all() []cache.SharedIndexInformer {
	return []cache.SharedIndexInformer{c.blocks, c.affinities, c.handles, c.pools, c.nodes, c.pods}
}

// run starts the informers and returns once they have synced (or with
// ctx's error); they stop when ctx ends.
func (c *informers) run(ctx context.Context) error {
	var synced []cache.InformerSynced
	for _, inf := range c.all() {
		go inf.RunWithContext(ctx)
		synced = append(synced, inf.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("the IPAM garbage collector's caches did not sync with the API server at %s: %w", c.ds.Host(), context.Cause(ctx))
	}
	return nil
}

func (c *informers) snapshot(context.Context) (*Snapshot, error) {
	s := &Snapshot{
		Blocks:     datastore.StoreList[tabbyv1.IPAMBlock](c.blocks),
		Affinities: datastore.StoreList[tabbyv1.BlockAffinity](c.affinities),
		Handles:    datastore.StoreList[tabbyv1.IPAMHandle](c.handles),
		Pools:      datastore.StoreList[tabbyv1.IPPool](c.pools),
		Pods:       map[PodKey]*corev1.Pod{},
		Nodes:      map[string]bool{},
	}
	for _, n := range datastore.StoreList[corev1.Node](c.nodes) {
		s.Nodes[n.Name] = true
	}
	for _, p := range datastore.StoreList[corev1.Pod](c.pods) {
		s.Pods[PodKey{p.Namespace, p.Name}] = p
	}
	return s, nil
}
