package ipam

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
)

// Spares: addresses a node's CNI agent (tabbyd) allocates ahead, in the
// node's own blocks, under a handle of its own, so that it can answer a
// pod's ADD from memory and move the address to the pod's handle after the
// answer (TransferSpare), as Cilium's agent hands out addresses it holds.
//
// A spare is an allocation like any other: its block records it, so
// nothing else takes the address. It names its node and no pod, so the IPAM
// garbage collector keeps it while the node exists and frees it once the
// node is deleted (gc.Judge). It has no IPAMHandle object: the blocks are
// its record.

// SpareHandlePrefix begins every spare's handle: "_spare.<node>.<id>". A
// CNI network's name begins with a letter or a digit (libcni refuses any
// other), so no pod's handle, "<network>.<containerID>", begins so, and CNI
// GC never takes a spare for a pod's leftover.
const SpareHandlePrefix = "_spare."

// SpareHandle is the handle of node's spare id.
func SpareHandle(node, id string) string { return SpareHandlePrefix + node + "." + id }

// IsSpareHandle says whether a handle is a spare's (of any node).
func IsSpareHandle(handleID string) bool { return strings.HasPrefix(handleID, SpareHandlePrefix) }

// isSpareOf says whether a handle is one of node's spares.
func isSpareOf(handleID, node string) bool {
	return strings.HasPrefix(handleID, SpareHandlePrefix+node+".")
}

// A Spare is the addresses held under one spare handle: one per family it
// was assigned for.
type Spare struct {
	Handle    string
	Addresses []Assigned
}

// Families says which address families the spare holds.
func (s Spare) Families() (ipv4, ipv6 bool) {
	for _, a := range s.Addresses {
		if a.IP.To4() != nil {
			ipv4 = true
		} else {
			ipv6 = true
		}
	}
	return ipv4, ipv6
}

// ErrSpareBorrowed is returned by AssignSpare when the node's blocks had no
// room and no block was free to claim: a spare is never borrowed from
// another node's block (what it took is released again).
var ErrSpareBorrowed = errors.New("no room in the node's own blocks for a spare address")

// ErrSpareLost is wrapped by TransferSpare's errors that trying again
// cannot mend: another handle holds the address now, or its block is gone
// or corrupted.
var ErrSpareLost = errors.New("the spare address is lost")

// AssignSpare allocates a spare for node under handle: one address of
// each family asked, from the node's own blocks (claiming a new block if
// they are full), in the pools a pod without pool annotations would get.
func (m *IPAM) AssignSpare(ctx context.Context, node, handle string, ipv4, ipv6 bool) (Spare, error) {
	if !isSpareOf(handle, node) {
		return Spare{}, fmt.Errorf("ipam: %q is not a spare handle of node %s", handle, node)
	}
	as, record, err := m.AssignDeferred(ctx, Request{HandleID: handle, Node: node, IPv4: ipv4, IPv6: ipv6, Use: tabbyv1.UseWorkload})
	if err != nil {
		return Spare{}, err
	}
	if record == nil {
		// Borrowed (recorded already): give it back.
		if err := m.ReleaseHandle(ctx, handle, node); err != nil {
			return Spare{}, fmt.Errorf("%w, and releasing the borrowed address failed: %v", ErrSpareBorrowed, err)
		}
		return Spare{}, ErrSpareBorrowed
	}
	// record is not run: a spare has no IPAMHandle object.
	return Spare{Handle: handle, Addresses: as}, nil
}

// NodeSpares finds node's spares in its blocks (read from the Source, or
// from the API server when fromAPI), ordered by handle.
func (m *IPAM) NodeSpares(ctx context.Context, node string, fromAPI bool) ([]Spare, error) {
	blocks, err := m.nodeBlocks(ctx, node, !fromAPI)
	if err != nil {
		return nil, wrapDS(m.ds, err)
	}
	pools, err := m.listPools(ctx)
	if err != nil {
		return nil, err
	}
	ps := newPoolSet(pools)
	by := map[string]*Spare{}
	for _, b := range blocks {
		pfx, err := blockPrefix(b)
		if err != nil || blockOK(b) != nil {
			continue
		}
		for ord := range b.Spec.Allocations {
			a := attributeOf(b, ord)
			if a == nil || !isSpareOf(a.HandleID, node) {
				continue
			}
			s := by[a.HandleID]
			if s == nil {
				s = &Spare{Handle: a.HandleID}
				by[a.HandleID] = s
			}
			ip := addrAt(pfx, ord)
			as := Assigned{IP: net.IP(ip.AsSlice()), Block: prefixToIPNet(pfx)}
			if p := ps.containing(ip); p != nil {
				as.Pool = p.obj
			}
			s.Addresses = append(s.Addresses, as)
		}
	}
	out := make([]Spare, 0, len(by))
	for _, s := range by {
		out = append(out, *s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Handle < out[j].Handle })
	return out, nil
}

// SpareFits says whether spare s may answer req as Assign would: req asks
// for any address (no pools named, no exact address) of exactly the
// spare's families, and each of the spare's addresses lies in a pool that
// req could get now (enabled, allowing the use, selecting the node).
func (m *IPAM) SpareFits(ctx context.Context, s Spare, req Request) bool {
	if len(req.IPs) > 0 || len(req.IPv4Pools) > 0 || len(req.IPv6Pools) > 0 || len(s.Addresses) == 0 {
		return false
	}
	if v4, v6 := s.Families(); v4 != req.IPv4 || v6 != req.IPv6 {
		return false
	}
	use := req.Use
	if use == "" {
		use = tabbyv1.UseWorkload
	}
	ps, node, err := m.poolsFor(ctx, req.Node)
	if err != nil {
		return false
	}
	for _, a := range s.Addresses {
		pfx, ip, _, ok := slotOf(a)
		if !ok {
			return false
		}
		family := 4
		if !ip.Is4() {
			family = 6
		}
		cands, _, err := ps.candidates(family, nil, use, node, req.Node)
		if err != nil {
			return false
		}
		found := false
		for _, p := range cands {
			found = found || (p.prefix.Contains(ip) && p.blocks.size == pfx.Bits())
		}
		if !found {
			return false
		}
	}
	return true
}

// TransferSpare gives the addresses of spare s to the attachment req asks
// for (its handle, namespace and pod): in each address's block one
// compare-and-swap moves the address from the spare's handle to req's, as
// a new allocation (a new sequence number), and then req's handle is
// recorded (an IPAMHandle). It is idempotent: an address req's handle holds
// already is left as it is. An address the spare no longer holds is
// allocated to req again when it is free; when another handle holds it,
// the error says so: the address is in use twice.
//
// With next (a spare handle of the node, or "") and a spare of one
// address, the same write also allocates the next spare in that block if
// it has room and is still the node's: a handover then costs one block
// write, not two. The spare made is returned (none: no Addresses).
func (m *IPAM) TransferSpare(ctx context.Context, s Spare, req Request, next string) (Spare, error) {
	if req.HandleID == "" || req.Node == "" || !isSpareOf(s.Handle, req.Node) || (next != "" && !isSpareOf(next, req.Node)) {
		return Spare{}, fmt.Errorf("ipam: cannot transfer %q to handle %q of node %q (next spare %q)", s.Handle, req.HandleID, req.Node, next)
	}
	if req.Use == "" {
		req.Use = tabbyv1.UseWorkload
	}
	attr := tabbyv1.AllocationAttribute{HandleID: req.HandleID, Use: req.Use, Namespace: req.Namespace, Pod: req.Pod, Node: req.Node, Timestamp: nowTime(m.now)}
	if len(s.Addresses) != 1 {
		next = ""
	}
	made := Spare{Handle: next}
	refs := make([]assignedRef, 0, len(s.Addresses))
	for _, a := range s.Addresses {
		got, err := m.transferOne(ctx, s.Handle, a, attr, next)
		if err != nil {
			return Spare{}, err
		}
		if got != nil {
			made.Addresses = append(made.Addresses, *got)
		}
		refs = append(refs, assignedRef{Assigned: a, own: true})
	}
	return made, m.recordHandle(ctx, req.HandleID, req.Node, refs)
}

// transferOne moves one address (see TransferSpare), allocating the next
// spare in its block when next is set; it returns that spare's address.
func (m *IPAM) transferOne(ctx context.Context, spare string, a Assigned, attr tabbyv1.AllocationAttribute, next string) (*Assigned, error) {
	pfx, ip, ord, ok := slotOf(a)
	if !ok {
		return nil, fmt.Errorf("ipam: spare %s has an address outside its block: %v in %v", spare, a.IP, a.Block)
	}
	name := BlockName(pfx)
	b, err := m.src.Block(ctx, name)
	for attempt := range maxRetries {
		if attempt > 0 || b == nil || err != nil {
			b, err = getBlock(ctx, m.ds, name)
		}
		if err != nil {
			return nil, wrapDS(m.ds, fmt.Errorf("reading block %s: %w", pfx, err))
		}
		if b == nil {
			return nil, fmt.Errorf("%w: block %s of spare address %s is gone: the address may be in use twice; run tabbyctl ipam check", ErrSpareLost, pfx, ip)
		}
		if err := blockOK(b); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSpareLost, err)
		}
		nb := b.DeepCopy()
		switch cur := attributeOf(nb, ord); {
		case cur != nil && cur.HandleID == attr.HandleID:
			// Done by an earlier attempt, whose outcome was not known:
			// the next spare it made, if any, is in the block too.
			for o := range nb.Spec.Allocations {
				if h := attributeOf(nb, o); next != "" && h != nil && h.HandleID == next {
					return &Assigned{IP: net.IP(addrAt(pfx, o).AsSlice()), Pool: a.Pool, Block: prefixToIPNet(pfx)}, nil
				}
			}
			return nil, nil
		case cur != nil && cur.HandleID == spare:
			nb.Spec.Allocations[ord] = -1
			assign(nb, ord, attr)
			compactAttributes(nb)
		case cur == nil:
			m.log.Warn("a spare address was released before it was handed over: allocating it to its pod again", "ip", ip.String(), "spare", spare, "handle", attr.HandleID)
			allocateOrdinal(nb, ord, attr)
		default:
			return nil, fmt.Errorf("%w: address %s, handed to %s from spare %s, is now held by handle %s in block %s: it may be in use twice; run tabbyctl ipam check", ErrSpareLost, ip, attr.HandleID, spare, cur.HandleID, pfx)
		}
		nextOrd := -1
		if next != "" && nb.Spec.Affinity == affinityFor(attr.Node) && !nb.Spec.Deleted {
			if o, ok := allocate(nb, tabbyv1.AllocationAttribute{HandleID: next, Use: tabbyv1.UseWorkload, Node: attr.Node, Timestamp: attr.Timestamp}); ok {
				nextOrd = o
			}
		}
		updated, uerr := m.ds.IPAMBlocks.Update(ctx, nb, metav1.UpdateOptions{})
		switch {
		case uerr == nil:
			m.observe(updated)
			if nextOrd < 0 {
				return nil, nil
			}
			return &Assigned{IP: net.IP(addrAt(pfx, nextOrd).AsSlice()), Pool: a.Pool, Block: prefixToIPNet(pfx)}, nil
		case apierrors.IsConflict(uerr), apierrors.IsNotFound(uerr):
			continue
		default:
			return nil, wrapDS(m.ds, fmt.Errorf("handing spare address %s to %s in block %s: %w", ip, attr.HandleID, pfx, uerr))
		}
	}
	return nil, fmt.Errorf("block %s kept changing under %d attempts to hand spare address %s over; try again", pfx, maxRetries, ip)
}

// AddressClaim says that the address at ordinal Ord of block Block, which
// the block still records for handle Holder (a spare), is the attachment's
// that Attr names: a node's CNI agent handed it over, and TransferSpare
// writes that to the block a moment later. tabbyd's NetworkPolicy loop
// programs the pod from the claim meanwhile.
type AddressClaim struct {
	Block  string
	Ord    int
	Holder string
	Attr   tabbyv1.AllocationAttribute
}

// Claims are the claims of req on the spare's addresses.
func (s Spare) Claims(req Request) []AddressClaim {
	use := req.Use
	if use == "" {
		use = tabbyv1.UseWorkload
	}
	attr := tabbyv1.AllocationAttribute{HandleID: req.HandleID, Use: use, Namespace: req.Namespace, Pod: req.Pod, Node: req.Node}
	out := make([]AddressClaim, 0, len(s.Addresses))
	for _, a := range s.Addresses {
		pfx, _, ord, ok := slotOf(a)
		if !ok {
			continue
		}
		out = append(out, AddressClaim{Block: BlockName(pfx), Ord: ord, Holder: s.Handle, Attr: attr})
	}
	return out
}

// slotOf is where an assigned address lies: its block, the address and its
// ordinal; false when it lies outside its block.
func slotOf(a Assigned) (netip.Prefix, netip.Addr, int, bool) {
	ip, ok := netip.AddrFromSlice(a.IP)
	if !ok || a.Block == nil {
		return netip.Prefix{}, netip.Addr{}, 0, false
	}
	ba, ok := netip.AddrFromSlice(a.Block.IP)
	if !ok {
		return netip.Prefix{}, netip.Addr{}, 0, false
	}
	ones, _ := a.Block.Mask.Size()
	pfx := netip.PrefixFrom(ba.Unmap(), ones).Masked()
	ip = ip.Unmap()
	ord, ok := ordinalOf(pfx, ip)
	return pfx, ip, ord, ok
}
