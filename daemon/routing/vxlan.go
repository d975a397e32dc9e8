package routing

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// applyVXLAN creates or adjusts tabby.vxlan and makes its addresses, FDB
// and neighbour entries exactly those of x.
func (a *Applier) applyVXLAN(x *VXLAN, st *Stats) error {
	mtu, err := tunnelMTU(VXLANDevice, x.MTU, x.Local, VXLANOverhead)
	if err != nil {
		return err
	}
	link, err := a.ensureVXLANLink(x, mtu, &st.Links)
	if err != nil {
		return err
	}
	v6 := x.carriesIPv6()
	errs := []error{tunnelSysctls(VXLANDevice, v6, &st.Sysctls)}
	errs = append(errs, a.syncAddresses(link, x.Addresses, "", &st.Addresses))
	errs = append(errs, a.syncFDB(link, x.FDB, &st.FDB))
	errs = append(errs, a.syncNeighbors(link, x.Neighbors, &st.Neighbors))
	return errors.Join(errs...)
}

// ensureVXLANLink returns tabby.vxlan as x wants it, up. What cannot be
// changed on a live VXLAN device (VNI, port, local address, learning) is
// fixed by recreating it; MTU and MAC are set in place.
func (a *Applier) ensureVXLANLink(x *VXLAN, mtu int, c *Counts) (netlink.Link, error) {
	want := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: VXLANDevice, MTU: mtu, HardwareAddr: x.MAC},
		VxlanId:   VXLANVNI,
		SrcAddr:   x.Local.AsSlice(),
		Port:      VXLANPort,
		Learning:  false,
	}
	l, err := findLink(VXLANDevice)
	if err != nil {
		return nil, err
	}
	if l != nil {
		have, ok := l.(*netlink.Vxlan)
		if !ok {
			return nil, fmt.Errorf("a %s link named %s exists and is not tabby's VXLAN device: delete it (ip link del %s) so tabby can create its own", l.Type(), VXLANDevice, VXLANDevice)
		}
		if have.VxlanId == VXLANVNI && have.Port == VXLANPort && have.SrcAddr.Equal(want.SrcAddr) && !have.Learning {
			return a.adjustVXLAN(have, want, c)
		}
		a.log.Info("recreating the VXLAN device", "device", VXLANDevice, "vni", have.VxlanId, "port", have.Port, "local", have.SrcAddr.String(), "learning", have.Learning)
		if err := netlink.LinkDel(have); err != nil {
			return nil, fmt.Errorf("deleting %s to recreate it: %w", VXLANDevice, err)
		}
		c.Removed++
	}
	if err := netlink.LinkAdd(want); err != nil {
		return nil, fmt.Errorf("creating %s (VXLAN, VNI %d, port %d, local %s): %w", VXLANDevice, VXLANVNI, VXLANPort, x.Local, err)
	}
	c.Added++
	a.log.Info("created the VXLAN device", "device", VXLANDevice, "mac", x.MAC.String(), "mtu", mtu, "local", x.Local.String())
	if l, err = mustFindLink(VXLANDevice); err != nil {
		return nil, err
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return nil, fmt.Errorf("bringing %s up: %w", VXLANDevice, err)
	}
	return l, nil
}

func (a *Applier) adjustVXLAN(have *netlink.Vxlan, want *netlink.Vxlan, c *Counts) (netlink.Link, error) {
	changed, err := setMTUAndUp(have, want.MTU)
	if err != nil {
		return nil, err
	}
	if len(want.HardwareAddr) != 0 && !bytes.Equal(have.HardwareAddr, want.HardwareAddr) {
		if err := netlink.LinkSetHardwareAddr(have, want.HardwareAddr); err != nil {
			return nil, fmt.Errorf("setting the MAC of %s to %s: %w", VXLANDevice, want.HardwareAddr, err)
		}
		changed = true
	}
	a.counted(c, changed, "adjusted the VXLAN device", "device", VXLANDevice, "mac", want.HardwareAddr.String(), "mtu", want.MTU)
	return have, nil
}

// deleteVXLAN removes tabby.vxlan (and with it every route, FDB and
// neighbour entry on it).
func (a *Applier) deleteVXLAN(st *Stats) error {
	l, err := findLink(VXLANDevice)
	if l == nil {
		return err
	}
	if _, ok := l.(*netlink.Vxlan); !ok {
		return nil // not tabby's
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("deleting %s: %w", VXLANDevice, err)
	}
	st.Links.Removed++
	a.log.Info("deleted the VXLAN device", "device", VXLANDevice)
	return nil
}

// syncAddresses makes link's addresses want. IPv6 link-local addresses
// the kernel made itself are left alone; with label set, only addresses
// carrying it are removed and new ones get it.
func (a *Applier) syncAddresses(link netlink.Link, want []netip.Prefix, label string, c *Counts) error {
	have, err := netlinksafe.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("listing the addresses of %s: %w", link.Attrs().Name, err)
	}
	wanted := map[netip.Prefix]bool{}
	for _, p := range want {
		wanted[p] = true
	}
	var errs []error
	for _, ad := range have {
		p := prefixOf(ad.IPNet)
		if wanted[p] {
			delete(wanted, p)
			c.Unchanged++
			continue
		}
		if p.Addr().IsLinkLocalUnicast() || (label != "" && ad.Label != label) {
			continue
		}
		if err := netlink.AddrDel(link, &ad); err != nil {
			errs = append(errs, fmt.Errorf("removing %s from %s: %w", p, link.Attrs().Name, err))
			continue
		}
		c.Removed++
		a.log.Info("address removed", "device", link.Attrs().Name, "address", p.String())
	}
	for _, p := range want {
		if !wanted[p] {
			continue
		}
		ad := &netlink.Addr{IPNet: ipNet(p), Label: label}
		if p.Addr().Is6() {
			ad.Flags = unix.IFA_F_NODAD
		}
		if err := netlink.AddrReplace(link, ad); err != nil {
			errs = append(errs, fmt.Errorf("adding %s to %s: %w", p, link.Attrs().Name, err))
			continue
		}
		c.Added++
		a.log.Info("address added", "device", link.Attrs().Name, "address", p.String())
	}
	return errors.Join(errs...)
}

// syncFDB makes the device's permanent FDB entries want.
func (a *Applier) syncFDB(link netlink.Link, want []FDBEntry, c *Counts) error {
	have, err := neighList(link.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		return fmt.Errorf("listing the FDB of %s: %w", VXLANDevice, err)
	}
	key := func(mac net.HardwareAddr, ip netip.Addr) string { return mac.String() + " " + ip.String() }
	wanted := map[string]bool{}
	for _, e := range want {
		wanted[key(e.MAC, e.Dst)] = true
	}
	var errs []error
	for _, n := range have {
		if n.State&unix.NUD_PERMANENT == 0 {
			continue
		}
		k := key(n.HardwareAddr, addrOf(n.IP))
		if wanted[k] {
			delete(wanted, k)
			c.Unchanged++
			continue
		}
		if err := netlink.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("deleting the FDB entry %s on %s: %w", k, VXLANDevice, err))
			continue
		}
		c.Removed++
		a.log.Info("FDB entry removed", "entry", k)
	}
	for _, e := range want {
		k := key(e.MAC, e.Dst)
		if !wanted[k] {
			continue
		}
		n := &netlink.Neigh{LinkIndex: link.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
			Flags: netlink.NTF_SELF, HardwareAddr: e.MAC, IP: e.Dst.AsSlice()}
		if err := netlink.NeighSet(n); err != nil {
			errs = append(errs, fmt.Errorf("adding the FDB entry %s on %s: %w", k, VXLANDevice, err))
			continue
		}
		c.Added++
		a.log.Info("FDB entry added", "entry", k)
	}
	return errors.Join(errs...)
}

// syncNeighbors makes the device's permanent neighbour entries want;
// entries the kernel made (ARP/NDP states) are left to the kernel.
func (a *Applier) syncNeighbors(link netlink.Link, want []Neighbor, c *Counts) error {
	idx := link.Attrs().Index
	wanted := map[netip.Addr]net.HardwareAddr{}
	for _, n := range want {
		wanted[n.IP] = n.MAC
	}
	replaced := map[netip.Addr]bool{}
	var errs []error
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		have, err := neighList(idx, family)
		if err != nil {
			errs = append(errs, fmt.Errorf("listing the neighbours on %s: %w", VXLANDevice, err))
			continue
		}
		for _, n := range have {
			ip := addrOf(n.IP)
			mac, ok := wanted[ip]
			if ok && n.State == netlink.NUD_PERMANENT && bytes.Equal(n.HardwareAddr, mac) {
				delete(wanted, ip)
				c.Unchanged++
				continue
			}
			if ok {
				replaced[ip] = n.State&netlink.NUD_PERMANENT != 0
				continue
			}
			if n.State&netlink.NUD_PERMANENT == 0 {
				continue // the kernel's
			}
			if err := netlink.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("deleting the neighbour %s on %s: %w", ip, VXLANDevice, err))
				continue
			}
			c.Removed++
			a.log.Info("neighbour removed", "ip", ip.String())
		}
	}
	for _, n := range want {
		if _, ok := wanted[n.IP]; !ok {
			continue
		}
		family := netlink.FAMILY_V4
		if n.IP.Is6() {
			family = netlink.FAMILY_V6
		}
		e := &netlink.Neigh{LinkIndex: idx, Family: family, State: netlink.NUD_PERMANENT, IP: n.IP.AsSlice(), HardwareAddr: n.MAC}
		if err := netlink.NeighSet(e); err != nil {
			errs = append(errs, fmt.Errorf("adding the neighbour %s lladdr %s on %s: %w", n.IP, n.MAC, VXLANDevice, err))
			continue
		}
		if replaced[n.IP] {
			c.Updated++
		} else {
			c.Added++
		}
		a.log.Info("neighbour set", "ip", n.IP.String(), "mac", n.MAC.String())
	}
	return errors.Join(errs...)
}

// neighList is netlink.NeighList retried while the kernel reports that the
// dump was interrupted by a concurrent change.
func neighList(linkIndex, family int) ([]netlink.Neigh, error) {
	var ns []netlink.Neigh
	var err error
	for range 5 {
		ns, err = netlink.NeighList(linkIndex, family)
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	return ns, err
}
