package testnet

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Router is an underlay of several subnets: a namespace holding one bridge
// per subnet, with the subnet's gateway address on it and forwarding on,
// so that nodes on different subnets reach each other through it (what
// CrossSubnet encapsulation is about). Nothing leads out of it.
type Router struct {
	NS ns.NetNS
	// Gateways are the router's address on each subnet's bridge.
	Gateways []netip.Prefix
}

// NewRouter makes the router with one bridge (br0, br1, ...) per gateway
// address in CIDR notation, such as "10.80.1.1/24".
func NewRouter(gateways ...string) (_ *Router, err error) {
	r := &Router{}
	for _, g := range gateways {
		p, err := netip.ParsePrefix(g)
		if err != nil {
			return nil, fmt.Errorf("router gateway %q: %w (write it as an address with its prefix length, like 10.80.1.1/24)", g, err)
		}
		r.Gateways = append(r.Gateways, p)
	}
	if r.NS, err = testutils.NewNS(); err != nil {
		return nil, fmt.Errorf("creating the router's namespace: %w", err)
	}
	err = r.NS.Do(func(ns.NetNS) error {
		if err := linkUp("lo"); err != nil {
			return err
		}
		for i, gw := range gateways {
			name := fmt.Sprintf("br%d", i)
			if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
				return fmt.Errorf("adding bridge %s: %w", name, err)
			}
			if err := addAddr(name, gw); err != nil {
				return err
			}
			if err := linkUp(name); err != nil {
				return err
			}
		}
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	})
	if err != nil {
		_ = r.Close()
		return nil, fmt.Errorf("setting up the router: %w", err)
	}
	return r, nil
}

// Close removes the router's namespace, and with it every bridge and port.
func (r *Router) Close() error { return closeNS(r.NS) }

// Plug gives node n an eth0 on subnet i's bridge with address addr (CIDR
// notation) and routes each of via (CIDR notation) through the subnet's
// gateway; the node's default route stays on its uplink.
func (r *Router) Plug(n *Node, i int, addr string, via ...string) error {
	if i < 0 || i >= len(r.Gateways) {
		return fmt.Errorf("the router has no subnet %d (it has %d)", i, len(r.Gateways))
	}
	port := "to-" + n.Name
	err := r.NS.Do(func(ns.NetNS) error {
		br, err := netlink.LinkByName(fmt.Sprintf("br%d", i))
		if err != nil {
			return err
		}
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: port, MasterIndex: br.Attrs().Index}, PeerName: "eth0",
			PeerNamespace: netlink.NsFd(int(n.NS.Fd()))}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("adding %s's eth0: %w", n.Name, err)
		}
		return linkUp(port)
	})
	if err != nil {
		return err
	}
	return n.Do(func() error {
		if err := addAddr("eth0", addr); err != nil {
			return err
		}
		if err := linkUp("eth0"); err != nil {
			return err
		}
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		for _, dst := range via {
			_, d, err := net.ParseCIDR(dst)
			if err != nil {
				return fmt.Errorf("route %q: %w", dst, err)
			}
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: d, Gw: r.Gateways[i].Addr().AsSlice()}); err != nil {
				return fmt.Errorf("adding the route to %s via %s: %w", dst, r.Gateways[i].Addr(), err)
			}
		}
		return nil
	})
}

func addAddr(link, cidr string) error {
	l, err := netlink.LinkByName(link)
	if err != nil {
		return err
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		return fmt.Errorf("address %q: %w", cidr, err)
	}
	if err := netlink.AddrAdd(l, a); err != nil {
		return fmt.Errorf("adding %s to %s: %w", cidr, link, err)
	}
	return nil
}

// Register makes the node's Node object what a kubelet makes it: Ready,
// with ip as its InternalIP and its name as Hostname; why says what stands
// in for the kubelet (the Ready condition's message).
func (n *Node) Register(ctx context.Context, ip netip.Addr, why string) error {
	node, err := n.DS.Nodes.Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	now := metav1.Now()
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip.String()}, {Type: corev1.NodeHostName, Address: n.Name}}
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		Message: why, LastHeartbeatTime: now, LastTransitionTime: now}}
	if _, err := n.DS.Nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("registering Node %s: %w", n.Name, err)
	}
	return nil
}
