package inspect

import (
	"fmt"
	"math/big"
	"net/netip"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// ShowReport is `tabbyctl ipam show`: every pool with its blocks.
type ShowReport struct {
	Pools []PoolUsage `json:"pools"`
	// BlocksOutsidePools are blocks no pool contains (their pool was
	// deleted, or their CIDR does not parse).
	BlocksOutsidePools []BlockUsage `json:"blocksOutsidePools,omitempty"`
	Totals             Totals       `json:"totals"`
}

// PoolUsage is one pool. Counts that can exceed 64 bits (IPv6) are decimal
// strings.
type PoolUsage struct {
	Name      string `json:"name"`
	CIDR      string `json:"cidr"`
	BlockSize int    `json:"blockSize"`
	Disabled  bool   `json:"disabled,omitempty"`
	// Size is the number of addresses in the pool (decimal).
	Size string `json:"size"`
	// BlockCapacity is the number of blocks the pool is carved into (decimal).
	BlockCapacity string `json:"blockCapacity"`
	// BlocksClaimed is the number of blocks that exist.
	BlocksClaimed int `json:"blocksClaimed"`
	// Used is the number of addresses allocated.
	Used int `json:"used"`
	// FreeInBlocks is the number of free addresses in the claimed blocks.
	FreeInBlocks int `json:"freeInBlocks"`
	// Free is Size less Used (decimal).
	Free   string       `json:"free"`
	Blocks []BlockUsage `json:"blocks"`
}

// BlockUsage is one block.
type BlockUsage struct {
	CIDR string `json:"cidr"`
	// Name is the IPAMBlock object's name.
	Name string `json:"name"`
	Pool string `json:"pool,omitempty"`
	// Node is the node the block is affine to (spec.affinity), "" for none.
	Node string `json:"node,omitempty"`
	// Affinity is the state of the node's BlockAffinity: confirmed, pending,
	// pendingDeletion, "missing" (the node has no BlockAffinity for it) or
	// "none" (the block has no node).
	Affinity string `json:"affinity"`
	Size     int    `json:"size"`
	Used     int    `json:"used"`
	Free     int    `json:"free"`
	// Borrowed counts addresses allocated to other nodes.
	Borrowed int  `json:"borrowed"`
	Deleted  bool `json:"deleted,omitempty"`
	// NodeMissing is set when the block's node does not exist.
	NodeMissing bool `json:"nodeMissing,omitempty"`
	// Corrupted says why the block is inconsistent, when it is.
	Corrupted []string `json:"corrupted,omitempty"`
}

// Totals add up every pool.
type Totals struct {
	Pools        int `json:"pools"`
	Blocks       int `json:"blocks"`
	Used         int `json:"used"`
	FreeInBlocks int `json:"freeInBlocks"`
}

// Show computes the usage of every pool and block.
func Show(s *Snapshot) ShowReport {
	x := newIndex(s, Options{})
	rep := ShowReport{Pools: []PoolUsage{}}
	byPool := map[*poolInfo]*PoolUsage{}
	// Pools in name order; blocks in address order.
	pools := append([]*poolInfo(nil), x.pools...)
	sort.Slice(pools, func(i, j int) bool { return pools[i].obj.Name < pools[j].obj.Name })
	for _, p := range pools {
		bits := p.prefix.Addr().BitLen()
		rep.Pools = append(rep.Pools, PoolUsage{
			Name: p.obj.Name, CIDR: p.prefix.String(), BlockSize: p.size, Disabled: p.obj.Spec.Disabled,
			Size: pow2(bits - p.prefix.Bits()), BlockCapacity: pow2(p.size - p.prefix.Bits()),
			Blocks: []BlockUsage{},
		})
	}
	for i := range rep.Pools {
		byPool[pools[i]] = &rep.Pools[i]
	}
	for _, b := range x.blocks {
		u := x.blockUsage(b)
		rep.Totals.Blocks++
		rep.Totals.Used += u.Used
		rep.Totals.FreeInBlocks += u.Free
		pu := byPool[b.pool]
		if pu == nil {
			rep.BlocksOutsidePools = append(rep.BlocksOutsidePools, u)
			continue
		}
		pu.Blocks = append(pu.Blocks, u)
		pu.BlocksClaimed++
		pu.Used += u.Used
		pu.FreeInBlocks += u.Free
	}
	for i := range rep.Pools {
		p := &rep.Pools[i]
		size, _ := new(big.Int).SetString(p.Size, 10)
		p.Free = size.Sub(size, big.NewInt(int64(p.Used))).String()
	}
	rep.Totals.Pools = len(rep.Pools)
	return rep
}

func (x *index) blockUsage(b *blockInfo) BlockUsage {
	u := BlockUsage{
		CIDR: b.cidr(), Name: b.obj.Name, Node: b.node, Size: b.capacity(),
		Used: b.used, Borrowed: b.borrowed, Deleted: b.obj.Spec.Deleted, Corrupted: b.corrupt,
	}
	u.Free = u.Size - u.Used
	if b.pool != nil {
		u.Pool = b.pool.obj.Name
	}
	switch {
	case b.node == "":
		u.Affinity = "none"
	case b.prefix.IsValid() && len(x.affs[affKey{b.node, b.prefix}]) > 0:
		u.Affinity = string(x.affs[affKey{b.node, b.prefix}][0].Spec.State)
	default:
		u.Affinity = "missing"
	}
	if b.node != "" && x.nodes[b.node] == nil {
		u.NodeMissing = true
	}
	return u
}

// IPReport is `tabbyctl ipam show --ip X`: who holds one address.
type IPReport struct {
	IP string `json:"ip"`
	// Pool and Block (CIDR) the address lies in, "" when none.
	Pool      string `json:"pool,omitempty"`
	Block     string `json:"block,omitempty"`
	BlockNode string `json:"blockNode,omitempty"`
	// Allocated says whether a block holds the address for someone.
	Allocated bool `json:"allocated"`
	// Holders are the allocations of the address (more than one only when
	// blocks overlap).
	Holders []Holder `json:"holders,omitempty"`
	// UsedBy are the live pods whose status lists the address.
	UsedBy []PodRef `json:"usedBy,omitempty"`
	// Findings are what Check reports about this address.
	Findings []Finding `json:"findings,omitempty"`
}

// Holder is one allocation.
type Holder struct {
	// Block is the CIDR of the block holding the allocation.
	Block  string `json:"block"`
	Handle string `json:"handle"`
	// HandleObject is the IPAMHandle recording the handle, "" when none does.
	HandleObject string `json:"handleObject,omitempty"`
	Use          string `json:"use,omitempty"`
	Namespace    string `json:"namespace,omitempty"`
	Pod          string `json:"pod,omitempty"`
	// Node is the node the address was allocated for.
	Node string `json:"node,omitempty"`
	// Since is the time of the allocation.
	Since *time.Time `json:"since,omitempty"`
	// Sequence is the block's sequence number of the allocation.
	Sequence *uint64 `json:"sequence,omitempty"`
	// State is one of the State* constants: running, pending, recent,
	// other-addresses, finished, missing, node, replaced, node-gone.
	State string `json:"state"`
	// Reason explains State.
	Reason string `json:"reason"`
	// PodIPs are the addresses the holder pod's status lists.
	PodIPs []string `json:"podIPs,omitempty"`
	// InUse says whether release refuses it without --force.
	InUse bool `json:"inUse"`
}

// PodRef names a pod.
type PodRef struct {
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
	Node        string `json:"node,omitempty"`
	Terminating bool   `json:"terminating,omitempty"`
}

// ShowIP says who holds one address.
func ShowIP(s *Snapshot, ip netip.Addr, o Options) IPReport {
	x := newIndex(s, o)
	ip = ip.Unmap()
	rep := IPReport{IP: ip.String()}
	if p := x.poolOf(netip.PrefixFrom(ip, ip.BitLen())); p != nil {
		rep.Pool = p.obj.Name
	}
	for _, b := range x.blocks {
		if b.prefix.IsValid() && b.prefix.Contains(ip) {
			rep.Block, rep.BlockNode = b.cidr(), b.node
			break
		}
	}
	for _, a := range x.byIP[ip] {
		rep.Allocated = true
		rep.Holders = append(rep.Holders, x.holder(a))
	}
	for _, p := range x.users[ip] {
		rep.UsedBy = append(rep.UsedBy, podRef(p))
	}
	for _, f := range Check(s, o).Findings {
		if f.IP == rep.IP || (f.Block != "" && f.Block == rep.Block && f.IP == "") {
			rep.Findings = append(rep.Findings, f)
		}
	}
	return rep
}

func (x *index) holder(a *allocation) Holder {
	state, why := x.holderState(a)
	h := Holder{
		Block: a.block.cidr(), Handle: a.attr.HandleID, Use: string(a.attr.Use),
		Namespace: a.attr.Namespace, Pod: a.attr.Pod, Node: a.attr.Node,
		Sequence: a.seq, State: state, Reason: why, InUse: inUse(state) || len(x.users[a.ip]) > 0,
	}
	if a.attr.Timestamp != nil {
		t := a.attr.Timestamp.Time
		h.Since = &t
	}
	if ho := x.handles[a.attr.HandleID]; ho != nil {
		h.HandleObject = ho.Name
	}
	if p := x.pods[a.podKey()]; p != nil && a.attr.Pod != "" {
		for _, ip := range podIPs(p) {
			h.PodIPs = append(h.PodIPs, ip.String())
		}
	}
	return h
}

// ReleasePlan is what releasing one address would do.
type ReleasePlan struct {
	IP netip.Addr
	// Allocated is false when no block holds the address: nothing to do.
	Allocated bool
	// Block is the CIDR of the block holding it.
	Block string
	// Handle and Sequence pin the allocation: the release is refused if the
	// address was freed and handed out again meanwhile.
	Handle   string
	Sequence *uint64
	Holder   Holder
	// Refusal says why releasing it could free an address in use; release
	// needs --force then.
	Refusal string
}

// PlanRelease decides whether an address may be released.
func PlanRelease(s *Snapshot, ip netip.Addr, o Options) (ReleasePlan, error) {
	x := newIndex(s, o)
	ip = ip.Unmap()
	plan := ReleasePlan{IP: ip}
	p := x.poolOf(netip.PrefixFrom(ip, ip.BitLen()))
	allocs := x.byIP[ip]
	if p == nil {
		if len(allocs) > 0 {
			return plan, fmt.Errorf("%s is allocated in block %s, which lies in no IPPool: IPAM releases only addresses of its pools; recreate the pool that contained %s, or see tabbyctl ipam check", ip, allocs[0].block.cidr(), allocs[0].block.cidr())
		}
		return plan, fmt.Errorf("%s is in no IPPool, so tabby did not allocate it (tabbyctl ipam show lists the pools)", ip)
	}
	if len(allocs) == 0 {
		return plan, nil
	}
	if len(allocs) > 1 {
		return plan, fmt.Errorf("%s is allocated by %d overlapping blocks: this needs repair by hand, see tabbyctl ipam check", ip, len(allocs))
	}
	a := allocs[0]
	if a.block.pool != p || a.block.prefix.Bits() != p.size {
		return plan, fmt.Errorf("%s is allocated in block %s, which does not fit pool %s (blockSize %d): IPAM cannot release it; see tabbyctl ipam check", ip, a.block.cidr(), p.obj.Name, p.size)
	}
	h := x.holder(a)
	plan.Allocated, plan.Block, plan.Handle, plan.Sequence, plan.Holder = true, a.block.cidr(), a.attr.HandleID, a.seq, h
	var users []string
	for _, u := range x.users[ip] {
		users = append(users, u.Namespace+"/"+u.Name)
	}
	switch {
	case inUse(h.State):
		plan.Refusal = h.Reason
		if h.State == StatePending || h.State == StateRecent {
			plan.Refusal += " (it may be starting: a CNI ADD finished and the kubelet has not reported the address yet)"
		}
	case len(users) > 0:
		plan.Refusal = "the status of live pod " + joinList(users) + " lists it"
	}
	return plan, nil
}

func podRef(p *corev1.Pod) PodRef {
	return PodRef{Namespace: p.Namespace, Name: p.Name, Node: p.Spec.NodeName, Terminating: p.DeletionTimestamp != nil}
}

// ReleaseResult is what `tabbyctl ipam release -o json` prints for each
// address.
type ReleaseResult struct {
	IP string `json:"ip"`
	// Released is true when this run freed the address.
	Released bool `json:"released"`
	// Forced is true when it was released despite Refusal.
	Forced bool `json:"forced,omitempty"`
	// Allocated is false when the address was free already.
	Allocated bool `json:"allocated"`
	// Holder is the allocation as it was before the release.
	Holder *Holder `json:"holder,omitempty"`
	// Refusal says why the address looked in use.
	Refusal string `json:"refusal,omitempty"`
	// Error says what went wrong ("" when nothing did).
	Error string `json:"error,omitempty"`
}
