package ipam

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
)

// Deferred is the outcome of one request of AssignDeferredBatch: what
// AssignDeferred returns for it.
type Deferred struct {
	Assigned []Assigned
	// Record writes the handle; nil when it was written already (see
	// AssignDeferred).
	Record func(context.Context) error
	Err    error
}

// AssignDeferredBatch is AssignDeferred for requests of one node that are
// waiting at once (a burst of pods starting on the node): those that one
// block of the node can serve get their addresses in a single write of
// that block, a compare-and-swap like any other, so each is answered only
// once its address is committed, and an address is never handed out twice.
// The others (a specific address, dual-stack, a new block to claim, a
// borrowed address, an error) go through AssignDeferred one by one
// afterwards. The outcomes are in the order of reqs.
func (m *IPAM) AssignDeferredBatch(ctx context.Context, reqs []Request) []Deferred {
	out := make([]Deferred, len(reqs))
	rest := make([]int, 0, len(reqs))
	for i := range reqs {
		rest = append(rest, i)
	}
	if len(reqs) > 1 {
		rest = m.assignTogether(ctx, reqs, out)
	}
	for _, i := range rest {
		out[i].Assigned, out[i].Record, out[i].Err = m.AssignDeferred(ctx, reqs[i])
	}
	return out
}

// batchable says whether a request may share a block write: one family,
// any free address, for the batch's node.
func batchable(r Request, node string) (family int, ok bool) {
	if r.HandleID == "" || r.Node != node || len(r.IPs) > 0 || r.IPv4 == r.IPv6 {
		return 0, false
	}
	if r.IPv6 {
		return 6, true
	}
	return 4, true
}

// batchMember is a request allocating in the batch's block.
type batchMember struct {
	i    int
	attr tabbyv1.AllocationAttribute
	ord  int
}

// assignTogether serves from one of the node's blocks, in one write, the
// requests of reqs that it can; it fills their outcomes in out and returns
// the indexes of the requests left for AssignDeferred. A write whose
// outcome is unknown (not a conflict) fails its requests: the caller
// releases their handles, as after a failed AssignDeferred.
func (m *IPAM) assignTogether(ctx context.Context, reqs []Request, out []Deferred) (rest []int) {
	node := reqs[0].Node
	family := 0
	var pending []int // batchable requests of the batch's family
	for i, r := range reqs {
		f, ok := batchable(r, node)
		if ok && family == 0 {
			family = f
		}
		if !ok || f != family {
			rest = append(rest, i)
			continue
		}
		pending = append(pending, i)
	}
	if len(pending) < 2 {
		return append(rest, pending...)
	}
	st := &assignState{req: reqs[pending[0]], nodeBlocksCached: true}
	if err := m.load(ctx, st); err != nil {
		// AssignDeferred meets (and reports) the same error.
		return append(rest, pending...)
	}
	// Each request's candidate pools; a request with none (or a pool the
	// cached list misses) goes alone.
	cands := map[int][]*pool{}
	var members []int
	for _, i := range pending {
		r := reqs[i]
		names := r.IPv4Pools
		if family == 6 {
			names = r.IPv6Pools
		}
		use := r.Use
		if use == "" {
			use = tabbyv1.UseWorkload
		}
		c, _, err := st.pools.candidates(family, names, use, st.node, node)
		if err != nil || len(c) == 0 {
			rest = append(rest, i)
			continue
		}
		cands[i] = c
		members = append(members, i)
	}
	// The block: the first of the node's blocks with room that the first
	// member may use, as AssignDeferred would pick for it; the members
	// that may not use it go alone.
	slot := -1
	for j, b := range st.nodeBlocks {
		if len(members) > 0 && poolOfBlock(cands[members[0]], b) != nil && !b.Spec.Deleted && freeCount(b) > 0 && blockOK(b) == nil {
			slot = j
			break
		}
	}
	if slot < 0 {
		return append(rest, members...)
	}
	b := st.nodeBlocks[slot]
	var in []int
	for _, i := range members {
		if poolOfBlock(cands[i], b) == nil {
			rest = append(rest, i)
			continue
		}
		in = append(in, i)
	}
	if len(in) < 2 {
		return append(rest, in...)
	}
	now := nowTime(m.now)
	for range maxRetries {
		if blockOK(b) != nil || b.Spec.Deleted || b.Spec.Affinity != affinityFor(node) {
			return append(rest, in...)
		}
		nb := b.DeepCopy()
		var got []batchMember
		var full []int
		for _, i := range in {
			r := reqs[i]
			use := r.Use
			if use == "" {
				use = tabbyv1.UseWorkload
			}
			attr := tabbyv1.AllocationAttribute{HandleID: r.HandleID, Use: use, Namespace: r.Namespace, Pod: r.Pod, Node: node, Timestamp: now}
			ord, ok := allocate(nb, attr)
			if !ok {
				full = append(full, i)
				continue
			}
			got = append(got, batchMember{i: i, attr: attr, ord: ord})
		}
		if len(got) == 0 {
			return append(rest, in...)
		}
		updated, err := m.ds.IPAMBlocks.Update(ctx, nb, metav1.UpdateOptions{})
		switch {
		case err == nil:
			m.observe(updated)
			p := poolOfBlock(cands[got[0].i], updated)
			for _, g := range got {
				st := &assignState{req: reqs[g.i]}
				st.add(p, updated, g.ord)
				r, assigned := reqs[g.i], st.assigned
				out[g.i] = Deferred{
					Assigned: []Assigned{assigned[0].Assigned},
					Record: func(ctx context.Context) error {
						return m.recordHandle(ctx, r.HandleID, r.Node, assigned)
					},
				}
			}
			m.log.Debug("assigned together", "block", updated.Spec.CIDR, "node", node, "requests", len(got))
			return append(rest, full...)
		case apierrors.IsConflict(err):
			fresh, gerr := m.ds.IPAMBlocks.Get(ctx, b.Name, metav1.GetOptions{})
			if gerr != nil {
				return append(rest, in...)
			}
			m.observe(fresh)
			b = fresh
		case apierrors.IsNotFound(err):
			return append(rest, in...)
		default:
			// The write may have been committed: its requests fail (and
			// their handles are released); the others go alone.
			err = wrapDS(m.ds, fmt.Errorf("allocating in block %s: %w", b.Name, err))
			for _, g := range got {
				out[g.i].Err = err
			}
			return append(rest, full...)
		}
	}
	return append(rest, in...)
}
