// Package gc is tabby's IPAM garbage collector: it frees what CNI DEL and
// node removal left behind, and never an address in use.
//
// One instance in the cluster is active: every tabbyd runs RunElected, and
// the holder of a coordination.k8s.io Lease (DefaultLeaseName, in tabbyd's
// namespace) runs the passes. A pass reads its informer caches, works out
// the candidates with the pure Compute (plan.go), and acts on those that
// are due:
//
//   - An allocation whose pod is gone, has finished, or runs in a newer
//     sandbox (Running, its status lists the address of a newer allocation
//     of the same pod and network, not this one; never a pod whose status
//     lists no address yet) is a candidate (Judge). A tunnel address, or
//     one without pod identity, is its node's: a candidate only once the
//     node is gone.
//   - A candidate is due once this collector has seen it a candidate
//     continuously for the grace period and its allocation timestamp is at
//     least that old; a collector that just started, or just became
//     leader, waits a full grace period. An address allocated for a pod
//     the API server does not know yet is young, so never due.
//   - Just before a release the pod (or node) is read again from the API
//     server (a GET, not the cache); only if that still makes it a
//     candidate is it released, with ipam.ReleaseInBlock: a compare-and-swap
//     on the block's resourceVersion that frees the ordinal only while it
//     is held by the same handle and sequence number. An address freed and
//     handed out again meanwhile is never taken.
//   - A deleted node's blocks: once their own allocations are released, an
//     empty block is deleted (any node may claim it again) and a block still
//     holding addresses other nodes' pods borrowed loses its affinity. Its
//     BlockAffinity records go with it.
//   - A live node's empty block is deleted once it has been empty for the
//     grace period, unless it is the node's last block of its pool (the
//     node keeps one, so the next pod does not wait for a claim). An
//     unaffined empty block is deleted after the grace period. Deletions
//     carry the block's UID and resourceVersion as preconditions, so a
//     block that got an address meanwhile stays.
//   - Records left by races are repaired after the grace period:
//     BlockAffinities whose block is gone or someone else's are removed,
//     blocks of live nodes with no BlockAffinity get one, IPAMHandles no
//     block refers to are removed.
//
// Two collectors running at once (a leader that lost its Lease mid-pass)
// are safe: every write is a compare-and-swap.
package gc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/loop"
	"github.com/tabbynet/tabby/ipam"
)

// Defaults, as Calico's kube-controllers (leakGracePeriod 15m).
const (
	// DefaultGrace is how long something must stay a candidate before it
	// is freed.
	DefaultGrace = 15 * time.Minute
	// DefaultInterval is the time between passes.
	DefaultInterval = time.Minute
	// DefaultLeaseName is the Lease the tabbyds elect the active collector with.
	DefaultLeaseName = "tabby-ipam-gc"
	// passTimeout bounds one pass.
	passTimeout = 2 * time.Minute
)

// Config configures a collector.
type Config struct {
	// DS reaches the API server (required).
	DS *datastore.Client
	// IPAM releases addresses (default ipam.New(DS)).
	IPAM *ipam.IPAM
	// Grace: how long an allocation, block or record must stay a candidate
	// before it is freed (default DefaultGrace). It must be longer than a
	// kubelet takes to report a new pod sandbox's addresses, and than the
	// clock skew between nodes.
	Grace time.Duration
	// Interval between passes in Run (default DefaultInterval).
	Interval time.Duration
	// Log (default: discard). Registerer receives the metrics (nil: none).
	Log        *slog.Logger
	Registerer prometheus.Registerer
	// Metrics, when set, are the collector's metrics instead of Registerer's.
	Metrics *Metrics
}

// GC is the garbage collector.
type GC struct {
	cfg  Config
	ds   *datastore.Client
	ipam *ipam.IPAM
	log  *slog.Logger
	met  *metrics
	now  func() time.Time

	mu   sync.Mutex // one pass at a time; guards seen and decided
	seen Seen
	// decided is the time the current pass judged its candidates by.
	decided time.Time

	passes  atomic.Uint64
	leading atomic.Bool
}

// New returns a collector.
func New(cfg Config) (*GC, error) {
	if cfg.DS == nil {
		return nil, errors.New("ipam gc: no datastore client")
	}
	if cfg.Grace < 0 || cfg.Interval < 0 {
		return nil, fmt.Errorf("ipam gc: grace (%v) and interval (%v) cannot be negative", cfg.Grace, cfg.Interval)
	}
	if cfg.Grace == 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.IPAM == nil {
		cfg.IPAM = ipam.New(cfg.DS, ipam.WithLogger(cfg.Log))
	}
	met := (*metrics)(nil)
	if cfg.Metrics != nil {
		met = cfg.Metrics.m
	} else {
		met = newMetrics(cfg.Registerer)
	}
	return &GC{cfg: cfg, ds: cfg.DS, ipam: cfg.IPAM, log: cfg.Log, met: met, now: time.Now, seen: Seen{}}, nil
}

// Passes is how many passes this collector has run.
func (g *GC) Passes() uint64 { return g.passes.Load() }

// Leading says whether this collector holds the Lease and runs passes
// (RunElected).
func (g *GC) Leading() bool { return g.leading.Load() }

// PassResult says what one pass did.
type PassResult struct {
	// Candidates: allocations that looked leaked; Due: those past the
	// grace period; Released: those released (the fresh read confirmed
	// them and the compare-and-swap went through).
	Candidates, Due, Released int
	// BlocksDeleted and BlocksUnaffined: blocks freed.
	BlocksDeleted, BlocksUnaffined int
	// Records repaired.
	AffinitiesRemoved, AffinitiesCreated, HandlesRemoved int
	// NextDue is when the next candidate becomes due (zero: none waits).
	NextDue time.Time
}

func (r PassResult) acted() bool {
	return r.Released+r.BlocksDeleted+r.BlocksUnaffined+r.AffinitiesRemoved+r.AffinitiesCreated+r.HandlesRemoved > 0
}

// Pass runs one pass reading everything straight from the API server
// (Run reads informer caches instead). Passes of one collector share its
// memory of candidates: something becomes due in the first pass that
// finds it a candidate for the grace period since an earlier pass did.
func (g *GC) Pass(ctx context.Context) (PassResult, error) {
	return g.pass(ctx, apiReader{g.ds})
}

func (g *GC) pass(ctx context.Context, r reader) (PassResult, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	start := time.Now()
	res, err := g.passLocked(ctx, r)
	g.met.passTime.Observe(time.Since(start).Seconds())
	if err != nil {
		g.met.passes.WithLabelValues("error").Inc()
	} else {
		g.met.passes.WithLabelValues("ok").Inc()
	}
	g.passes.Add(1)
	return res, err
}

func (g *GC) passLocked(ctx context.Context, r reader) (PassResult, error) {
	var res PassResult
	snap, err := r.snapshot(ctx)
	if err != nil {
		return res, wrapDS(g.ds, err)
	}
	g.decided = g.now()
	g.met.pools.set(PoolUsages(snap))
	plan, seen := Compute(snap, g.seen, g.decided, g.cfg.Grace)
	g.seen = seen
	res.NextDue = plan.NextDue
	res.Candidates = len(plan.Allocations)
	g.met.candidates.Set(float64(res.Candidates))
	errs := []error{
		g.releaseAllocations(ctx, plan.Allocations, HoldersOf(snap.Blocks), &res),
		g.freeBlocks(ctx, plan.Blocks, snap, &res),
		g.fixAffinities(ctx, plan.Affinities, snap, &res),
		g.removeHandles(ctx, plan.Handles, &res),
	}
	return res, errors.Join(errs...)
}

// releaseAllocations releases the due candidates that a fresh read of
// their pod (or node) confirms.
func (g *GC) releaseAllocations(ctx context.Context, cands []Candidate, holders Holders, res *PassResult) error {
	type owner struct{ handle, ns, pod, node string }
	groups := map[owner][]Candidate{}
	var order []owner
	for _, c := range cands {
		if !c.Due {
			continue
		}
		res.Due++
		o := owner{handle: c.Attr.HandleID}
		if k, ok := c.PodKey(); ok {
			o.ns, o.pod = k.Namespace, k.Name
		} else {
			o.node = c.Node()
		}
		if _, ok := groups[o]; !ok {
			order = append(order, o)
		}
		groups[o] = append(groups[o], c)
	}
	var errs []error
	for _, o := range order {
		// The fresh read: a GET from the API server, just before the release.
		var pod *corev1.Pod
		nodeExists := true
		if o.pod != "" {
			p, err := g.ds.Pods(o.ns).Get(ctx, o.pod, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				errs = append(errs, wrapDS(g.ds, fmt.Errorf("reading pod %s/%s before releasing its addresses: %w", o.ns, o.pod, err)))
				continue
			default:
				pod = p
			}
		} else {
			_, err := g.ds.Nodes.Get(ctx, o.node, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				nodeExists = false
			case err != nil:
				errs = append(errs, wrapDS(g.ds, fmt.Errorf("reading node %s before releasing its addresses: %w", o.node, err)))
				continue
			}
		}
		byBlock := map[netip.Prefix][]Candidate{}
		var blocks []netip.Prefix
		for _, c := range groups[o] {
			reason, ok := Judge(c.Allocation, pod, nodeExists, holders)
			if !ok {
				g.log.Debug("not releasing: the API server says the address is in use", "ip", c.IP, "handle", c.Attr.HandleID, "pod", o.ns+"/"+o.pod, "node", c.Node())
				delete(g.seen, c.key())
				continue
			}
			c.Reason = reason
			if _, seen := byBlock[c.CIDR]; !seen {
				blocks = append(blocks, c.CIDR)
			}
			byBlock[c.CIDR] = append(byBlock[c.CIDR], c)
		}
		for _, bp := range blocks {
			cs := byBlock[bp]
			opts := make([]ipam.ReleaseOptions, 0, len(cs))
			for _, c := range cs {
				ro := ipam.ReleaseOptions{IP: net.IP(c.IP.AsSlice()), HandleID: c.Attr.HandleID}
				if c.HasSequence {
					seq := c.Sequence
					ro.SequenceNumber = &seq
				}
				opts = append(opts, ro)
			}
			released, err := g.ipam.ReleaseInBlock(ctx, bp, opts)
			if err != nil {
				errs = append(errs, wrapDS(g.ds, fmt.Errorf("releasing leaked addresses of handle %s in block %s: %w", o.handle, bp, err)))
			}
			done := map[netip.Addr]bool{}
			for _, ip := range released {
				if a, ok := netip.AddrFromSlice(ip); ok {
					done[a.Unmap()] = true
				}
			}
			for _, c := range cs {
				if !done[c.IP] {
					g.log.Debug("not released: the address changed hands meanwhile", "ip", c.IP, "handle", c.Attr.HandleID)
					continue
				}
				delete(g.seen, c.key())
				res.Released++
				g.met.releases.WithLabelValues(string(c.Reason)).Inc()
				// To the millisecond: when it became a candidate and when
				// this pass found it due, which tells a release on time from
				// one a pass late whatever the API calls took since.
				g.log.Info("released a leaked address", "ip", c.IP, "block", bp, "handle", c.Attr.HandleID,
					"pod", podName(c.Attr), "node", c.Node(), "reason", c.Reason,
					"candidateSince", c.Since.Format(logTime), "decidedAt", g.decided.Format(logTime))
			}
		}
	}
	return errors.Join(errs...)
}

// logTime is RFC 3339 to the millisecond.
const logTime = "2006-01-02T15:04:05.000Z07:00"

func podName(a tabbyv1.AllocationAttribute) string {
	if a.Pod == "" {
		return ""
	}
	return a.Namespace + "/" + a.Pod
}

// freeBlocks deletes or unaffines the due blocks.
func (g *GC) freeBlocks(ctx context.Context, acts []BlockAction, snap *Snapshot, res *PassResult) error {
	pools := sortedPools(snap.Pools)
	var errs []error
	for _, a := range acts {
		if !a.Due {
			continue
		}
		var err error
		switch {
		case a.Kind == BlockNodeGone:
			err = g.freeNodeGoneBlock(ctx, a, snap, res)
		case a.Node == "":
			err = g.freeUnaffinedBlock(ctx, a, res)
		default:
			err = g.freeSpareBlock(ctx, a, snap, pools, res)
		}
		if err != nil {
			errs = append(errs, wrapDS(g.ds, err))
		}
	}
	return errors.Join(errs...)
}

// deleteBlock deletes a block if it is still exactly b (UID and
// resourceVersion): false when it changed or is gone.
func (g *GC) deleteBlock(ctx context.Context, b *tabbyv1.IPAMBlock) (bool, error) {
	uid, rv := b.UID, b.ResourceVersion
	err := g.ds.IPAMBlocks.Delete(ctx, b.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	switch {
	case err == nil:
		return true, nil
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		return false, nil
	default:
		return false, fmt.Errorf("deleting block %s: %w", b.Spec.CIDR, err)
	}
}

// freshBlock reads a block from the API server; nil when it is gone or is
// no longer the block the plan saw (another UID).
func (g *GC) freshBlock(ctx context.Context, seen *tabbyv1.IPAMBlock) (*tabbyv1.IPAMBlock, error) {
	b, err := g.ds.IPAMBlocks.Get(ctx, seen.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading block %s: %w", seen.Spec.CIDR, err)
	}
	if b.UID != seen.UID {
		return nil, nil
	}
	return b, nil
}

func (g *GC) nodeGone(ctx context.Context, node string) (bool, error) {
	_, err := g.ds.Nodes.Get(ctx, node, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("reading node %s: %w", node, err)
	}
	return false, nil
}

// freeNodeGoneBlock frees a block of a deleted node: deleted when empty;
// unaffined when all it still holds are other nodes' (borrowed) addresses;
// left alone while the node's own allocations remain (they are released
// first, as candidates).
func (g *GC) freeNodeGoneBlock(ctx context.Context, a BlockAction, snap *Snapshot, res *PassResult) error {
	gone, err := g.nodeGone(ctx, a.Node)
	if err != nil || !gone {
		return err
	}
	b, err := g.freshBlock(ctx, a.Block)
	if err != nil {
		return err
	}
	if b == nil {
		return g.removeAffinities(ctx, a.Node, a.Block.Spec.CIDR, snap)
	}
	if blockNode(b) != a.Node {
		return nil
	}
	if !blockOK(b) {
		g.log.Warn("a deleted node's block is corrupted: leaving it (tabbyctl ipam check)", "block", b.Spec.CIDR, "node", a.Node)
		return nil
	}
	as := Allocations(b)
	if len(as) == 0 {
		ok, err := g.deleteBlock(ctx, b)
		if err != nil || !ok {
			return err
		}
		res.BlocksDeleted++
		g.met.blocks.WithLabelValues(reclaimNodeDeleted).Inc()
		g.log.Info("freed a deleted node's block", "block", b.Spec.CIDR, "node", a.Node)
		return g.removeAffinities(ctx, a.Node, b.Spec.CIDR, snap)
	}
	for _, al := range as {
		if al.Node() == a.Node {
			return nil // the node's own allocations go first
		}
	}
	nb := b.DeepCopy()
	nb.Spec.Affinity = ""
	delete(nb.Labels, tabbyv1.LabelNode)
	_, err = g.ds.IPAMBlocks.Update(ctx, nb, metav1.UpdateOptions{})
	switch {
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("removing deleted node %s's affinity from block %s: %w", a.Node, b.Spec.CIDR, err)
	}
	res.BlocksUnaffined++
	g.met.blocks.WithLabelValues(reclaimUnaffined).Inc()
	g.log.Info("removed a deleted node's affinity from a block that other nodes' pods still use", "block", b.Spec.CIDR, "node", a.Node, "addresses", len(as))
	return g.removeAffinities(ctx, a.Node, b.Spec.CIDR, snap)
}

// freeUnaffinedBlock deletes an empty block that no node holds.
func (g *GC) freeUnaffinedBlock(ctx context.Context, a BlockAction, res *PassResult) error {
	b, err := g.freshBlock(ctx, a.Block)
	if err != nil || b == nil {
		return err
	}
	if b.Spec.Affinity != "" || !blockOK(b) || len(Allocations(b)) > 0 {
		return nil
	}
	ok, err := g.deleteBlock(ctx, b)
	if err != nil || !ok {
		return err
	}
	res.BlocksDeleted++
	g.met.blocks.WithLabelValues(reclaimEmpty).Inc()
	g.log.Info("freed an empty block no node holds", "block", b.Spec.CIDR)
	return nil
}

// freeSpareBlock deletes a live node's empty block if, by a consistent
// list of the node's blocks, the node keeps another block of its pool.
func (g *GC) freeSpareBlock(ctx context.Context, a BlockAction, snap *Snapshot, pools []parsedPool, res *PassResult) error {
	l, err := g.ds.IPAMBlocks.List(ctx, metav1.ListOptions{LabelSelector: tabbyv1.LabelNode + "=" + ipam.NodeLabelValue(a.Node)})
	if err != nil {
		return fmt.Errorf("listing node %s's blocks: %w", a.Node, err)
	}
	var cur *tabbyv1.IPAMBlock
	others := 0
	for i := range l.Items {
		b := &l.Items[i]
		if blockNode(b) != a.Node {
			continue
		}
		if b.UID == a.Block.UID {
			cur = b
			continue
		}
		if poolOf(b, pools) == a.Pool {
			others++
		}
	}
	if cur == nil || others == 0 || !blockOK(cur) || len(Allocations(cur)) > 0 {
		return nil
	}
	ok, err := g.deleteBlock(ctx, cur)
	if err != nil || !ok {
		return err
	}
	res.BlocksDeleted++
	g.met.blocks.WithLabelValues(reclaimEmpty).Inc()
	g.log.Info("freed a node's spare empty block", "block", cur.Spec.CIDR, "node", a.Node, "pool", a.Pool, "emptySince", a.Since.Format(time.RFC3339))
	return g.removeAffinities(ctx, a.Node, cur.Spec.CIDR, snap)
}

// removeAffinities deletes node's BlockAffinity records of a freed block,
// unless the node claimed the block again meanwhile.
func (g *GC) removeAffinities(ctx context.Context, node, cidr string, snap *Snapshot) error {
	pfx, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil
	}
	names := []string{ipam.AffinityObjectName(node, pfx)}
	for _, a := range snap.Affinities {
		if a.Spec.Node == node && canonCIDR(a.Spec.CIDR) == pfx.Masked().String() && a.Name != names[0] {
			names = append(names, a.Name)
		}
	}
	var errs []error
	for _, name := range names {
		a, err := g.ds.BlockAffinities.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("reading block affinity %s: %w", name, err))
			continue
		}
		if a.Spec.Node != node || canonCIDR(a.Spec.CIDR) != pfx.Masked().String() {
			continue
		}
		b, err := g.ds.IPAMBlocks.Get(ctx, ipam.BlockName(pfx.Masked()), metav1.GetOptions{})
		if err == nil && blockNode(b) == node {
			continue // claimed again by the node: its record stays
		}
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("reading block %s: %w", pfx, err))
			continue
		}
		if err := g.deleteAffinity(ctx, a); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (g *GC) deleteAffinity(ctx context.Context, a *tabbyv1.BlockAffinity) error {
	uid, rv := a.UID, a.ResourceVersion
	err := g.ds.BlockAffinities.Delete(ctx, a.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting block affinity %s: %w", a.Name, err)
	}
	return nil
}

// fixAffinities removes orphan BlockAffinities and records missing ones.
func (g *GC) fixAffinities(ctx context.Context, acts []AffinityAction, snap *Snapshot, res *PassResult) error {
	var errs []error
	for _, a := range acts {
		if !a.Due {
			continue
		}
		var err error
		if a.Kind == AffinityOrphan {
			err = g.removeOrphanAffinity(ctx, a, res)
		} else {
			err = g.recordAffinity(ctx, a, res)
		}
		if err != nil {
			errs = append(errs, wrapDS(g.ds, err))
		}
	}
	return errors.Join(errs...)
}

func (g *GC) removeOrphanAffinity(ctx context.Context, a AffinityAction, res *PassResult) error {
	cur, err := g.ds.BlockAffinities.Get(ctx, a.Affinity.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading block affinity %s: %w", a.Affinity.Name, err)
	}
	if cur.UID != a.Affinity.UID {
		return nil
	}
	if pfx, perr := netip.ParsePrefix(cur.Spec.CIDR); perr == nil {
		b, err := g.ds.IPAMBlocks.Get(ctx, ipam.BlockName(pfx.Masked()), metav1.GetOptions{})
		if err == nil && blockNode(b) == cur.Spec.Node {
			return nil
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("reading block %s: %w", pfx, err)
		}
	}
	uid, rv := cur.UID, cur.ResourceVersion
	err = g.ds.BlockAffinities.Delete(ctx, cur.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return nil
	case err != nil:
		return fmt.Errorf("deleting block affinity %s: %w", cur.Name, err)
	}
	res.AffinitiesRemoved++
	g.met.repairs.WithLabelValues("orphan-affinity").Inc()
	g.log.Info("removed a block affinity whose block is gone or another node's", "affinity", cur.Name, "node", cur.Spec.Node, "block", cur.Spec.CIDR)
	return nil
}

func (g *GC) recordAffinity(ctx context.Context, a AffinityAction, res *PassResult) error {
	gone, err := g.nodeGone(ctx, a.Node)
	if err != nil || gone {
		return err
	}
	b, err := g.freshBlock(ctx, a.Block)
	if err != nil || b == nil || blockNode(b) != a.Node {
		return err
	}
	pfx, err := netip.ParsePrefix(b.Spec.CIDR)
	if err != nil {
		return nil
	}
	l, err := g.ds.BlockAffinities.List(ctx, metav1.ListOptions{LabelSelector: tabbyv1.LabelNode + "=" + ipam.NodeLabelValue(a.Node)})
	if err != nil {
		return fmt.Errorf("listing node %s's block affinities: %w", a.Node, err)
	}
	for _, x := range l.Items {
		if x.Spec.Node == a.Node && canonCIDR(x.Spec.CIDR) == pfx.Masked().String() {
			return nil
		}
	}
	labels := map[string]string{tabbyv1.LabelNode: ipam.NodeLabelValue(a.Node)}
	if p := b.Labels[tabbyv1.LabelPool]; p != "" {
		labels[tabbyv1.LabelPool] = p
	}
	aff := &tabbyv1.BlockAffinity{
		ObjectMeta: metav1.ObjectMeta{Name: ipam.AffinityObjectName(a.Node, pfx), Labels: labels},
		Spec:       tabbyv1.BlockAffinitySpec{State: tabbyv1.AffinityConfirmed, Node: a.Node, CIDR: pfx.Masked().String()},
	}
	_, err = g.ds.BlockAffinities.Create(ctx, aff, metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		return nil
	case err != nil:
		return fmt.Errorf("recording node %s's affinity to block %s: %w", a.Node, pfx, err)
	}
	res.AffinitiesCreated++
	g.met.repairs.WithLabelValues("missing-affinity").Inc()
	g.log.Info("recorded a missing block affinity", "node", a.Node, "block", pfx)
	return nil
}

// removeHandles deletes the due IPAMHandles that, by a fresh read of the
// handle and then a consistent list of every block, hold nothing.
func (g *GC) removeHandles(ctx context.Context, acts []HandleAction, res *PassResult) error {
	var fresh []*tabbyv1.IPAMHandle
	var errs []error
	for _, a := range acts {
		if !a.Due {
			continue
		}
		h, err := g.ds.IPAMHandles.Get(ctx, a.Handle.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			errs = append(errs, wrapDS(g.ds, fmt.Errorf("reading IPAM handle %s: %w", a.Handle.Name, err)))
		case h.UID == a.Handle.UID:
			fresh = append(fresh, h)
		}
	}
	if len(fresh) == 0 {
		return errors.Join(errs...)
	}
	// Listed after the handles were read: an address given to a handle
	// before that is seen here; one given after changes the handle, and
	// the delete's precondition fails.
	bl, err := g.ds.IPAMBlocks.List(ctx, metav1.ListOptions{})
	if err != nil {
		return errors.Join(append(errs, wrapDS(g.ds, fmt.Errorf("listing IPAM blocks: %w", err)))...)
	}
	held := map[string]bool{}
	for i := range bl.Items {
		for _, a := range Allocations(&bl.Items[i]) {
			held[a.Attr.HandleID] = true
		}
		if !blockOK(&bl.Items[i]) {
			// A corrupted block may hold anything: judge nothing by it.
			for _, at := range bl.Items[i].Spec.Attributes {
				held[at.HandleID] = true
			}
		}
	}
	sort.Slice(fresh, func(i, j int) bool { return fresh[i].Name < fresh[j].Name })
	for _, h := range fresh {
		if held[h.Spec.HandleID] {
			continue
		}
		uid, rv := h.UID, h.ResourceVersion
		err := g.ds.IPAMHandles.Delete(ctx, h.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
		switch {
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			continue
		case err != nil:
			errs = append(errs, wrapDS(g.ds, fmt.Errorf("deleting IPAM handle %s: %w", h.Name, err)))
			continue
		}
		res.HandlesRemoved++
		g.met.repairs.WithLabelValues("orphan-handle").Inc()
		g.log.Info("removed an IPAM handle that holds no address", "handle", h.Spec.HandleID)
	}
	return errors.Join(errs...)
}

// Run runs passes every Interval until ctx ends, reading informer caches
// it starts (and stops when it returns). Its memory of candidates starts
// empty: nothing is freed before a full grace period has passed.
func (g *GC) Run(ctx context.Context) error {
	inf := newInformers(g.ds)
	ictx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := inf.run(ictx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	g.mu.Lock()
	g.seen = Seen{}
	g.mu.Unlock()
	g.log.Info("IPAM garbage collector running", "grace", g.cfg.Grace, "interval", g.cfg.Interval)
	// A pass runs every Interval, and early at the moment a candidate
	// becomes due, so that it is released within a grace period, not a
	// grace period and an interval. A failed pass is not retried sooner:
	// the next one retries.
	var early *time.Timer
	defer func() {
		if early != nil {
			early.Stop()
		}
	}()
	var l *loop.Loop
	l = loop.New(loop.Config{Resync: g.cfg.Interval, Pass: func(ctx context.Context) error {
		res := g.runPass(ctx, inf)
		if early != nil {
			early.Stop()
		}
		if !res.NextDue.IsZero() {
			if wait := time.Until(res.NextDue) + 10*time.Millisecond; wait < g.cfg.Interval {
				early = l.TriggerAfter(max(wait, 10*time.Millisecond))
			}
		}
		return nil
	}})
	return l.Run(ctx)
}

// runPass runs one pass of Run and logs what it did.
func (g *GC) runPass(ctx context.Context, r reader) PassResult {
	pctx, pcancel := context.WithTimeout(ctx, passTimeout)
	res, err := g.pass(pctx, r)
	pcancel()
	switch {
	case ctx.Err() != nil:
	case err != nil:
		g.log.Warn("IPAM garbage collection pass failed in part; the next pass retries", "error", err, "candidates", res.Candidates, "released", res.Released)
	case res.acted():
		g.log.Info("IPAM garbage collection pass", "candidates", res.Candidates, "due", res.Due, "released", res.Released,
			"blocksDeleted", res.BlocksDeleted, "blocksUnaffined", res.BlocksUnaffined, "affinitiesRemoved", res.AffinitiesRemoved,
			"affinitiesCreated", res.AffinitiesCreated, "handlesRemoved", res.HandlesRemoved)
	default:
		g.log.Debug("IPAM garbage collection pass", "candidates", res.Candidates, "due", res.Due)
	}
	return res
}

// wrapDS adds what to check when the API server is unreachable.
func wrapDS(ds *datastore.Client, err error) error {
	if err != nil && datastore.IsUnreachable(err) {
		return datastore.Unreachable(ds.Host(), err)
	}
	return err
}
