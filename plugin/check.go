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
// and the routes and neighbour entries of podRoutes.
func CheckPod(podNS ns.NetNS, w *Wiring) error {
	return podNS.Do(func(ns.NetNS) error {
		link, err := netlinksafe.LinkByName(w.IfName)
		if err != nil {
			return fmt.Errorf("the pod has no interface %s: %w", w.IfName, err)
		}
		if err := checkPodLink(link, w); err != nil {
			return err
		}
		if err := checkPodAddrs(link, w); err != nil {
			return err
		}
		want := podRoutes(link.Attrs().Index, 0, w.IPs)
		routes, err := netlinksafe.RouteList(link, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("listing the routes of the pod: %w", err)
		}
		if r := missingRoute(routes, want.Routes); r != nil {
			return fmt.Errorf("the pod lacks its route %s (it was removed): delete and re-create the pod", routeString(*r, w.IfName))
		}
		return checkGatewayNeighs(w.IfName, want.Neighs)
	})
}

// checkPodLink verifies the kind, state and MTU of the pod end.
func checkPodLink(link netlink.Link, w *Wiring) error {
	if link.Type() != "veth" {
		return fmt.Errorf("the pod's interface %s is a %s, not a veth", w.IfName, link.Type())
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		return fmt.Errorf("the pod's interface %s is down", w.IfName)
	}
	if w.MTU > 0 && link.Attrs().MTU != w.MTU {
		return fmt.Errorf("the pod's interface %s has MTU %d, expected %d", w.IfName, link.Attrs().MTU, w.MTU)
	}
	return nil
}

// checkPodAddrs verifies that the pod end holds every address, with its
// prefix length.
func checkPodAddrs(link netlink.Link, w *Wiring) error {
	addrs, err := netlinksafe.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("listing the addresses of %s in the pod: %w", w.IfName, err)
	}
	for _, want := range w.IPs {
		a := findAddr(addrs, want.IP)
		if a == nil {
			return fmt.Errorf("the pod's interface %s lacks its address %s (it was removed): delete and re-create the pod", w.IfName, want.String())
		}
		ow, _ := want.Mask.Size()
		if oa, _ := a.Mask.Size(); oa != ow {
			return fmt.Errorf("the pod's interface %s has %s, expected %s", w.IfName, a.IPNet, want.String())
		}
	}
	return nil
}

// findAddr returns the address of addrs that is ip, or nil.
func findAddr(addrs []netlink.Addr, ip net.IP) *netlink.Addr {
	for i, a := range addrs {
		if a.IPNet != nil && a.IP.Equal(ip) {
			return &addrs[i]
		}
	}
	return nil
}

// checkGatewayNeighs verifies the pod's permanent neighbour entries for
// its gateways (run it in the pod's namespace).
func checkGatewayNeighs(ifName string, want []netlink.Neigh) error {
	for _, w := range want {
		neighs, err := netlink.NeighList(w.LinkIndex, w.Family)
		if err != nil {
			return fmt.Errorf("listing the neighbour entries of %s in the pod: %w", ifName, err)
		}
		found := false
		for _, n := range neighs {
			if !n.IP.Equal(w.IP) {
				continue
			}
			if n.State&w.State == 0 || !bytes.Equal(n.HardwareAddr, w.HardwareAddr) {
				return fmt.Errorf("the pod's neighbour entry for its gateway %s is not the permanent one to %s (it has lladdr %q, state %#x): delete and re-create the pod", w.IP, w.HardwareAddr, n.HardwareAddr.String(), n.State)
			}
			found = true
		}
		if !found {
			return fmt.Errorf("the pod lacks its permanent neighbour entry %s lladdr %s dev %s: delete and re-create the pod", w.IP, w.HardwareAddr, ifName)
		}
	}
	return nil
}

// CheckHost verifies the host end in the node's namespace (run it there):
// the veth exists with the attachment's alias and HostVethMAC, is up,
// answers ARP by proxy (IPv4) or holds fe80::1 (IPv6), and carries the
// host routes of podRoutes.
func CheckHost(w *Wiring) error {
	link, err := netlinksafe.LinkByName(w.HostVeth)
	if err != nil {
		return fmt.Errorf("the host veth %s is missing: %w", w.HostVeth, err)
	}
	if err := checkHostLink(link, w); err != nil {
		return err
	}
	if err := checkHostGateways(link, w); err != nil {
		return err
	}
	routes, err := netlinksafe.RouteList(link, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("listing the routes through %s: %w", w.HostVeth, err)
	}
	if r := missingRoute(routes, podRoutes(0, link.Attrs().Index, w.IPs).HostRoutes); r != nil {
		return fmt.Errorf("the node lacks the route %s", routeString(*r, w.HostVeth))
	}
	return nil
}

// checkHostLink verifies the owner, state and MAC of the host veth.
func checkHostLink(link netlink.Link, w *Wiring) error {
	if link.Attrs().Alias != w.Alias {
		return fmt.Errorf("the host veth %s belongs to another attachment (alias %q, expected %q)", w.HostVeth, link.Attrs().Alias, w.Alias)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		return fmt.Errorf("the host veth %s is down", w.HostVeth)
	}
	if !bytes.Equal(link.Attrs().HardwareAddr, HostVethMAC) {
		return fmt.Errorf("the host veth %s has MAC %s, but the pod's gateway entries point at %s: set it back (ip link set %s address %s) or re-create the pod", w.HostVeth, link.Attrs().HardwareAddr, HostVethMAC, w.HostVeth, HostVethMAC)
	}
	return nil
}

// checkHostGateways verifies that the host veth answers for the pod's
// gateways: by proxy ARP for IPv4, by holding fe80::1 for IPv6.
func checkHostGateways(link netlink.Link, w *Wiring) error {
	v4, v6 := families(w.IPs)
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
		if findAddr(addrs, GatewayV6) == nil {
			return fmt.Errorf("the host veth %s lacks the pods' IPv6 gateway %s", w.HostVeth, GatewayV6)
		}
	}
	return nil
}
