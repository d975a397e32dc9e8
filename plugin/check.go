package plugin

import (
	"bytes"
	"fmt"
	"net"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/utils/sysctl"
	"github.com/vishvananda/netlink"
)

// CheckPod verifies the pod end in the pod's namespace: the interface
// exists, is a veth and up, has the MTU (when mtu > 0) and every address,
// routes to the gateways of its families, and permanent neighbour entries
// for them pointing at HostVethMAC.
func CheckPod(podNS ns.NetNS, w *Wiring) error {
	v4, v6 := w.families()
	return podNS.Do(func(ns.NetNS) error {
		link, err := netlinksafe.LinkByName(w.IfName)
		if err != nil {
			return fmt.Errorf("the pod has no interface %s: %w", w.IfName, err)
		}
		if link.Type() != "veth" {
			return fmt.Errorf("the pod's interface %s is a %s, not a veth", w.IfName, link.Type())
		}
		if link.Attrs().Flags&net.FlagUp == 0 {
			return fmt.Errorf("the pod's interface %s is down", w.IfName)
		}
		if w.MTU > 0 && link.Attrs().MTU != w.MTU {
			return fmt.Errorf("the pod's interface %s has MTU %d, expected %d", w.IfName, link.Attrs().MTU, w.MTU)
		}
		addrs, err := netlinksafe.AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("listing the addresses of %s in the pod: %w", w.IfName, err)
		}
		for _, want := range w.IPs {
			found := false
			for _, a := range addrs {
				if a.IPNet != nil && a.IP.Equal(want.IP) {
					ow, _ := want.Mask.Size()
					oa, _ := a.Mask.Size()
					if ow != oa {
						return fmt.Errorf("the pod's interface %s has %s, expected %s", w.IfName, a.IPNet, want.String())
					}
					found = true
				}
			}
			if !found {
				return fmt.Errorf("the pod's interface %s lacks its address %s (it was removed): delete and re-create the pod", w.IfName, want.String())
			}
		}
		routes, err := netlinksafe.RouteList(link, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("listing the routes of the pod: %w", err)
		}
		hasDefault := func(gw net.IP) bool {
			for _, r := range routes {
				if isDefault(r.Dst) && r.Gw.Equal(gw) && (r.Dst == nil || (r.Dst.IP.To4() == nil) == (gw.To4() == nil)) {
					return true
				}
			}
			return false
		}
		if v4 {
			found := false
			for _, r := range routes {
				if r.Dst != nil && r.Dst.IP.Equal(GatewayV4) && r.Scope == netlink.SCOPE_LINK {
					found = true
				}
			}
			if !found {
				return fmt.Errorf("the pod lacks its route %s dev %s scope link", GatewayV4, w.IfName)
			}
			if !hasDefault(GatewayV4) {
				return fmt.Errorf("the pod lacks its default route via %s dev %s", GatewayV4, w.IfName)
			}
		}
		if v6 && !hasDefault(GatewayV6) {
			return fmt.Errorf("the pod lacks its IPv6 default route via %s dev %s", GatewayV6, w.IfName)
		}
		return checkGatewayNeighs(link, w.IfName, gateways(v4, v6))
	})
}

// checkGatewayNeighs verifies the pod's permanent neighbour entries for
// its gateways (run it in the pod's namespace).
func checkGatewayNeighs(link netlink.Link, ifName string, gws []net.IP) error {
	for _, gw := range gws {
		want := gatewayNeigh(link.Attrs().Index, gw)
		neighs, err := netlink.NeighList(link.Attrs().Index, want.Family)
		if err != nil {
			return fmt.Errorf("listing the neighbour entries of %s in the pod: %w", ifName, err)
		}
		found := false
		for _, n := range neighs {
			if !n.IP.Equal(gw) {
				continue
			}
			if n.State&netlink.NUD_PERMANENT == 0 || !bytes.Equal(n.HardwareAddr, HostVethMAC) {
				return fmt.Errorf("the pod's neighbour entry for its gateway %s is not the permanent one to %s (it has lladdr %q, state %#x): delete and re-create the pod", gw, HostVethMAC, n.HardwareAddr.String(), n.State)
			}
			found = true
		}
		if !found {
			return fmt.Errorf("the pod lacks its permanent neighbour entry %s lladdr %s dev %s: delete and re-create the pod", gw, HostVethMAC, ifName)
		}
	}
	return nil
}

// CheckHost verifies the host end in the node's namespace (run it there):
// the veth exists with the attachment's alias and HostVethMAC, is up,
// answers ARP by proxy
// (IPv4) or holds fe80::1 (IPv6), and carries tabby's route to every pod
// address.
func CheckHost(w *Wiring) error {
	v4, v6 := w.families()
	link, err := netlinksafe.LinkByName(w.HostVeth)
	if err != nil {
		return fmt.Errorf("the host veth %s is missing: %w", w.HostVeth, err)
	}
	if link.Attrs().Alias != w.Alias {
		return fmt.Errorf("the host veth %s belongs to another attachment (alias %q, expected %q)", w.HostVeth, link.Attrs().Alias, w.Alias)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		return fmt.Errorf("the host veth %s is down", w.HostVeth)
	}
	if !bytes.Equal(link.Attrs().HardwareAddr, HostVethMAC) {
		return fmt.Errorf("the host veth %s has MAC %s, but the pod's gateway entries point at %s: set it back (ip link set %s address %s) or re-create the pod", w.HostVeth, link.Attrs().HardwareAddr, HostVethMAC, w.HostVeth, HostVethMAC)
	}
	if v4 {
		v, err := sysctl.Sysctl("net/ipv4/conf/" + w.HostVeth + "/proxy_arp")
		if err != nil || strings.TrimSpace(v) != "1" {
			return fmt.Errorf("proxy ARP is off on host veth %s", w.HostVeth)
		}
	}
	if v6 {
		addrs, err := netlinksafe.AddrList(link, netlink.FAMILY_V6)
		if err != nil {
			return fmt.Errorf("listing the addresses of %s: %w", w.HostVeth, err)
		}
		found := false
		for _, a := range addrs {
			if a.IP.Equal(GatewayV6) {
				found = true
			}
		}
		if !found {
			return fmt.Errorf("the host veth %s lacks the pods' IPv6 gateway %s", w.HostVeth, GatewayV6)
		}
	}
	routes, err := netlinksafe.RouteList(link, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("listing the routes through %s: %w", w.HostVeth, err)
	}
	for _, want := range w.IPs {
		found := false
		for _, r := range routes {
			if r.Dst != nil && r.Dst.String() == want.String() && r.Protocol == RouteProtocol {
				found = true
			}
		}
		if !found {
			return fmt.Errorf("the node lacks the route %s dev %s proto %d", want.String(), w.HostVeth, RouteProtocol)
		}
	}
	return nil
}
