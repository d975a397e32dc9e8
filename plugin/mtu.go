package plugin

import (
	"errors"
	"fmt"
	"net"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/tabbynet/tabby/contract/agentapi"
)

// Encapsulation overheads subtracted from the underlay MTU.
const (
	OverheadVXLAN = 50
	OverheadIPIP  = 20
)

// DefaultLinkMTU is assumed when the node has no default route.
const DefaultLinkMTU = 1500

// EncapOverhead is the largest encapsulation overhead over the pools: VXLAN
// 50, IPIP 20, for any mode but Never (disabled pools are skipped).
func EncapOverhead(pools []agentapi.Pool) int {
	over := 0
	for _, p := range pools {
		if p.Disabled {
			continue
		}
		if encapOn(p.VXLANMode) && OverheadVXLAN > over {
			over = OverheadVXLAN
		}
		if encapOn(p.IPIPMode) && OverheadIPIP > over {
			over = OverheadIPIP
		}
	}
	return over
}

// encapOn: an encapsulation mode (the IPPool's ipipMode or vxlanMode,
// Never, Always or CrossSubnet) other than Never.
func encapOn(m string) bool { return m != "" && m != "Never" }

// ComputeMTU is the pod interface MTU: the configured one when set, else the
// node's default-route interface MTU (linkMTU; DefaultLinkMTU when 0) less
// the largest encapsulation overhead of the usable pools.
func ComputeMTU(configured, linkMTU int, pools []agentapi.Pool) int {
	if configured > 0 {
		return configured
	}
	if linkMTU <= 0 {
		linkMTU = DefaultLinkMTU
	}
	return linkMTU - EncapOverhead(pools)
}

// DefaultRouteMTU returns the MTU of the interface of the default route in
// the current network namespace (IPv4 first, then IPv6), and 0 when there
// is none. Call it in the node's namespace.
func DefaultRouteMTU() (int, error) {
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := netlinksafe.RouteListFiltered(fam, &netlink.Route{Table: 0}, 0)
		if err != nil {
			return 0, fmt.Errorf("listing routes to find the default-route interface: %w", err)
		}
		for _, r := range routes {
			if !isDefault(r.Dst) {
				continue
			}
			idx := r.LinkIndex
			if idx == 0 && len(r.MultiPath) > 0 {
				idx = r.MultiPath[0].LinkIndex
			}
			if idx == 0 {
				continue
			}
			l, err := netlink.LinkByIndex(idx)
			if err != nil {
				var nf netlink.LinkNotFoundError
				if errors.As(err, &nf) {
					continue
				}
				return 0, fmt.Errorf("looking up the default-route interface (index %d): %w", idx, err)
			}
			return l.Attrs().MTU, nil
		}
	}
	return 0, nil
}

func isDefault(dst *net.IPNet) bool {
	if dst == nil {
		return true
	}
	ones, _ := dst.Mask.Size()
	return ones == 0
}
