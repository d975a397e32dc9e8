package ipam

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
)

// Source is where IPAM reads what it may read slightly stale: the pools, the
// node's blocks, every block, the IPAMConfiguration and the Node, and a
// handle and a block by name. The default (APISource) asks the API server,
// lists from its watch cache; a long-lived caller such as tabbyd passes
// informer caches instead.
//
// Stale reads are safe because every write is a compare-and-swap: a stale
// block fails its update and is re-read with a GET, a block claimed by
// someone else fails to be created again, a handle deleted with a stale
// resourceVersion is re-read. The decisions a stale read could get wrong
// are re-checked with a consistent read from the API server first: claiming
// another block because the node's blocks look full, and concluding that
// a handle or block holds nothing to release.
//
// Objects a Source returns may be shared with its cache: IPAM never
// modifies them.
type Source interface {
	// Pools lists every IPPool.
	Pools(ctx context.Context) ([]tabbyv1.IPPool, error)
	// NodeBlocks lists the blocks labelled with the node (LabelNode);
	// IPAM keeps those whose affinity is the node's.
	NodeBlocks(ctx context.Context, node string) ([]*tabbyv1.IPAMBlock, error)
	// AllBlocks lists every block.
	AllBlocks(ctx context.Context) ([]*tabbyv1.IPAMBlock, error)
	// IPAMConfig returns the IPAMConfiguration named
	// tabbyv1.IPAMConfigurationName, nil when there is none.
	IPAMConfig(ctx context.Context) (*tabbyv1.IPAMConfiguration, error)
	// Node returns the Node, nil when there is none.
	Node(ctx context.Context, name string) (*corev1.Node, error)
	// Handle returns the IPAMHandle object named name, nil when the source
	// has none.
	Handle(ctx context.Context, name string) (*tabbyv1.IPAMHandle, error)
	// Block returns the IPAMBlock named name, nil when the source has none.
	Block(ctx context.Context, name string) (*tabbyv1.IPAMBlock, error)
}

// BlockObserver is implemented by a Source that wants to see every block
// IPAM wrote or read from the API server, so that its next answer is no
// older than what IPAM already knows (an informer learns of IPAM's own
// writes only a moment later).
type BlockObserver interface {
	ObserveBlock(b *tabbyv1.IPAMBlock)
}

// WithSource makes IPAM read pools, blocks, the IPAMConfiguration and the
// Node through s (default: APISource of the datastore).
func WithSource(s Source) Option { return func(m *IPAM) { m.src = s } }

// APISource reads from the API server: pools and blocks from its watch
// cache (resourceVersion=0: a consistent list waits for the cache to catch
// up with etcd, tens of milliseconds), the IPAMConfiguration and the Node
// with GETs.
func APISource(ds *datastore.Client) Source { return apiSource{ds} }

type apiSource struct{ ds *datastore.Client }

func (s apiSource) Pools(ctx context.Context) ([]tabbyv1.IPPool, error) {
	l, err := s.ds.IPPools.List(ctx, cached)
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

func (s apiSource) NodeBlocks(ctx context.Context, node string) ([]*tabbyv1.IPAMBlock, error) {
	return listBlocks(ctx, s.ds, metav1.ListOptions{LabelSelector: nodeSelector(node), ResourceVersion: "0"})
}

func (s apiSource) AllBlocks(ctx context.Context) ([]*tabbyv1.IPAMBlock, error) {
	return listBlocks(ctx, s.ds, cached)
}

func (s apiSource) IPAMConfig(ctx context.Context) (*tabbyv1.IPAMConfiguration, error) {
	c, err := s.ds.IPAMConfigurations.Get(ctx, tabbyv1.IPAMConfigurationName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return c, err
}

func (s apiSource) Node(ctx context.Context, name string) (*corev1.Node, error) {
	n, err := s.ds.Nodes.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return n, err
}

func (s apiSource) Handle(ctx context.Context, name string) (*tabbyv1.IPAMHandle, error) {
	return getHandle(ctx, s.ds, name)
}

func (s apiSource) Block(ctx context.Context, name string) (*tabbyv1.IPAMBlock, error) {
	return getBlock(ctx, s.ds, name)
}

// getHandle reads a handle from the API server, nil when there is none.
func getHandle(ctx context.Context, ds *datastore.Client, name string) (*tabbyv1.IPAMHandle, error) {
	h, err := ds.IPAMHandles.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return h, err
}

// getBlock reads a block from the API server, nil when there is none.
func getBlock(ctx context.Context, ds *datastore.Client, name string) (*tabbyv1.IPAMBlock, error) {
	b, err := ds.IPAMBlocks.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	return b, err
}

func listBlocks(ctx context.Context, ds *datastore.Client, opts metav1.ListOptions) ([]*tabbyv1.IPAMBlock, error) {
	l, err := ds.IPAMBlocks.List(ctx, opts)
	if err != nil {
		return nil, err
	}
	out := make([]*tabbyv1.IPAMBlock, len(l.Items))
	for i := range l.Items {
		out[i] = &l.Items[i]
	}
	return out, nil
}

// nodeSelector selects the objects labelled with a node.
func nodeSelector(node string) string { return tabbyv1.LabelNode + "=" + NodeLabelValue(node) }

// observe tells the source about a block IPAM wrote or read.
func (m *IPAM) observe(b *tabbyv1.IPAMBlock) {
	if o, ok := m.src.(BlockObserver); ok && b != nil {
		o.ObserveBlock(b)
	}
}
