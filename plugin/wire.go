package plugin

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tabbynet/tabby/contract"
)

// RouteProtocol marks the routes tabby owns (the host-side pod routes); the
// daemon recognises them by it. It is the rtnetlink protocol number shown by
// `ip route` as "proto 80".
const RouteProtocol netlink.RouteProtocol = contract.RouteProtocolPod

// Link-local gateways every pod routes through. The host end of the veth
// carries fe80::1 itself and answers ARP for 169.254.1.1 by proxy; the pod
// does not need either answer, though: it holds a permanent neighbour
// entry for each gateway that points at HostVethMAC.
var (
	GatewayV4 = net.IPv4(169, 254, 1, 1).To4()
	GatewayV6 = net.ParseIP("fe80::1")
)

// HostVethMAC is the MAC address of every host veth (as Calico's
// ee:ee:ee:ee:ee:ee): locally administered, the same on every link since
// each is point-to-point. Set explicitly, it is never rewritten by udev's
// MACAddressPolicy (which replaces only random addresses), so the pod's
// permanent neighbour entries for the gateways stay right. Proxy ARP alone
// answers only while the node has a route to 169.254.1.1, which a node
// without a default route lacks: its pods could reach nothing, not even
// each other.
var HostVethMAC = net.HardwareAddr{0xee, 0xee, 0xee, 0xee, 0xee, 0xee}

// Wiring is what one attachment looks like in the kernel.
type Wiring struct {
	// HostVeth names the host end (in the node's namespace).
	HostVeth string
	// IfName is the pod end (in the pod's namespace).
	IfName string
	// Alias is written on the host end.
	Alias string
	// MTU of both ends.
	MTU int
	// IPs are the pod's addresses, as /32 and /128 host prefixes.
	IPs []net.IPNet
}

// gatewayFor returns the gateway of an address's family.
func gatewayFor(a net.IP) net.IP {
	if a.To4() != nil {
		return GatewayV4
	}
	return GatewayV6
}

// hostPrefix returns ip as a /32 or /128.
func hostPrefix(a net.IP) net.IPNet {
	if v4 := a.To4(); v4 != nil {
		return net.IPNet{IP: v4, Mask: net.CIDRMask(32, 32)}
	}
	return net.IPNet{IP: a.To16(), Mask: net.CIDRMask(128, 128)}
}

// setSysctl writes a sysctl of the current thread's network namespace when
// it does not already hold the value (writing ip_forward walks every device).
func setSysctl(name, value string) error {
	if cur, err := os.ReadFile(sysctlPath(name)); err == nil && strings.TrimSpace(string(cur)) == value {
		return nil
	}
	return writeSysctl(name, value)
}

// writeSysctl writes a sysctl without reading it back (the write fails
// when the kernel refuses the value).
func writeSysctl(name, value string) error {
	if err := os.WriteFile(sysctlPath(name), []byte(value), 0o644); err != nil {
		return fmt.Errorf("setting sysctl %s=%s: %w", name, value, err)
	}
	return nil
}

func sysctlPath(name string) string { return "/proc/sys/" + name }

// EnableForwarding turns IP forwarding on in the node's namespace (run it
// there) for the families in use.
func EnableForwarding(v4, v6 bool) error {
	if v4 {
		if err := setSysctl("net/ipv4/ip_forward", "1"); err != nil {
			return err
		}
	}
	if v6 {
		if err := setSysctl("net/ipv6/conf/all/forwarding", "1"); err != nil {
			return err
		}
	}
	return nil
}

// RemoveStaleHostVeth deletes a link named w.HostVeth in the node's
// namespace (run it there) that belongs to another attachment, such as an
// earlier sandbox of the same pod. It refuses to touch a link that tabby did
// not create.
func RemoveStaleHostVeth(name string) (bool, error) {
	l, err := netlinksafe.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return false, nil
		}
		return false, fmt.Errorf("looking up link %s: %w", name, err)
	}
	if _, ok := ParseVethAlias(l.Attrs().Alias); !ok && l.Type() != "veth" {
		return false, fmt.Errorf("a %s link named %s exists on this node and was not made by tabby: remove or rename it", l.Type(), name)
	}
	if err := netlink.LinkDel(l); err != nil && !isNotFound(err) {
		return false, fmt.Errorf("deleting stale link %s (alias %q): %w", name, l.Attrs().Alias, err)
	}
	return true, nil
}

// SetupPod creates the veth pair from the node's namespace (the caller's),
// its pod end made directly in the pod's namespace, the host end
// made up with HostVethMAC, and configures the pod end: addresses, and the
// routes and neighbour entries of podRoutes. It returns both interfaces for
// the CNI result. Run it in the node's namespace.
//
// Everything is one netlink request where the kernel allows it (name, MTU,
// MAC, state and the peer's namespace at creation), and the pod's side is
// written through a netlink socket opened in the pod's namespace, so no
// thread moves between namespaces (but for IPv6's sysctls).
func SetupPod(podNS ns.NetNS, w *Wiring) (hostIf, podIf *current.Interface, err error) {
	v, err := newVeth(podNS, w)
	if err != nil {
		return nil, nil, err
	}
	defer v.Close()
	return v.setupPod(w)
}

// vethPair is a veth pair newVeth made, whose pod end has no address or
// route yet: everything that needs the pod's addresses comes after.
type vethPair struct {
	podNS ns.NetNS
	// host is the host end (with its index), pod the pod end.
	host, pod netlink.Link
	// h is a netlink socket in the pod's namespace.
	h *netlink.Handle
}

// newVeth makes the pair (addVeth) and opens the pod's side. Close it.
func newVeth(podNS ns.NetNS, w *Wiring) (*vethPair, error) {
	host, err := addVeth(podNS, w)
	if err != nil {
		return nil, err
	}
	v := &vethPair{podNS: podNS, host: host}
	if v.h, err = netlink.NewHandleAt(netns.NsHandle(podNS.Fd()), unix.NETLINK_ROUTE); err != nil {
		return nil, fmt.Errorf("opening a netlink socket in the pod's namespace %s: %w", podNS.Path(), err)
	}
	if v.pod, err = v.h.LinkByName(w.IfName); err != nil {
		v.Close()
		return nil, fmt.Errorf("looking up %s in the pod: %w", w.IfName, err)
	}
	return v, nil
}

// Close closes the netlink socket in the pod's namespace.
func (v *vethPair) Close() { v.h.Close() }

// setupPod configures the pod end for w.IPs: up, addresses, neighbour
// entries and routes. It returns both interfaces for the CNI result.
func (v *vethPair) setupPod(w *Wiring) (hostIf, podIf *current.Interface, err error) {
	if err := setupPodAddrs(v.h, v.podNS, v.pod, w); err != nil {
		return nil, nil, err
	}
	if err := setupPodRoutes(v.h, podRoutes(v.pod.Attrs().Index, v.host.Attrs().Index, w.IPs), w.IfName); err != nil {
		return nil, nil, err
	}
	hostIf = &current.Interface{Name: w.HostVeth, Mac: HostVethMAC.String()}
	podIf = &current.Interface{Name: w.IfName, Sandbox: v.podNS.Path(), Mtu: w.MTU, Mac: v.pod.Attrs().HardwareAddr.String()}
	return hostIf, podIf, nil
}

// addVeth creates the pair in one request. A link of the host end's name
// left by an earlier sandbox of the pod is deleted first (RemoveStaleHostVeth)
// and the creation tried again: looking for one only when the name is
// taken spares every other ADD a round trip.
func addVeth(podNS ns.NetNS, w *Wiring) (netlink.Link, error) {
	attrs := netlink.NewLinkAttrs()
	attrs.Name, attrs.MTU, attrs.HardwareAddr, attrs.Flags = w.HostVeth, w.MTU, HostVethMAC, net.FlagUp
	veth := netlink.NewVeth(attrs)
	veth.PeerName, veth.PeerNamespace = w.IfName, netlink.NsFd(podNS.Fd())
	err := netlink.LinkAdd(veth)
	if errors.Is(err, unix.EEXIST) {
		var stale bool
		if stale, err = RemoveStaleHostVeth(w.HostVeth); err != nil {
			return nil, err
		}
		if !stale {
			return nil, fmt.Errorf("creating veth %s (pod) / %s (node): %s already exists in the pod's namespace %s", w.IfName, w.HostVeth, w.IfName, podNS.Path())
		}
		err = netlink.LinkAdd(veth)
	}
	if err != nil {
		return nil, fmt.Errorf("creating veth %s (pod) / %s (node): %w", w.IfName, w.HostVeth, err)
	}
	return veth, nil
}

// setupPodAddrs brings the pod end up with its addresses, through h, a
// netlink socket in the pod's namespace.
func setupPodAddrs(h *netlink.Handle, podNS ns.NetNS, link netlink.Link, w *Wiring) error {
	if _, v6 := families(w.IPs); v6 {
		// The pod may have IPv6 off by default; its address is set
		// without DAD so it is usable at once. /proc/sys shows the
		// namespace of the thread that opens it.
		_ = podNS.Do(func(ns.NetNS) error {
			_ = writeSysctl("net/ipv6/conf/"+w.IfName+"/disable_ipv6", "0")
			_ = writeSysctl("net/ipv6/conf/"+w.IfName+"/accept_ra", "0")
			return nil
		})
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("bringing %s up in the pod: %w", w.IfName, err)
	}
	for _, a := range w.IPs {
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: a.IP, Mask: a.Mask}}
		if a.IP.To4() == nil {
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("adding address %s to %s in the pod: %w", a.String(), w.IfName, err)
		}
	}
	return nil
}

// setupPodRoutes writes the pod side of p, neighbour entries then routes,
// through h, a netlink socket in the pod's namespace.
func setupPodRoutes(h *netlink.Handle, p podNet, ifName string) error {
	for i, n := range p.Neighs {
		if err := h.NeighSet(&p.Neighs[i]); err != nil {
			return fmt.Errorf("adding the neighbour entry %s lladdr %s dev %s in the pod: %w", n.IP, n.HardwareAddr, ifName, err)
		}
	}
	for i, r := range p.Routes {
		if err := h.RouteReplace(&p.Routes[i]); err != nil {
			return fmt.Errorf("adding route %s in the pod: %w", routeString(r, ifName), err)
		}
	}
	return nil
}

// SetupHost configures the host end in the node's namespace (run it there):
// its alias, proxy ARP with no delay, forwarding, fe80::1 for IPv6, and
// the host routes of podRoutes: one to every pod address through it,
// marked with RouteProtocol.
func SetupHost(w *Wiring) error {
	link, err := netlinksafe.LinkByName(w.HostVeth)
	if err != nil {
		return fmt.Errorf("looking up host veth %s: %w", w.HostVeth, err)
	}
	return setupHost(link, w)
}

// setupHost is SetupHost on the host end link (its index, flags and
// alias known).
func setupHost(link netlink.Link, w *Wiring) error {
	if err := setAlias(link, w); err != nil {
		return err
	}
	v4, v6 := families(w.IPs)
	for _, s := range hostSysctls(w.HostVeth, v4, v6) {
		if err := setSysctl(s[0], s[1]); err != nil {
			return err
		}
	}
	if v6 {
		gw := &netlink.Addr{IPNet: &net.IPNet{IP: GatewayV6, Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
		if err := netlink.AddrReplace(link, gw); err != nil {
			return fmt.Errorf("adding %s to host veth %s: %w", gw.IPNet, w.HostVeth, err)
		}
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("bringing %s up: %w", w.HostVeth, err)
		}
	}
	for _, r := range podRoutes(0, link.Attrs().Index, w.IPs).HostRoutes {
		if err := netlink.RouteReplace(&r); err != nil {
			return fmt.Errorf("adding route %s: %w", routeString(r, w.HostVeth), err)
		}
	}
	return nil
}

// setAlias writes w.Alias on the host end unless it holds it already.
func setAlias(link netlink.Link, w *Wiring) error {
	if link.Attrs().Alias == w.Alias {
		return nil
	}
	if err := netlink.LinkSetAlias(link, w.Alias); err != nil {
		return fmt.Errorf("setting the alias of %s: %w", w.HostVeth, err)
	}
	link.Attrs().Alias = w.Alias
	return nil
}

// hostSysctls are the sysctls of the host veth for the families in use:
// IPv4 answers ARP for the gateway by proxy, at once; IPv6 is on without
// router advertisements, which would add routes tabby does not own.
func hostSysctls(veth string, v4, v6 bool) [][2]string {
	var out [][2]string
	if v4 {
		out = append(out,
			[2]string{"net/ipv4/conf/" + veth + "/proxy_arp", "1"},
			[2]string{"net/ipv4/neigh/" + veth + "/proxy_delay", "0"},
			[2]string{"net/ipv4/conf/" + veth + "/forwarding", "1"})
	}
	if v6 {
		out = append(out,
			[2]string{"net/ipv6/conf/" + veth + "/disable_ipv6", "0"},
			[2]string{"net/ipv6/conf/" + veth + "/accept_ra", "0"},
			[2]string{"net/ipv6/conf/" + veth + "/forwarding", "1"})
	}
	return out
}

// DeleteHostVeth deletes the host veth of an attachment in the node's
// namespace (run it there): the link named name when its alias says it is
// this attachment's, else any tabby link whose alias names the attachment.
// Deleting it deletes the pod end and the routes through it. It reports
// whether something was deleted; a missing link is not an error.
func DeleteHostVeth(name string, att Attachment) (bool, error) {
	alias := VethAlias(att)
	if name != "" {
		l, err := netlinksafe.LinkByName(name)
		if err == nil && l.Attrs().Alias == alias {
			if err := netlink.LinkDel(l); err != nil && !isNotFound(err) {
				return false, fmt.Errorf("deleting host veth %s: %w", name, err)
			}
			return true, nil
		}
		if err != nil && !isNotFound(err) {
			return false, fmt.Errorf("looking up host veth %s: %w", name, err)
		}
	}
	links, err := netlinksafe.LinkList()
	if err != nil {
		return false, fmt.Errorf("listing links: %w", err)
	}
	deleted := false
	for _, l := range links {
		if l.Attrs().Alias != alias {
			continue
		}
		if err := netlink.LinkDel(l); err != nil && !isNotFound(err) {
			return deleted, fmt.Errorf("deleting host veth %s: %w", l.Attrs().Name, err)
		}
		deleted = true
	}
	return deleted, nil
}

// HostVeths lists the attachments of a network that have a host veth in the
// node's namespace (run it there), by the alias tabby writes.
func HostVeths(network string) (map[Attachment]netlink.Link, error) {
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, fmt.Errorf("listing links: %w", err)
	}
	out := map[Attachment]netlink.Link{}
	for _, l := range links {
		a, ok := ParseVethAlias(l.Attrs().Alias)
		if !ok || a.Network != network {
			continue
		}
		out[a] = l
	}
	return out, nil
}

// DeletePodLink deletes the pod end in the pod's namespace; a namespace or
// link already gone is not an error.
func DeletePodLink(netnsPath, ifName string) error {
	if netnsPath == "" {
		return nil
	}
	err := ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
		l, err := netlinksafe.LinkByName(ifName)
		if err == nil {
			err = netlink.LinkDel(l)
		}
		if err != nil && !isNotFound(err) {
			return fmt.Errorf("deleting %s: %w", ifName, err)
		}
		return nil
	})
	var notExist ns.NSPathNotExistErr
	if err != nil && (errors.As(err, &notExist) || errors.Is(err, os.ErrNotExist)) {
		return nil
	}
	return err
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT)
}
