package network

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/contract"
	"github.com/tabbynet/tabby/datastore"
)

// Watcher keeps Inputs from informers: every IPPool, IPAMBlock and the
// IPAMConfiguration, and the tabbyd heartbeat Leases of one namespace.
type Watcher struct {
	// CheckHeartbeats makes Inputs carry the heartbeats (otherwise nodes
	// are not checked for a ready tabbyd).
	CheckHeartbeats bool
	// Now is the clock (time.Now when nil).
	Now func() time.Time

	mu         sync.Mutex
	pools      map[string]*tabbyv1.IPPool
	blocks     map[string]Block
	config     *tabbyv1.IPAMConfigurationSpec
	heartbeats map[string]time.Time
	inputs     *Inputs // nil when something changed since it was made
	version    uint64  // counts the Inputs made
}

// NewWatcher makes an empty Watcher; Start fills it.
func NewWatcher() *Watcher {
	return &Watcher{pools: map[string]*tabbyv1.IPPool{}, blocks: map[string]Block{}, heartbeats: map[string]time.Time{}}
}

// Start runs the informers and returns once they have synced.
func (w *Watcher) Start(ctx context.Context, ds *datastore.Client, kube kubernetes.Interface, namespace string) error {
	pools := datastore.NewInformer(&tabbyv1.IPPool{}, ds.IPPools, nil, nil)
	blocks := datastore.NewInformer(&tabbyv1.IPAMBlock{}, ds.IPAMBlocks, nil, nil)
	configs := datastore.NewInformer(&tabbyv1.IPAMConfiguration{}, ds.IPAMConfigurations, nil, nil)
	infs := []toolscache.SharedIndexInformer{pools, blocks, configs}
	handle := func(inf toolscache.SharedIndexInformer, set func(any), del func(any)) error {
		_, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: set, UpdateFunc: func(_, o any) { set(o) },
			DeleteFunc: func(o any) {
				if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
					o = d.Obj
				}
				del(o)
			},
		})
		return err
	}
	errs := []error{
		handle(pools, func(o any) { w.SetPool(o.(*tabbyv1.IPPool)) }, func(o any) {
			if p, ok := o.(*tabbyv1.IPPool); ok {
				w.DeletePool(p.Name)
			}
		}),
		handle(blocks, func(o any) { w.SetBlock(o.(*tabbyv1.IPAMBlock)) }, func(o any) {
			if b, ok := o.(*tabbyv1.IPAMBlock); ok {
				w.DeleteBlock(b.Name)
			}
		}),
		handle(configs, func(o any) { w.SetConfig(o.(*tabbyv1.IPAMConfiguration)) }, func(o any) {
			if c, ok := o.(*tabbyv1.IPAMConfiguration); ok && c.Name == "default" {
				w.SetConfig(nil)
			}
		}),
	}
	var factory informers.SharedInformerFactory
	if w.CheckHeartbeats {
		factory = informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithNamespace(namespace))
		leases := factory.Coordination().V1().Leases().Informer()
		errs = append(errs, handle(leases, func(o any) { w.SetLease(o.(*coordinationv1.Lease)) }, func(o any) {
			if l, ok := o.(*coordinationv1.Lease); ok {
				w.DeleteLease(l.Name)
			}
		}))
		infs = append(infs, leases)
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	var synced []toolscache.InformerSynced
	for _, inf := range infs {
		if factory == nil || inf != infs[len(infs)-1] {
			go inf.RunWithContext(ctx)
		}
		synced = append(synced, inf.HasSynced)
	}
	if factory != nil {
		factory.Start(ctx.Done())
	}
	if !toolscache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("tabby's IPAM informers did not sync with the API server at %s: %w", ds.Host(), context.Cause(ctx))
	}
	return nil
}

func (w *Watcher) changed(f func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	f()
	w.inputs = nil
}

// SetPool adds or updates a pool.
func (w *Watcher) SetPool(p *tabbyv1.IPPool) { w.changed(func() { w.pools[p.Name] = p }) }

// DeletePool forgets a pool.
func (w *Watcher) DeletePool(name string) { w.changed(func() { delete(w.pools, name) }) }

// SetBlock adds or updates a block.
func (w *Watcher) SetBlock(b *tabbyv1.IPAMBlock) {
	sum, ok := BlockOf(b)
	w.changed(func() {
		if ok {
			w.blocks[b.Name] = sum
		} else {
			delete(w.blocks, b.Name)
		}
	})
}

// DeleteBlock forgets a block.
func (w *Watcher) DeleteBlock(name string) { w.changed(func() { delete(w.blocks, name) }) }

// SetConfig sets the IPAMConfiguration; nil (or one not named default)
// means the defaults.
func (w *Watcher) SetConfig(c *tabbyv1.IPAMConfiguration) {
	if c != nil && c.Name != "default" {
		return
	}
	w.changed(func() {
		w.config = nil
		if c != nil {
			spec := c.Spec
			w.config = &spec
		}
	})
}

// SetLease records a tabbyd heartbeat.
func (w *Watcher) SetLease(l *coordinationv1.Lease) {
	node, ok := contract.NodeOfHeartbeatLease(l.Name)
	if !ok {
		return
	}
	var until time.Time
	if l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil {
		until = l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
	}
	w.changed(func() { w.heartbeats[node] = until })
}

// DeleteLease forgets a heartbeat.
func (w *Watcher) DeleteLease(name string) {
	if node, ok := contract.NodeOfHeartbeatLease(name); ok {
		w.changed(func() { delete(w.heartbeats, node) })
	}
}

// Inputs is the state now. The slices and maps are shared between calls
// until something changes: read them only.
func (w *Watcher) Inputs() *Inputs {
	now := time.Now
	if w.Now != nil {
		now = w.Now
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.inputs == nil {
		w.version++
		in := &Inputs{Config: tabbyv1.IPAMConfigurationSpec{MaxBlocksPerHost: tabbyv1.DefaultMaxBlocksPerHost}, Version: w.version}
		if w.config != nil {
			in.Config = *w.config
		}
		for _, p := range w.pools {
			in.Pools = append(in.Pools, p)
		}
		sort.Slice(in.Pools, func(i, j int) bool { return in.Pools[i].Name < in.Pools[j].Name })
		for _, b := range w.blocks {
			in.Blocks = append(in.Blocks, b)
		}
		if w.CheckHeartbeats {
			in.Heartbeats = make(map[string]time.Time, len(w.heartbeats))
			for k, v := range w.heartbeats {
				in.Heartbeats[k] = v
			}
		}
		w.inputs = in
	}
	c := *w.inputs
	c.Now = now()
	return &c
}
