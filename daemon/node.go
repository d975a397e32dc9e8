package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"slices"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/daemon/routing"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// nodeAddress finds this node's address with its subnet's prefix length:
// configured (--node-ip) when given, else the first global address of the
// interface holding the default route of that family, else the source
// address the kernel picks towards the API server. It says how it found it.
func nodeAddress(configured net.IP, apiServer string) (netip.Prefix, string, error) {
	if configured != nil {
		a, ok := netip.AddrFromSlice(configured)
		if !ok {
			return netip.Prefix{}, "", fmt.Errorf("--node-ip %s is not an IP address", configured)
		}
		a = a.Unmap()
		p, err := prefixOfLocal(a)
		if err != nil {
			return netip.Prefix{}, "", fmt.Errorf("--node-ip %s: %w", a, err)
		}
		return p, "--node-ip", nil
	}
	if p, dev, err := defaultRouteAddress(netlink.FAMILY_V4); err == nil {
		return p, "the address of " + dev + ", which holds the default route", nil
	}
	host := apiServer
	if u, err := url.Parse(apiServer); err == nil && u.Host != "" {
		host = u.Host
	}
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(host, "443")
	}
	// A UDP "connection" sends nothing: it only asks the kernel for the
	// source address it would use.
	c, err := net.Dial("udp", host)
	if err != nil {
		return netip.Prefix{}, "", fmt.Errorf("no default route and no route to the API server at %s (%w): pass --node-ip", host, err)
	}
	local := c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap()
	_ = c.Close()
	p, err := prefixOfLocal(local)
	if err != nil {
		return netip.Prefix{}, "", err
	}
	return p, "the source address towards the API server", nil
}

// prefixOfLocal returns a local address with the prefix length of the
// interface that holds it.
func prefixOfLocal(a netip.Addr) (netip.Prefix, error) {
	family := netlink.FAMILY_V4
	if a.Is6() {
		family = netlink.FAMILY_V6
	}
	addrs, err := netlinksafe.AddrList(nil, family)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("listing this node's addresses: %w", err)
	}
	for _, ad := range addrs {
		if p, ok := prefixFromIPNet(ad.IPNet); ok && p.Addr() == a {
			return p, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("no interface of this node holds %s: pass an address of this node as --node-ip", a)
}

func prefixFromIPNet(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}

// defaultRouteAddress returns the first global address of the link that
// holds the main table's default route of family, and the link's name.
func defaultRouteAddress(family int) (netip.Prefix, string, error) {
	routes, err := netlinksafe.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return netip.Prefix{}, "", err
	}
	for _, r := range routes {
		if (r.Dst != nil && !isDefault(r.Dst)) || r.LinkIndex == 0 {
			continue
		}
		link, err := netlink.LinkByIndex(r.LinkIndex)
		if err != nil {
			continue
		}
		addrs, err := netlinksafe.AddrList(link, family)
		if err != nil {
			continue
		}
		for _, ad := range addrs {
			if p, ok := prefixFromIPNet(ad.IPNet); ok && p.Addr().IsGlobalUnicast() && ad.Scope == unix.RT_SCOPE_UNIVERSE {
				return p, link.Attrs().Name, nil
			}
		}
	}
	return netip.Prefix{}, "", errors.New("no default route with a global address")
}

func isDefault(n *net.IPNet) bool {
	ones, _ := n.Mask.Size()
	return ones == 0
}

// ownedAnnotations are the Node annotations tabbyd publishes (and removes
// when it no longer has their value). The AS-number annotation is the
// user's.
var ownedAnnotations = []string{
	tabbyv1.AnnotationNodeIPv4Address,
	tabbyv1.AnnotationNodeIPv6Address,
	tabbyv1.AnnotationVXLANTunnelMAC,
	tabbyv1.AnnotationVXLANTunnelAddress,
	tabbyv1.AnnotationIPIPTunnelAddress,
}

// annotationPatch is the JSON merge patch that makes a Node's owned
// annotations want (nil when they already are): changed ones set, the
// others removed.
func annotationPatch(have map[string]string, want map[string]string) []byte {
	delta := map[string]any{}
	for _, k := range ownedAnnotations {
		w, wok := want[k]
		h, hok := have[k]
		switch {
		case wok && (!hok || h != w):
			delta[k] = w
		case !wok && hok:
			delta[k] = nil
		}
	}
	if len(delta) == 0 {
		return nil
	}
	data, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": delta}})
	return data
}

// publish patches the node's annotations to announce info; it reports
// whether it changed anything. A patch, not an update: a patch never races
// the kubelet. Through nodes/status, as calico-node writes its
// annotations: the tabby-node role may not patch Nodes themselves (their
// spec: taints, unschedulable), and the API server keeps metadata changes
// of a status write (only the spec is reset). The admission policy
// tabby-node-own-node lets it change only its own Node's tabby.io/*
// annotations there.
func publish(ctx context.Context, ds *datastore.Client, node *corev1.Node, info routing.NodeInfo) (bool, error) {
	patch := annotationPatch(node.Annotations, info.Annotations())
	if patch == nil {
		return false, nil
	}
	if _, err := ds.Nodes.Patch(ctx, node.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return false, fmt.Errorf("publishing node %s's routing identity (patching its annotations): %w", node.Name, err)
	}
	return true, nil
}

// tunnel is one kind of tunnel address (VXLAN or IPIP) of this node: IPAM
// hands it out from the pools that use that encapsulation, under the
// handle <kind>-tunnel-addr-<node>.
type tunnel struct {
	kind     string // "vxlan" or "ipip"
	node     string
	m        *ipam.IPAM
	verified netip.Addr // the address IPAM was seen to hold for the handle
	released bool       // the handle was released since the last assignment
}

func (t *tunnel) handle() string { return t.kind + "-tunnel-addr-" + t.node }

// ensure returns the tunnel address the node should publish: none when no
// pool in pools (the enabled IPv4 pools that use this encapsulation) is
// usable, else current when IPAM holds it for the handle and it lies in
// one of pools, else a new one from IPAM (the old one released).
func (t *tunnel) ensure(ctx context.Context, pools []tabbyv1.IPPool, current netip.Addr) (netip.Addr, error) {
	if len(pools) == 0 {
		if t.released && !current.IsValid() {
			return netip.Addr{}, nil
		}
		if err := t.m.ReleaseHandle(ctx, t.handle(), t.node); err != nil {
			return netip.Addr{}, fmt.Errorf("releasing the %s tunnel address: %w", t.kind, err)
		}
		t.released, t.verified = true, netip.Addr{}
		return netip.Addr{}, nil
	}
	inPools := func(a netip.Addr) bool {
		return slices.ContainsFunc(pools, func(p tabbyv1.IPPool) bool {
			c, err := netip.ParsePrefix(p.Spec.CIDR)
			return err == nil && c.Contains(a)
		})
	}
	if current.IsValid() && current == t.verified && inPools(current) {
		return current, nil
	}
	held, err := t.m.HandleIPsOnNode(ctx, t.handle(), t.node)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("reading the %s tunnel address: %w", t.kind, err)
	}
	var keep netip.Addr
	for _, ip := range held {
		if a, ok := netip.AddrFromSlice(ip); ok && inPools(a.Unmap()) && (!keep.IsValid() || a.Unmap() == current) {
			keep = a.Unmap()
		}
	}
	if keep.IsValid() && len(held) == 1 {
		t.verified, t.released = keep, false
		return keep, nil
	}
	if len(held) > 0 {
		if err := t.m.ReleaseHandle(ctx, t.handle(), t.node); err != nil {
			return netip.Addr{}, fmt.Errorf("releasing the old %s tunnel address: %w", t.kind, err)
		}
	}
	names := make([]string, 0, len(pools))
	for _, p := range pools {
		names = append(names, p.Name)
	}
	got, err := t.m.Assign(ctx, ipam.Request{HandleID: t.handle(), Node: t.node, IPv4: true, IPv4Pools: names, Use: tabbyv1.UseTunnel})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("assigning the %s tunnel address from pools %v: %w", t.kind, names, err)
	}
	if len(got) == 0 {
		return netip.Addr{}, fmt.Errorf("IPAM assigned no %s tunnel address from pools %v", t.kind, names)
	}
	a, _ := netip.AddrFromSlice(got[0].IP)
	t.verified, t.released = a.Unmap(), false
	return t.verified, nil
}

// tunnelPools are the enabled IPv4 pools that encapsulate with VXLAN
// (vxlan) or IPIP (!vxlan), allow tunnel addresses, and whose
// nodeSelector picks node.
func tunnelPools(pools []tabbyv1.IPPool, node *corev1.Node, vxlan bool) []tabbyv1.IPPool {
	var out []tabbyv1.IPPool
	for _, p := range pools {
		mode := p.Spec.IPIPMode
		if vxlan {
			mode = p.Spec.VXLANMode
		}
		if p.Spec.Disabled || mode == "" || mode == tabbyv1.EncapNever {
			continue
		}
		if c, err := netip.ParsePrefix(p.Spec.CIDR); err != nil || !c.Addr().Is4() {
			continue
		}
		if !vxlan && p.Spec.VXLANMode != "" && p.Spec.VXLANMode != tabbyv1.EncapNever {
			continue // both set: routing uses VXLAN
		}
		if len(p.Spec.AllowedUses) > 0 && !slices.Contains(p.Spec.AllowedUses, tabbyv1.UseTunnel) {
			continue
		}
		if !selects(p.Spec.NodeSelector, node.Labels) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// selects says whether a label selector (nil: everything) matches labels.
func selects(sel *metav1.LabelSelector, labels map[string]string) bool {
	if sel == nil {
		return true
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false
	}
	return s.Matches(k8slabels.Set(labels))
}

// setNetworkAvailable clears the node's NetworkUnavailable condition (as
// Calico does once its routes are programmed; some cloud providers set it
// on new nodes) unless it is clear already. It reports whether the
// condition is clear now.
func setNetworkAvailable(ctx context.Context, ds *datastore.Client, node *corev1.Node, log *slog.Logger) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeNetworkUnavailable && c.Status == corev1.ConditionFalse {
			return true
		}
	}
	now := metav1.Now()
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse, Reason: "TabbyIsUp",
		Message: "tabbyd programs this node's routes", LastTransitionTime: now, LastHeartbeatTime: now,
	}}}})
	if _, err := ds.Nodes.Patch(ctx, node.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		log.Warn("clearing the node's NetworkUnavailable condition", "err", err)
		return false
	}
	return true
}
