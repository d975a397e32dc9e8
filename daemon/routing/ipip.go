package routing

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ErrNoIPIP is returned (wrapped) when the kernel cannot make IPIP devices.
var ErrNoIPIP = errors.New("the kernel has no ipip module: load it with modprobe ipip or use VXLAN")

// applyIPIP makes tunl0 exist, up, with the MTU and tabby's address of t.
func (a *Applier) applyIPIP(t *IPIP, st *Stats) error {
	l, err := a.ensureTunl0(&st.Links)
	if err != nil {
		return err
	}
	mtu, err := tunnelMTU(IPIPDevice, t.MTU, t.Local, IPIPOverhead)
	if err != nil {
		return err
	}
	changed, err := setMTUAndUp(l, mtu)
	if err != nil {
		return err
	}
	a.counted(&st.Links, changed, "adjusted the IPIP device", "device", IPIPDevice, "mtu", mtu)
	var want []netip.Prefix
	if t.Address.IsValid() {
		want = append(want, t.Address)
	}
	return errors.Join(
		tunnelSysctls(IPIPDevice, false, &st.Sysctls),
		a.syncAddresses(l, want, IPIPAddressLabel, &st.Addresses),
	)
}

// ensureTunl0 returns tunl0, creating it where the ipip module is not
// loaded yet. Once loaded, tunl0 exists in every namespace, so "already
// exists" is success.
func (a *Applier) ensureTunl0(c *Counts) (netlink.Link, error) {
	l, err := findLink(IPIPDevice)
	switch {
	case err != nil:
		return nil, err
	case l != nil && l.Type() != "ipip":
		return nil, fmt.Errorf("a %s link named %s exists where the IPIP device should be: delete it", l.Type(), IPIPDevice)
	case l != nil:
		return l, nil
	}
	err = netlink.LinkAdd(&netlink.Iptun{LinkAttrs: netlink.LinkAttrs{Name: IPIPDevice}})
	switch {
	case err == nil:
		c.Added++
		a.log.Info("created the IPIP device", "device", IPIPDevice)
	case errors.Is(err, unix.EEXIST):
	case errors.Is(err, unix.EOPNOTSUPP): // "Unknown device type"
		return nil, fmt.Errorf("creating %s: %w (%v)", IPIPDevice, ErrNoIPIP, err)
	default:
		return nil, fmt.Errorf("creating %s: %w", IPIPDevice, err)
	}
	return mustFindLink(IPIPDevice)
}

// removeIPIPAddress removes the address tabby put on tunl0 (the device
// itself cannot be deleted, and may serve others).
func (a *Applier) removeIPIPAddress(st *Stats) error {
	l, err := findLink(IPIPDevice)
	if l == nil {
		return err
	}
	return a.syncAddresses(l, nil, IPIPAddressLabel, &st.Addresses)
}
