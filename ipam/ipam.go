// Package ipam is tabby's block allocator on the Kubernetes API: IPPools are
// carved into blocks, a node claims blocks (BlockAffinity + IPAMBlock) and
// hands out their addresses to its pods, claiming a new block when its blocks
// are full and borrowing from other nodes' blocks when no block is free
// (unless strict affinity is on). Every write that can race is a
// compare-and-swap on resourceVersion, retried on conflict; an IPAMHandle
// records what one attachment holds so that releasing it is idempotent.
package ipam

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
)

// maxRetries bounds compare-and-swap retries on one object.
const maxRetries = 32

// IPAM allocates and releases addresses.
type IPAM struct {
	ds  *datastore.Client
	src Source
	log *slog.Logger
	now func() time.Time

	// The pool list is shared by calls that run close together (the CNI
	// plugin works out the MTU from the pools while it assigns addresses).
	poolsOnce singleflight.Group
	poolsMu   sync.Mutex
	pools     []tabbyv1.IPPool
	poolsAt   time.Time
	poolsTTL  time.Duration
}

// listPools returns every IPPool; concurrent calls share one list, and with
// WithPoolListReuse a list is reused for a while.
func (m *IPAM) listPools(ctx context.Context) ([]tabbyv1.IPPool, error) {
	m.poolsMu.Lock()
	if m.pools != nil && m.now().Sub(m.poolsAt) < m.poolsTTL {
		defer m.poolsMu.Unlock()
		return m.pools, nil
	}
	m.poolsMu.Unlock()
	v, err, _ := m.poolsOnce.Do("pools", func() (any, error) {
		l, err := m.src.Pools(ctx)
		if err != nil {
			return nil, wrapDS(m.ds, fmt.Errorf("listing IP pools: %w", err))
		}
		m.poolsMu.Lock()
		m.pools, m.poolsAt = l, m.now()
		m.poolsMu.Unlock()
		return l, nil
	})
	if err != nil {
		return nil, err
	}
	return v.([]tabbyv1.IPPool), nil
}

// Option configures an IPAM.
type Option func(*IPAM)

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(m *IPAM) { m.log = l } }

// WithPoolListReuse reuses a list of the pools for ttl. A short-lived caller
// such as the CNI plugin, which reads the pools for the MTU and again to
// assign, saves a request; pools change rarely, and a list a second old is
// no staler than the watch cache it came from.
func WithPoolListReuse(ttl time.Duration) Option { return func(m *IPAM) { m.poolsTTL = ttl } }

// New returns an allocator working on the datastore.
func New(ds *datastore.Client, opts ...Option) *IPAM {
	m := &IPAM{ds: ds, log: slog.New(slog.DiscardHandler), now: time.Now}
	for _, o := range opts {
		o(m)
	}
	if m.src == nil {
		m.src = APISource(ds)
	}
	return m
}

// ErrExhausted is wrapped by errors of a request no pool could satisfy.
var ErrExhausted = errors.New("no address available")

// assignState caches what one Assign call read, so each object is listed
// at most once per call.
type assignState struct {
	req        Request
	attr       tabbyv1.AllocationAttribute
	pools      *poolSet
	poolList   []tabbyv1.IPPool
	node       *corev1.Node
	nodeBlocks []*tabbyv1.IPAMBlock // blocks affine to the node
	// nodeBlocksCached: nodeBlocks came from the watch cache (maybe stale).
	nodeBlocksCached bool
	// consistentPools: the pool list is a consistent read, not the watch
	// cache's (assign looks again that way when a pool seems missing).
	consistentPools bool
	allBlocks       []*tabbyv1.IPAMBlock // nil until needed
	config          *tabbyv1.IPAMConfigurationSpec
	assigned        []assignedRef
}

type assignedRef struct {
	Assigned
	seq uint64
	// own: the address lies in a block affine to the requesting node.
	own bool
}

// Assign hands out the addresses a request asks for and records them under
// its handle. On any error nothing stays assigned.
func (m *IPAM) Assign(ctx context.Context, req Request) ([]Assigned, error) {
	out, _, err := m.assign(ctx, req, false)
	return out, err
}

// AssignDeferred is Assign that may leave writing the handle (IPAMHandle) to
// the caller: when every address came from the node's own blocks it returns
// record, which the caller must run, e.g. after answering. Until it has run,
// the allocation is found through the blocks alone: each allocation carries
// its handle, ReleaseHandle and HandleIPsOnNode search the node's blocks
// when the handle object is missing, and NodeHandles reads the blocks too,
// so a caller that dies before recording leaks nothing. Addresses from other
// nodes' blocks (borrowed, or requested by address) are recorded before it
// returns, and record is nil.
func (m *IPAM) AssignDeferred(ctx context.Context, req Request) (_ []Assigned, record func(context.Context) error, _ error) {
	return m.assign(ctx, req, true)
}

func (m *IPAM) assign(ctx context.Context, req Request, mayDefer bool) (_ []Assigned, record func(context.Context) error, _ error) {
	if req.HandleID == "" || req.Node == "" {
		return nil, nil, errors.New("ipam: a request needs a handle ID and a node name")
	}
	if !req.IPv4 && !req.IPv6 && len(req.IPs) == 0 {
		return nil, nil, errors.New("ipam: the request asks for no address family: enable assignIPv4 or assignIPv6")
	}
	if req.Use == "" {
		req.Use = tabbyv1.UseWorkload
	}
	var st *assignState
	var err error
	for consistent := false; ; consistent = true {
		st = &assignState{req: req, attr: tabbyv1.AllocationAttribute{
			HandleID: req.HandleID, Use: req.Use, Namespace: req.Namespace, Pod: req.Pod, Node: req.Node,
			Timestamp: nowTime(m.now),
		}}
		st.nodeBlocksCached = true
		st.consistentPools = consistent
		if err := m.load(ctx, st); err != nil {
			return nil, nil, err
		}
		err = m.assignAll(ctx, st)
		// The pool list came from the watch cache, which may be a moment
		// behind: a pool created just now may be missing. Look again at a
		// consistent list before saying so.
		var missing poolMissingError
		if consistent || !errors.As(err, &missing) {
			break
		}
		if rerr := m.undo(ctx, st); rerr != nil {
			break
		}
	}
	deferred := mayDefer && err == nil && len(st.assigned) > 0
	for _, a := range st.assigned {
		deferred = deferred && a.own
	}
	if err == nil && !deferred {
		err = m.recordHandle(ctx, req.HandleID, req.Node, st.assigned)
	}
	if err != nil {
		if rerr := m.undo(ctx, st); rerr != nil {
			return nil, nil, fmt.Errorf("%w (and releasing what was assigned failed: %v; tabbyctl ipam check will find it)", err, rerr)
		}
		return nil, nil, err
	}
	out := make([]Assigned, len(st.assigned))
	for i, a := range st.assigned {
		out[i] = a.Assigned
	}
	if deferred {
		assigned := st.assigned
		record = func(ctx context.Context) error { return m.recordHandle(ctx, req.HandleID, req.Node, assigned) }
	}
	return out, record, nil
}

// load reads the pools and the node's blocks concurrently.
func (m *IPAM) load(ctx context.Context, st *assignState) error {
	var wg sync.WaitGroup
	var poolErr, blockErr error
	wg.Add(2)
	go func() {
		defer wg.Done()
		if st.consistentPools {
			var l *tabbyv1.IPPoolList
			if l, poolErr = m.ds.IPPools.List(ctx, metav1.ListOptions{}); poolErr == nil {
				st.poolList = l.Items
			} else {
				poolErr = wrapDS(m.ds, fmt.Errorf("listing IP pools: %w", poolErr))
			}
			return
		}
		st.poolList, poolErr = m.listPools(ctx)
	}()
	go func() {
		defer wg.Done()
		st.nodeBlocks, blockErr = m.nodeBlocks(ctx, st.req.Node, true)
		blockErr = wrapDS(m.ds, blockErr)
	}()
	wg.Wait()
	if err := errors.Join(poolErr, blockErr); err != nil {
		return err
	}
	st.pools = newPoolSet(st.poolList)
	if needsNode(st.poolList) {
		// An unregistered node (nil) matches only pools without a selector.
		n, err := m.src.Node(ctx, st.req.Node)
		if err != nil {
			return wrapDS(m.ds, fmt.Errorf("reading node %s for the pools' nodeSelectors: %w", st.req.Node, err))
		}
		st.node = n
	}
	return nil
}

// poolMissingError is an error that a pool missing from the pool list
// explains: when the list came from the watch cache, assign looks again at
// a consistent one before returning it.
type poolMissingError struct{ err error }

func (e poolMissingError) Error() string { return e.err.Error() }
func (e poolMissingError) Unwrap() error { return e.err }

// cached list options read from the API server's watch cache. A consistent
// list waits for the cache to catch up with etcd (tens of milliseconds), which
// would dominate a CNI ADD. Reading slightly stale lists is safe here because
// every write is a compare-and-swap: a stale block fails its update and is
// re-read. Decisions that a stale list could make wrongly (claiming another
// block when the node's blocks look full) re-check with a consistent list.
var cached = metav1.ListOptions{ResourceVersion: "0"}

// nodeBlocks lists the blocks affine to a node: from the Source (maybe
// stale) when fromCache is set, else with a consistent list from the API
// server. The slice is the caller's; the blocks are shared.
func (m *IPAM) nodeBlocks(ctx context.Context, node string, fromCache bool) ([]*tabbyv1.IPAMBlock, error) {
	var l []*tabbyv1.IPAMBlock
	var err error
	if fromCache {
		l, err = m.src.NodeBlocks(ctx, node)
	} else {
		l, err = listBlocks(ctx, m.ds, metav1.ListOptions{LabelSelector: nodeSelector(node)})
	}
	if err != nil {
		return nil, fmt.Errorf("listing the blocks of node %s: %w", node, err)
	}
	var out []*tabbyv1.IPAMBlock
	for _, b := range l {
		if !fromCache {
			m.observe(b)
		}
		if b.Spec.Affinity == affinityFor(node) {
			out = append(out, b)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (m *IPAM) allBlocks(ctx context.Context, st *assignState) ([]*tabbyv1.IPAMBlock, error) {
	if st.allBlocks != nil {
		return st.allBlocks, nil
	}
	// From the Source: a block it misses fails to be created again
	// (AlreadyExists) and the claim moves on to the next free one.
	l, err := m.src.AllBlocks(ctx)
	if err != nil {
		return nil, wrapDS(m.ds, fmt.Errorf("listing all blocks: %w", err))
	}
	st.allBlocks = append(make([]*tabbyv1.IPAMBlock, 0, len(l)), l...)
	return st.allBlocks, nil
}

func (m *IPAM) ipamConfig(ctx context.Context, st *assignState) (*tabbyv1.IPAMConfigurationSpec, error) {
	if st.config != nil {
		return st.config, nil
	}
	c, err := m.src.IPAMConfig(ctx)
	switch {
	case err != nil:
		return nil, wrapDS(m.ds, fmt.Errorf("reading IPAMConfiguration %s: %w", tabbyv1.IPAMConfigurationName, err))
	case c == nil:
		st.config = &tabbyv1.IPAMConfigurationSpec{MaxBlocksPerHost: tabbyv1.DefaultMaxBlocksPerHost}
	default:
		st.config = &c.Spec
	}
	return st.config, nil
}

func (m *IPAM) assignAll(ctx context.Context, st *assignState) error {
	if len(st.req.IPs) > 0 {
		for _, ip := range st.req.IPs {
			if err := m.assignSpecific(ctx, st, ip); err != nil {
				return err
			}
		}
		return nil
	}
	var families []int
	if st.req.IPv4 {
		families = append(families, 4)
	}
	if st.req.IPv6 {
		families = append(families, 6)
	}
	for _, f := range families {
		if err := m.assignFamily(ctx, st, f); err != nil {
			if len(families) == 2 && len(st.assigned) > 0 {
				return fmt.Errorf("dual-stack request got an IPv%d address but no IPv%d address, so it was released: %w", 10-f, f, err)
			}
			return err
		}
	}
	return nil
}

// assignFamily gives one address of a family: from the node's own blocks,
// else from a newly claimed block, else borrowed from another node's block.
func (m *IPAM) assignFamily(ctx context.Context, st *assignState, family int) error {
	names := st.req.IPv4Pools
	if family == 6 {
		names = st.req.IPv6Pools
	}
	cands, excluded, err := st.pools.candidates(family, names, st.req.Use, st.node, st.req.Node)
	if err != nil {
		return fmt.Errorf("no IPv%d address for %s: %w", family, st.who(), err)
	}
	if len(cands) == 0 {
		return poolMissingError{fmt.Errorf("%w: no usable IPv%d pool for %s on node %s%s: create an IPPool that this node may use",
			ErrExhausted, family, st.who(), st.req.Node, joinReasons(excluded))}
	}
	// 1. The node's own blocks, in the candidate pools. The list came from
	// the watch cache; before claiming another block, look again at a
	// consistent list, so a block claimed moments ago is not missed.
	for fresh := false; ; fresh = true {
		ok, err := m.fromNodeBlocks(ctx, st, cands)
		if err != nil || ok {
			return err
		}
		if fresh || !st.nodeBlocksCached {
			break
		}
		if st.nodeBlocks, err = m.nodeBlocks(ctx, st.req.Node, false); err != nil {
			return wrapDS(m.ds, err)
		}
		st.nodeBlocksCached = false
	}
	// 2. Claim a new block.
	cfg, err := m.ipamConfig(ctx, st)
	if err != nil {
		return err
	}
	limitReached := cfg.MaxBlocksPerHost > 0 && len(st.nodeBlocks) >= cfg.MaxBlocksPerHost
	if !limitReached {
		ok, err := m.claimAndAssign(ctx, st, cands)
		if err != nil || ok {
			return err
		}
	}
	// 3. Borrow.
	if !cfg.StrictAffinity {
		ok, err := m.borrow(ctx, st, cands)
		if err != nil || ok {
			return err
		}
	}
	return m.exhausted(ctx, st, family, cands, excluded, cfg, limitReached)
}

func (m *IPAM) fromNodeBlocks(ctx context.Context, st *assignState, cands []*pool) (bool, error) {
	for i, b := range st.nodeBlocks {
		p := poolOfBlock(cands, b)
		if p == nil || b.Spec.Deleted || freeCount(b) == 0 {
			continue
		}
		ok, err := m.allocateIn(ctx, st, p, &st.nodeBlocks[i], func(b *tabbyv1.IPAMBlock) bool { return b.Spec.Affinity == affinityFor(st.req.Node) })
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

func (st *assignState) who() string {
	if st.req.Pod != "" {
		return "pod " + st.req.Namespace + "/" + st.req.Pod
	}
	return "handle " + st.req.HandleID
}

func poolOfBlock(cands []*pool, b *tabbyv1.IPAMBlock) *pool {
	p, err := blockPrefix(b)
	if err != nil {
		return nil
	}
	for _, c := range cands {
		if c.prefix.Contains(p.Addr()) && p.Bits() == c.blocks.size {
			return c
		}
	}
	return nil
}

// allocateIn takes the next free address of the block in *slot with
// compare-and-swap, re-reading the block on conflict; *slot ends up holding
// the latest version seen (the block itself is never modified: it may be a
// Source's). It reports false when the block turned out full or no longer
// acceptable.
func (m *IPAM) allocateIn(ctx context.Context, st *assignState, p *pool, slot **tabbyv1.IPAMBlock, acceptable func(*tabbyv1.IPAMBlock) bool) (bool, error) {
	b := *slot
	for range maxRetries {
		if err := blockOK(b); err != nil {
			m.log.Warn("skipping corrupted block", "block", b.Name, "err", err)
			return false, nil
		}
		if b.Spec.Deleted || freeCount(b) == 0 || !acceptable(b) {
			return false, nil
		}
		nb := b.DeepCopy()
		ord, ok := allocate(nb, st.attr)
		if !ok {
			return false, nil
		}
		updated, err := m.ds.IPAMBlocks.Update(ctx, nb, metav1.UpdateOptions{})
		switch {
		case err == nil:
			m.observe(updated)
			*slot = updated
			st.add(p, updated, ord)
			return true, nil
		case apierrors.IsConflict(err):
			fresh, gerr := m.ds.IPAMBlocks.Get(ctx, b.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(gerr) {
				return false, nil
			}
			if gerr != nil {
				return false, wrapDS(m.ds, fmt.Errorf("re-reading block %s: %w", b.Name, gerr))
			}
			m.observe(fresh)
			b, *slot = fresh, fresh
		case apierrors.IsNotFound(err):
			return false, nil
		default:
			return false, wrapDS(m.ds, fmt.Errorf("allocating in block %s: %w", b.Name, err))
		}
	}
	return false, fmt.Errorf("block %s kept changing under %d attempts to allocate from it; try again", b.Name, maxRetries)
}

func (st *assignState) add(p *pool, b *tabbyv1.IPAMBlock, ord int) {
	pfx, _ := blockPrefix(b)
	seq, _ := sequenceOf(b, ord)
	st.assigned = append(st.assigned, assignedRef{
		Assigned: Assigned{IP: net.IP(addrAt(pfx, ord).AsSlice()), Pool: p.obj, Block: prefixToIPNet(pfx)},
		seq:      seq,
		own:      b.Spec.Affinity == affinityFor(st.req.Node),
	})
}

// claimAndAssign claims a free block of the first candidate pool that has
// one, with this request's address already allocated in it.
func (m *IPAM) claimAndAssign(ctx context.Context, st *assignState, cands []*pool) (bool, error) {
	all, err := m.allBlocks(ctx, st)
	if err != nil {
		return false, err
	}
	used := map[netip.Prefix]bool{}
	for _, b := range all {
		if p, err := blockPrefix(b); err == nil {
			used[p] = true
		}
	}
	for _, p := range cands {
		for attempt := 0; attempt < maxRetries; attempt++ {
			free := p.blocks.freeBlocks(st.req.Node, used, 1)
			if len(free) == 0 {
				break
			}
			blk, err := m.claim(ctx, p, free[0], st.req.Node, func(b *tabbyv1.IPAMBlock) (int, bool) { return allocate(b, st.attr) })
			if errors.Is(err, errBlockTaken) {
				used[free[0]] = true
				continue
			}
			if err != nil {
				return false, err
			}
			st.nodeBlocks = append(st.nodeBlocks, blk.block)
			st.add(p, blk.block, blk.ord)
			return true, nil
		}
	}
	return false, nil
}

var errBlockTaken = errors.New("block taken by another node")

type claimed struct {
	block *tabbyv1.IPAMBlock
	ord   int
}

// claim makes block pfx of pool p the node's: a pending BlockAffinity, then
// the IPAMBlock itself (created with the first allocation already in it, so
// the claim costs no extra write), then the affinity confirmed. Creating the
// block is the atomic step: if another node created it first, the claim
// backs out and reports errBlockTaken.
func (m *IPAM) claim(ctx context.Context, p *pool, pfx netip.Prefix, node string, alloc func(*tabbyv1.IPAMBlock) (int, bool)) (*claimed, error) {
	aff := &tabbyv1.BlockAffinity{
		ObjectMeta: metav1.ObjectMeta{
			Name:   affinityObjectName(node, pfx),
			Labels: map[string]string{tabbyv1.LabelNode: NodeLabelValue(node), tabbyv1.LabelPool: p.obj.Name},
		},
		Spec: tabbyv1.BlockAffinitySpec{State: tabbyv1.AffinityPending, Node: node, CIDR: pfx.String()},
	}
	createdAff, err := m.ds.BlockAffinities.Create(ctx, aff, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// Left over from an earlier claim by this node that did not finish.
		createdAff, err = m.ds.BlockAffinities.Get(ctx, aff.Name, metav1.GetOptions{})
	}
	if err != nil {
		return nil, wrapDS(m.ds, fmt.Errorf("claiming block %s for node %s: %w", pfx, node, err))
	}
	blk := newBlock(pfx, p.obj.Name, node)
	ord, ok := alloc(blk)
	if !ok {
		return nil, fmt.Errorf("block %s cannot hold the requested address", pfx)
	}
	created, err := m.ds.IPAMBlocks.Create(ctx, blk, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		existing, gerr := m.ds.IPAMBlocks.Get(ctx, blk.Name, metav1.GetOptions{})
		if gerr == nil {
			m.observe(existing)
		}
		if gerr == nil && existing.Spec.Affinity == affinityFor(node) {
			// Ours from an earlier unfinished claim: allocate in it normally.
			m.confirm(ctx, createdAff)
			return nil, errBlockTaken
		}
		m.deleteAffinity(ctx, createdAff)
		return nil, errBlockTaken
	}
	if err != nil {
		m.deleteAffinity(ctx, createdAff)
		return nil, wrapDS(m.ds, fmt.Errorf("creating block %s for node %s: %w", pfx, node, err))
	}
	m.observe(created)
	m.confirm(ctx, createdAff)
	m.log.Info("claimed block", "block", pfx.String(), "node", node, "pool", p.obj.Name)
	return &claimed{block: created, ord: ord}, nil
}

// confirm marks an affinity confirmed. The block's own affinity field is the
// truth, so a failure here only leaves the affinity pending for the next
// claim or a check to finish.
func (m *IPAM) confirm(ctx context.Context, aff *tabbyv1.BlockAffinity) {
	if aff.Spec.State == tabbyv1.AffinityConfirmed {
		return
	}
	a := aff.DeepCopy()
	a.Spec.State = tabbyv1.AffinityConfirmed
	if _, err := m.ds.BlockAffinities.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		m.log.Warn("could not confirm block affinity", "affinity", aff.Name, "err", err)
	}
}

// deleteAffinity removes an affinity only if nobody changed it since we read
// it (UID and resourceVersion preconditions).
func (m *IPAM) deleteAffinity(ctx context.Context, aff *tabbyv1.BlockAffinity) {
	uid, rv := aff.UID, aff.ResourceVersion
	err := m.ds.BlockAffinities.Delete(ctx, aff.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	if err != nil && !apierrors.IsNotFound(err) {
		m.log.Warn("could not remove block affinity", "affinity", aff.Name, "err", err)
	}
}

// borrow takes an address from any block of the candidate pools with room,
// preferring blocks with no affinity.
func (m *IPAM) borrow(ctx context.Context, st *assignState, cands []*pool) (bool, error) {
	all, err := m.allBlocks(ctx, st)
	if err != nil {
		return false, err
	}
	var order []int // indexes into all
	for i, b := range all {
		if b.Spec.Affinity != affinityFor(st.req.Node) && freeCount(b) > 0 && !b.Spec.Deleted && poolOfBlock(cands, b) != nil {
			order = append(order, i)
		}
	}
	sort.SliceStable(order, func(i, j int) bool { return freeCount(all[order[i]]) > freeCount(all[order[j]]) })
	for _, i := range order {
		b := all[i]
		ok, err := m.allocateIn(ctx, st, poolOfBlock(cands, b), &all[i], func(*tabbyv1.IPAMBlock) bool { return true })
		if err != nil {
			return false, err
		}
		if ok {
			m.log.Info("borrowed an address", "block", b.Spec.CIDR, "owner", b.Spec.Affinity, "node", st.req.Node)
			return true, nil
		}
	}
	return false, nil
}

// exhausted explains why nothing could be assigned: the pools tried and how
// full they are, the per-node limit, and whether borrowing was allowed.
func (m *IPAM) exhausted(ctx context.Context, st *assignState, family int, cands []*pool, excluded []string, cfg *tabbyv1.IPAMConfigurationSpec, limitReached bool) error {
	all, _ := m.allBlocks(ctx, st)
	var parts []string
	for _, p := range cands {
		var claimedBlocks, used, capacity int
		for _, b := range all {
			if poolOfBlock([]*pool{p}, b) != nil {
				claimedBlocks++
				used += inUse(b)
			}
		}
		capStr := p.blocks.count.String()
		if p.blocks.count.IsInt64() && p.blocks.count.Int64() < 1<<20 {
			capacity = int(p.blocks.count.Int64()) * blockSize(netip.PrefixFrom(p.prefix.Addr(), p.blocks.size))
			capStr = fmt.Sprintf("%s blocks of /%d, %d addresses", p.blocks.count, p.blocks.size, capacity)
		}
		parts = append(parts, fmt.Sprintf("pool %s: %d blocks claimed of %s, %d addresses in use", p.describe(), claimedBlocks, capStr, used))
	}
	msg := fmt.Sprintf("no IPv%d address for %s on node %s: tried %s", family, st.who(), st.req.Node, strings.Join(parts, "; "))
	if limitReached {
		msg += fmt.Sprintf("; node %s already holds %d blocks, the limit (IPAMConfiguration maxBlocksPerHost=%d)", st.req.Node, len(st.nodeBlocks), cfg.MaxBlocksPerHost)
	}
	if cfg.StrictAffinity {
		msg += "; borrowing from other nodes' blocks is off (IPAMConfiguration strictAffinity)"
	}
	msg += joinReasons(excluded)
	msg += ". Free leaked addresses (tabbyctl ipam check), add a pool or enlarge one"
	if limitReached {
		msg += ", or raise maxBlocksPerHost"
	}
	return fmt.Errorf("%w: %s", ErrExhausted, msg)
}

// assignSpecific assigns one exact address, claiming its block for the node
// when nobody has it yet.
func (m *IPAM) assignSpecific(ctx context.Context, st *assignState, ip net.IP) error {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return fmt.Errorf("requested address %v is not an IP address", ip)
	}
	a = a.Unmap()
	p := st.pools.containing(a)
	if p == nil {
		return poolMissingError{fmt.Errorf("requested address %s (%s) is in no IP pool: create a pool that contains it", a, tabbyv1.AnnotationIPAddrs)}
	}
	if p.obj.Spec.Disabled {
		return fmt.Errorf("requested address %s is in pool %s, which is disabled", a, p.describe())
	}
	if !p.obj.AllowsUse(st.req.Use) {
		return fmt.Errorf("requested address %s is in pool %s, which does not allow use %s", a, p.describe(), st.req.Use)
	}
	bp := p.blocks.blockFor(a)
	ord, _ := ordinalOf(bp, a)
	for range maxRetries {
		b, err := m.ds.IPAMBlocks.Get(ctx, BlockName(bp), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			c, cerr := m.claim(ctx, p, bp, st.req.Node, func(b *tabbyv1.IPAMBlock) (int, bool) {
				return ord, allocateOrdinal(b, ord, st.attr)
			})
			if errors.Is(cerr, errBlockTaken) {
				continue
			}
			if cerr != nil {
				return cerr
			}
			st.add(p, c.block, c.ord)
			return nil
		}
		if err != nil {
			return wrapDS(m.ds, fmt.Errorf("reading block %s: %w", bp, err))
		}
		m.observe(b)
		if err := blockOK(b); err != nil {
			return err
		}
		if h := attributeOf(b, ord); h != nil {
			holder := h.HandleID
			if h.Pod != "" {
				holder = fmt.Sprintf("pod %s/%s (handle %s)", h.Namespace, h.Pod, h.HandleID)
			}
			return fmt.Errorf("requested address %s is already in use by %s", a, holder)
		}
		if b.Spec.Deleted {
			return fmt.Errorf("requested address %s is in block %s, which is being deleted; try again", a, bp)
		}
		nb := b.DeepCopy()
		allocateOrdinal(nb, ord, st.attr)
		updated, err := m.ds.IPAMBlocks.Update(ctx, nb, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return wrapDS(m.ds, fmt.Errorf("allocating %s in block %s: %w", a, bp, err))
		}
		m.observe(updated)
		st.add(p, updated, ord)
		return nil
	}
	return fmt.Errorf("block %s kept changing under %d attempts to allocate %s; try again", bp, maxRetries, a)
}

// undo releases what a failed Assign had taken, by sequence number so a
// concurrent reuse is never freed.
func (m *IPAM) undo(ctx context.Context, st *assignState) error {
	if len(st.assigned) == 0 {
		return nil
	}
	// Use a fresh context: the request's may be what expired.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), datastore.Timeout)
	defer cancel()
	var opts []ReleaseOptions
	for _, a := range st.assigned {
		seq := a.seq
		opts = append(opts, ReleaseOptions{IP: a.IP, HandleID: st.req.HandleID, SequenceNumber: &seq})
	}
	_, err := m.releaseIPs(ctx, opts, false)
	st.assigned = nil
	return err
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// wrapDS adds what to check when the API server is unreachable.
func wrapDS(ds *datastore.Client, err error) error {
	if datastore.IsUnreachable(err) {
		return datastore.Unreachable(ds.Host(), err)
	}
	return err
}
