package routing

import (
	"bytes"
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	v1 "github.com/tabbynet/tabby/api/v1"
)

// pool is an IPPool as routing sees it.
type pool struct {
	name        string
	cidr        netip.Prefix
	ipip, vxlan v1.EncapMode
	nat         bool
}

// encap is how a learned route is carried.
type encap int

const (
	native encap = iota
	overIPIP
	overVXLAN
)

// Desired computes the state a node needs from its inputs. It is pure and
// deterministic: the same inputs, in any order, give the same State.
//
// Learned routes inside a pool follow the pool's mode: Never routes natively
// via the originating node; IPIP Always routes via that node over tunl0;
// VXLAN Always routes via the node's VXLAN tunnel address over tabby.vxlan
// (IPv6 via the node's VXLAN link-local address, over the same IPv4
// underlay); CrossSubnet encapsulates only when the next hop is outside this
// node's subnet. Routes outside every pool (from external BGP peers) are
// native. The node's own blocks become blackholes, and learned copies of
// them are ignored. What cannot be honoured is said in State.Warnings.
func Desired(in Inputs) State {
	d := &desired{in: in, self: in.Node}
	d.pools()
	d.devices()
	d.peers()
	d.routes()
	d.nat()
	return d.s
}

type desired struct {
	in      Inputs
	self    NodeInfo
	s       State
	pl      []pool                   // most specific first
	byAddr  map[netip.Addr]*NodeInfo // peers by node address
	vxlanV6 bool                     // an IPv6 pool uses VXLAN
}

func (d *desired) warn(format string, args ...any) {
	d.s.Warnings = append(d.s.Warnings, fmt.Sprintf(format, args...))
}

func mode(m v1.EncapMode) v1.EncapMode {
	if m == "" {
		return v1.EncapNever
	}
	return m
}

func (d *desired) pools() {
	byName := slices.Clone(d.in.Pools)
	slices.SortFunc(byName, func(a, b v1.IPPool) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Spec.CIDR, b.Spec.CIDR))
	})
	for _, p := range byName {
		cidr, err := netip.ParsePrefix(p.Spec.CIDR)
		if err != nil {
			d.warn("pool %s: cidr %q is not a CIDR: the pool is ignored", p.Name, p.Spec.CIDR)
			continue
		}
		q := pool{name: p.Name, cidr: cidr.Masked(), ipip: mode(p.Spec.IPIPMode), vxlan: mode(p.Spec.VXLANMode), nat: p.Spec.NATOutgoing}
		if q.ipip != v1.EncapNever && q.vxlan != v1.EncapNever {
			d.warn("pool %s has both ipipMode %s and vxlanMode %s: VXLAN is used", q.name, q.ipip, q.vxlan)
			q.ipip = v1.EncapNever
		}
		if q.ipip != v1.EncapNever && !q.cidr.Addr().Is4() {
			d.warn("pool %s: IPIP carries only IPv4, so the IPv6 pool is routed natively: use vxlanMode to encapsulate it", q.name)
			q.ipip = v1.EncapNever
		}
		d.pl = append(d.pl, q)
	}
	slices.SortFunc(d.pl, func(a, b pool) int {
		return cmp.Or(b.cidr.Bits()-a.cidr.Bits(), a.cidr.Addr().Compare(b.cidr.Addr()), cmp.Compare(a.name, b.name))
	})
}

// poolOf returns the most specific pool containing p, or nil.
func (d *desired) poolOf(p netip.Prefix) *pool {
	for i := range d.pl {
		if c := d.pl[i].cidr; c.Bits() <= p.Bits() && c.Contains(p.Addr()) {
			return &d.pl[i]
		}
	}
	return nil
}

func (d *desired) devices() {
	var vxlan, ipip bool
	for _, p := range d.pl {
		if p.vxlan != v1.EncapNever {
			vxlan = true
			d.vxlanV6 = d.vxlanV6 || p.cidr.Addr().Is6()
		}
		ipip = ipip || p.ipip != v1.EncapNever
		if p.cidr.Addr().Is4() {
			d.s.IPv4Forwarding = true
		} else {
			d.s.IPv6Forwarding = true
		}
	}
	d.s.IPv4Forwarding = d.s.IPv4Forwarding || d.self.IPv4.IsValid()
	d.s.IPv6Forwarding = d.s.IPv6Forwarding || d.self.IPv6.IsValid()
	if vxlan {
		if !d.self.IPv4.IsValid() {
			d.warn("VXLAN needs this node's IPv4 address (VXLAN over IPv6 is not supported): no VXLAN device")
		} else {
			mac := d.self.VXLANMAC
			if len(mac) == 0 {
				mac = DefaultVXLANMAC(d.self.Name)
			}
			x := &VXLAN{MAC: mac, Local: d.self.IPv4.Addr()}
			if a := d.self.VXLANAddress; a.IsValid() {
				x.Addresses = append(x.Addresses, netip.PrefixFrom(a, 32))
			} else {
				d.warn("this node has no VXLAN tunnel address: traffic the node itself sends over VXLAN has no tunnel source address")
			}
			if d.vxlanV6 {
				x.Addresses = append(x.Addresses, netip.PrefixFrom(LinkLocalFromMAC(mac), 64))
			}
			d.s.VXLAN = x
		}
	}
	if ipip {
		t := &IPIP{Local: d.self.IPv4.Addr()}
		if a := d.self.IPIPAddress; a.IsValid() {
			t.Address = netip.PrefixFrom(a, 32)
		}
		d.s.IPIP = t
	}
}

// peers indexes the other nodes by address and gives every peer with a
// complete VXLAN identity its FDB and neighbour entries.
func (d *desired) peers() {
	peers := slices.Clone(d.in.Peers)
	slices.SortFunc(peers, func(a, b NodeInfo) int { return cmp.Compare(a.Name, b.Name) })
	d.byAddr = map[netip.Addr]*NodeInfo{}
	macOwner := map[string]string{}
	for i := range peers {
		p := &peers[i]
		if p.Name == d.self.Name {
			continue
		}
		for _, a := range []netip.Prefix{p.IPv4, p.IPv6} {
			if !a.IsValid() {
				continue
			}
			if other, dup := d.byAddr[a.Addr()]; dup {
				d.warn("nodes %s and %s both claim the address %s: routes via it use %s", other.Name, p.Name, a.Addr(), other.Name)
				continue
			}
			d.byAddr[a.Addr()] = p
		}
		x := d.s.VXLAN
		if x == nil || len(p.VXLANMAC) == 0 || !p.IPv4.IsValid() {
			continue
		}
		mac := p.VXLANMAC.String()
		if other, dup := macOwner[mac]; dup || bytes.Equal(p.VXLANMAC, x.MAC) {
			if !dup {
				other = d.self.Name + " (this node)"
			}
			d.warn("nodes %s and %s have the same VXLAN MAC %s: %s is left out of VXLAN", other, p.Name, mac, p.Name)
			continue
		}
		macOwner[mac] = p.Name
		x.FDB = append(x.FDB, FDBEntry{MAC: p.VXLANMAC, Dst: p.IPv4.Addr()})
		if p.VXLANAddress.IsValid() {
			x.Neighbors = append(x.Neighbors, Neighbor{IP: p.VXLANAddress, MAC: p.VXLANMAC})
		}
		if d.vxlanV6 {
			x.Neighbors = append(x.Neighbors, Neighbor{IP: LinkLocalFromMAC(p.VXLANMAC), MAC: p.VXLANMAC})
		}
	}
	if x := d.s.VXLAN; x != nil {
		slices.SortFunc(x.FDB, func(a, b FDBEntry) int { return bytes.Compare(a.MAC, b.MAC) })
		slices.SortFunc(x.Neighbors, func(a, b Neighbor) int { return a.IP.Compare(b.IP) })
	}
}

// onSubnet says whether a is inside this node's subnet of its family.
func (d *desired) onSubnet(a netip.Addr) bool {
	p := d.self.prefixOf(a)
	return p.IsValid() && p.Masked().Contains(a)
}

func (d *desired) isSelf(a netip.Addr) bool {
	return a == d.self.IPv4.Addr() || a == d.self.IPv6.Addr()
}

func (d *desired) routes() {
	own := map[netip.Prefix]bool{}
	for _, b := range d.in.Blocks {
		if !b.IsValid() {
			continue
		}
		b = b.Masked()
		if !own[b] {
			own[b] = true
			d.s.Routes = append(d.s.Routes, Route{Dst: b, Type: Blackhole})
		}
	}
	learned := slices.Clone(d.in.Learned)
	for i := range learned {
		learned[i].Prefix = learned[i].Prefix.Masked()
		learned[i].NextHop = learned[i].NextHop.Unmap()
	}
	slices.SortFunc(learned, func(a, b LearnedRoute) int {
		return cmp.Or(comparePrefix(a.Prefix, b.Prefix), a.NextHop.Compare(b.NextHop))
	})
	chosen := map[netip.Prefix]netip.Addr{}
	for _, lr := range learned {
		p, nh := lr.Prefix, lr.NextHop
		switch {
		case !p.IsValid() || !nh.IsValid():
			d.warn("learned route %s via %s is incomplete: ignored", p, nh)
			continue
		case own[p] || d.isSelf(nh):
			continue // our own advertisement, learned back
		case p.Addr().Is4() != nh.Is4():
			d.warn("learned route %s via %s mixes address families: ignored", p, nh)
			continue
		}
		if first, dup := chosen[p]; dup {
			if first != nh {
				d.warn("%s is learned via both %s and %s: %s is used", p, first, nh, first)
			}
			continue
		}
		chosen[p] = nh
		if r, ok := d.route(p, nh); ok {
			d.s.Routes = append(d.s.Routes, r)
		}
	}
	slices.SortFunc(d.s.Routes, func(a, b Route) int { return comparePrefix(a.Dst, b.Dst) })
}

// route computes the route for a learned prefix p via next hop nh.
func (d *desired) route(p netip.Prefix, nh netip.Addr) (Route, bool) {
	how, m := native, v1.EncapNever
	if pl := d.poolOf(p); pl != nil {
		switch {
		case pl.vxlan != v1.EncapNever:
			how, m = overVXLAN, pl.vxlan
		case pl.ipip != v1.EncapNever:
			how, m = overIPIP, pl.ipip
		}
	}
	if m == v1.EncapCrossSubnet && d.onSubnet(nh) {
		how = native
	}
	switch how {
	case overIPIP:
		return Route{Dst: p, Gateway: nh, Device: IPIPDevice, OnLink: true}, true
	case overVXLAN:
		return d.vxlanRoute(p, nh)
	}
	if !d.onSubnet(nh) {
		d.warn("%s is routed natively via %s, which is not on this node's subnet %s: the kernel installs it only if %s is directly reachable (use vxlanMode CrossSubnet or Always for pools across subnets)",
			p, nh, d.self.prefixOf(nh), nh)
	}
	return Route{Dst: p, Gateway: nh}, true
}

func (d *desired) vxlanRoute(p netip.Prefix, nh netip.Addr) (Route, bool) {
	if d.s.VXLAN == nil {
		d.warn("%s via %s needs VXLAN, which this node cannot run: not routed", p, nh)
		return Route{}, false
	}
	peer := d.byAddr[nh]
	if peer == nil {
		d.warn("%s via %s needs VXLAN, but no node has the address %s: not routed until its node publishes its VXLAN identity", p, nh, nh)
		return Route{}, false
	}
	if !slices.ContainsFunc(d.s.VXLAN.FDB, func(e FDBEntry) bool { return bytes.Equal(e.MAC, peer.VXLANMAC) && e.Dst == peer.IPv4.Addr() }) {
		d.warn("%s via node %s needs VXLAN, but node %s has published no usable VXLAN MAC and IPv4 address: not routed yet", p, peer.Name, peer.Name)
		return Route{}, false
	}
	if p.Addr().Is6() {
		return Route{Dst: p, Gateway: LinkLocalFromMAC(peer.VXLANMAC), Device: VXLANDevice}, true
	}
	if !peer.VXLANAddress.IsValid() {
		d.warn("%s via node %s needs VXLAN, but node %s has published no VXLAN tunnel address: not routed yet", p, peer.Name, peer.Name)
		return Route{}, false
	}
	return Route{Dst: p, Gateway: peer.VXLANAddress, Device: VXLANDevice, OnLink: true}, true
}

func (d *desired) nat() {
	var all, nat []netip.Prefix
	for _, p := range d.pl {
		all = append(all, p.cidr)
		if p.nat {
			nat = append(nat, p.cidr)
		}
	}
	d.s.NAT = NAT{AllPools: sortedPrefixes(all), NATPools: sortedPrefixes(nat)}
}

// comparePrefix orders IPv4 before IPv6, then by address, then shorter first.
func comparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

func sortedPrefixes(ps []netip.Prefix) []netip.Prefix {
	slices.SortFunc(ps, comparePrefix)
	return slices.Compact(ps)
}
