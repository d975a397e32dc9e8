package cniagent

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// byNode indexes blocks by their node label (ipam.NodeLabelValue).
const byNode = "node"

// mutationTTL is how long a block IPAM wrote (or read from the API server)
// wins over an older copy in the informer: long enough for the watch event
// of the write to arrive.
const mutationTTL = 10 * time.Second

// Caches are the agent's informers: every IPPool, every IPAMBlock (indexed
// by node), the IPAMConfigurations, this node's Node and IPAMHandles, the
// pods bound to this node and every Namespace. They are IPAM's Source (ipam.Source,
// ipam.BlockObserver) and the pod annotations' lookup (ipam.PodLookup,
// through ForPod), with the API server behind for what they lack.
type Caches struct {
	ds   *datastore.Client
	infs *datastore.Informers
	node string
	api  ipam.Source

	pools, blocks, configs, nodes, handles, pods, namespaces cache.SharedIndexInformer
	// blockView is the block informer's store overlaid with the blocks
	// IPAM wrote since: the newer of the two (by resourceVersion) wins.
	blockView cache.MutationCache

	// podLookup counts pod lookups by where they were answered.
	podLookup func(source string)
	// onBlock, when set, is also told of the blocks ObserveBlock is.
	onBlock func(*tabbyv1.IPAMBlock)
}

// NewCaches makes the informers of node (the pools, blocks, nodes and
// namespaces from infs, nil: its own); Run starts them.
func NewCaches(ds *datastore.Client, infs *datastore.Informers, node string) (*Caches, error) {
	if infs == nil {
		infs = datastore.NewInformers(ds)
	}
	c := &Caches{ds: ds, infs: infs, node: node, api: ipam.APISource(ds), podLookup: func(string) {}}
	everything := func(*metav1.ListOptions) {}
	c.pools = infs.IPPools()
	c.blocks = infs.IPAMBlocks()
	if _, ok := c.blocks.GetIndexer().GetIndexers()[byNode]; !ok {
		if err := c.blocks.AddIndexers(cache.Indexers{byNode: blockNode}); err != nil {
			return nil, fmt.Errorf("indexing the IPAMBlock cache by node: %w", err)
		}
	}
	c.configs = datastore.NewInformer(&tabbyv1.IPAMConfiguration{}, ds.IPAMConfigurations, everything, nil)
	c.nodes = infs.Nodes() // routing's: this node is one of them
	c.handles = datastore.NewInformer(&tabbyv1.IPAMHandle{}, ds.IPAMHandles, func(o *metav1.ListOptions) {
		o.LabelSelector = tabbyv1.LabelNode + "=" + ipam.NodeLabelValue(node)
	}, nil)
	c.pods = datastore.NewInformer(&corev1.Pod{}, ds.Pods(metav1.NamespaceAll), fieldIs("spec.nodeName", node), nil)
	c.namespaces = infs.Namespaces()
	c.blockView = cache.NewIntegerResourceVersionMutationCache(klog.Background(), c.blocks.GetStore(), c.blocks.GetIndexer(), mutationTTL, true)
	return c, nil
}

// blockNode indexes a block by its node label (byNode).
func blockNode(obj any) ([]string, error) {
	b, ok := obj.(*tabbyv1.IPAMBlock)
	if !ok {
		return nil, nil
	}
	return []string{b.Labels[tabbyv1.LabelNode]}, nil
}

// fieldIs restricts a list to the objects whose field has the value.
func fieldIs(field, value string) func(*metav1.ListOptions) {
	sel := fields.OneTermEqualSelector(field, value).String()
	return func(o *metav1.ListOptions) { o.FieldSelector = sel }
}

func (c *Caches) all() []cache.SharedIndexInformer {
	return []cache.SharedIndexInformer{c.pools, c.blocks, c.configs, c.nodes, c.handles, c.pods, c.namespaces}
}

// Run starts the informers and returns once they have synced, or with
// ctx's error. They run until ctx ends.
func (c *Caches) Run(ctx context.Context) error {
	var synced []cache.InformerSynced
	c.infs.Run(ctx, c.all()...)
	for _, inf := range c.all() {
		synced = append(synced, inf.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("the informer caches did not sync with the API server at %s: %w", c.ds.Host(), context.Cause(ctx))
	}
	return nil
}

// Pools lists the pools from the cache.
func (c *Caches) Pools(context.Context) ([]tabbyv1.IPPool, error) {
	objs := c.pools.GetStore().List()
	out := make([]tabbyv1.IPPool, 0, len(objs))
	for _, o := range objs {
		out = append(out, *o.(*tabbyv1.IPPool))
	}
	return out, nil
}

// NodeBlocks lists the node's blocks: the cache's, or IPAM's own newer
// copies.
func (c *Caches) NodeBlocks(_ context.Context, node string) ([]*tabbyv1.IPAMBlock, error) {
	objs, err := c.blockView.ByIndex(byNode, ipam.NodeLabelValue(node))
	if err != nil {
		return nil, err
	}
	out := make([]*tabbyv1.IPAMBlock, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(*tabbyv1.IPAMBlock))
	}
	return out, nil
}

// AllBlocks lists every block from the cache.
func (c *Caches) AllBlocks(context.Context) ([]*tabbyv1.IPAMBlock, error) {
	objs := c.blocks.GetStore().List()
	out := make([]*tabbyv1.IPAMBlock, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(*tabbyv1.IPAMBlock))
	}
	return out, nil
}

// Block returns a block: the cache's, or IPAM's own newer copy.
func (c *Caches) Block(_ context.Context, name string) (*tabbyv1.IPAMBlock, error) {
	o, ok, err := c.blockView.GetByKey(name)
	if err != nil || !ok {
		return nil, err
	}
	return o.(*tabbyv1.IPAMBlock), nil
}

// Handle returns one of this node's handles from the cache.
func (c *Caches) Handle(_ context.Context, name string) (*tabbyv1.IPAMHandle, error) {
	o, ok, err := c.handles.GetStore().GetByKey(name)
	if err != nil || !ok {
		return nil, err
	}
	return o.(*tabbyv1.IPAMHandle), nil
}

// ObserveBlock remembers a block IPAM wrote or read, until the informer
// has caught up with it, and passes it on to onBlock.
func (c *Caches) ObserveBlock(b *tabbyv1.IPAMBlock) {
	c.blockView.Mutation(b)
	if c.onBlock != nil {
		c.onBlock(b)
	}
}

// IPAMConfig returns the IPAMConfiguration from the cache.
func (c *Caches) IPAMConfig(context.Context) (*tabbyv1.IPAMConfiguration, error) {
	o, ok, err := c.configs.GetStore().GetByKey(tabbyv1.IPAMConfigurationName)
	if err != nil || !ok {
		return nil, err
	}
	return o.(*tabbyv1.IPAMConfiguration), nil
}

// Node returns this node from the cache; another node is read from the API
// server.
func (c *Caches) Node(ctx context.Context, name string) (*corev1.Node, error) {
	if name != c.node {
		return c.api.Node(ctx, name)
	}
	o, ok, err := c.nodes.GetStore().GetByKey(name)
	if err != nil || !ok {
		return nil, err
	}
	return o.(*corev1.Node), nil
}

// ForPod is the pod lookup of one request: a cached Pod whose UID is not
// uid (when given) is an older pod of the same name, and is read again
// from the API server.
func (c *Caches) ForPod(uid string) ipam.PodLookup { return podLookup{c: c, uid: types.UID(uid)} }

type podLookup struct {
	c   *Caches
	uid types.UID
}

// Pod reads a pod bound to this node from the cache; one the cache does not
// have yet (bound a moment ago) is read from the API server.
func (l podLookup) Pod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	o, ok, err := l.c.pods.GetStore().GetByKey(namespace + "/" + name)
	if err == nil && ok {
		if p := o.(*corev1.Pod); l.uid == "" || p.UID == l.uid {
			l.c.podLookup("cache")
			return p, nil
		}
	}
	l.c.podLookup("api")
	return l.c.ds.Pods(namespace).Get(ctx, name, metav1.GetOptions{})
}

// Namespace reads a namespace from the cache, else from the API server.
func (l podLookup) Namespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	o, ok, err := l.c.namespaces.GetStore().GetByKey(name)
	if err == nil && ok {
		return o.(*corev1.Namespace), nil
	}
	return l.c.ds.Namespaces.Get(ctx, name, metav1.GetOptions{})
}
