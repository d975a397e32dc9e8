package policy

import (
	"net"
	"net/netip"
	"slices"
	"sort"

	netutils "k8s.io/utils/net"
)

// parseCIDR reads an ipBlock CIDR the way the API server does (leading
// zeros allowed, host bits allowed and masked off).
func parseCIDR(s string) (netip.Prefix, bool) {
	_, n, err := netutils.ParseCIDRSloppy(s)
	if err != nil || n == nil {
		return netip.Prefix{}, false
	}
	return ipNetToPrefix(n)
}

func ipNetToPrefix(n *net.IPNet) (netip.Prefix, bool) {
	ones, bits := n.Mask.Size()
	var a netip.Addr
	switch {
	case bits == 32 && n.IP.To4() != nil:
		a = netip.AddrFrom4([4]byte(n.IP.To4()))
	case bits == 128 && len(n.IP.To16()) == 16:
		a = netip.AddrFrom16([16]byte(n.IP.To16()))
	default:
		return netip.Prefix{}, false
	}
	p := netip.PrefixFrom(a, ones)
	if !p.IsValid() {
		return netip.Prefix{}, false
	}
	return p.Masked(), true
}

// netMembers turns a rule's ipBlocks (already validated) into the sorted
// members of one hash:net set per family, written for the way the kernel
// matches hash:net: the member with the longest prefix containing the
// address decides, and a "nomatch" member means "not in the set". So an
// ipBlock is its cidr plus its excepts as nomatch entries: as many members
// as the policy has CIDRs, where the complement of the excepts (what
// iptables alone could match) takes up to one prefix per except and per
// bit of the address: 11,000 excepts of ::/0 were over a million members.
//
// Several ipBlocks of a rule share one set, and naively listing every cidr
// and every except would be wrong where they overlap: an except of one
// block that holds (or is) another block's cidr would hide the addresses
// the other block allows. So the members are worked out instead from every
// prefix the blocks name: the addresses whose longest named prefix is P
// are all in the same blocks and excepts, so they are all allowed or all
// not; P is listed (as a member, or nomatch) exactly when that answer
// differs from the one of the prefix around it. This is exact for any
// blocks, and never has more members than the blocks have CIDRs (plus one
// for a /0, which hash:net cannot hold: it becomes its two /1 halves).
func netMembers(blocks []ipBlock) (v4, v6 []string) {
	var fams [2][]namedPrefix
	for i, b := range blocks {
		f := 0
		if b.cidr.Addr().Is6() {
			f = 1
		}
		for _, c := range splitZero(b.cidr) {
			fams[f] = append(fams[f], namedPrefix{c, i, false})
		}
		for _, e := range b.except {
			fams[f] = append(fams[f], namedPrefix{e, i, true})
		}
	}
	return lpmMembers(fams[0], len(blocks)), lpmMembers(fams[1], len(blocks))
}

// namedPrefix is a prefix an ipBlock names: its cidr, or one of its
// excepts.
type namedPrefix struct {
	p      netip.Prefix
	block  int
	except bool
}

// splitZero gives a /0 as its two /1 halves, any other prefix as itself.
func splitZero(p netip.Prefix) []netip.Prefix {
	if p.Bits() != 0 {
		return []netip.Prefix{p}
	}
	lo := netip.PrefixFrom(p.Addr(), 1)
	b := p.Addr().AsSlice()
	b[0] |= 0x80
	hi, _ := netip.AddrFromSlice(b)
	return []netip.Prefix{lo, netip.PrefixFrom(hi, 1)}
}

// lpmMembers walks the named prefixes of one family in order, parents
// before children, keeping for the chain of prefixes around the current
// one how many of each block's cidrs and excepts hold it.
func lpmMembers(named []namedPrefix, nblocks int) []string {
	if len(named) == 0 {
		return nil
	}
	slices.SortFunc(named, func(a, b namedPrefix) int {
		if c := a.p.Addr().Compare(b.p.Addr()); c != 0 {
			return c
		}
		return a.p.Bits() - b.p.Bits()
	})
	inCIDR := make([]int, nblocks)
	inExcept := make([]int, nblocks)
	allowing := 0 // blocks whose cidr holds the prefix and no except does
	apply := func(x namedPrefix, d int) {
		before := inCIDR[x.block] > 0 && inExcept[x.block] == 0
		if x.except {
			inExcept[x.block] += d
		} else {
			inCIDR[x.block] += d
		}
		after := inCIDR[x.block] > 0 && inExcept[x.block] == 0
		switch {
		case after && !before:
			allowing++
		case before && !after:
			allowing--
		}
	}
	type frame struct {
		p     netip.Prefix
		named []namedPrefix
	}
	var stack []frame
	var out []string
	for i := 0; i < len(named); {
		p := named[i].p
		j := i
		for j < len(named) && named[j].p == p {
			j++
		}
		for len(stack) > 0 && !(stack[len(stack)-1].p.Bits() < p.Bits() && stack[len(stack)-1].p.Contains(p.Addr())) {
			for _, x := range stack[len(stack)-1].named {
				apply(x, -1)
			}
			stack = stack[:len(stack)-1]
		}
		around := allowing > 0
		for _, x := range named[i:j] {
			apply(x, 1)
		}
		if here := allowing > 0; here != around {
			if here {
				out = append(out, p.String())
			} else {
				out = append(out, p.String()+" nomatch")
			}
		}
		stack = append(stack, frame{p, named[i:j]})
		i = j
	}
	sort.Strings(out)
	return out
}
