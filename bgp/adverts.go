package bgp

import (
	"fmt"
	"net/netip"
	"sort"

	v1 "github.com/tabbynet/tabby/api/v1"
)

// Route is a prefix and the next hop to reach it.
type Route struct {
	Prefix  netip.Prefix
	NextHop netip.Addr
}

// AdvertKind says why a route is advertised.
type AdvertKind string

// The kinds of advertisement.
const (
	// AdvertBlock: an IPAM block affine to this node.
	AdvertBlock AdvertKind = "block"
	// AdvertBorrowed: one address this node's pods hold in another node's block.
	AdvertBorrowed AdvertKind = "borrowed"
	// AdvertService: a service CIDR of the BGPConfiguration.
	AdvertService AdvertKind = "service"
)

// Advert is one route this node advertises.
type Advert struct {
	Route
	Kind AdvertKind
}

// AdvertInputs are everything Advertisements needs.
type AdvertInputs struct {
	// Node is this node's name.
	Node string
	// IPv4 and IPv6 are its addresses, the next hops of its routes; a
	// family without an address advertises nothing.
	IPv4, IPv6 netip.Addr
	// Pools are all IP pools; blocks of a pool with disableBGPExport stay
	// out of BGP.
	Pools []v1.IPPool
	// Blocks are all IPAM blocks.
	Blocks []v1.IPAMBlock
	// Config is the "default" BGPConfiguration's spec.
	Config v1.BGPConfigurationSpec
}

// Advertisements returns the routes the node advertises, ordered by prefix:
// one per block affine to it, a /32 or /128 per address it holds in another
// node's block (the owner advertises the whole block; the longer prefix
// wins), and the service cluster, external and load-balancer CIDRs. Every
// next hop is the node's address. Unparsable CIDRs are reported and left out.
func Advertisements(in AdvertInputs) ([]Advert, []error) {
	a := &advertBuilder{in: in, seen: map[netip.Prefix]bool{}, noNextHop: map[bool]bool{}}
	a.pools()
	for i := range in.Blocks {
		a.block(&in.Blocks[i])
	}
	for _, list := range [][]v1.ServiceIPBlock{in.Config.ServiceClusterIPs, in.Config.ServiceExternalIPs, in.Config.ServiceLoadBalancerIPs} {
		for _, s := range list {
			p, err := netip.ParsePrefix(s.CIDR)
			if err != nil {
				a.problem("BGPConfiguration service CIDR %q is invalid, so it is not advertised: %v", s.CIDR, err)
				continue
			}
			a.add(p.Masked(), AdvertService)
		}
	}
	sort.Slice(a.out, func(i, j int) bool { return prefixLess(a.out[i].Prefix, a.out[j].Prefix) })
	return a.out, a.problems
}

type advertBuilder struct {
	in        AdvertInputs
	noExport  []netip.Prefix // pools with disableBGPExport
	seen      map[netip.Prefix]bool
	out       []Advert
	problems  []error
	noNextHop map[bool]bool // families already reported as lacking a next hop, by Is4
}

func (a *advertBuilder) problem(format string, args ...any) {
	a.problems = append(a.problems, fmt.Errorf(format, args...))
}

func (a *advertBuilder) pools() {
	for _, p := range a.in.Pools {
		if !p.Spec.DisableBGPExport {
			continue
		}
		pfx, err := netip.ParsePrefix(p.Spec.CIDR)
		if err != nil {
			a.problem("IPPool %s: cidr %q is invalid: %v", p.Name, p.Spec.CIDR, err)
			continue
		}
		a.noExport = append(a.noExport, pfx.Masked())
	}
}

// exported says whether a prefix may go out: no disableBGPExport pool holds it.
func (a *advertBuilder) exported(p netip.Prefix) bool {
	for _, pool := range a.noExport {
		if pool.Bits() <= p.Bits() && pool.Contains(p.Addr()) {
			return false
		}
	}
	return true
}

func (a *advertBuilder) add(p netip.Prefix, kind AdvertKind) {
	nh := a.in.IPv4
	if p.Addr().Is6() {
		nh = a.in.IPv6
	}
	if !nh.IsValid() {
		if !a.noNextHop[p.Addr().Is4()] {
			a.noNextHop[p.Addr().Is4()] = true
			f := familyOf(p.Addr())
			a.problem("node %s has no IPv%d address, so its IPv%d routes (%s and any others) are not advertised", a.in.Node, f, f, p)
		}
		return
	}
	if a.seen[p] || !a.exported(p) {
		return
	}
	a.seen[p] = true
	a.out = append(a.out, Advert{Route: Route{Prefix: p, NextHop: nh}, Kind: kind})
}

func (a *advertBuilder) block(b *v1.IPAMBlock) {
	if b.Spec.Deleted {
		return
	}
	p, err := netip.ParsePrefix(b.Spec.CIDR)
	if err != nil {
		a.problem("IPAMBlock %s: cidr %q is invalid: %v", b.Name, b.Spec.CIDR, err)
		return
	}
	p = p.Masked()
	if b.Spec.Affinity == "host:"+a.in.Node {
		a.add(p, AdvertBlock)
		return
	}
	Borrowed(b, func(ord int, node string) {
		if node != a.in.Node {
			return
		}
		if addr, ok := nthAddr(p, ord); ok {
			a.add(netip.PrefixFrom(addr, addr.BitLen()), AdvertBorrowed)
		}
	})
}

// nthAddr is the ord-th address of p.
func nthAddr(p netip.Prefix, ord int) (netip.Addr, bool) {
	if ord < 0 || p.Addr().BitLen()-p.Bits() < 31 && ord >= 1<<(p.Addr().BitLen()-p.Bits()) {
		return netip.Addr{}, false
	}
	b := p.Addr().AsSlice()
	carry := ord
	for i := len(b) - 1; i >= 0 && carry > 0; i-- {
		sum := int(b[i]) + carry&0xff
		b[i] = byte(sum)
		carry = carry>>8 + sum>>8
	}
	addr, _ := netip.AddrFromSlice(b)
	return addr, true
}

// prefixLess orders prefixes by address, then by length.
func prefixLess(a, b netip.Prefix) bool {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c < 0
	}
	return a.Bits() < b.Bits()
}
