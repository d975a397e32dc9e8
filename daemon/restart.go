package daemon

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/daemon/routing"
)

// DefaultStartupHold bounds how long a restarted tabbyd keeps the routes
// its previous run left in the kernel while BGP converges (every expected
// session up and synced). Sessions come back within about ten seconds
// (GoBGP idles 5 s after a connection drops, then retries every 3 s).
const DefaultStartupHold = 60 * time.Second

// kernelRoutes reads the routes tabby programmed (protocol
// routing.RouteProtocol in the main table, both families) as desired
// routes, so that a restarted tabbyd can keep them until BGP has
// converged. Routes it cannot express (multipath) are left out.
func kernelRoutes() ([]routing.Route, error) {
	var out []routing.Route
	names := map[int]string{}
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := netlinksafe.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_MAIN, Protocol: routing.RouteProtocol},
			netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			return nil, fmt.Errorf("listing tabby's routes: %w", err)
		}
		for _, r := range rs {
			dst, ok := prefixFromIPNet(r.Dst)
			if !ok || len(r.MultiPath) > 0 {
				continue
			}
			if r.Type == unix.RTN_BLACKHOLE {
				out = append(out, routing.Route{Dst: dst, Type: routing.Blackhole})
				continue
			}
			gw, ok := netip.AddrFromSlice(r.Gw)
			if !ok {
				continue
			}
			rt := routing.Route{Dst: dst, Gateway: gw.Unmap(), OnLink: r.Flags&int(netlink.FLAG_ONLINK) != 0}
			if r.LinkIndex != 0 {
				name, ok := names[r.LinkIndex]
				if !ok {
					if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
						name = l.Attrs().Name
					}
					names[r.LinkIndex] = name
				}
				// Native routes leave the device to the kernel; tunnel
				// routes name theirs.
				if name == routing.VXLANDevice || name == routing.IPIPDevice {
					rt.Device = name
				}
			}
			out = append(out, rt)
		}
	}
	return out, nil
}

// withKept returns s with the kept routes added whose destination s has
// no route for, and how many it added. A restarted tabbyd programs this
// until BGP has converged, so a route learned again later never goes
// missing in between.
func withKept(s routing.State, kept []routing.Route) (routing.State, int) {
	if len(kept) == 0 {
		return s, 0
	}
	have := map[netip.Prefix]bool{}
	for _, r := range s.Routes {
		have[r.Dst] = true
	}
	routes := slices.Clone(s.Routes)
	n := 0
	for _, r := range kept {
		if !have[r.Dst] {
			routes = append(routes, r)
			have[r.Dst] = true
			n++
		}
	}
	slices.SortFunc(routes, func(a, b routing.Route) int {
		if c := a.Dst.Addr().Compare(b.Dst.Addr()); c != 0 {
			return c
		}
		return a.Dst.Bits() - b.Dst.Bits()
	})
	s.Routes = routes
	return s, n
}

// converged says whether BGP has converged after a start: every desired
// session is up and its peer has sent all its routes (End-of-RIB, or the
// speaker's grace after the session came up). It says what it waits for.
func converged(desired []bgp.Peer, states []bgp.PeerState) (bool, string) {
	byKey := map[string]bgp.PeerState{}
	for _, st := range states {
		byKey[st.Key()] = st
	}
	for _, p := range desired {
		st, ok := byKey[p.Key()]
		switch {
		case !ok || !st.Established():
			return false, fmt.Sprintf("the session with %s (%s) is not up", p.Address, p.Reason())
		case !st.Synced:
			return false, fmt.Sprintf("%s (%s) has not sent all its routes yet", p.Address, p.Reason())
		}
	}
	return true, ""
}
