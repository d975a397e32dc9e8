package plugin

import (
	"fmt"
	"net"
	"reflect"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestPodRoutes pins what ADD writes, CHECK expects and the result reports
// for each mix of families, written as `ip route` and `ip neigh` show it.
func TestPodRoutes(t *testing.T) {
	const podIdx, hostIdx = 2, 7
	v4a, v4b, v6a := hostPrefix(net.ParseIP("10.0.0.5")), hostPrefix(net.ParseIP("10.0.0.6")), hostPrefix(net.ParseIP("fd00::5"))
	for _, tc := range []struct {
		name                          string
		addrs                         []net.IPNet
		routes, neighs, host, results []string
	}{{
		name:    "IPv4 only",
		addrs:   []net.IPNet{v4a},
		routes:  []string{"169.254.1.1/32 dev eth0 scope link", "default via 169.254.1.1 dev eth0 onlink"},
		neighs:  []string{"169.254.1.1 lladdr ee:ee:ee:ee:ee:ee dev 2 permanent"},
		host:    []string{"10.0.0.5/32 dev tab1 proto 80 scope link"},
		results: []string{"0.0.0.0/0 via 169.254.1.1"},
	}, {
		name:    "IPv6 only",
		addrs:   []net.IPNet{v6a},
		routes:  []string{"default via fe80::1 dev eth0"},
		neighs:  []string{"fe80::1 lladdr ee:ee:ee:ee:ee:ee dev 2 permanent"},
		host:    []string{"fd00::5/128 dev tab1 proto 80"},
		results: []string{"::/0 via fe80::1"},
	}, {
		name:   "dual stack, two IPv4 addresses",
		addrs:  []net.IPNet{v4a, v6a, v4b},
		routes: []string{"169.254.1.1/32 dev eth0 scope link", "default via 169.254.1.1 dev eth0 onlink", "default via fe80::1 dev eth0"},
		neighs: []string{"169.254.1.1 lladdr ee:ee:ee:ee:ee:ee dev 2 permanent", "fe80::1 lladdr ee:ee:ee:ee:ee:ee dev 2 permanent"},
		host: []string{"10.0.0.5/32 dev tab1 proto 80 scope link", "fd00::5/128 dev tab1 proto 80",
			"10.0.0.6/32 dev tab1 proto 80 scope link"},
		results: []string{"0.0.0.0/0 via 169.254.1.1", "::/0 via fe80::1"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			p := podRoutes(podIdx, hostIdx, tc.addrs)
			check := func(what string, got, want []string) {
				t.Helper()
				if !reflect.DeepEqual(got, want) {
					t.Errorf("%s:\n got %q\nwant %q", what, got, want)
				}
			}
			check("pod routes", routeStrings(p.Routes, podIdx, "eth0", t), tc.routes)
			check("host routes", routeStrings(p.HostRoutes, hostIdx, "tab1", t), tc.host)
			var neighs []string
			for _, n := range p.Neighs {
				state := "?"
				if n.State == netlink.NUD_PERMANENT {
					state = "permanent"
				}
				neighs = append(neighs, fmt.Sprintf("%s lladdr %s dev %d %s", n.IP, n.HardwareAddr, n.LinkIndex, state))
			}
			check("neighbours", neighs, tc.neighs)
			var results []string
			for _, r := range p.result() {
				results = append(results, r.Dst.String()+" via "+r.GW.String())
			}
			check("result routes", results, tc.results)
			if r := missingRoute(p.Routes, p.Routes); r != nil {
				t.Errorf("the routes ADD writes lack %s", routeString(*r, "eth0"))
			}
		})
	}
}

// routeStrings writes routes as `ip route` does, after checking that each
// is on the link idx.
func routeStrings(routes []netlink.Route, idx int, dev string, t *testing.T) []string {
	var out []string
	for _, r := range routes {
		if r.LinkIndex != idx {
			t.Errorf("%s is on link %d, want %d", routeString(r, dev), r.LinkIndex, idx)
		}
		out = append(out, routeString(r, dev))
	}
	return out
}

// TestMissingRoute: CHECK finds each route the way the kernel lists it,
// and misses a route whose destination, gateway, scope or protocol
// differs from what ADD wrote.
func TestMissingRoute(t *testing.T) {
	p := podRoutes(2, 7, []net.IPNet{hostPrefix(net.ParseIP("10.0.0.5")), hostPrefix(net.ParseIP("fd00::5"))})
	gwRoute, def4, def6 := p.Routes[0], p.Routes[1], p.Routes[2]
	host4 := p.HostRoutes[0]
	// The kernel reports what it keeps: a default route may come without
	// a destination, and with fields tabby never set.
	kernel := func(r netlink.Route) netlink.Route {
		r.Table, r.Type, r.Family = 254, 1, netlink.FAMILY_V4
		if r.Dst.IP.To4() == nil {
			r.Family = netlink.FAMILY_V6
		}
		return r
	}
	noDst := func(r netlink.Route) netlink.Route { r = kernel(r); r.Dst = nil; return r }
	with := func(r netlink.Route, f func(*netlink.Route)) netlink.Route { f(&r); return r }
	for _, tc := range []struct {
		name string
		have []netlink.Route
		want []netlink.Route
		miss *netlink.Route
	}{
		{"all there", []netlink.Route{kernel(def6), kernel(gwRoute), kernel(def4)}, p.Routes, nil},
		{"defaults without a destination", []netlink.Route{kernel(gwRoute), noDst(def4), noDst(def6)}, p.Routes, nil},
		{"IPv4 default gone", []netlink.Route{kernel(gwRoute), kernel(def6)}, p.Routes, &def4},
		{"IPv6 default only, IPv4 wanted", []netlink.Route{kernel(gwRoute), noDst(def6)}, p.Routes, &def4},
		{"default via another gateway", []netlink.Route{kernel(gwRoute), with(def4, func(r *netlink.Route) { r.Gw = net.ParseIP("10.0.0.1") }), def6}, p.Routes, &def4},
		{"gateway route not scope link", []netlink.Route{with(gwRoute, func(r *netlink.Route) { r.Scope = netlink.SCOPE_UNIVERSE }), def4, def6}, p.Routes, &gwRoute},
		{"host route of another protocol", []netlink.Route{with(host4, func(r *netlink.Route) { r.Protocol = 4 })}, p.HostRoutes[:1], &host4},
		{"host route to another prefix", []netlink.Route{with(host4, func(r *netlink.Route) { r.Dst = &net.IPNet{IP: r.Dst.IP, Mask: net.CIDRMask(24, 32)} })}, p.HostRoutes[:1], &host4},
		{"host routes there", []netlink.Route{kernel(p.HostRoutes[1]), kernel(host4)}, p.HostRoutes, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := missingRoute(tc.have, tc.want)
			switch {
			case got == nil && tc.miss != nil:
				t.Errorf("found every route, want %s missing", routeString(*tc.miss, "eth0"))
			case got != nil && tc.miss == nil:
				t.Errorf("%s is missing, want every route found", routeString(*got, "eth0"))
			case got != nil && routeString(*got, "eth0") != routeString(*tc.miss, "eth0"):
				t.Errorf("%s is missing, want %s", routeString(*got, "eth0"), routeString(*tc.miss, "eth0"))
			}
		})
	}
}
