package netpol

import (
	"strconv"
	"sync"

	"k8s.io/client-go/tools/cache"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/ipam"
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

// addressClaims are the claims the agent made and has not withdrawn. A
// claim changes a sync's input only while the block (the informer's, or a
// newer hint) still records Holder at its ordinal: once the block has the
// transfer, or anything else at that address, the block wins.
type addressClaims struct {
	mu sync.Mutex
	m  map[string]map[int]ipam.AddressClaim // block name -> ordinal -> claim
}

func (c *addressClaims) add(cl []ipam.AddressClaim) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]map[int]ipam.AddressClaim{}
	}
	for _, x := range cl {
		if c.m[x.Block] == nil {
			c.m[x.Block] = map[int]ipam.AddressClaim{}
		}
		c.m[x.Block][x.Ord] = x
	}
}

func (c *addressClaims) remove(cl []ipam.AddressClaim) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, x := range cl {
		if cur, ok := c.m[x.Block][x.Ord]; ok && cur.Holder == x.Holder && cur.Attr.HandleID == x.Attr.HandleID {
			delete(c.m[x.Block], x.Ord)
			if len(c.m[x.Block]) == 0 {
				delete(c.m, x.Block)
			}
		}
	}
}

// apply puts the claims that still hold into copies of their blocks (the
// blocks themselves are shared with the informer and are not modified).
func (c *addressClaims) apply(blocks []*tabbyv1.IPAMBlock) []*tabbyv1.IPAMBlock {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) == 0 {
		return blocks
	}
	for i, b := range blocks {
		cl := c.m[b.Name]
		var cp *tabbyv1.IPAMBlock
		for ord, x := range cl {
			if ord < 0 || ord >= len(b.Spec.Allocations) {
				continue
			}
			idx := b.Spec.Allocations[ord]
			if idx < 0 || idx >= len(b.Spec.Attributes) || b.Spec.Attributes[idx].HandleID != x.Holder {
				continue
			}
			if cp == nil {
				cp = b.DeepCopy()
			}
			cp.Spec.Attributes = append(cp.Spec.Attributes, x.Attr)
			cp.Spec.Allocations[ord] = len(cp.Spec.Attributes) - 1
		}
		if cp != nil {
			blocks[i] = cp
		}
	}
	return blocks
}

// ObserveClaims is told by this node's CNI agent that it handed spare
// addresses to a pod (ipam.AddressClaim); the next sync programs the pod with
// them, before the block records them as the pod's.
func (c *Controller) ObserveClaims(cl []ipam.AddressClaim) {
	if len(cl) == 0 {
		return
	}
	c.claims.add(cl)
	c.markDirty()
}

// ForgetClaims withdraws claims: the block records the transfer now (its
// version was handed over with ObserveBlock first), or the pod was deleted
// before it.
func (c *Controller) ForgetClaims(cl []ipam.AddressClaim) {
	if len(cl) == 0 {
		return
	}
	c.claims.remove(cl)
	c.markDirty()
}
