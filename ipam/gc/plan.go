package gc

// The pure half of the garbage collector: from what one pass sees (blocks,
// affinities, handles, pools, pods, nodes), what it remembers (since when
// each thing has been a candidate) and the time, which allocations, blocks,
// affinities and handles are candidates and which of them are due. Nothing
// here talks to the API server.

import (
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
)

// Reason says why an allocation is a candidate for release.
type Reason string

const (
	// ReasonPodGone: the allocation names a pod the API server does not have.
	ReasonPodGone Reason = "pod-gone"
	// ReasonPodOtherAddresses: the pod is Running with another sandbox: its
	// status lists addresses, not this one, and one of them is held by a
	// newer allocation of the same pod on the same network (the old
	// sandbox's CNI DEL never came). A pod with no addresses in its status
	// yet (between CNI ADD and the kubelet's status update) is never this.
	ReasonPodOtherAddresses Reason = "pod-has-other-addresses"
	// ReasonPodFinished: the pod Succeeded or Failed; the kubelet has torn
	// its sandbox down.
	ReasonPodFinished Reason = "pod-finished"
	// ReasonNodeGone: a tunnel address, or an address with no pod identity,
	// whose node the API server no longer has.
	ReasonNodeGone Reason = "node-gone"
)

// PodKey names a pod.
type PodKey struct{ Namespace, Name string }

// Snapshot is what one pass reads. Objects may be shared with a cache:
// nothing here modifies them.
type Snapshot struct {
	Blocks     []*tabbyv1.IPAMBlock
	Affinities []*tabbyv1.BlockAffinity
	Handles    []*tabbyv1.IPAMHandle
	Pools      []*tabbyv1.IPPool
	// Pods by namespace and name; Nodes by name (present means it exists).
	Pods  map[PodKey]*corev1.Pod
	Nodes map[string]bool
}

// Allocation is one held address of a block.
type Allocation struct {
	// Block is the block's object name, CIDR its prefix.
	Block   string
	CIDR    netip.Prefix
	Ordinal int
	IP      netip.Addr
	// Sequence is the block's sequence number the address was allocated
	// with (HasSequence false when the block does not record it).
	Sequence    uint64
	HasSequence bool
	Attr        tabbyv1.AllocationAttribute
	// BlockNode is the node the block is affine to ("" for none).
	BlockNode string
}

// Node is the node the allocation was made for: its attribute's, else the
// block's.
func (a Allocation) Node() string {
	if a.Attr.Node != "" {
		return a.Attr.Node
	}
	return a.BlockNode
}

// Tunnel says whether the address is a node's tunnel address (IPIP or
// VXLAN): use Tunnel, or a handle named <kind>-tunnel-addr-<node>.
func (a Allocation) Tunnel() bool {
	return a.Attr.Use == tabbyv1.UseTunnel || strings.HasPrefix(a.Attr.HandleID, "vxlan-tunnel-addr-") ||
		strings.HasPrefix(a.Attr.HandleID, "ipip-tunnel-addr-")
}

// PodKey is the pod the allocation names, false when it names none (a
// tunnel address, or an allocation made without pod identity: no pod name
// and namespace).
func (a Allocation) PodKey() (PodKey, bool) {
	if a.Tunnel() || a.Attr.Pod == "" || a.Attr.Namespace == "" {
		return PodKey{}, false
	}
	return PodKey{a.Attr.Namespace, a.Attr.Pod}, true
}

// key identifies the allocation across passes: a release that finds the
// address reallocated (another handle or sequence number) is refused.
func (a Allocation) key() string {
	return seenAllocation.key(a.Block, strconv.Itoa(a.Ordinal), a.Attr.HandleID, strconv.FormatUint(a.Sequence, 10))
}

// blockNode is the node a block is affine to ("" for none or another form).
func blockNode(b *tabbyv1.IPAMBlock) string {
	n, _ := strings.CutPrefix(b.Spec.Affinity, "host:")
	if n == b.Spec.Affinity {
		return ""
	}
	return n
}

// Allocations lists the held addresses of a block, by ordinal (none when
// the block is corrupted).
func Allocations(b *tabbyv1.IPAMBlock) []Allocation {
	p, err := netip.ParsePrefix(b.Spec.CIDR)
	if err != nil || p.Addr().BitLen()-p.Bits() > 12 {
		return nil
	}
	p = p.Masked()
	if len(b.Spec.Allocations) != 1<<(p.Addr().BitLen()-p.Bits()) {
		return nil
	}
	node := blockNode(b)
	var out []Allocation
	for ord, idx := range b.Spec.Allocations {
		if idx < 0 || idx >= len(b.Spec.Attributes) {
			continue
		}
		seq, ok := b.Spec.SequenceNumberForAllocation[strconv.Itoa(ord)]
		out = append(out, Allocation{
			Block: b.Name, CIDR: p, Ordinal: ord, IP: addrAt(p, ord),
			Sequence: seq, HasSequence: ok, Attr: b.Spec.Attributes[idx], BlockNode: node,
		})
	}
	return out
}

// addrAt is the address at ordinal ord of block p (aligned, at most 4096
// addresses, so the low 32 bits carry the offset).
func addrAt(p netip.Prefix, ord int) netip.Addr {
	b := p.Addr().As16()
	low := uint32(b[12])<<24 | uint32(b[13])<<16 | uint32(b[14])<<8 | uint32(b[15])
	low += uint32(ord)
	b[12], b[13], b[14], b[15] = byte(low>>24), byte(low>>16), byte(low>>8), byte(low)
	a := netip.AddrFrom16(b)
	if p.Addr().Is4() {
		return a.Unmap()
	}
	return a
}

// podIPs are the addresses a pod's status lists.
func podIPs(p *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	if len(out) == 0 && p.Status.PodIP != "" {
		if a, err := netip.ParseAddr(p.Status.PodIP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// network is the CNI network of a pod allocation's handle
// ("<network>.<containerID>"; container IDs have no dots).
func network(handle string) string {
	if i := strings.LastIndexByte(handle, '.'); i >= 0 {
		return handle[:i]
	}
	return handle
}

// Holders finds who holds an address (nil: nobody, as far as is known).
type Holders func(netip.Addr) *Allocation

// HoldersOf indexes the allocations of blocks by address.
func HoldersOf(blocks []*tabbyv1.IPAMBlock) Holders {
	m := map[netip.Addr]Allocation{}
	for _, b := range blocks {
		for _, a := range Allocations(b) {
			m[a.IP] = a
		}
	}
	return func(ip netip.Addr) *Allocation {
		if a, ok := m[ip]; ok {
			return &a
		}
		return nil
	}
}

// Judge says whether an allocation is a candidate for release, given its
// pod (nil: the API server has none), whether its node exists, and who
// holds the addresses the pod's status lists.
//
//   - An allocation that names a pod is a candidate when the pod is gone,
//     or has finished (Succeeded, Failed), or has been given another
//     sandbox: it is Running, its status lists addresses, not this one,
//     and one of them is held by another allocation of the same pod on the
//     same CNI network (a newer handle). A pod that exists and is not
//     Running, or lists no address yet (between CNI ADD and the kubelet's
//     status update), keeps its address; so does an address of a second
//     network (Multus), whose addresses the status never lists. The node
//     does not matter: a pod bound to a deleted node keeps its address
//     until the pod is deleted (kube-controller-manager's pod GC does that).
//   - A tunnel address, or an allocation without pod identity, belongs to
//     its node: a candidate only once the node is gone.
func Judge(a Allocation, pod *corev1.Pod, nodeExists bool, holders Holders) (Reason, bool) {
	if k, ok := a.PodKey(); ok {
		if pod == nil {
			return ReasonPodGone, true
		}
		switch pod.Status.Phase {
		case corev1.PodSucceeded, corev1.PodFailed:
			return ReasonPodFinished, true
		case corev1.PodRunning:
			ips := podIPs(pod)
			for _, ip := range ips {
				if ip == a.IP {
					return "", false
				}
			}
			for _, ip := range ips {
				h := holders(ip)
				if h == nil || h.Attr.HandleID == a.Attr.HandleID || network(h.Attr.HandleID) != network(a.Attr.HandleID) {
					continue
				}
				if hk, ok := h.PodKey(); ok && hk == k {
					return ReasonPodOtherAddresses, true
				}
			}
		}
		return "", false
	}
	if a.Node() == "" || nodeExists {
		return "", false
	}
	return ReasonNodeGone, true
}

// Candidate is an allocation that looks leaked.
type Candidate struct {
	Allocation
	Reason Reason
	// Since is when this collector first saw it a candidate (continuously
	// since); Due says it has been one for the grace period, and its
	// allocation is older than the grace period by its timestamp.
	Since time.Time
	Due   bool
}

// BlockKind says what is to become of a block.
type BlockKind string

const (
	// BlockNodeGone: the block's node is gone. Once its allocations are
	// released the block is deleted; while it still holds addresses other
	// nodes' pods borrowed, only its affinity is removed.
	BlockNodeGone BlockKind = "node-deleted"
	// BlockEmpty: an empty block of a live node that holds another block of
	// the same pool, or an empty block with no affinity: deleted, so that
	// any node may claim it.
	BlockEmpty BlockKind = "empty"
)

// BlockAction is a block to free.
type BlockAction struct {
	Block *tabbyv1.IPAMBlock
	Kind  BlockKind
	// Node is the block's node ("" for none); Pool the pool it belongs to
	// ("" when none contains it).
	Node, Pool string
	Since      time.Time
	// Due: the condition has held for the grace period. For BlockEmpty
	// a block that is a live node's last one in its pool is never due.
	Due bool
}

// AffinityKind says what is wrong with a block's affinity record.
type AffinityKind string

const (
	// AffinityOrphan: a BlockAffinity whose block does not exist or is not
	// affine to its node (a claim that died, a block freed by someone else).
	AffinityOrphan AffinityKind = "orphan"
	// AffinityMissing: a block affine to a live node with no BlockAffinity
	// (a claim or a release that raced): the record is created.
	AffinityMissing AffinityKind = "missing"
)

// AffinityAction is an affinity record to remove or create.
type AffinityAction struct {
	Kind AffinityKind
	// Affinity is the orphan (AffinityOrphan); Block the block lacking a
	// record (AffinityMissing).
	Affinity *tabbyv1.BlockAffinity
	Block    *tabbyv1.IPAMBlock
	Node     string
	CIDR     string
	Since    time.Time
	Due      bool
}

// HandleAction is an IPAMHandle no block allocation refers to.
type HandleAction struct {
	Handle *tabbyv1.IPAMHandle
	Since  time.Time
	Due    bool
}

// Plan is what one pass found.
type Plan struct {
	Allocations []Candidate
	Blocks      []BlockAction
	Affinities  []AffinityAction
	Handles     []HandleAction
	// NextDue is the earliest time something found here that is not due
	// yet becomes due by the clock (zero for none), so that a collector can
	// pass again then instead of up to a whole interval later.
	NextDue time.Time
}

// Seen records since when each thing has been a candidate, continuously.
// Compute returns the next Seen: things that stopped being candidates are
// forgotten, so a candidate must stay one through the whole grace period.
type Seen map[string]time.Time

// seenKind is what a key of Seen tracks: each kind of candidate is
// tracked apart, so an object that becomes a candidate for another reason
// (an empty block whose node then goes) waits a grace period anew.
type seenKind string

const (
	seenAllocation      seenKind = "a"  // an allocation (block, ordinal, handle, sequence)
	seenBlockNodeGone   seenKind = "bg" // a block whose node is gone
	seenBlockEmpty      seenKind = "be" // an empty block
	seenAffinityOrphan  seenKind = "af" // an affinity record without its block
	seenAffinityMissing seenKind = "am" // a block without its affinity record
	seenHandle          seenKind = "h"  // a handle no allocation refers to
)

// key is the key of Seen of this kind's candidate named by parts (its
// name and UID, which a re-created object does not share).
func (k seenKind) key(parts ...string) string {
	return strings.Join(append([]string{string(k)}, parts...), "/")
}

// Compute works out the candidates of one pass and which are due. Nothing
// is due before it has been a candidate for grace in this collector's own
// memory (seen), so a collector that just started, or just became leader,
// waits a full grace period. Allocations also need a timestamp at least
// grace old (when they carry one: IPAM writes it); objects with a creation
// time need that too. now - since >= grace and age >= grace.
func Compute(s *Snapshot, seen Seen, now time.Time, grace time.Duration) (Plan, Seen) {
	p := &planner{s: s, seen: seen, next: Seen{}, now: now, grace: grace, blocks: sortedByName(s.Blocks)}
	allocs, held := p.allocations()
	p.blockActions(allocs)
	p.affinities()
	p.handles(held)
	return p.plan, p.next
}

// planner is one Compute: what it reads and remembers, and the plan and
// the next Seen it builds.
type planner struct {
	s          *Snapshot
	seen, next Seen
	now        time.Time
	grace      time.Duration
	plan       Plan
	blocks     []*tabbyv1.IPAMBlock // s.Blocks by name
}

// track is since when key has been a candidate, and keeps it in the next
// Seen.
func (p *planner) track(key string) time.Time {
	t, ok := p.seen[key]
	if !ok || t.After(p.now) {
		t = p.now
	}
	p.next[key] = t
	return t
}

// old says whether every time given is grace ago; when not, it notes
// when they all will be.
func (p *planner) old(times ...time.Time) bool {
	var latest time.Time
	for _, t := range times {
		if t.After(latest) {
			latest = t
		}
	}
	if p.now.Sub(latest) >= p.grace {
		return true
	}
	if at := latest.Add(p.grace); p.plan.NextDue.IsZero() || at.Before(p.plan.NextDue) {
		p.plan.NextDue = at
	}
	return false
}

func (p *planner) nodeExists(n string) bool { return p.s.Nodes[n] }

// allocations adds the allocations that are candidates, and returns every
// block's allocations (by block name) and the handle IDs held in some
// block.
func (p *planner) allocations() (allocs map[string][]Allocation, held map[string]bool) {
	allocs, held = map[string][]Allocation{}, map[string]bool{}
	holders := HoldersOf(p.blocks)
	for _, b := range p.blocks {
		as := Allocations(b)
		allocs[b.Name] = as
		for _, a := range as {
			held[a.Attr.HandleID] = true
			var pod *corev1.Pod
			if k, ok := a.PodKey(); ok {
				pod = p.s.Pods[k]
			}
			reason, cand := Judge(a, pod, p.nodeExists(a.Node()), holders)
			if !cand {
				continue
			}
			since := p.track(a.key())
			// Not due either when allocated moments ago by its own clock.
			times := []time.Time{since}
			if ts := a.Attr.Timestamp; ts != nil {
				times = append(times, ts.Time)
			}
			due := p.old(times...)
			p.plan.Allocations = append(p.plan.Allocations, Candidate{Allocation: a, Reason: reason, Since: since, Due: due})
		}
	}
	return allocs, held
}

// nodePool is a node's blocks of one pool.
type nodePool struct{ node, pool string }

// blockActions adds the blocks whose node is gone, then the empty ones.
func (p *planner) blockActions(allocs map[string][]Allocation) {
	pools := sortedPools(p.s.Pools)
	total := map[nodePool]int{}
	var empties []BlockAction
	for _, b := range p.blocks {
		node := blockNode(b)
		pool := poolOf(b, pools)
		if node != "" {
			total[nodePool{node, pool}]++
		}
		switch {
		case node != "" && !p.nodeExists(node):
			since := p.track(seenBlockNodeGone.key(b.Name, string(b.UID)))
			p.plan.Blocks = append(p.plan.Blocks, BlockAction{Block: b, Kind: BlockNodeGone, Node: node, Pool: pool, Since: since, Due: p.old(since)})
		case b.Spec.Affinity != "" && node == "":
			// An affinity tabby does not write: not ours to judge.
		case len(allocs[b.Name]) == 0 && blockOK(b):
			since := p.track(seenBlockEmpty.key(b.Name, string(b.UID)))
			empties = append(empties, BlockAction{Block: b, Kind: BlockEmpty, Node: node, Pool: pool, Since: since, Due: p.old(since, b.CreationTimestamp.Time)})
		}
	}
	keepLastBlocks(empties, total)
	p.plan.Blocks = append(p.plan.Blocks, empties...)
}

// keepLastBlocks makes the due empty blocks that would leave a live node
// without a block of a pool it has blocks in (total of them) not due: the
// node keeps at least one.
func keepLastBlocks(empties []BlockAction, total map[nodePool]int) {
	dueIn := map[nodePool]int{}
	for i := range empties {
		e := &empties[i]
		if e.Node == "" || !e.Due {
			continue
		}
		g := nodePool{e.Node, e.Pool}
		if dueIn[g]+1 >= total[g] {
			e.Due = false // would leave the node without a block of this pool
			continue
		}
		dueIn[g]++
	}
}

// affinities adds the affinity records whose block is gone or affine to
// another node, then the live nodes' blocks without a record.
func (p *planner) affinities() {
	byCIDR := map[string]*tabbyv1.IPAMBlock{}
	for _, b := range p.blocks {
		if pfx, err := netip.ParsePrefix(b.Spec.CIDR); err == nil {
			byCIDR[pfx.Masked().String()] = b
		}
	}
	type nodeCIDR struct{ node, cidr string }
	recorded := map[nodeCIDR]bool{}
	for _, a := range sortedByName(p.s.Affinities) {
		cidr := canonCIDR(a.Spec.CIDR)
		recorded[nodeCIDR{a.Spec.Node, cidr}] = true
		b := byCIDR[cidr]
		if b != nil && blockNode(b) == a.Spec.Node {
			continue // in order, or freed with its block when the node is gone
		}
		since := p.track(seenAffinityOrphan.key(a.Name, string(a.UID)))
		p.plan.Affinities = append(p.plan.Affinities, AffinityAction{Kind: AffinityOrphan, Affinity: a, Node: a.Spec.Node, CIDR: a.Spec.CIDR,
			Since: since, Due: p.old(since, a.CreationTimestamp.Time)})
	}
	for _, b := range p.blocks {
		node := blockNode(b)
		if node == "" || !p.nodeExists(node) || recorded[nodeCIDR{node, canonCIDR(b.Spec.CIDR)}] {
			continue
		}
		since := p.track(seenAffinityMissing.key(b.Name, string(b.UID)))
		p.plan.Affinities = append(p.plan.Affinities, AffinityAction{Kind: AffinityMissing, Block: b, Node: node, CIDR: b.Spec.CIDR,
			Since: since, Due: p.old(since, b.CreationTimestamp.Time)})
	}
}

// handles adds the handle records that no allocation refers to (no ID in
// held).
func (p *planner) handles(held map[string]bool) {
	for _, h := range sortedByName(p.s.Handles) {
		if held[h.Spec.HandleID] {
			continue
		}
		since := p.track(seenHandle.key(h.Name, string(h.UID)))
		p.plan.Handles = append(p.plan.Handles, HandleAction{Handle: h, Since: since, Due: p.old(since, h.CreationTimestamp.Time)})
	}
}

// sortedByName is a copy of objs sorted by name (the snapshot's slices may
// be shared with a cache).
func sortedByName[T metav1.Object](objs []T) []T {
	out := append([]T(nil), objs...)
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out
}

// canonCIDR is a CIDR in canonical form (as written when it does not parse).
func canonCIDR(c string) string {
	if p, err := netip.ParsePrefix(c); err == nil {
		return p.Masked().String()
	}
	return c
}

// blockOK: the block's arrays match its CIDR (a corrupted block is left
// to tabbyctl ipam check).
func blockOK(b *tabbyv1.IPAMBlock) bool {
	p, err := netip.ParsePrefix(b.Spec.CIDR)
	if err != nil || p.Addr().BitLen()-p.Bits() > 12 {
		return false
	}
	return len(b.Spec.Allocations) == 1<<(p.Addr().BitLen()-p.Bits())
}

type parsedPool struct {
	name   string
	prefix netip.Prefix
}

// sortedPools are the pools most specific first.
func sortedPools(l []*tabbyv1.IPPool) []parsedPool {
	var out []parsedPool
	for _, p := range l {
		if pfx, err := netip.ParsePrefix(p.Spec.CIDR); err == nil {
			out = append(out, parsedPool{p.Name, pfx.Masked()})
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].prefix.Bits() != out[j].prefix.Bits() {
			return out[i].prefix.Bits() > out[j].prefix.Bits()
		}
		return out[i].name < out[j].name
	})
	return out
}

// poolOf is the name of the pool a block lies in ("" for none).
func poolOf(b *tabbyv1.IPAMBlock, pools []parsedPool) string {
	p, err := netip.ParsePrefix(b.Spec.CIDR)
	if err != nil {
		return ""
	}
	for _, pl := range pools {
		if pl.prefix.Contains(p.Addr()) && pl.prefix.Bits() <= p.Bits() {
			return pl.name
		}
	}
	return ""
}
