// Package routing turns what a node knows (its own address and blocks, the
// IP pools, the routes BGP learned and the other nodes' tunnel identities)
// into the routes, tunnels and NAT rules the node needs, and programs them.
//
// It is split as the rest of tabby is: Desired is a pure function from
// Inputs to a State (routes, the VXLAN device with its FDB and neighbour
// entries, tunl0, the NAT-outgoing sets, forwarding), and an Applier diffs a
// State against the kernel of the namespace it runs in and changes only the
// difference. The applier owns only what carries tabby's marks: routes with
// protocol RouteProtocol in the main table, the device VXLANDevice and the
// entries on it, tunl0's address labelled IPIPAddressLabel, the ipsets and
// the nat chain named below. Everything else on the node (the CNI plugin's
// proto-80 pod routes, kube-proxy's and the admin's rules, other routes) is
// never changed, flushed or reordered.
//
// tabbyd drives it from its reconcile loop, in the node's namespace, on
// every change and on a periodic resync:
//
//	s := routing.Desired(inputs) // pure: table-tested
//	for _, w := range s.Warnings {
//		log.Warn(w)
//	}
//	stats, err := applier.Apply(s) // err joins every failure; stats feed metrics
//
// and calls applier.Cleanup() when the node leaves tabby. The node
// publishes its own NodeInfo with NodeInfo.Annotations (its VXLAN MAC is
// DefaultVXLANMAC(name) unless it chooses another), and reads its peers'
// with NodeInfoFromAnnotations.
package routing

import (
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"

	"github.com/tabbynet/tabby/contract"
)

// Names and numbers of what tabby programs on a node.
const (
	// RouteProtocol marks every route the applier programs; `ip route`
	// shows it as "proto 81". The CNI plugin's pod routes carry 80
	// (contract.RouteProtocolPod) and are never touched here.
	RouteProtocol netlink.RouteProtocol = contract.RouteProtocolNode

	// VXLANDevice is the VXLAN device tabby owns; its prefix keeps it out
	// of the policy rules' pod interfaces.
	VXLANDevice = contract.DeviceIfacePrefix + ".vxlan"
	// VXLANVNI and VXLANPort are its VXLAN network identifier and UDP port.
	VXLANVNI  = 4096
	VXLANPort = 4789
	// VXLANOverhead is what VXLAN over IPv4 adds to a packet; the device's
	// MTU is the uplink's minus this.
	VXLANOverhead = 50

	// IPIPDevice is the kernel's IPIP fallback device, which exists in
	// every namespace once the ipip module is loaded.
	IPIPDevice = "tunl0"
	// IPIPOverhead is what IPIP adds to a packet.
	IPIPOverhead = 20
	// IPIPAddressLabel labels the address tabby puts on tunl0, so that only
	// that address is ever removed.
	IPIPAddressLabel = IPIPDevice + ":tabby"

	// NATChain is the nat-table chain POSTROUTING jumps to for NAT
	// outgoing (the same name in iptables and ip6tables).
	NATChain = contract.ChainPrefix + "NAT-OUTGOING"
	// SetAllPools holds every pool's CIDR (hash:net); SetNATPools the
	// CIDRs of pools with natOutgoing. IPv6 sets carry SetSuffixV6.
	SetAllPools = "tabby-masq-pools"
	SetNATPools = "tabby-nat-pools"
	SetSuffixV6 = "-v6"
)

// RouteType is the kind of a route.
type RouteType int

const (
	// Unicast routes forward to a gateway.
	Unicast RouteType = iota
	// Blackhole routes drop silently (a node's own blocks: addresses of the
	// block that no pod holds must not leak to the default route).
	Blackhole
)

func (t RouteType) String() string {
	if t == Blackhole {
		return "blackhole"
	}
	return "unicast"
}

// Route is one route of the main table, programmed with RouteProtocol.
type Route struct {
	Dst  netip.Prefix
	Type RouteType
	// Gateway of a unicast route.
	Gateway netip.Addr
	// Device the route goes out of; empty lets the kernel choose by the
	// gateway (native routes).
	Device string
	// OnLink tells the kernel the gateway is reachable on Device even
	// though no subnet of Device contains it (tunnel routes).
	OnLink bool
}

func (r Route) String() string {
	if r.Type == Blackhole {
		return "blackhole " + r.Dst.String()
	}
	s := r.Dst.String() + " via " + r.Gateway.String()
	if r.Device != "" {
		s += " dev " + r.Device
	}
	if r.OnLink {
		s += " onlink"
	}
	return s
}

// FDBEntry sends frames for MAC on the VXLAN device to the VTEP Dst (a
// peer node's address): `bridge fdb MAC dev tabby.vxlan dst Dst`.
type FDBEntry struct {
	MAC net.HardwareAddr
	Dst netip.Addr
}

// Neighbor is a permanent neighbour entry on the VXLAN device: a peer's
// tunnel address resolves to the peer's VTEP MAC without ARP or NDP.
type Neighbor struct {
	IP  netip.Addr
	MAC net.HardwareAddr
}

// VXLAN is the desired VXLAN device with the entries it owns.
type VXLAN struct {
	// MAC of the device (what peers put in their neighbour entries).
	MAC net.HardwareAddr
	// Local is the node's IPv4 address, the source of encapsulated packets.
	Local netip.Addr
	// Addresses of the device: the node's VXLAN tunnel address as a /32,
	// and with IPv6 pools over VXLAN the link-local address derived from
	// MAC (LinkLocalFromMAC).
	Addresses []netip.Prefix
	// MTU of the device; 0 means the uplink's (the link holding Local)
	// minus VXLANOverhead.
	MTU int
	// FDB and Neighbors are the peers' entries, sorted.
	FDB       []FDBEntry
	Neighbors []Neighbor
}

// IPIP is the desired state of tunl0.
type IPIP struct {
	// Address is the node's IPIP tunnel address (a /32); invalid: none.
	Address netip.Prefix
	// MTU of tunl0; 0 means the uplink's minus IPIPOverhead, where the
	// uplink is the link holding Local.
	MTU   int
	Local netip.Addr
}

// NAT is the NAT-outgoing state of both families: traffic from NATPools to
// destinations outside every one of AllPools is masqueraded. A family with
// no NATPools has no chain, jump or sets.
type NAT struct {
	AllPools []netip.Prefix
	NATPools []netip.Prefix
}

// State is everything the applier programs on a node.
type State struct {
	// Routes, sorted by destination.
	Routes []Route
	// VXLAN is nil when no pool uses VXLAN: the device is then removed.
	VXLAN *VXLAN
	// IPIP is nil when no pool uses IPIP: tabby's address on tunl0 is
	// then removed.
	IPIP *IPIP
	NAT  NAT
	// IPv4Forwarding and IPv6Forwarding turn forwarding on (never off).
	IPv4Forwarding, IPv6Forwarding bool
	// Warnings say what Desired could not do as asked, and why.
	Warnings []string
}
