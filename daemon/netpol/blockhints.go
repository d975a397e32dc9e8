package netpol

import (
	"strconv"
	"sync"

	"k8s.io/client-go/tools/cache"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
)

// blockHints are versions of IPAMBlocks that this node's CNI agent wrote
// (or read from the API server), handed over before the watch of blocks
// brings them (ObserveBlock): a new pod's address is in the next sync's
// input as soon as its allocation is committed, without the watch's round
// trip, so the plugin's policy-wait returns sooner.
//
// The watch stays the source of truth. A hint is a committed version of a
// block (it has a resourceVersion), and is used only while it is newer
// than what the informer holds: the informer's copy of the block, or, for
// a block the informer does not have, every event the informer has seen
// (its last resourceVersion), so a hint never outlives a later write, such
// as a release, nor a deletion. A release or a failed ADD's undo through
// the agent is itself a newer hint.
type blockHints struct {
	mu sync.Mutex
	m  map[string]blockHint // block name -> newest hint
}

type blockHint struct {
	b  *tabbyv1.IPAMBlock
	rv uint64
}

// resourceVersion reads a resourceVersion as the number it is in
// Kubernetes (etcd's revision); false when it is not one.
func resourceVersion(s string) (uint64, bool) {
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil && v > 0
}

// observe keeps b unless a newer hint of it is kept already; false when b
// was not kept.
func (h *blockHints) observe(b *tabbyv1.IPAMBlock) bool {
	rv, ok := resourceVersion(b.ResourceVersion)
	if !ok || b.Name == "" {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if old, ok := h.m[b.Name]; ok && old.rv >= rv {
		return false
	}
	if h.m == nil {
		h.m = map[string]blockHint{}
	}
	h.m[b.Name] = blockHint{b: b, rv: rv}
	return true
}

// caughtUp is told of a block the informer now holds: it drops the hints
// that version supersedes, and says whether that version is exactly a
// hint's (a sync after the hint has it already).
func (h *blockHints) caughtUp(obj any) bool {
	b, ok := obj.(*tabbyv1.IPAMBlock)
	if !ok {
		return false
	}
	rv, ok := resourceVersion(b.ResourceVersion)
	if !ok {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	hint, ok := h.m[b.Name]
	if !ok || hint.rv > rv {
		return false
	}
	delete(h.m, b.Name)
	return hint.rv == rv
}

// overlay is the informer's blocks with the hints newer than them in
// their place, and the hinted blocks the informer has not seen created.
// Hints the informer has caught up with are dropped.
func (h *blockHints) overlay(blocks []*tabbyv1.IPAMBlock, lastSynced string) []*tabbyv1.IPAMBlock {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.m) == 0 {
		return blocks
	}
	last, _ := resourceVersion(lastSynced)
	seen := make(map[string]bool, len(h.m))
	for i, b := range blocks {
		hint, ok := h.m[b.Name]
		if !ok {
			continue
		}
		seen[b.Name] = true
		if rv, ok := resourceVersion(b.ResourceVersion); ok && rv >= hint.rv {
			delete(h.m, b.Name)
			continue
		}
		blocks[i] = hint.b
	}
	for name, hint := range h.m {
		if seen[name] {
			continue
		}
		if hint.rv <= last {
			// The informer has seen every event up to the hint and
			// does not hold the block: it was deleted since (or its
			// creation is on its way to the store, which triggers a
			// sync of its own).
			delete(h.m, name)
			continue
		}
		blocks = append(blocks, hint.b)
	}
	return blocks
}

// storeBlocks lists the blocks of an informer with the hints overlaid.
func (h *blockHints) storeBlocks(inf cache.SharedIndexInformer) []*tabbyv1.IPAMBlock {
	objs := inf.GetStore().List()
	out := make([]*tabbyv1.IPAMBlock, 0, len(objs)+1)
	for _, o := range objs {
		if b, ok := o.(*tabbyv1.IPAMBlock); ok {
			out = append(out, b)
		}
	}
	return h.overlay(out, inf.LastSyncResourceVersion())
}

// informerHas says whether an informer that holds held (nil: not the
// block) and has seen every event up to lastSynced has version b of a
// block already, or a later state of it: a hint of b would change no sync.
// A block it does not hold while it has seen past b was deleted since, or
// its creation is on its way to the store, which triggers a sync itself.
func informerHas(b, held *tabbyv1.IPAMBlock, lastSynced string) bool {
	rv, ok := resourceVersion(b.ResourceVersion)
	if !ok {
		return false
	}
	if held != nil {
		have, ok := resourceVersion(held.ResourceVersion)
		return ok && have >= rv
	}
	last, ok := resourceVersion(lastSynced)
	return ok && last >= rv
}

// ObserveBlock is told of a version of an IPAMBlock that this node's CNI
// agent wrote or read from the API server (cniagent.PolicyWaiter): while
// it is newer than the informer's, the syncs use it (blockHints), and it
// triggers one. A version the informer has already (a block the agent
// read, or a write whose watch event came first) triggers nothing: the
// informer's own event did.
func (c *Controller) ObserveBlock(b *tabbyv1.IPAMBlock) {
	if b == nil {
		return
	}
	var held *tabbyv1.IPAMBlock
	if o, ok, err := c.blocks.GetStore().GetByKey(b.Name); err == nil && ok {
		held, _ = o.(*tabbyv1.IPAMBlock)
	}
	if informerHas(b, held, c.blocks.LastSyncResourceVersion()) {
		return
	}
	if c.hints.observe(b) {
		c.markDirty()
	}
}
