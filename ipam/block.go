package ipam

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/big"
	"net/netip"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
)

// The pure half of IPAM: block naming, carving pools into blocks, and
// allocating and releasing ordinals inside one block. Nothing here talks to
// the datastore.

// affinityFor is the IPAMBlock affinity of a node.
func affinityFor(node string) string { return "host:" + node }

// NodeLabelValue is the value of the tabby.io/node label for a node: its name
// when that is a valid label value, else a stable hash of it.
func NodeLabelValue(node string) string {
	if len(validation.IsValidLabelValue(node)) == 0 {
		return node
	}
	sum := sha256.Sum256([]byte(node))
	return "h-" + hex.EncodeToString(sum[:])[:40]
}

// BlockName is the object name of the block with the given CIDR:
// 10.244.0.64/26 -> 10-244-0-64-26, fd00::40/122 -> fd00-0-0-0-0-0-0-40-122.
func BlockName(p netip.Prefix) string {
	a := p.Addr()
	var parts []string
	if a.Is4() {
		b := a.As4()
		for _, x := range b {
			parts = append(parts, strconv.Itoa(int(x)))
		}
	} else {
		b := a.As16()
		for i := 0; i < 16; i += 2 {
			parts = append(parts, strconv.FormatUint(uint64(b[i])<<8|uint64(b[i+1]), 16))
		}
	}
	return strings.Join(parts, "-") + "-" + strconv.Itoa(p.Bits())
}

// objectName makes a valid object name from free text (handle IDs, node +
// block), hashing what would be too long or invalid.
func objectName(s string) string {
	lower := strings.ToLower(s)
	var b strings.Builder
	for _, r := range lower {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '.':
			b.WriteRune(r)
		default:
			b.WriteRune('-')
		}
	}
	name := strings.Trim(b.String(), "-.")
	if name == s && len(name) <= 200 {
		return name
	}
	// Lossy or too long: keep a readable prefix and make it unique with a hash.
	sum := sha256.Sum256([]byte(s))
	if len(name) > 180 {
		name = name[:180]
	}
	name = strings.Trim(name, "-.")
	if name == "" {
		name = "x"
	}
	return name + "-" + hex.EncodeToString(sum[:])[:16]
}

// HandleObjectName is the IPAMHandle object name for a handle ID.
func HandleObjectName(handleID string) string { return objectName(handleID) }

// affinityObjectName is the BlockAffinity object name for node and block.
func affinityObjectName(node string, block netip.Prefix) string {
	return objectName(node + "-" + BlockName(block))
}

// blockSize returns the number of addresses in a block, which must be small
// enough to hold one slot per address (the API refuses blocks larger than /20
// or /116).
func blockSize(p netip.Prefix) int {
	return 1 << (p.Addr().BitLen() - p.Bits())
}

// newBlock makes an empty block affine to node (or to no node when empty).
func newBlock(p netip.Prefix, pool, node string) *tabbyv1.IPAMBlock {
	n := blockSize(p)
	b := &tabbyv1.IPAMBlock{
		ObjectMeta: metav1.ObjectMeta{
			Name:   BlockName(p),
			Labels: map[string]string{tabbyv1.LabelPool: pool},
		},
		Spec: tabbyv1.IPAMBlockSpec{
			CIDR:        p.String(),
			Allocations: make([]int, n),
			Unallocated: make([]int, n),
		},
	}
	if node != "" {
		b.Labels[tabbyv1.LabelNode] = NodeLabelValue(node)
		b.Spec.Affinity = affinityFor(node)
	}
	for i := range n {
		b.Spec.Allocations[i] = -1
		b.Spec.Unallocated[i] = i
	}
	return b
}

// blockPrefix parses a block's CIDR.
func blockPrefix(b *tabbyv1.IPAMBlock) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(b.Spec.CIDR)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("block %s has an invalid cidr %q: %w", b.Name, b.Spec.CIDR, err)
	}
	return p, nil
}

// blockOK says whether a block's arrays are consistent with its CIDR; a
// corrupted block is never written to.
func blockOK(b *tabbyv1.IPAMBlock) error {
	p, err := blockPrefix(b)
	if err != nil {
		return err
	}
	n := blockSize(p)
	if len(b.Spec.Allocations) != n {
		return fmt.Errorf("block %s (%s) has %d allocation slots, want %d: it is corrupted; run tabbyctl ipam check", b.Name, b.Spec.CIDR, len(b.Spec.Allocations), n)
	}
	return nil
}

// freeCount is the number of unallocated addresses of a block.
func freeCount(b *tabbyv1.IPAMBlock) int { return len(b.Spec.Unallocated) }

// ordinalOf returns the position of ip inside block prefix p. Blocks hold at
// most 4096 addresses and are aligned, so the low 32 bits give the offset.
func ordinalOf(p netip.Prefix, ip netip.Addr) (int, bool) {
	if !p.Contains(ip) {
		return 0, false
	}
	low := func(a netip.Addr) uint32 {
		b := a.As16()
		return uint32(b[12])<<24 | uint32(b[13])<<16 | uint32(b[14])<<8 | uint32(b[15])
	}
	return int(low(ip) - low(p.Masked().Addr())), true
}

// addrAt returns the address at ordinal i of block prefix p.
func addrAt(p netip.Prefix, i int) netip.Addr {
	return addAddr(p.Masked().Addr(), big.NewInt(int64(i)))
}

// addAddr adds n to an address.
func addAddr(a netip.Addr, n *big.Int) netip.Addr {
	b := a.AsSlice()
	v := new(big.Int).SetBytes(b)
	v.Add(v, n)
	out := v.FillBytes(make([]byte, len(b)))
	r, _ := netip.AddrFromSlice(out)
	return r
}

// allocate takes the next free ordinal of the block for attr. It returns the
// ordinal, or false when the block is full.
func allocate(b *tabbyv1.IPAMBlock, attr tabbyv1.AllocationAttribute) (int, bool) {
	for len(b.Spec.Unallocated) > 0 {
		ord := b.Spec.Unallocated[0]
		b.Spec.Unallocated = b.Spec.Unallocated[1:]
		if ord < 0 || ord >= len(b.Spec.Allocations) || b.Spec.Allocations[ord] != -1 {
			continue // an inconsistent free list never hands out a held address
		}
		assign(b, ord, attr)
		return ord, true
	}
	return 0, false
}

// allocateOrdinal takes one given ordinal; false when it is held.
func allocateOrdinal(b *tabbyv1.IPAMBlock, ord int, attr tabbyv1.AllocationAttribute) bool {
	if ord < 0 || ord >= len(b.Spec.Allocations) || b.Spec.Allocations[ord] != -1 {
		return false
	}
	for i, u := range b.Spec.Unallocated {
		if u == ord {
			b.Spec.Unallocated = append(b.Spec.Unallocated[:i:i], b.Spec.Unallocated[i+1:]...)
			break
		}
	}
	assign(b, ord, attr)
	return true
}

func assign(b *tabbyv1.IPAMBlock, ord int, attr tabbyv1.AllocationAttribute) {
	idx := -1
	for i := range b.Spec.Attributes {
		if attributesEqual(b.Spec.Attributes[i], attr) {
			idx = i
			break
		}
	}
	if idx < 0 {
		b.Spec.Attributes = append(b.Spec.Attributes, attr)
		idx = len(b.Spec.Attributes) - 1
	}
	b.Spec.Allocations[ord] = idx
	b.Spec.SequenceNumber++
	if b.Spec.SequenceNumberForAllocation == nil {
		b.Spec.SequenceNumberForAllocation = map[string]uint64{}
	}
	b.Spec.SequenceNumberForAllocation[strconv.Itoa(ord)] = b.Spec.SequenceNumber
}

func attributesEqual(a, b tabbyv1.AllocationAttribute) bool {
	return a.HandleID == b.HandleID && a.Use == b.Use && a.Namespace == b.Namespace &&
		a.Pod == b.Pod && a.Node == b.Node
}

// attributeOf returns the holder of an ordinal, or nil when it is free.
func attributeOf(b *tabbyv1.IPAMBlock, ord int) *tabbyv1.AllocationAttribute {
	if ord < 0 || ord >= len(b.Spec.Allocations) {
		return nil
	}
	idx := b.Spec.Allocations[ord]
	if idx < 0 || idx >= len(b.Spec.Attributes) {
		return nil
	}
	return &b.Spec.Attributes[idx]
}

// releaseOrdinal frees one ordinal: it goes to the back of the free list.
func releaseOrdinal(b *tabbyv1.IPAMBlock, ord int) {
	b.Spec.Allocations[ord] = -1
	b.Spec.Unallocated = append(b.Spec.Unallocated, ord)
	delete(b.Spec.SequenceNumberForAllocation, strconv.Itoa(ord))
}

// releaseHandle frees every ordinal the handle holds in the block and
// returns how many.
func releaseHandle(b *tabbyv1.IPAMBlock, handleID string) int {
	n := 0
	for ord := range b.Spec.Allocations {
		if a := attributeOf(b, ord); a != nil && a.HandleID == handleID {
			releaseOrdinal(b, ord)
			n++
		}
	}
	if n > 0 {
		compactAttributes(b)
	}
	return n
}

// compactAttributes drops attributes no allocation refers to.
func compactAttributes(b *tabbyv1.IPAMBlock) {
	used := make([]bool, len(b.Spec.Attributes))
	for _, idx := range b.Spec.Allocations {
		if idx >= 0 && idx < len(used) {
			used[idx] = true
		}
	}
	remap := make([]int, len(b.Spec.Attributes))
	var kept []tabbyv1.AllocationAttribute
	for i, a := range b.Spec.Attributes {
		if used[i] {
			remap[i] = len(kept)
			kept = append(kept, a)
		} else {
			remap[i] = -1
		}
	}
	for ord, idx := range b.Spec.Allocations {
		if idx >= 0 && idx < len(remap) {
			b.Spec.Allocations[ord] = remap[idx]
		}
	}
	b.Spec.Attributes = kept
}

// sequenceOf returns the sequence number an ordinal was allocated with.
func sequenceOf(b *tabbyv1.IPAMBlock, ord int) (uint64, bool) {
	s, ok := b.Spec.SequenceNumberForAllocation[strconv.Itoa(ord)]
	return s, ok
}

// inUse counts held addresses.
func inUse(b *tabbyv1.IPAMBlock) int {
	n := 0
	for _, idx := range b.Spec.Allocations {
		if idx >= 0 {
			n++
		}
	}
	return n
}

// poolBlocks describes how a pool is carved into blocks.
type poolBlocks struct {
	pool   netip.Prefix
	size   int      // block prefix length
	count  *big.Int // number of blocks
	stride *big.Int // addresses per block
}

func carve(pool netip.Prefix, size int) poolBlocks {
	bits := pool.Addr().BitLen()
	return poolBlocks{
		pool:   pool.Masked(),
		size:   size,
		count:  new(big.Int).Lsh(big.NewInt(1), uint(size-pool.Bits())),
		stride: new(big.Int).Lsh(big.NewInt(1), uint(bits-size)),
	}
}

// block returns block number i of the pool.
func (c poolBlocks) block(i *big.Int) netip.Prefix {
	off := new(big.Int).Mul(i, c.stride)
	return netip.PrefixFrom(addAddr(c.pool.Addr(), off), c.size)
}

// blockFor returns the block of the pool that holds ip.
func (c poolBlocks) blockFor(ip netip.Addr) netip.Prefix {
	p, _ := ip.Prefix(c.size)
	return p
}

// startIndex spreads nodes over a pool so that they rarely race for the same
// block: each node starts its search at a position hashed from its name.
func (c poolBlocks) startIndex(node string) *big.Int {
	sum := sha256.Sum256([]byte(node))
	v := new(big.Int).SetBytes(sum[:16])
	return v.Mod(v, c.count)
}

// freeBlocks yields up to max free block prefixes of the pool (those not in
// used), starting at the node's hashed position and wrapping around.
func (c poolBlocks) freeBlocks(node string, used map[netip.Prefix]bool, max int) []netip.Prefix {
	var out []netip.Prefix
	i := c.startIndex(node)
	one := big.NewInt(1)
	// At most len(used)+max probes find max free blocks, if they exist.
	probes := new(big.Int).SetInt64(int64(len(used) + max))
	if probes.Cmp(c.count) > 0 {
		probes.Set(c.count)
	}
	for k := new(big.Int); k.Cmp(probes) < 0 && len(out) < max; k.Add(k, one) {
		p := c.block(i)
		if !used[p] {
			out = append(out, p)
		}
		i.Add(i, one)
		if i.Cmp(c.count) >= 0 {
			i.SetInt64(0)
		}
	}
	return out
}

// nowTime is the allocation timestamp.
func nowTime(now func() time.Time) *metav1.Time {
	t := metav1.NewTime(now().UTC().Truncate(time.Second))
	return &t
}
