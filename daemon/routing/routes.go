package routing

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tabbynet/tabby/contract"
)

// ipv6DefaultMetric is the metric the kernel gives IPv6 routes added
// without one; tabby's IPv6 routes carry it explicitly so they compare.
const ipv6DefaultMetric = 1024

type routeKey struct {
	dst    netip.Prefix
	metric int
}

// podHolds says whether a route of protocol proto at w's destination is
// the CNI plugin's route to a pod (contract.RouteProtocolPod) where w is a
// block's blackhole: a block of one address (/32, /128) holds one pod, and
// the pod's route is the one to keep. That is no conflict: it is there
// for every local pod of such a pool.
func podHolds(w Route, proto netlink.RouteProtocol) bool {
	return w.Type == Blackhole && proto == contract.RouteProtocolPod
}

// protocolAt is the protocol of the main table's route at r's destination
// and metric, when there is one.
func protocolAt(family int, r *netlink.Route) (netlink.RouteProtocol, bool) {
	rs, err := netlinksafe.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_MAIN, Dst: r.Dst},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_DST)
	if err != nil {
		return 0, false
	}
	for _, x := range rs {
		if x.Priority == r.Priority {
			return x.Protocol, true
		}
	}
	return 0, false
}

// applyRoutes makes the main table's RouteProtocol routes of both families
// exactly want: missing ones are added, changed ones replaced, stale ones
// deleted (after the replacements, so no destination is ever without a
// route in between). A desired route whose destination and metric are held
// by a route of another protocol is not programmed (Stats.Conflicts).
func (a *Applier) applyRoutes(want []Route, st *Stats) error {
	var errs []error
	links := map[string]int{}
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		all, err := netlinksafe.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing routes: %w", err))
			continue
		}
		ours := map[netip.Prefix][]netlink.Route{}
		foreign := map[routeKey]netlink.RouteProtocol{}
		for _, r := range all {
			dst := prefixOf(r.Dst)
			if r.Protocol == RouteProtocol {
				ours[dst] = append(ours[dst], r)
			} else if dst.IsValid() {
				foreign[routeKey{dst, r.Priority}] = r.Protocol
			}
		}
		if a.afterList != nil {
			a.afterList()
		}
		used := map[*netlink.Route]bool{}
		for _, w := range want {
			if w.Dst.Addr().Is4() != (family == netlink.FAMILY_V4) {
				continue
			}
			nr, err := toNetlink(w, links)
			if err != nil {
				// Leave whatever routes this destination has.
				for i := range ours[w.Dst] {
					used[&ours[w.Dst][i]] = true
				}
				errs = append(errs, err)
				continue
			}
			have := ours[w.Dst]
			if i := indexMatch(have, nr, used); i >= 0 {
				used[&have[i]] = true
				st.Routes.Unchanged++
				continue
			}
			if proto, taken := foreign[routeKey{w.Dst, nr.Priority}]; taken {
				if podHolds(w, proto) {
					st.Routes.Unchanged++
					continue
				}
				msg := fmt.Sprintf("%s: the destination has a route with protocol %d, which is not tabby's; left alone", w, proto)
				st.Conflicts = append(st.Conflicts, msg)
				a.log.Warn("route not programmed", "route", w.String(), "protocol", int(proto))
				continue
			}
			// A new destination is added exclusively: a route another
			// program added since the listing (the CNI plugin's route to
			// a pod of a /32 block, which the block's blackhole would
			// otherwise overwrite) is left alone.
			add := netlink.RouteReplace
			if len(have) == 0 {
				add = netlink.RouteAdd
			}
			if err := add(nr); errors.Is(err, unix.EEXIST) {
				if proto, ok := protocolAt(family, nr); ok && podHolds(w, proto) {
					st.Routes.Unchanged++
					continue
				}
				msg := fmt.Sprintf("%s: the destination got a route of another program meanwhile; left alone", w)
				st.Conflicts = append(st.Conflicts, msg)
				a.log.Warn("route not programmed", "route", w.String(), "why", "another program added one meanwhile")
				continue
			} else if err != nil {
				errs = append(errs, routeError(w, err))
				continue
			}
			if len(have) > 0 {
				st.Routes.Updated++
				a.log.Info("route replaced", "route", w.String())
			} else {
				st.Routes.Added++
				a.log.Info("route added", "route", w.String())
			}
		}
		for dst, rs := range ours {
			for i := range rs {
				if used[&rs[i]] {
					continue
				}
				err := netlink.RouteDel(&rs[i])
				switch {
				case errors.Is(err, unix.ESRCH):
					// Replaced in place above.
				case err != nil:
					errs = append(errs, fmt.Errorf("deleting the stale route %s: %w", rs[i], err))
				default:
					st.Routes.Removed++
					a.log.Info("route removed", "dst", dst.String())
				}
			}
		}
	}
	return errors.Join(errs...)
}

// toNetlink converts a desired route, resolving its device through links.
func toNetlink(w Route, links map[string]int) (*netlink.Route, error) {
	r := &netlink.Route{Dst: ipNet(w.Dst), Protocol: RouteProtocol, Table: unix.RT_TABLE_MAIN}
	if w.Dst.Addr().Is6() {
		r.Priority = ipv6DefaultMetric
	}
	if w.Type == Blackhole {
		r.Type = unix.RTN_BLACKHOLE
		return r, nil
	}
	r.Gw = w.Gateway.AsSlice()
	if w.OnLink {
		r.Flags = int(netlink.FLAG_ONLINK)
	}
	if w.Device != "" {
		idx, ok := links[w.Device]
		if !ok {
			l, err := netlinksafe.LinkByName(w.Device)
			if err != nil {
				return nil, fmt.Errorf("route %s: its device is missing: %w", w, err)
			}
			idx = l.Attrs().Index
			links[w.Device] = idx
		}
		r.LinkIndex = idx
	}
	return r, nil
}

// indexMatch returns the index of the first route in have, not yet used,
// that is w as far as tabby cares, or -1.
func indexMatch(have []netlink.Route, w *netlink.Route, used map[*netlink.Route]bool) int {
	for i := range have {
		if !used[&have[i]] && sameRoute(&have[i], w) {
			return i
		}
	}
	return -1
}

func sameRoute(k, w *netlink.Route) bool {
	typ := func(t int) int {
		if t == 0 {
			return unix.RTN_UNICAST
		}
		return t
	}
	if typ(k.Type) != typ(w.Type) || k.Priority != w.Priority || len(k.MultiPath) != 0 {
		return false
	}
	if typ(w.Type) != unix.RTN_UNICAST {
		return true
	}
	return k.Gw.Equal(w.Gw) &&
		(w.LinkIndex == 0 || k.LinkIndex == w.LinkIndex) &&
		k.Flags&int(netlink.FLAG_ONLINK) == w.Flags&int(netlink.FLAG_ONLINK)
}

func routeError(w Route, err error) error {
	if (errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH)) && w.Device == "" {
		return fmt.Errorf("adding route %s: %w (the gateway is not on a subnet of this node: use an encapsulating pool, vxlanMode CrossSubnet or Always, for nodes in other subnets)", w, err)
	}
	return fmt.Errorf("adding route %s: %w", w, err)
}
