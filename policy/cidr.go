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

// span is a closed range of addresses of one family.
type span struct{ lo, hi netip.Addr }

// lastAddr is the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

func prefixSpan(p netip.Prefix) span {
	return span{p.Masked().Addr(), lastAddr(p)}
}

// blockSpans is cidr minus every except, as sorted disjoint spans.
func blockSpans(cidr netip.Prefix, excepts []netip.Prefix) []span {
	ex := make([]span, 0, len(excepts))
	for _, e := range excepts {
		ex = append(ex, prefixSpan(e))
	}
	slices.SortFunc(ex, func(a, b span) int { return a.lo.Compare(b.lo) })
	whole := prefixSpan(cidr)
	var out []span
	cur := whole.lo
	for _, e := range ex {
		if e.hi.Less(cur) {
			continue
		}
		if cur.Less(e.lo) {
			hi := e.lo.Prev()
			if whole.hi.Less(hi) {
				hi = whole.hi
			}
			out = append(out, span{cur, hi})
		}
		if !e.hi.Less(whole.hi) {
			return out
		}
		if cur.Less(e.hi.Next()) {
			cur = e.hi.Next()
		}
	}
	if !whole.hi.Less(cur) {
		out = append(out, span{cur, whole.hi})
	}
	return out
}

// unionSpans sorts and merges overlapping or adjacent spans.
func unionSpans(in []span) []span {
	if len(in) == 0 {
		return nil
	}
	s := slices.Clone(in)
	slices.SortFunc(s, func(a, b span) int {
		if c := a.lo.Compare(b.lo); c != 0 {
			return c
		}
		return a.hi.Compare(b.hi)
	})
	out := []span{s[0]}
	for _, x := range s[1:] {
		last := &out[len(out)-1]
		next := last.hi.Next() // invalid when last.hi is the top address
		if !next.IsValid() || !next.Less(x.lo) {
			if last.hi.Less(x.hi) {
				last.hi = x.hi
			}
			continue
		}
		out = append(out, x)
	}
	return out
}

// spanPrefixes is the shortest list of prefixes covering exactly s, none of
// them /0 (ipset's hash:net cannot hold a /0: it becomes two /1s).
func spanPrefixes(s span) []netip.Prefix {
	var out []netip.Prefix
	lo := s.lo
	maxBits := lo.BitLen()
	for {
		bits := maxBits
		for b := 0; b <= maxBits; b++ {
			p := netip.PrefixFrom(lo, b)
			if p.Masked().Addr() == lo && !s.hi.Less(lastAddr(p)) {
				bits = b
				break
			}
		}
		p := netip.PrefixFrom(lo, bits)
		if bits == 0 {
			lo1 := netip.PrefixFrom(lo, 1)
			hi1 := netip.PrefixFrom(lastAddr(lo1).Next(), 1)
			out = append(out, lo1, hi1)
		} else {
			out = append(out, p)
		}
		last := lastAddr(p)
		if last == s.hi {
			return out
		}
		lo = last.Next()
	}
}

// netMembers turns ipBlocks (already validated) into the sorted members of
// one hash:net set per family.
func netMembers(blocks []ipBlock) (v4, v6 []string) {
	var s4, s6 []span
	for _, b := range blocks {
		spans := blockSpans(b.cidr, b.except)
		if b.cidr.Addr().Is4() {
			s4 = append(s4, spans...)
		} else {
			s6 = append(s6, spans...)
		}
	}
	conv := func(spans []span) []string {
		var out []string
		for _, s := range unionSpans(spans) {
			for _, p := range spanPrefixes(s) {
				out = append(out, p.String())
			}
		}
		sort.Strings(out)
		return out
	}
	return conv(s4), conv(s6)
}
