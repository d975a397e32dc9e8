package ipam

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sort"
)

// ReleaseInBlock is Release for addresses of one block, named by its CIDR,
// without looking up their pool (so it also frees addresses of a block
// whose pool is gone). It is what the garbage collector (package ipam/gc)
// uses: every address is released with compare-and-swap on the block's
// resourceVersion, and only while it is still held by opts' handle and
// sequence number (when given). It returns the addresses it released; the
// others were left as they are. The handles' records (IPAMHandle) shrink
// by what was released; an error doing that still returns what was
// released.
func (m *IPAM) ReleaseInBlock(ctx context.Context, block netip.Prefix, opts []ReleaseOptions) ([]net.IP, error) {
	block = block.Masked()
	var mine []ReleaseOptions
	for _, o := range opts {
		if a, ok := netip.AddrFromSlice(o.IP); ok && block.Contains(a.Unmap()) {
			mine = append(mine, o)
		}
	}
	if len(mine) == 0 {
		return nil, nil
	}
	rel, skipped, err := m.releaseInBlock(ctx, block, mine)
	if err != nil {
		return nil, err
	}
	refused := map[string]bool{}
	for _, ip := range skipped {
		refused[ip.String()] = true
	}
	var released []net.IP
	for _, o := range mine {
		if !refused[o.IP.String()] {
			released = append(released, o.IP)
		}
	}
	handles := make([]string, 0, len(rel))
	for h := range rel {
		handles = append(handles, h)
	}
	sort.Strings(handles)
	for _, h := range handles {
		if err := m.shrinkHandle(ctx, h, map[string]int{block.String(): rel[h]}); err != nil {
			return released, fmt.Errorf("the addresses were released, but: %w", err)
		}
	}
	return released, nil
}

// AffinityObjectName is the name of the BlockAffinity object recording that
// node claimed block (the name IPAM's claims use).
func AffinityObjectName(node string, block netip.Prefix) string {
	return affinityObjectName(node, block.Masked())
}
