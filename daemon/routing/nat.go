package routing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"

	"github.com/coreos/go-iptables/iptables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tabbynet/tabby/contract"
	"github.com/tabbynet/tabby/internal/iptbackend"
)

// natJump is the POSTROUTING rule that enters NATChain.
var natJump = []string{"-m", "comment", "--comment", contract.CommentPrefix + "nat-outgoing", "-j", NATChain}

// natFamily is one family's names.
type natFamily struct {
	v6             bool
	cmd            string // iptables or ip6tables
	allSet, natSet string
	setFamily      uint8
	protocol       iptables.Protocol
}

var natFamilies = []natFamily{
	{false, "iptables", SetAllPools, SetNATPools, unix.AF_INET, iptables.ProtocolIPv4},
	{true, "ip6tables", SetAllPools + SetSuffixV6, SetNATPools + SetSuffixV6, unix.AF_INET6, iptables.ProtocolIPv6},
}

// chainRules are the rules of NATChain, as `iptables -S` prints them:
// masquerade what leaves a natOutgoing pool for somewhere outside every pool.
func (f natFamily) chainRules() []string {
	return []string{"-A " + NATChain + " -m set --match-set " + f.natSet + " src -m set ! --match-set " + f.allSet + " dst -j MASQUERADE"}
}

// iptablesCache holds the iptables backend and the go-iptables handles,
// found on first use: the backend is the one the host already uses
// (iptbackend.Detect), so NAT and the NetworkPolicy chains land where
// kube-proxy's and everyone else's rules are.
type iptablesCache struct {
	backend *iptbackend.Backend
	berr    error
	h       [2]*iptables.IPTables
	errs    [2]error
}

// SetIPTablesBackend makes the Applier use backend b instead of detecting
// one on first use; tabbyd passes the backend it detected (or was told to
// use) once, so that routing and policy always agree. Call it before the
// first Apply.
func (a *Applier) SetIPTablesBackend(b iptbackend.Backend) {
	a.ipt = iptablesCache{backend: &b}
}

func (c *iptablesCache) getBackend() (*iptbackend.Backend, error) {
	if c.backend == nil && c.berr == nil {
		b, err := iptbackend.Detect(context.Background(), iptbackend.Options{})
		if err != nil {
			c.berr = fmt.Errorf("finding the iptables backend: %w", err)
		} else {
			c.backend = &b
		}
	}
	return c.backend, c.berr
}

func (c *iptablesCache) get(f natFamily) (*iptables.IPTables, error) {
	i := 0
	if f.v6 {
		i = 1
	}
	if c.h[i] == nil && c.errs[i] == nil {
		b, err := c.getBackend()
		if err != nil {
			return nil, err
		}
		c.h[i], c.errs[i] = b.Handle(f.protocol, 10)
	}
	return c.h[i], c.errs[i]
}

// applyNAT makes NAT outgoing of each family what n says: the two ipsets
// with the pools, NATChain with its one rule, and the jump to it at the
// top of POSTROUTING; a family without natOutgoing pools has none of them.
// Nothing else in the nat table is changed or moved.
func (a *Applier) applyNAT(n NAT, st *Stats) error {
	var errs []error
	for _, f := range natFamilies {
		all, nat := ofFamily(n.AllPools, f.v6), ofFamily(n.NATPools, f.v6)
		var err error
		if len(nat) == 0 {
			err = a.removeNAT(f, st)
		} else {
			err = a.ensureNAT(f, all, nat, st)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func ofFamily(ps []netip.Prefix, v6 bool) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if p.Addr().Is6() == v6 {
			out = append(out, p)
		}
	}
	return out
}

func (a *Applier) ensureNAT(f natFamily, all, nat []netip.Prefix, st *Stats) error {
	ipt, err := a.ipt.get(f)
	if err != nil {
		return err
	}
	if err := a.syncSet(f.allSet, f.setFamily, all, &st.SetMembers); err != nil {
		return err
	}
	if err := a.syncSet(f.natSet, f.setFamily, nat, &st.SetMembers); err != nil {
		return err
	}
	if err := a.syncChain(ipt, f, &st.NATRules); err != nil {
		return err
	}
	ok, err := ipt.Exists("nat", "POSTROUTING", natJump...)
	if err != nil {
		return fmt.Errorf("checking the jump from POSTROUTING to %s: %w", NATChain, err)
	}
	if ok {
		st.NATRules.Unchanged++
		return nil
	}
	if err := ipt.Insert("nat", "POSTROUTING", 1, natJump...); err != nil {
		return fmt.Errorf("inserting the jump from POSTROUTING to %s: %w", NATChain, err)
	}
	st.NATRules.Added++
	a.log.Info("NAT outgoing jump added", "chain", NATChain, "ipv6", f.v6)
	return nil
}

// syncChain rewrites NATChain as a whole, atomically, when its rules are
// not f.chainRules(): iptables-restore --noflush replaces that one chain
// and leaves the rest of the table as it is.
func (a *Applier) syncChain(ipt *iptables.IPTables, f natFamily, c *Counts) error {
	want := f.chainRules()
	exists, err := ipt.ChainExists("nat", NATChain)
	if err != nil {
		return fmt.Errorf("looking for the chain %s: %w", NATChain, err)
	}
	if exists {
		lines, err := ipt.List("nat", NATChain)
		if err != nil {
			return fmt.Errorf("listing the chain %s: %w", NATChain, err)
		}
		have := slices.DeleteFunc(lines, func(l string) bool { return !strings.HasPrefix(l, "-A ") })
		if slices.Equal(have, want) {
			c.Unchanged++
			return nil
		}
	}
	in := "*nat\n:" + NATChain + " - [0:0]\n-F " + NATChain + "\n" + strings.Join(want, "\n") + "\nCOMMIT\n"
	b, err := a.ipt.getBackend()
	if err != nil {
		return err
	}
	restore := b.Restore(f.protocol)
	if restore == "" {
		return fmt.Errorf("writing the chain %s: no %s-restore for the %s backend (install iptables)", NATChain, f.cmd, b.Mode)
	}
	cmd := exec.Command(restore, "--noflush", "--wait", "10")
	cmd.Stdin = strings.NewReader(in)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("writing the chain %s with %s: %w: %s", NATChain, restore, err, strings.TrimSpace(out.String()))
	}
	if exists {
		c.Updated++
	} else {
		c.Added++
	}
	a.log.Info("NAT outgoing chain written", "chain", NATChain, "ipv6", f.v6)
	return nil
}

// removeNAT removes a family's jump, chain and sets, where they exist.
func (a *Applier) removeNAT(f natFamily, st *Stats) error {
	var errs []error
	if ipt, err := a.ipt.get(f); err == nil {
		errs = append(errs, a.removeChain(ipt, f, &st.NATRules))
	}
	for _, set := range []string{f.allSet, f.natSet} {
		if _, err := netlink.IpsetList(set); err != nil {
			continue // no such set, or no ipset in this kernel at all
		}
		if err := netlink.IpsetDestroy(set); err != nil {
			errs = append(errs, fmt.Errorf("destroying the ipset %s: %w", set, err))
			continue
		}
		st.SetMembers.Removed++
		a.log.Info("ipset destroyed", "set", set)
	}
	return errors.Join(errs...)
}

func (a *Applier) removeChain(ipt *iptables.IPTables, f natFamily, c *Counts) error {
	exists, err := ipt.ChainExists("nat", NATChain)
	if err != nil || !exists {
		// Where the nat table cannot even be listed (IPv6 off), tabby
		// cannot have made anything in it; without the chain there is no
		// jump to it either.
		return nil
	}
	for range 10 { // every copy of the jump, or the chain cannot go
		ok, err := ipt.Exists("nat", "POSTROUTING", natJump...)
		if err != nil {
			return fmt.Errorf("checking the jump from POSTROUTING to %s: %w", NATChain, err)
		}
		if !ok {
			break
		}
		if err := ipt.Delete("nat", "POSTROUTING", natJump...); err != nil {
			return fmt.Errorf("deleting the jump from POSTROUTING to %s: %w", NATChain, err)
		}
		c.Removed++
	}
	if err := ipt.ClearAndDeleteChain("nat", NATChain); err != nil {
		return fmt.Errorf("deleting the chain %s: %w", NATChain, err)
	}
	c.Removed++
	a.log.Info("NAT outgoing chain removed", "chain", NATChain, "ipv6", f.v6)
	return nil
}

// syncSet makes the hash:net ipset name hold exactly want.
func (a *Applier) syncSet(name string, family uint8, want []netip.Prefix, c *Counts) error {
	res, err := netlink.IpsetList(name)
	switch {
	case errors.Is(err, unix.ENOENT):
		if err := netlink.IpsetCreate(name, "hash:net", netlink.IpsetCreateOptions{Family: family}); err != nil {
			return fmt.Errorf("creating the ipset %s: %w", name, err)
		}
		c.Added++
		a.log.Info("ipset created", "set", name)
		res = &netlink.IPSetResult{}
	case errors.Is(err, unix.EPROTONOSUPPORT):
		return fmt.Errorf("listing the ipset %s: %w (the kernel has no ipset support: load the ip_set and ip_set_hash_net modules, or turn natOutgoing off)", name, err)
	case err != nil:
		return fmt.Errorf("listing the ipset %s: %w", name, err)
	case res.TypeName != "hash:net" || res.Family != family:
		return fmt.Errorf("the ipset %s exists as %s family %d, not hash:net of the family tabby needs: destroy it (ipset destroy %s) so tabby can recreate it", name, res.TypeName, res.Family, name)
	}
	wanted := map[netip.Prefix]bool{}
	for _, p := range want {
		wanted[p] = true
	}
	var errs []error
	for _, e := range res.Entries {
		p := netip.PrefixFrom(addrOf(e.IP), int(e.CIDR))
		if e.CIDR == 0 {
			p = netip.PrefixFrom(p.Addr(), p.Addr().BitLen())
		}
		if wanted[p] {
			delete(wanted, p)
			c.Unchanged++
			continue
		}
		if err := netlink.IpsetDel(name, &netlink.IPSetEntry{IP: e.IP, CIDR: e.CIDR}); err != nil {
			errs = append(errs, fmt.Errorf("removing %s from the ipset %s: %w", p, name, err))
			continue
		}
		c.Removed++
		a.log.Info("ipset member removed", "set", name, "cidr", p.String())
	}
	for _, p := range want {
		if !wanted[p] {
			continue
		}
		if err := netlink.IpsetAdd(name, &netlink.IPSetEntry{IP: p.Addr().AsSlice(), CIDR: uint8(p.Bits())}); err != nil {
			errs = append(errs, fmt.Errorf("adding %s to the ipset %s: %w", p, name, err))
			continue
		}
		c.Added++
		a.log.Info("ipset member added", "set", name, "cidr", p.String())
	}
	return errors.Join(errs...)
}
