package routing

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"reflect"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
)

// Options configure an Applier.
type Options struct {
	// Log receives what the applier changes (one line a change) and what
	// it refuses to touch; nil: slog.Default().
	Log *slog.Logger
}

// Applier programs States into the kernel of the network namespace of the
// goroutine that calls it (lock the OS thread and enter a namespace, e.g.
// with ns.Do, to program another). It keeps no state about the kernel
// between calls: each Apply reads what is there and changes only the
// difference, so a restart or a change made behind its back heals on the
// next Apply. An Applier is not safe for concurrent use.
type Applier struct {
	log *slog.Logger
	nf  kernel
	// afterList, when set (tests), runs after applyRoutes listed the
	// routes and before it changes any: where another program's route
	// can appear.
	afterList func()
}

// NewApplier returns an Applier.
func NewApplier(opts Options) *Applier {
	a := &Applier{log: opts.Log}
	if a.log == nil {
		a.log = slog.Default()
	}
	return a
}

// Counts count what one kind of object an Apply went through.
type Counts struct {
	Added, Updated, Removed, Unchanged int
}

// Changed is the number of changes.
func (c Counts) Changed() int { return c.Added + c.Updated + c.Removed }

// Stats say what an Apply did, for metrics and logs.
type Stats struct {
	Routes     Counts
	Links      Counts // tabby.vxlan and tunl0: created, adjusted, deleted
	Addresses  Counts // addresses on those devices
	FDB        Counts
	Neighbors  Counts
	SetMembers Counts // members of the NAT ipsets (sets count as added/removed too)
	NATRules   Counts // the chain's rule sets (rewritten as a whole) and the POSTROUTING jumps
	Sysctls    Counts
	// Conflicts are desired routes not programmed because a route with
	// another protocol holds the same destination and metric.
	Conflicts []string
}

// Changed is the total number of changes made.
func (s Stats) Changed() int {
	n := 0
	for _, c := range []Counts{s.Routes, s.Links, s.Addresses, s.FDB, s.Neighbors, s.SetMembers, s.NATRules, s.Sysctls} {
		n += c.Changed()
	}
	return n
}

// Apply programs s: forwarding, the tunnel devices with their addresses and
// entries, the routes, NAT outgoing, and last removes the devices s no
// longer wants. It goes on past errors and returns them all, with the
// counts of what it did.
func (a *Applier) Apply(s State) (Stats, error) {
	st, err := a.ApplyNetlink(s)
	natSt, natErr := a.ApplyNAT(s.NAT)
	st.SetMembers, st.NATRules = natSt.SetMembers, natSt.NATRules
	return st, errors.Join(err, natErr)
}

// ApplyNetlink programs all of s but its NAT: forwarding, the tunnels,
// the routes, and the removal of devices s no longer wants. All of it is
// netlink and sysctl files, no program is spawned, so it is quick however
// busy the node is; tabbyd's routing loop uses it, and leaves NAT
// outgoing (iptables and ipset) to a worker of its own, through ApplyNAT.
func (a *Applier) ApplyNetlink(s State) (Stats, error) {
	var st Stats
	var errs []error
	errs = append(errs, a.forwarding(s, &st))
	if s.VXLAN != nil {
		errs = append(errs, a.applyVXLAN(s.VXLAN, &st))
	}
	if s.IPIP != nil {
		errs = append(errs, a.applyIPIP(s.IPIP, &st))
	}
	errs = append(errs, a.applyRoutes(s.Routes, &st))
	if s.VXLAN == nil {
		errs = append(errs, a.deleteVXLAN(&st))
	}
	if s.IPIP == nil {
		errs = append(errs, a.removeIPIPAddress(&st))
	}
	return st, errors.Join(errs...)
}

// ApplyNAT programs NAT outgoing alone: the ipsets of the pools, the
// chain and its jump, for both families (n empty removes them).
func (a *Applier) ApplyNAT(n NAT) (Stats, error) {
	var st Stats
	err := a.applyNAT(n, &st)
	return st, err
}

// ApplyRoutes programs only s's routes: the part of a State that changes
// each time BGP learns or loses a route. Callers that applied a State
// differing from s only in its routes a moment ago use it to skip reading
// the tunnels, sysctls and NAT rules again (the NAT checks alone spawn
// iptables and ipset several times); a periodic full Apply heals what
// changed behind tabby's back.
func (a *Applier) ApplyRoutes(s State) (Stats, error) {
	var st Stats
	err := a.applyRoutes(s.Routes, &st)
	return st, err
}

// SameButRoutes says whether x and y differ at most in their routes (and
// warnings), so that ApplyRoutes(y) after Apply(x) programs all of y.
func SameButRoutes(x, y State) bool {
	x.Routes, y.Routes, x.Warnings, y.Warnings = nil, nil, nil, nil
	return reflect.DeepEqual(x, y)
}

// Cleanup removes everything tabby programs on this node: its routes (both
// families), tabby.vxlan, tabby's address on tunl0, the NAT chains, jumps
// and sets. Forwarding is left on.
func (a *Applier) Cleanup() error {
	var st Stats
	return errors.Join(
		a.applyRoutes(nil, &st),
		a.applyNAT(NAT{}, &st),
		a.deleteVXLAN(&st),
		a.removeIPIPAddress(&st),
	)
}

// carriesIPv6 says whether IPv6 goes over the device (it then has its
// link-local address).
func (x *VXLAN) carriesIPv6() bool {
	for _, p := range x.Addresses {
		if p.Addr().Is6() {
			return true
		}
	}
	return false
}

// tunnelMTU is mtu, or when that is 0 the MTU of the uplink (the link
// holding the address local) less overhead.
func tunnelMTU(dev string, mtu int, local netip.Addr, overhead int) (int, error) {
	if mtu != 0 {
		return mtu, nil
	}
	if !local.IsValid() {
		return 0, fmt.Errorf("sizing %s: this node has no IPv4 address to find its uplink by", dev)
	}
	addrs, err := netlinksafe.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return 0, fmt.Errorf("sizing %s: listing addresses: %w", dev, err)
	}
	for _, ad := range addrs {
		if addrOf(ad.IP) != local {
			continue
		}
		l, err := netlink.LinkByIndex(ad.LinkIndex)
		if err != nil {
			return 0, fmt.Errorf("sizing %s: looking up the link holding %s: %w", dev, local, err)
		}
		return l.Attrs().MTU - overhead, nil
	}
	return 0, fmt.Errorf("sizing %s: no interface of this node holds the node address %s: check --node-ip", dev, local)
}

// ipNet converts a prefix for netlink.
func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// prefixOf converts a netlink destination back.
func prefixOf(n *net.IPNet) netip.Prefix {
	if n == nil {
		return netip.Prefix{}
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones)
}

func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

// findLink returns the link named name, or nil when there is none.
func findLink(name string) (netlink.Link, error) {
	l, err := netlinksafe.LinkByName(name)
	if isNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("looking up %s: %w", name, err)
	}
	return l, nil
}

// mustFindLink returns the link named name, which was just made.
func mustFindLink(name string) (netlink.Link, error) {
	l, err := netlinksafe.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("looking up %s after creating it: %w", name, err)
	}
	return l, nil
}

// setMTUAndUp gives l the MTU mtu and brings it up; it says whether that
// changed anything.
func setMTUAndUp(l netlink.Link, mtu int) (bool, error) {
	changed := false
	if l.Attrs().MTU != mtu {
		if err := netlink.LinkSetMTU(l, mtu); err != nil {
			return false, fmt.Errorf("setting the MTU of %s to %d: %w", l.Attrs().Name, mtu, err)
		}
		changed = true
	}
	if l.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(l); err != nil {
			return changed, fmt.Errorf("bringing %s up: %w", l.Attrs().Name, err)
		}
		changed = true
	}
	return changed, nil
}

// counted counts one object as updated or unchanged, logging an update.
func (a *Applier) counted(c *Counts, changed bool, msg string, args ...any) {
	if !changed {
		c.Unchanged++
		return
	}
	c.Updated++
	a.log.Info(msg, args...)
}
