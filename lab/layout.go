// Package lab is `tabbyctl lab`: a Kubernetes cluster of network namespaces
// on one machine, with nothing faked where tabby is concerned.
//
// `lab up` builds, all inside network namespaces it creates itself:
//
//   - an underlay: one bridge (two with Subnets 2) in the namespace
//     tabby-<name>-underlay, and a router namespace (tabby-<name>-router)
//     holding the gateway address of every subnet and no route out, so that
//     no lab packet can leave the machine;
//   - a control plane in tabby-<name>-cp on the underlay (etcd,
//     kube-apiserver, tabby-scheduler-extender on the namespace's loopback,
//     kube-scheduler with deploy/scheduler/kube-scheduler-config.yaml
//     pointed at it, kube-controller-manager);
//   - per node a network namespace tabby-<name>-nodeN with eth0 on the
//     underlay and a mount namespace of its own (RunNodeRoot: its /run,
//     kubelet's, containerd's and the CNI folders are the node's), a cgroup
//     root of its own, and the real containerd (v2, or Debian's 1.6) with
//     runc and the real kubelet, with the lab's images imported;
//   - on that cluster, as users install them with kubectl: tabby from the
//     repository's deploy/tabby.yaml (tabbyd as the tabby-node DaemonSet,
//     install-cni writing each node's CNI config), kube-proxy and CoreDNS.
//
// The host's own namespace gets only a loopback port forward to the API
// server (RunForward), for `lab kubeconfig`. Everything the lab made is
// recorded in its folder (State) and found again by name prefix, by the
// nodes' cgroups and by a scan of /proc, so that Down removes it all, also
// after a crash.
package lab

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
)

// Defaults.
const (
	// DefaultName names the lab: its namespaces are tabby-<name>-*.
	DefaultName = "lab"
	// DefaultDir holds the default lab's state, logs and files.
	DefaultDir = "/var/run/tabby-lab"
	// DefaultNodes is how many nodes `lab up` makes.
	DefaultNodes = 3
	// DefaultPodCIDR is the default IPPool's range (deploy/base/ippool.yaml).
	DefaultPodCIDR = "10.244.0.0/16"
	// DefaultPoolName is the default IPPool's name.
	DefaultPoolName = "default-ipv4"
	// DefaultIPv6PodCIDR is the default IPv6 IPPool's range in a
	// dual-stack lab (kind's and kubeadm's example, a ULA).
	DefaultIPv6PodCIDR = "fd00:10:244::/56"
	// ServiceCIDR6 is the Services' IPv6 range in a dual-stack lab, next
	// to the IPv4 one (controlplane.ServiceClusterIPRange).
	ServiceCIDR6 = "fd00:10:96::/108"
	// APIServerPort is the API server's port on the underlay.
	APIServerPort = 6443
	// TabbydHealthPort is where tabbyd serves /healthz and /readyz
	// (its --health-listen default, :9099) inside each node.
	TabbydHealthPort = 9099
	// NetNSDir is where named network namespaces are bound (ip netns).
	NetNSDir = "/run/netns"
	// MaxNodes bounds --nodes (node addresses are .11 to .210).
	MaxNodes = 200
	// MaxSubnets bounds --subnets.
	MaxSubnets = 2
)

var validName = regexp.MustCompile(`^[a-z0-9]{1,12}$`)

// CheckName checks a lab name: 1 to 12 lower-case letters and digits, so
// that the prefix tabby-<name>- of one lab is never the prefix of another's
// names.
func CheckName(name string) error {
	if !validName.MatchString(name) {
		return fmt.Errorf("lab name %q: use 1 to 12 lower-case letters and digits", name)
	}
	return nil
}

// Layout is the shape of a lab: its name, nodes and subnets. Every name and
// address the lab uses comes from it.
type Layout struct {
	Name    string
	Nodes   int
	Subnets int
}

// Check validates the layout.
func (l Layout) Check() error {
	if err := CheckName(l.Name); err != nil {
		return err
	}
	if l.Nodes < 1 || l.Nodes > MaxNodes {
		return fmt.Errorf("%d nodes: a lab has 1 to %d", l.Nodes, MaxNodes)
	}
	if l.Subnets < 1 || l.Subnets > MaxSubnets {
		return fmt.Errorf("%d subnets: use 1 (one bridge) or 2 (two bridges and a router)", l.Subnets)
	}
	return nil
}

// Prefix starts the name of every network namespace of the lab.
func Prefix(name string) string { return "tabby-" + name + "-" }

// Prefix starts the name of every network namespace of the lab.
func (l Layout) Prefix() string { return Prefix(l.Name) }

// UnderlayNS holds the underlay bridges.
func (l Layout) UnderlayNS() string { return l.Prefix() + "underlay" }

// RouterNS joins the subnets; it has no route out of the lab.
func (l Layout) RouterNS() string { return l.Prefix() + "router" }

// ControlPlaneNS runs etcd, kube-apiserver, tabby-scheduler-extender,
// kube-scheduler and kube-controller-manager.
func (l Layout) ControlPlaneNS() string { return l.Prefix() + "cp" }

// NodeNS is the namespace of node i (1-based).
func (l Layout) NodeNS(i int) string { return l.Prefix() + NodeName(i) }

// PodNSPrefix starts the names of the pods' namespaces.
func (l Layout) PodNSPrefix() string { return l.Prefix() + "pod-" }

// NodeName is the name of node i (1-based): node1, node2, ...
func NodeName(i int) string { return "node" + strconv.Itoa(i) }

// Bridge is the name of subnet s's bridge (0-based) in the underlay namespace.
func Bridge(s int) string { return "br" + strconv.Itoa(s) }

// Subnet is subnet s (0-based): 10.77.0.0/24, 10.78.0.0/24.
func Subnet(s int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(77 + s), 0, 0}), 24)
}

// Subnet6 is subnet s's IPv6 prefix in a dual-stack lab, a ULA that
// spells the IPv4 subnet: fd00:10:77::/64, fd00:10:78::/64.
func Subnet6(s int) netip.Prefix { return hostAddr6(s, 0).Masked() }

// hostAddr6 is host h of subnet s, IPv6, with the subnet's prefix length:
// the groups read as the IPv4 address does (10.77.0.11 is fd00:10:77::11).
func hostAddr6(s, h int) netip.Prefix {
	return netip.MustParsePrefix(fmt.Sprintf("fd00:10:%d::%d/64", 77+s, h))
}

// Gateway6 is the router's IPv6 address on subnet s.
func Gateway6(s int) netip.Prefix { return hostAddr6(s, 1) }

// ControlPlaneAddr6 is the control plane's IPv6 address (on subnet 0).
func ControlPlaneAddr6() netip.Prefix { return hostAddr6(0, 2) }

// NodeAddr6 is node i's IPv6 address on eth0 in a dual-stack lab
// (fd00:10:77::11/64 for node1).
func (l Layout) NodeAddr6(i int) netip.Prefix { return hostAddr6(l.NodeSubnet(i), 10+i) }

// hostAddr is host h of subnet s with the subnet's prefix length.
func hostAddr(s, h int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(77 + s), 0, byte(h)}), 24)
}

// Gateway is the router's address on subnet s: the nodes' default route.
func Gateway(s int) netip.Prefix { return hostAddr(s, 1) }

// ControlPlaneAddr is the control plane's address (on subnet 0).
func ControlPlaneAddr() netip.Prefix { return hostAddr(0, 2) }

// NodeSubnet is the subnet of node i (1-based): nodes alternate between the
// subnets, so that with 2 subnets both same-subnet and cross-subnet pairs
// exist from 3 nodes on.
func (l Layout) NodeSubnet(i int) int { return (i - 1) % l.Subnets }

// NodeAddr is node i's eth0 address: 10.77.0.11/24 for node1, the last
// byte is 10+i whatever the subnet.
func (l Layout) NodeAddr(i int) netip.Prefix { return hostAddr(l.NodeSubnet(i), 10+i) }

// NetNSPath is where the named namespace is bound.
func NetNSPath(name string) string { return filepath.Join(NetNSDir, name) }
