package routing

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/netip"

	v1 "github.com/tabbynet/tabby/api/v1"
)

// NodeInfo is a node's routing identity, as tabbyd publishes it in the
// Node annotations of api/v1 (NodeInfoFromAnnotations reads them back).
type NodeInfo struct {
	Name string
	// IPv4 and IPv6 are the node's addresses with their subnet's prefix
	// length, e.g. 192.168.1.10/24; the zero Prefix when the node has none.
	IPv4, IPv6 netip.Prefix
	// VXLANMAC is the MAC of the node's VXLAN device; nil for this node
	// means DefaultVXLANMAC(Name).
	VXLANMAC net.HardwareAddr
	// VXLANAddress is the IPv4 address of the node's VXLAN device.
	VXLANAddress netip.Addr
	// IPIPAddress is the IPv4 address of the node's tunl0.
	IPIPAddress netip.Addr
}

// prefixOf returns the node's address of addr's family.
func (n NodeInfo) prefixOf(addr netip.Addr) netip.Prefix {
	if addr.Is4() {
		return n.IPv4
	}
	return n.IPv6
}

// LearnedRoute is a route BGP learned: Prefix is reached via NextHop, the
// address of the node (or external router) that originated it.
type LearnedRoute struct {
	Prefix  netip.Prefix
	NextHop netip.Addr
}

// Inputs are everything Desired needs.
type Inputs struct {
	// Node is this node.
	Node NodeInfo
	// Pools are all IP pools, disabled ones included (their addresses are
	// still in use, so they are still routed and excluded from NAT).
	Pools []v1.IPPool
	// Blocks are the CIDRs of the blocks affine to this node.
	Blocks []netip.Prefix
	// Learned are the routes BGP learned.
	Learned []LearnedRoute
	// Peers are the other nodes; a learned route's next hop is matched to
	// a peer by the peer's IPv4 or IPv6 address.
	Peers []NodeInfo
}

// DefaultVXLANMAC is the MAC tabby gives a node's VXLAN device unless told
// otherwise: derived from the node's name, so it is stable across restarts
// and known before the device exists; unicast and locally administered.
func DefaultVXLANMAC(nodeName string) net.HardwareAddr {
	sum := sha256.Sum256([]byte("tabby.vxlan/" + nodeName))
	mac := net.HardwareAddr(sum[:6])
	mac[0] = mac[0]&^0x01 | 0x02
	return mac
}

// LinkLocalFromMAC is the IPv6 link-local address the kernel derives from
// a MAC (modified EUI-64). IPv6 pools over VXLAN route via the peers'
// link-local addresses, so no IPv6 tunnel address has to be published.
func LinkLocalFromMAC(mac net.HardwareAddr) netip.Addr {
	if len(mac) != 6 {
		return netip.Addr{}
	}
	return netip.AddrFrom16([16]byte{0: 0xfe, 1: 0x80,
		8: mac[0] ^ 0x02, 9: mac[1], 10: mac[2], 11: 0xff, 12: 0xfe, 13: mac[3], 14: mac[4], 15: mac[5]})
}

// NodeInfoFromAnnotations reads a node's routing identity from its Node
// annotations. Missing annotations leave their field zero; malformed ones
// are reported (all of them) and also left zero.
func NodeInfoFromAnnotations(name string, annotations map[string]string) (NodeInfo, error) {
	n := NodeInfo{Name: name}
	var errs []error
	bad := func(key, value, want string, err error) {
		errs = append(errs, fmt.Errorf("node %s: annotation %s=%q is not %s: %w", name, key, value, want, err))
	}
	prefix := func(key string, is4 bool, dst *netip.Prefix) {
		v, ok := annotations[key]
		if !ok {
			return
		}
		p, err := netip.ParsePrefix(v)
		if err == nil && p.Addr().Is4() != is4 {
			err = errors.New("wrong address family")
		}
		if err != nil {
			bad(key, v, "an address with its prefix length, such as 192.168.1.10/24", err)
			return
		}
		*dst = p
	}
	addr4 := func(key string, dst *netip.Addr) {
		v, ok := annotations[key]
		if !ok {
			return
		}
		a, err := netip.ParseAddr(v)
		if err == nil && !a.Is4() {
			err = errors.New("not IPv4")
		}
		if err != nil {
			bad(key, v, "an IPv4 address", err)
			return
		}
		*dst = a
	}
	prefix(v1.AnnotationNodeIPv4Address, true, &n.IPv4)
	prefix(v1.AnnotationNodeIPv6Address, false, &n.IPv6)
	addr4(v1.AnnotationVXLANTunnelAddress, &n.VXLANAddress)
	addr4(v1.AnnotationIPIPTunnelAddress, &n.IPIPAddress)
	if v, ok := annotations[v1.AnnotationVXLANTunnelMAC]; ok {
		mac, err := net.ParseMAC(v)
		if err == nil && len(mac) != 6 {
			err = errors.New("not 6 bytes long")
		}
		if err != nil {
			bad(v1.AnnotationVXLANTunnelMAC, v, "a MAC address", err)
		} else {
			n.VXLANMAC = mac
		}
	}
	return n, errors.Join(errs...)
}

// Annotations are the Node annotations that publish n (the inverse of
// NodeInfoFromAnnotations); zero fields are left out.
func (n NodeInfo) Annotations() map[string]string {
	m := map[string]string{}
	if n.IPv4.IsValid() {
		m[v1.AnnotationNodeIPv4Address] = n.IPv4.String()
	}
	if n.IPv6.IsValid() {
		m[v1.AnnotationNodeIPv6Address] = n.IPv6.String()
	}
	if len(n.VXLANMAC) != 0 {
		m[v1.AnnotationVXLANTunnelMAC] = n.VXLANMAC.String()
	}
	if n.VXLANAddress.IsValid() {
		m[v1.AnnotationVXLANTunnelAddress] = n.VXLANAddress.String()
	}
	if n.IPIPAddress.IsValid() {
		m[v1.AnnotationIPIPTunnelAddress] = n.IPIPAddress.String()
	}
	return m
}
