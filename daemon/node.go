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
	"strings"

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

// ParseNodeIPs parses --node-ip: one address, or an IPv4 and an IPv6
// address separated by a comma in either order ("v4,v6", as kubelet's
// --node-ip takes them). "" is none: both families are detected.
func ParseNodeIPs(s string) ([]netip.Addr, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > 2 {
		return nil, fmt.Errorf("--node-ip %q: give one address, or an IPv4 and an IPv6 address separated by a comma", s)
	}
	var out []netip.Addr
	for _, part := range parts {
		a, err := netip.ParseAddr(strings.TrimSpace(part))
		if err != nil {
			return nil, fmt.Errorf("--node-ip %q: %q is not an IP address", s, strings.TrimSpace(part))
		}
		a = a.Unmap()
		if a.Zone() != "" || !a.IsGlobalUnicast() {
			return nil, fmt.Errorf("--node-ip %q: %s is not a global unicast address (no loopback, link-local, multicast or unspecified address)", s, a)
		}
		if len(out) == 1 && out[0].Is4() == a.Is4() {
			return nil, fmt.Errorf("--node-ip %q: two addresses of the same family; give at most one IPv4 and one IPv6 address", s)
		}
		out = append(out, a)
	}
	return out, nil
}

// nodeAddrs are the node's addresses, one per family, with their
// subnet's prefix length (the zero Prefix for a family it has none of),
// and how each was found.
type nodeAddrs struct {
	v4, v6     netip.Prefix
	how4, how6 string
	problem6   string // why no IPv6 address was found (IPv6 is optional)
	problem4   string // why no IPv4 address was found
}

// nodeAddresses finds this node's addresses, per family: the configured
// one (--node-ip); else the first global address of the interface that
// holds that family's default route; else the source address the kernel
// picks towards the API server, when the API server is of that family;
// else, for IPv6 only, a global IPv6 address (not link-local, deprecated,
// tentative or temporary) of the interface that holds the node's IPv4
// address. That last step is tabby's decision, as Calico's first-found
// and interface=<the IPv4 one> autodetection: a dual-stack node whose IPv6
// default route is missing (routes by router advertisement not accepted,
// or only a v4 default) still publishes the IPv6 address it plainly has.
// It fails only when neither family has an address.
func nodeAddresses(configured []netip.Addr, apiServer string) (nodeAddrs, error) {
	var na nodeAddrs
	var conf4, conf6 netip.Addr
	for _, a := range configured {
		if a.Is4() {
			conf4 = a
		} else {
			conf6 = a
		}
	}
	api, apiErr := sourceTowards(apiServer)
	var err error
	if na.v4, na.how4, err = familyAddress(netlink.FAMILY_V4, conf4, api, apiErr); err != nil {
		if conf4.IsValid() {
			return na, err
		}
		na.problem4 = err.Error()
	}
	if na.v6, na.how6, err = familyAddress(netlink.FAMILY_V6, conf6, api, apiErr); err != nil {
		if conf6.IsValid() {
			return na, err
		}
		na.problem6 = err.Error()
		if na.v4.IsValid() {
			if p, dev, err := sameLinkAddress(na.v4.Addr(), netlink.FAMILY_V6); err == nil {
				na.v6, na.how6, na.problem6 = p, "a global IPv6 address of "+dev+", which holds the node's IPv4 address", ""
			}
		}
	}
	if !na.v4.IsValid() && !na.v6.IsValid() {
		return na, fmt.Errorf("no address found: %s; and %s: pass --node-ip", na.problem4, na.problem6)
	}
	return na, nil
}

// familyAddress finds the node's address of one family (see
// nodeAddresses): configured, else the default route's interface, else
// api (the source address towards the API server) when it is of family.
func familyAddress(family int, configured, api netip.Addr, apiErr error) (netip.Prefix, string, error) {
	name := "IPv4"
	if family == netlink.FAMILY_V6 {
		name = "IPv6"
	}
	if configured.IsValid() {
		p, err := prefixOfLocal(configured)
		if err != nil {
			return netip.Prefix{}, "", fmt.Errorf("--node-ip %s: %w", configured, err)
		}
		return p, "--node-ip", nil
	}
	if p, dev, err := defaultRouteAddress(family); err == nil {
		return p, "the address of " + dev + ", which holds the " + name + " default route", nil
	}
	switch {
	case apiErr != nil:
		return netip.Prefix{}, "", fmt.Errorf("no %s default route with a global address, and %w", name, apiErr)
	case api.Is4() != (family == netlink.FAMILY_V4):
		return netip.Prefix{}, "", fmt.Errorf("no %s default route with a global address, and the API server is not reached over %s", name, name)
	case !api.IsGlobalUnicast():
		return netip.Prefix{}, "", fmt.Errorf("no %s default route with a global address, and the API server is reached from %s, not a global address", name, api)
	}
	p, err := prefixOfLocal(api)
	if err != nil {
		return netip.Prefix{}, "", err
	}
	return p, "the source address towards the API server", nil
}

// sourceTowards returns the source address the kernel picks towards the
// API server at apiServer (a URL or HOST[:PORT]). A UDP "connection"
// sends nothing: it only asks the kernel for the route.
func sourceTowards(apiServer string) (netip.Addr, error) {
	host := apiServer
	if u, err := url.Parse(apiServer); err == nil && u.Host != "" {
		host = u.Host
	}
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(host, "443")
	}
	c, err := net.Dial("udp", host)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no route to the API server at %s (%w)", host, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), nil
}

// sameLinkAddress returns the first usable global address of family on the
// link that holds the local address a, and the link's name.
func sameLinkAddress(a netip.Addr, family int) (netip.Prefix, string, error) {
	links, err := netlinksafe.LinkList()
	if err != nil {
		return netip.Prefix{}, "", err
	}
	for _, link := range links {
		addrs, err := netlinksafe.AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			continue
		}
		if !slices.ContainsFunc(addrs, func(ad netlink.Addr) bool { p, ok := prefixFromIPNet(ad.IPNet); return ok && p.Addr() == a }) {
			continue
		}
		if p, ok := firstUsable(addrs, family); ok {
			return p, link.Attrs().Name, nil
		}
		return netip.Prefix{}, "", fmt.Errorf("%s holds %s but no global address of the other family", link.Attrs().Name, a)
	}
	return netip.Prefix{}, "", fmt.Errorf("no interface holds %s", a)
}

// usableAddr says whether a node may publish an interface address: of
// family, global (not link-local, loopback or multicast), of universe
// scope, and not deprecated, tentative, failed duplicate detection or a
// temporary (privacy) address, which the kernel replaces.
func usableAddr(ad netlink.Addr, family int) (netip.Prefix, bool) {
	p, ok := prefixFromIPNet(ad.IPNet)
	if !ok || p.Addr().Is4() != (family == netlink.FAMILY_V4) || !p.Addr().IsGlobalUnicast() || ad.Scope != unix.RT_SCOPE_UNIVERSE {
		return netip.Prefix{}, false
	}
	if ad.Flags&(unix.IFA_F_DEPRECATED|unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED|unix.IFA_F_TEMPORARY) != 0 {
		return netip.Prefix{}, false
	}
	return p, true
}

// firstUsable returns the first usableAddr of family in addrs.
func firstUsable(addrs []netlink.Addr, family int) (netip.Prefix, bool) {
	for _, ad := range addrs {
		if p, ok := usableAddr(ad, family); ok {
			return p, true
		}
	}
	return netip.Prefix{}, false
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

// defaultRouteAddress returns the first usable global address (usableAddr)
// of the link that holds the main table's default route of family (each
// link of a multipath one), and the link's name.
func defaultRouteAddress(family int) (netip.Prefix, string, error) {
	routes, err := netlinksafe.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return netip.Prefix{}, "", err
	}
	for _, r := range routes {
		if r.Dst != nil && !isDefault(r.Dst) {
			continue
		}
		links := []int{r.LinkIndex}
		for _, nh := range r.MultiPath {
			links = append(links, nh.LinkIndex)
		}
		for _, idx := range links {
			if idx == 0 {
				continue
			}
			link, err := netlink.LinkByIndex(idx)
			if err != nil {
				continue
			}
			addrs, err := netlinksafe.AddrList(link, family)
			if err != nil {
				continue
			}
			if p, ok := firstUsable(addrs, family); ok {
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
