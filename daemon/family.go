package daemon

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
)

// Reasons of the Events tabbyd records on its Node when pods of the node
// get addresses of a family the node itself has no address of.
const (
	ReasonNoIPv4Address = "NoIPv4Address"
	ReasonNoIPv6Address = "NoIPv6Address"
)

// familyProblem is a family the node's pods use and the node lacks: its
// pod routes of that family are neither advertised nor learned (BGP needs
// the node's address of the family as next hop), so that traffic between
// nodes would be dropped without a word. It is reported, not fixed.
type familyProblem struct {
	Reason, Message string
}

// missingFamilies finds the pools that give node's pods addresses (enabled
// for workloads, nodeSelector picking it) or that hold blocks affine to it,
// of a family the node has no address of (v4, v6: its addresses, the zero
// Prefix for none); why4 and why6 say why detection found none.
func missingFamilies(pools []tabbyv1.IPPool, blocks []tabbyv1.IPAMBlock, node *corev1.Node, v4, v6 netip.Prefix, why4, why6 string) []familyProblem {
	var need4, need6 []string
	for _, p := range pools {
		c, err := netip.ParsePrefix(p.Spec.CIDR)
		if err != nil || (c.Addr().Is4() && v4.IsValid()) || (c.Addr().Is6() && v6.IsValid()) {
			continue
		}
		if !usedBy(p, c, blocks, node) {
			continue
		}
		name := fmt.Sprintf("%s (%s)", p.Name, p.Spec.CIDR)
		if c.Addr().Is4() {
			need4 = append(need4, name)
		} else {
			need6 = append(need6, name)
		}
	}
	var out []familyProblem
	if len(need4) > 0 {
		out = append(out, familyProblem{ReasonNoIPv4Address, familyMessage(node.Name, "IPv4", need4, why4,
			"give the node an IPv4 address (on the interface of its IPv4 default route) or pass tabbyd --node-ip <IPv4>,<IPv6>")})
	}
	if len(need6) > 0 {
		out = append(out, familyProblem{ReasonNoIPv6Address, familyMessage(node.Name, "IPv6", need6, why6,
			"give the node a global IPv6 address (on the interface of its IPv6 default route, or on the one holding its IPv4 address) or pass tabbyd --node-ip <IPv4>,<IPv6>")})
	}
	return out
}

// usedBy says whether node's pods take addresses from pool p (CIDR c):
// it is enabled for workloads and selects the node, or it holds a live
// block affine to the node.
func usedBy(p tabbyv1.IPPool, c netip.Prefix, blocks []tabbyv1.IPAMBlock, node *corev1.Node) bool {
	workload := len(p.Spec.AllowedUses) == 0 || slices.Contains(p.Spec.AllowedUses, tabbyv1.UseWorkload)
	if !p.Spec.Disabled && workload && selects(p.Spec.NodeSelector, node.Labels) {
		return true
	}
	return slices.ContainsFunc(blocks, func(b tabbyv1.IPAMBlock) bool {
		bc, err := netip.ParsePrefix(b.Spec.CIDR)
		return err == nil && !b.Spec.Deleted && b.Spec.Affinity == "host:"+node.Name && c.Contains(bc.Addr())
	})
}

func familyMessage(node, family string, pools []string, why, fix string) string {
	msg := fmt.Sprintf("node %s has no %s address, but its pods take %s addresses from IPPool %s: their %s routes are neither advertised to nor learned from other nodes, so %s traffic between pods on different nodes is dropped. Fix: %s, then restart tabbyd",
		node, family, family, strings.Join(pools, ", "), family, family, fix)
	if why != "" {
		msg += fmt.Sprintf(" (tabbyd found none: %s)", why)
	}
	return msg
}
