package daemon

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/datastore"
)

// SecretClient reads the Secrets of one namespace (BGP passwords).
type SecretClient = datastore.Resource[*corev1.Secret, *corev1.SecretList]

// secretClient is the Secret client of namespace, over the datastore's
// core REST client.
func secretClient(ds *datastore.Client, namespace string) *SecretClient {
	return datastore.NewResource[*corev1.Secret, *corev1.SecretList]("secrets", ds.CoreREST(), datastore.ParameterCodec, namespace,
		func() *corev1.Secret { return &corev1.Secret{} }, func() *corev1.SecretList { return &corev1.SecretList{} })
}

// watchAll is an informer over every object c lists; changed (may be nil)
// filters updates: only those it calls a change call onChange.
func watchAll[L runtime.Object](example runtime.Object, c datastore.ListWatcher[L], onChange func(), changed func(old, new any) bool) cache.SharedIndexInformer {
	inf := datastore.NewInformer(example, c, nil, nil)
	datastore.OnChange(inf, onChange, changed)
	return inf
}

// nodeChanged says whether a Node update matters to routing: its labels,
// annotations or addresses. The kubelet's heartbeats (conditions,
// timestamps) do not.
func nodeChanged(old, new any) bool {
	a, ok1 := old.(*corev1.Node)
	b, ok2 := new.(*corev1.Node)
	if !ok1 || !ok2 {
		return true
	}
	return !maps.Equal(a.Labels, b.Labels) || !maps.Equal(a.Annotations, b.Annotations) ||
		!reflect.DeepEqual(a.Status.Addresses, b.Status.Addresses)
}

// blockChanged says whether an IPAMBlock update matters to routing: its
// cidr, affinity or deletion, or the addresses nodes other than its own
// hold in it (borrowed: advertised and accepted as host routes). A pod's
// address taken or given back in its node's own block does not. On a
// cluster whose pods come and go that is most block updates, and each
// cost every node a routing pass.
func blockChanged(old, new any) bool {
	a, ok1 := old.(*tabbyv1.IPAMBlock)
	b, ok2 := new.(*tabbyv1.IPAMBlock)
	if !ok1 || !ok2 {
		return true
	}
	return a.Spec.CIDR != b.Spec.CIDR || a.Spec.Affinity != b.Spec.Affinity || a.Spec.Deleted != b.Spec.Deleted ||
		!slices.Equal(borrowed(a), borrowed(b))
}

// borrowed lists the allocations of b held by a node that is not its
// affine node, as ordinal=node: what bgp.Filters and bgp.Advertisements
// read of a block's allocations (bgp.Borrowed).
func borrowed(b *tabbyv1.IPAMBlock) []string {
	var out []string
	bgp.Borrowed(b, func(ord int, node string) { out = append(out, strconv.Itoa(ord)+"="+node) })
	return out
}

// caches are the informers the routing loop reads: every Node, IPPool,
// IPAMBlock, BGPConfiguration, BGPPeer and BGPFilter. Not Secrets:
// tabby-node may read only those granted to it by name (BGP passwords),
// one at a time.
type caches struct {
	ds                                            *datastore.Client
	infs                                          *datastore.Informers
	nodes, pools, blocks, configs, peers, filters cache.SharedIndexInformer

	// gen counts the changes that matter to routing, each counted before
	// the pass it asks for; last is the snapshot taken at gen lastGen, at
	// lastAt (see snapshot).
	gen     atomic.Uint64
	last    *snapshot
	lastGen uint64
	lastAt  time.Time
	copies  uint64 // snapshots copied (snapshot.id)
}

// snapshotReuse bounds how long snapshot answers with an earlier copy of
// the caches: a pass that changes nothing the filters of updates (such as
// nodeChanged) ignore copies them again at least that often.
const snapshotReuse = 10 * time.Second

func newCaches(ds *datastore.Client, infs *datastore.Informers, onChange func()) *caches {
	if infs == nil {
		infs = datastore.NewInformers(ds)
	}
	c := &caches{ds: ds, infs: infs}
	changed := func() {
		c.gen.Add(1)
		onChange()
	}
	c.nodes, c.pools, c.blocks = infs.Nodes(), infs.IPPools(), infs.IPAMBlocks()
	datastore.OnChange(c.nodes, changed, nodeChanged)
	datastore.OnChange(c.pools, changed, nil)
	datastore.OnChange(c.blocks, changed, blockChanged)
	c.configs = watchAll(&tabbyv1.BGPConfiguration{}, ds.BGPConfigurations, changed, nil)
	c.peers = watchAll(&tabbyv1.BGPPeer{}, ds.BGPPeers, changed, nil)
	c.filters = watchAll(&tabbyv1.BGPFilter{}, ds.BGPFilters, changed, nil)
	return c
}

// run starts the informers and returns once they have synced, or with
// ctx's error. They run until ctx ends.
func (c *caches) run(ctx context.Context) error {
	all := []cache.SharedIndexInformer{c.nodes, c.pools, c.blocks, c.configs, c.peers, c.filters}
	c.infs.Run(ctx, all...)
	synced := make([]cache.InformerSynced, 0, len(all))
	for _, inf := range all {
		synced = append(synced, inf.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("the routing caches did not sync with the API server at %s: %w", c.ds.Host(), context.Cause(ctx))
	}
	return nil
}

// listOf copies every object of an informer's store, sorted by name.
func listOf[T any](inf cache.SharedIndexInformer) []T {
	objs := inf.GetStore().List()
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		if v, ok := o.(*T); ok {
			out = append(out, *v)
		}
	}
	slices.SortFunc(out, func(a, b T) int {
		return compareNames(any(&a), any(&b))
	})
	return out
}

func compareNames(a, b any) int {
	ma, _ := a.(metav1.Object)
	mb, _ := b.(metav1.Object)
	if ma == nil || mb == nil {
		return 0
	}
	switch {
	case ma.GetName() < mb.GetName():
		return -1
	case ma.GetName() > mb.GetName():
		return 1
	}
	return 0
}

// snapshot is one consistent-enough read of the caches.
type snapshot struct {
	// id tells copies apart: passes given the same copy share its id.
	id      uint64
	nodes   []corev1.Node
	pools   []tabbyv1.IPPool
	blocks  []tabbyv1.IPAMBlock
	config  tabbyv1.BGPConfigurationSpec
	peers   []tabbyv1.BGPPeer
	filters []tabbyv1.BGPFilter
}

// snapshot copies the caches, sorted by name. Passes only read it. While
// no change that matters to routing came since the last copy (a pass
// that BGP, a timer or a retry asked for), that copy is the answer, for up
// to snapshotReuse: copying and sorting every Node and IPAMBlock was a
// tenth of what a node spent on each claim in the cluster. A change is
// counted before it asks for a pass, so that pass copies it.
func (c *caches) snapshot() snapshot {
	gen := c.gen.Load()
	if c.last != nil && gen == c.lastGen && time.Since(c.lastAt) < snapshotReuse {
		return *c.last
	}
	c.copies++
	s := c.copyAll()
	s.id = c.copies
	c.last, c.lastGen, c.lastAt = &s, gen, time.Now()
	return s
}

// copyAll copies every cache, sorted by name.
func (c *caches) copyAll() snapshot {
	s := snapshot{
		nodes:   listOf[corev1.Node](c.nodes),
		pools:   listOf[tabbyv1.IPPool](c.pools),
		blocks:  listOf[tabbyv1.IPAMBlock](c.blocks),
		peers:   listOf[tabbyv1.BGPPeer](c.peers),
		filters: listOf[tabbyv1.BGPFilter](c.filters),
	}
	if o, ok, _ := c.configs.GetStore().GetByKey(tabbyv1.BGPConfigurationName); ok {
		s.config = o.(*tabbyv1.BGPConfiguration).Spec
	}
	return s
}

// node returns the named node of the snapshot.
func (s *snapshot) node(name string) *corev1.Node {
	for i := range s.nodes {
		if s.nodes[i].Name == name {
			return &s.nodes[i]
		}
	}
	return nil
}
