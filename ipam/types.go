package ipam

import (
	"net"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
)

// Request asks for the addresses of one attachment (one pod interface, or a
// node's tunnel).
type Request struct {
	// HandleID names the attachment: "<network>.<containerID>" for a pod
	// interface. Everything assigned is recorded under it.
	HandleID string
	// Node is the node asking; its blocks are used first.
	Node string
	// Namespace and Pod identify the pod (empty for plain cnitool use).
	Namespace, Pod string
	// IPv4 and IPv6 say which families to assign. When both are set the
	// request is dual-stack: getting only one family is a failure, and what
	// was assigned is released.
	IPv4, IPv6 bool
	// IPv4Pools and IPv6Pools restrict the pools by name (from the
	// tabby.io/ipv4pools and tabby.io/ipv6pools annotations); empty means
	// every enabled pool whose nodeSelector matches Node.
	IPv4Pools, IPv6Pools []string
	// IPs asks for these exact addresses (tabby.io/ipAddrs) instead of any
	// free one; they must lie in an enabled pool.
	IPs []net.IP
	// Use is what the addresses are for (default Workload).
	Use tabbyv1.IPPoolAllowedUse
}

// Assigned is one address handed out.
type Assigned struct {
	// IP is the address.
	IP net.IP
	// Pool it came from.
	Pool *tabbyv1.IPPool
	// Block (CIDR) it came from.
	Block *net.IPNet
}

// Net returns the address as a host prefix (/32 or /128).
func (a Assigned) Net() net.IPNet {
	bits := 128
	if a.IP.To4() != nil {
		bits = 32
	}
	return net.IPNet{IP: a.IP, Mask: net.CIDRMask(bits, bits)}
}

// ReleaseOptions names one address to release. A release that names a
// handle or a sequence number is refused (left unreleased) when the address
// is now held by another handle or was allocated again since.
type ReleaseOptions struct {
	IP             net.IP
	HandleID       string
	SequenceNumber *uint64
}
