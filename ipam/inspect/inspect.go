// Package inspect is what `tabbyctl ipam` shows and checks. From a Snapshot
// of the IPAM objects (IPPools, IPAMBlocks, BlockAffinities, IPAMHandles)
// and the Pods and Nodes it computes per-pool usage (Show), who holds one
// address (ShowIP), the inconsistencies a user can act on (Check: leaked and
// double-booked addresses, handles that disagree with the blocks, blocks and
// affinities that disagree with each other or with the pools and nodes),
// and whether an address may be released (PlanRelease). These functions are
// pure; Load reads a Snapshot from the API server and Release frees an
// address through package ipam (compare-and-swap, handle included).
//
// The reports are stable JSON (`tabbyctl ipam ... -o json`); their field
// names and the Kind and holder-state strings are a contract for scripts.
package inspect

import (
	"encoding/binary"
	"fmt"
	"math/big"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/ipam"
)

// Snapshot is everything the inspection looks at.
type Snapshot struct {
	Pools      []tabbyv1.IPPool
	Blocks     []tabbyv1.IPAMBlock
	Affinities []tabbyv1.BlockAffinity
	Handles    []tabbyv1.IPAMHandle
	Pods       []corev1.Pod
	Nodes      []corev1.Node
	// Now is when the snapshot was read; ages (Options.Grace) count from it.
	Now time.Time
	// Revision is the resourceVersion every list was read at, "" when the
	// lists were read one after the other (not one consistent cut).
	Revision string
}

// DefaultGrace is Options.Grace when it is zero.
const DefaultGrace = 2 * time.Minute

// Options tune what counts as work in progress.
type Options struct {
	// Grace: an allocation of a live pod whose status shows other
	// addresses is pending (StateRecent), not leaked, while it is younger
	// than Grace: a sandbox being replaced gets its new address before the
	// kubelet reports it. (A live pod whose status shows no address yet is
	// pending at any age.) A pending BlockAffinity younger than Grace
	// without its block is a claim in progress. Release refuses pending
	// allocations without --force. Zero means DefaultGrace; negative, none.
	Grace time.Duration
}

func (o Options) grace() time.Duration {
	switch {
	case o.Grace == 0:
		return DefaultGrace
	case o.Grace < 0:
		return 0
	}
	return o.Grace
}

// Holder states: what became of the holder of an allocation.
const (
	// StateRunning: the pod is live and its status lists the address.
	StateRunning = "running"
	// StatePending: the pod is live and its status lists no address yet
	// (between CNI ADD and the kubelet's status update).
	StatePending = "pending"
	// StateRecent: the pod is live with other addresses, but the allocation
	// is younger than the grace period (a sandbox being replaced).
	StateRecent = "recent"
	// StateOtherAddresses: the pod is live with other addresses.
	StateOtherAddresses = "other-addresses"
	// StateFinished: the pod has finished (Succeeded or Failed).
	StateFinished = "finished"
	// StateMissing: the pod does not exist.
	StateMissing = "missing"
	// StateNode: a node's tunnel address, or an address recorded without a
	// pod, and the node exists.
	StateNode = "node"
	// StateReplaced: a node's tunnel address, but the node publishes another
	// one (and the allocation is older than the grace period).
	StateReplaced = "replaced"
	// StateSpare: an address tabbyd's CNI agent holds ahead for the next
	// pod of its node (ipam.SpareHandle), and the node exists.
	StateSpare = "spare"
	// StateNodeGone: recorded without a pod (or a tunnel address) for a node
	// that does not exist.
	StateNodeGone = "node-gone"
)

// inUse says whether releasing an allocation in this state could free an
// address that is, or is about to be, in use.
func inUse(state string) bool {
	switch state {
	case StateRunning, StatePending, StateRecent, StateNode, StateSpare:
		return true
	}
	return false
}

// poolInfo is a parsed pool.
type poolInfo struct {
	obj    *tabbyv1.IPPool
	prefix netip.Prefix
	size   int // block prefix length
}

// blockInfo is a parsed block.
type blockInfo struct {
	obj    *tabbyv1.IPAMBlock
	prefix netip.Prefix // invalid when the CIDR does not parse
	pool   *poolInfo
	node   string // from spec.affinity host:<node>
	// corrupt says why the block's arrays are inconsistent.
	corrupt []string
	// lost are free ordinals missing from spec.unallocated.
	lost     []int
	used     int
	borrowed int
}

func (b *blockInfo) cidr() string {
	if b.prefix.IsValid() {
		return b.prefix.String()
	}
	return b.obj.Spec.CIDR
}

func (b *blockInfo) capacity() int {
	if !b.prefix.IsValid() {
		return len(b.obj.Spec.Allocations)
	}
	return 1 << (b.prefix.Addr().BitLen() - b.prefix.Bits())
}

// allocation is one held address.
type allocation struct {
	ip    netip.Addr
	block *blockInfo
	ord   int
	attr  tabbyv1.AllocationAttribute
	seq   *uint64
}

func (a *allocation) podKey() string { return a.attr.Namespace + "/" + a.attr.Pod }

type affKey struct {
	node string
	cidr netip.Prefix
}

// index is a Snapshot cross-referenced.
type index struct {
	s       *Snapshot
	grace   time.Duration
	pools   []*poolInfo // most specific first
	blocks  []*blockInfo
	allocs  []*allocation
	byIP    map[netip.Addr][]*allocation
	users   map[netip.Addr][]*corev1.Pod // live pods whose status lists the address
	pods    map[string]*corev1.Pod       // by namespace/name
	nodes   map[string]*corev1.Node
	handles map[string]*tabbyv1.IPAMHandle // by handle ID
	affs    map[affKey][]*tabbyv1.BlockAffinity
}

func newIndex(s *Snapshot, o Options) *index {
	x := &index{
		s: s, grace: o.grace(),
		byIP:    map[netip.Addr][]*allocation{},
		users:   map[netip.Addr][]*corev1.Pod{},
		pods:    map[string]*corev1.Pod{},
		nodes:   map[string]*corev1.Node{},
		handles: map[string]*tabbyv1.IPAMHandle{},
		affs:    map[affKey][]*tabbyv1.BlockAffinity{},
	}
	for i := range s.Pools {
		p := &s.Pools[i]
		pfx, err := p.Prefix()
		if err != nil {
			continue
		}
		x.pools = append(x.pools, &poolInfo{obj: p, prefix: pfx.Masked(), size: p.EffectiveBlockSize()})
	}
	sort.SliceStable(x.pools, func(i, j int) bool {
		if a, b := x.pools[i].prefix.Bits(), x.pools[j].prefix.Bits(); a != b {
			return a > b
		}
		return x.pools[i].obj.Name < x.pools[j].obj.Name
	})
	for i := range s.Nodes {
		x.nodes[s.Nodes[i].Name] = &s.Nodes[i]
	}
	for i := range s.Pods {
		p := &s.Pods[i]
		x.pods[p.Namespace+"/"+p.Name] = p
		if !live(p) || p.Spec.HostNetwork {
			continue
		}
		for _, ip := range podIPs(p) {
			x.users[ip] = append(x.users[ip], p)
		}
	}
	for i := range s.Handles {
		h := &s.Handles[i]
		x.handles[h.Spec.HandleID] = h
	}
	for i := range s.Affinities {
		a := &s.Affinities[i]
		pfx, err := netip.ParsePrefix(a.Spec.CIDR)
		if err != nil {
			continue
		}
		k := affKey{a.Spec.Node, pfx.Masked()}
		x.affs[k] = append(x.affs[k], a)
	}
	for i := range s.Blocks {
		x.addBlock(&s.Blocks[i])
	}
	sort.SliceStable(x.blocks, func(i, j int) bool { return lessPrefix(x.blocks[i].prefix, x.blocks[j].prefix) })
	return x
}

func (x *index) addBlock(b *tabbyv1.IPAMBlock) {
	bi := &blockInfo{obj: b}
	x.blocks = append(x.blocks, bi)
	if n, ok := strings.CutPrefix(b.Spec.Affinity, "host:"); ok {
		bi.node = n
	}
	pfx, err := netip.ParsePrefix(b.Spec.CIDR)
	if err != nil {
		bi.corrupt = append(bi.corrupt, fmt.Sprintf("its cidr %q does not parse", b.Spec.CIDR))
		return
	}
	bi.prefix = pfx.Masked()
	if bits := pfx.Addr().BitLen() - pfx.Bits(); bits > 12 {
		bi.corrupt = append(bi.corrupt, fmt.Sprintf("it is a /%d, larger than a block may be", pfx.Bits()))
		return
	}
	bi.pool = x.poolOf(bi.prefix)
	n := bi.capacity()
	if len(b.Spec.Allocations) != n {
		bi.corrupt = append(bi.corrupt, fmt.Sprintf("it has %d allocation slots for %d addresses", len(b.Spec.Allocations), n))
	}
	listed := make([]int, n)
	for _, u := range b.Spec.Unallocated {
		if u < 0 || u >= n {
			bi.corrupt = append(bi.corrupt, fmt.Sprintf("spec.unallocated lists ordinal %d, outside the block", u))
			continue
		}
		listed[u]++
	}
	for ord := 0; ord < n && ord < len(b.Spec.Allocations); ord++ {
		idx := b.Spec.Allocations[ord]
		if idx < 0 {
			if listed[ord] == 0 {
				bi.lost = append(bi.lost, ord)
			}
			continue
		}
		if idx >= len(b.Spec.Attributes) {
			bi.corrupt = append(bi.corrupt, fmt.Sprintf("the allocation of %s refers to attribute %d, which does not exist", addrAt(bi.prefix, ord), idx))
			continue
		}
		a := &allocation{ip: addrAt(bi.prefix, ord), block: bi, ord: ord, attr: b.Spec.Attributes[idx]}
		if s, ok := b.Spec.SequenceNumberForAllocation[strconv.Itoa(ord)]; ok {
			a.seq = &s
		}
		bi.used++
		if bi.node != "" && a.attr.Node != "" && a.attr.Node != bi.node {
			bi.borrowed++
		}
		x.allocs = append(x.allocs, a)
		x.byIP[a.ip] = append(x.byIP[a.ip], a)
	}
}

// poolOf is the most specific pool containing a block (or address prefix).
func (x *index) poolOf(p netip.Prefix) *poolInfo {
	for _, pi := range x.pools {
		if pi.prefix.Bits() <= p.Bits() && pi.prefix.Contains(p.Addr()) {
			return pi
		}
	}
	return nil
}

// holderState says what became of an allocation's holder, and why.
func (x *index) holderState(a *allocation) (string, string) {
	if a.attr.Pod == "" {
		if _, ok := x.nodes[a.attr.Node]; !ok || a.attr.Node == "" {
			return StateNodeGone, fmt.Sprintf("node %q does not exist", a.attr.Node)
		}
		if a.attr.Use == tabbyv1.UseTunnel {
			if pub, key := x.publishedTunnel(a); pub.IsValid() && pub != a.ip && !x.recent(a) {
				return StateReplaced, fmt.Sprintf("node %s publishes %s as %s", a.attr.Node, pub, key)
			}
			return StateNode, "tunnel address of node " + a.attr.Node
		}
		if ipam.IsSpareHandle(a.attr.HandleID) {
			return StateSpare, "held ahead by tabbyd for the next pod of node " + a.attr.Node
		}
		return StateNode, "recorded without a pod; node " + a.attr.Node + " exists"
	}
	p := x.pods[a.podKey()]
	switch {
	case p == nil:
		return StateMissing, "pod " + a.podKey() + " does not exist"
	case !live(p):
		return StateFinished, fmt.Sprintf("pod %s has finished (%s)", a.podKey(), p.Status.Phase)
	}
	ips := podIPs(p)
	for _, ip := range ips {
		if ip == a.ip {
			return StateRunning, "pod " + a.podKey() + " is live and has this address"
		}
	}
	if len(ips) == 0 {
		return StatePending, "pod " + a.podKey() + " is live and has no address in its status yet"
	}
	if x.recent(a) {
		return StateRecent, fmt.Sprintf("pod %s is live with %s, and this allocation is younger than %v", a.podKey(), joinAddrs(ips), x.grace)
	}
	return StateOtherAddresses, fmt.Sprintf("pod %s is live but has %s now", a.podKey(), joinAddrs(ips))
}

// publishedTunnel is the tunnel address the allocation's node publishes for
// the allocation's kind of tunnel (from its handle ID).
func (x *index) publishedTunnel(a *allocation) (netip.Addr, string) {
	n := x.nodes[a.attr.Node]
	if n == nil {
		return netip.Addr{}, ""
	}
	key := ""
	switch {
	case strings.HasPrefix(a.attr.HandleID, "vxlan-tunnel-addr-"):
		key = tabbyv1.AnnotationVXLANTunnelAddress
	case strings.HasPrefix(a.attr.HandleID, "ipip-tunnel-addr-"):
		key = tabbyv1.AnnotationIPIPTunnelAddress
	default:
		return netip.Addr{}, ""
	}
	v, ok := n.Annotations[key]
	if !ok {
		return netip.Addr{}, key
	}
	ip, err := netip.ParseAddr(strings.TrimSpace(v))
	if err != nil {
		if p, perr := netip.ParsePrefix(v); perr == nil {
			return p.Addr().Unmap(), key
		}
		return netip.Addr{}, key
	}
	return ip.Unmap(), key
}

// recent says whether the allocation is younger than the grace period (an
// allocation without a timestamp is old).
func (x *index) recent(a *allocation) bool {
	t := a.attr.Timestamp
	return t != nil && x.s.Now.Sub(t.Time) < x.grace
}

func (x *index) holds(p *corev1.Pod, a *allocation) bool {
	return a.attr.Pod != "" && p.Namespace == a.attr.Namespace && p.Name == a.attr.Pod
}

// live says whether a pod may be running: it exists and has not finished.
// A terminating pod (deletionTimestamp set) is live until it is gone.
func live(p *corev1.Pod) bool {
	return p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// podIPs are the addresses a pod's status lists.
func podIPs(p *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	seen := map[netip.Addr]bool{}
	add := func(s string) {
		if a, err := netip.ParseAddr(s); err == nil && !seen[a.Unmap()] {
			seen[a.Unmap()] = true
			out = append(out, a.Unmap())
		}
	}
	for _, ip := range p.Status.PodIPs {
		add(ip.IP)
	}
	if len(out) == 0 && p.Status.PodIP != "" {
		add(p.Status.PodIP)
	}
	return out
}

// addrAt is the address at ordinal ord of block p (blocks hold at most 4096
// aligned addresses, so the offset fits the low 32 bits).
func addrAt(p netip.Prefix, ord int) netip.Addr {
	b := p.Masked().Addr().As16()
	binary.BigEndian.PutUint32(b[12:], binary.BigEndian.Uint32(b[12:])+uint32(ord))
	a := netip.AddrFrom16(b)
	if p.Addr().Is4() {
		return a.Unmap()
	}
	return a
}

func lessPrefix(a, b netip.Prefix) bool {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c < 0
	}
	return a.Bits() < b.Bits()
}

func joinAddrs(ips []netip.Addr) string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	return strings.Join(s, ", ")
}

// pow2 is 2^n as a decimal string.
func pow2(n int) string {
	if n < 0 {
		return "0"
	}
	return new(big.Int).Lsh(big.NewInt(1), uint(n)).String()
}

// affinityName is the BlockAffinity object name IPAM gives node's claim on
// block p: the same object-name rule IPAM applies to handle IDs, applied
// to "<node>-<block name>".
func affinityName(node string, p netip.Prefix) string {
	return ipam.HandleObjectName(node + "-" + ipam.BlockName(p))
}
