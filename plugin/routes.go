package plugin

import (
	"fmt"
	"net"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"
)

// podNet is a pod's routing as data: what ADD writes, what CHECK expects
// the kernel to hold and what the CNI result reports. podRoutes alone
// makes it, so the three cannot drift apart.
type podNet struct {
	// Routes and Neighs are in the pod's namespace, on the pod end.
	Routes []netlink.Route
	Neighs []netlink.Neigh
	// HostRoutes are in the node's namespace, through the host veth.
	HostRoutes []netlink.Route
}

// podRoutes computes the routing of a pod with the addresses addrs (host
// prefixes) whose pod end has the link index podIdx in the pod's namespace
// and whose host veth has hostIdx in the node's; a caller that handles one
// side only may pass 0 for the other.
//
// For each family in addrs the pod gets a default route via the
// family's link-local gateway and a permanent neighbour entry for that
// gateway pointing at HostVethMAC. IPv4 also needs "169.254.1.1 dev eth0
// scope link" (and onlink on the default route), since 169.254.1.1 is on
// no subnet of the pod's /32; IPv6 reaches fe80::1 on the link by itself.
// The node gets a route to each address through the host veth, marked
// RouteProtocol; IPv4 ones are scope link, as a /32 on a veth has no
// gateway.
func podRoutes(podIdx, hostIdx int, addrs []net.IPNet) podNet {
	var p podNet
	v4, v6 := families(addrs)
	if v4 {
		p.Neighs = append(p.Neighs, gatewayNeigh(podIdx, GatewayV4))
		p.Routes = append(p.Routes,
			netlink.Route{LinkIndex: podIdx, Dst: &net.IPNet{IP: GatewayV4, Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK},
			netlink.Route{LinkIndex: podIdx, Dst: defaultDst(GatewayV4), Gw: GatewayV4, Flags: int(netlink.FLAG_ONLINK)})
	}
	if v6 {
		p.Neighs = append(p.Neighs, gatewayNeigh(podIdx, GatewayV6))
		p.Routes = append(p.Routes, netlink.Route{LinkIndex: podIdx, Dst: defaultDst(GatewayV6), Gw: GatewayV6})
	}
	for _, a := range addrs {
		r := netlink.Route{LinkIndex: hostIdx, Dst: &net.IPNet{IP: a.IP, Mask: a.Mask}, Protocol: RouteProtocol}
		if a.IP.To4() != nil {
			r.Scope = netlink.SCOPE_LINK
		}
		p.HostRoutes = append(p.HostRoutes, r)
	}
	return p
}

// families tells which address families addrs hold.
func families(addrs []net.IPNet) (v4, v6 bool) {
	for _, a := range addrs {
		if a.IP.To4() != nil {
			v4 = true
		} else {
			v6 = true
		}
	}
	return v4, v6
}

// defaultDst is the default destination of gw's family.
func defaultDst(gw net.IP) *net.IPNet {
	if gw.To4() != nil {
		return &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
	}
	return &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
}

// gatewayNeigh is the pod's permanent neighbour entry for gw on the pod
// end (link index idx): the host veth answers for it whatever the node's
// routes are.
func gatewayNeigh(idx int, gw net.IP) netlink.Neigh {
	family := netlink.FAMILY_V4
	if gw.To4() == nil {
		family = netlink.FAMILY_V6
	}
	return netlink.Neigh{LinkIndex: idx, Family: family, State: netlink.NUD_PERMANENT, IP: gw, HardwareAddr: HostVethMAC}
}

// result is what the CNI result reports of the pod's routes: its default
// routes, by destination and gateway (the on-link route to the IPv4
// gateway is the plugin's own business).
func (p podNet) result() []*types.Route {
	var out []*types.Route
	for _, r := range p.Routes {
		if isDefault(r.Dst) {
			out = append(out, &types.Route{Dst: *r.Dst, GW: r.Gw})
		}
	}
	return out
}

// missingRoute returns the first route of want that have lacks, or nil.
// A route is there when one of have has its destination and gateway, and
// its scope and protocol where want sets them: what the kernel keeps of a
// route tabby wrote, whatever else the kernel reports with it.
func missingRoute(have, want []netlink.Route) *netlink.Route {
	for i, w := range want {
		found := false
		for _, h := range have {
			found = found || sameRoute(h, w)
		}
		if !found {
			return &want[i]
		}
	}
	return nil
}

func sameRoute(have, want netlink.Route) bool {
	return sameDst(have.Dst, want.Dst) && have.Gw.Equal(want.Gw) &&
		(want.Scope == netlink.SCOPE_UNIVERSE || have.Scope == want.Scope) &&
		(want.Protocol == 0 || have.Protocol == want.Protocol)
}

// sameDst compares destinations; the kernel may report a default route
// with no destination at all, its family then told by the gateway.
func sameDst(have, want *net.IPNet) bool {
	if isDefault(want) {
		return isDefault(have) && (have == nil || (have.IP.To4() == nil) == (want.IP.To4() == nil))
	}
	return have != nil && have.String() == want.String()
}

// routeString writes r as `ip route` would, on the device dev, so that
// an error names the route to put back.
func routeString(r netlink.Route, dev string) string {
	s := "default"
	if !isDefault(r.Dst) {
		s = r.Dst.String()
	}
	if r.Gw != nil {
		s += " via " + r.Gw.String()
	}
	s += " dev " + dev
	if r.Protocol != 0 {
		s += fmt.Sprintf(" proto %d", r.Protocol)
	}
	if r.Scope == netlink.SCOPE_LINK {
		s += " scope link"
	}
	if r.Flags&int(netlink.FLAG_ONLINK) != 0 {
		s += " onlink"
	}
	return s
}
