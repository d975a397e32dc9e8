package lab

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/tabbynet/tabby/internal/controlplane"
)

// addNetNS creates the named network namespace (bound at NetNSDir/name, as
// ip netns add does) with lo up.
func addNetNS(name string) error {
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns add %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return withLinks(name, func(h *netlink.Handle) error { return linkUp(h, "lo") })
}

// delNetNS removes the named network namespace's binding (the namespace
// goes when nothing else holds it). A missing one is fine.
func delNetNS(name string) error {
	path := NetNSPath(name)
	// A namespace bound twice over one file needs two unmounts; EINVAL
	// means nothing is mounted there any more.
	for range 5 {
		err := unix.Unmount(path, unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break
		}
		if err != nil {
			return fmt.Errorf("unmounting %s: %w", path, err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", path, err)
	}
	return nil
}

// listNetNS lists the named network namespaces whose names start with prefix.
func listNetNS(prefix string) []string {
	entries, _ := os.ReadDir(NetNSDir)
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// withLinks runs f with a netlink handle inside the named namespace.
func withLinks(name string, f func(*netlink.Handle) error) error {
	nsh, err := netns.GetFromPath(NetNSPath(name))
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w", name, err)
	}
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		return fmt.Errorf("netlink in namespace %s: %w", name, err)
	}
	defer h.Close()
	return f(h)
}

func linkUp(h *netlink.Handle, name string) error {
	l, err := h.LinkByName(name)
	if err == nil {
		err = h.LinkSetUp(l)
	}
	if err != nil {
		return fmt.Errorf("bringing %s up: %w", name, err)
	}
	return nil
}

// setSysctl writes /proc/sys/<key> inside the named namespace.
func setSysctl(name, key, value string) error {
	return controlplane.InNetNS(NetNSPath(name), func() error {
		if err := os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644); err != nil {
			return fmt.Errorf("setting %s=%s in %s: %w", key, value, name, err)
		}
		return nil
	})
}

// attach connects the namespace inner to bridge br of the underlay
// namespace: a veth pair whose end outer (in the underlay, a port of br)
// faces eth in inner, which gets addrs (an IPv4 one, and an IPv6 one in
// a dual-stack lab) and a default route through each of gws (one per
// family; none for the router).
func attach(underlay, br, outer, inner, eth string, addrs, gws []netip.Prefix) error {
	innerNS, err := netns.GetFromPath(NetNSPath(inner))
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w", inner, err)
	}
	defer innerNS.Close()
	err = withLinks(underlay, func(h *netlink.Handle) error {
		bridge, err := h.LinkByName(br)
		if err != nil {
			return fmt.Errorf("finding bridge %s: %w", br, err)
		}
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: outer, MTU: 1500},
			PeerName:      eth,
			PeerNamespace: netlink.NsFd(innerNS),
		}
		if err := h.LinkAdd(veth); err != nil {
			return fmt.Errorf("adding veth %s (to %s) in %s: %w", outer, inner, underlay, err)
		}
		l, err := h.LinkByName(outer)
		if err != nil {
			return err
		}
		if err := h.LinkSetMaster(l, bridge); err != nil {
			return fmt.Errorf("adding %s to bridge %s: %w", outer, br, err)
		}
		return h.LinkSetUp(l)
	})
	if err != nil {
		return err
	}
	return withLinks(inner, func(h *netlink.Handle) error {
		l, err := h.LinkByName(eth)
		if err != nil {
			return fmt.Errorf("finding %s in %s: %w", eth, inner, err)
		}
		for _, addr := range addrs {
			a := &netlink.Addr{IPNet: prefixIPNet(addr)}
			if addr.Addr().Is6() {
				// No duplicate address detection: the lab picks unique
				// addresses, and a tentative address would delay the
				// node's first IPv6 packets by a second or two.
				a.Flags = unix.IFA_F_NODAD
			}
			if err := h.AddrAdd(l, a); err != nil {
				return fmt.Errorf("adding %s to %s in %s: %w", addr, eth, inner, err)
			}
		}
		if err := h.LinkSetUp(l); err != nil {
			return fmt.Errorf("bringing %s up in %s: %w", eth, inner, err)
		}
		for _, gw := range gws {
			route := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.IP(gw.Addr().AsSlice())}
			if err := h.RouteAdd(route); err != nil {
				return fmt.Errorf("adding the default route via %s in %s: %w", gw.Addr(), inner, err)
			}
		}
		return nil
	})
}

func prefixIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// addNamespace creates a namespace of the lab and records it first, so
// that Down finds it whatever happens next.
func (s *State) addNamespace(name string) error {
	if err := s.update(func(s *State) { s.Namespaces = append(s.Namespaces, name) }); err != nil {
		return err
	}
	return addNetNS(name)
}

// buildUnderlay makes the underlay namespace with one bridge per subnet
// and the router namespace with the gateway address of each subnet (both
// families in a dual-stack lab), forwarding between them and routing
// nowhere else.
func buildUnderlay(s *State, l Layout) error {
	if err := s.addNamespace(l.UnderlayNS()); err != nil {
		return err
	}
	err := withLinks(l.UnderlayNS(), func(h *netlink.Handle) error {
		for sn := range l.Subnets {
			br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: Bridge(sn), MTU: 1500}}
			if err := h.LinkAdd(br); err != nil {
				return fmt.Errorf("adding bridge %s: %w", Bridge(sn), err)
			}
			if err := h.LinkSetUp(br); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := s.addNamespace(l.RouterNS()); err != nil {
		return err
	}
	if err := setForwarding(l.RouterNS(), s.DualStack); err != nil {
		return err
	}
	for sn := range l.Subnets {
		eth := fmt.Sprintf("eth%d", sn)
		gw := []netip.Prefix{Gateway(sn)}
		if s.DualStack {
			gw = append(gw, Gateway6(sn))
		}
		if err := attach(l.UnderlayNS(), Bridge(sn), "router"+eth, l.RouterNS(), eth, gw, nil); err != nil {
			return err
		}
	}
	return nil
}

// setForwarding turns IPv4 forwarding on in the named namespace, and
// IPv6 forwarding too when v6.
func setForwarding(name string, v6 bool) error {
	if err := setSysctl(name, "net/ipv4/ip_forward", "1"); err != nil {
		return err
	}
	if !v6 {
		return nil
	}
	return setSysctl(name, "net/ipv6/conf/all/forwarding", "1")
}

// buildHost makes a namespace on subnet sn of the underlay: eth0 with
// addr (and addr6 in a dual-stack lab) and a default route through the
// router in each family.
func buildHost(s *State, l Layout, name, port string, sn int, addr, addr6 netip.Prefix) error {
	if err := s.addNamespace(name); err != nil {
		return err
	}
	addrs, gws := []netip.Prefix{addr}, []netip.Prefix{Gateway(sn)}
	if s.DualStack {
		addrs, gws = append(addrs, addr6), append(gws, Gateway6(sn))
	}
	return attach(l.UnderlayNS(), Bridge(sn), port, name, "eth0", addrs, gws)
}

// dialInNetNS dials address from inside the named namespace.
func dialInNetNS(ctx context.Context, name, network, address string) (net.Conn, error) {
	return controlplane.DialInNetNS(ctx, NetNSPath(name), network, address)
}
