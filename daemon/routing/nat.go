package routing

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/coreos/go-iptables/iptables"

	"github.com/tabbynet/tabby/contract"
	"github.com/tabbynet/tabby/internal/iptbackend"
	"github.com/tabbynet/tabby/internal/netfilter"
)

// natJump is the POSTROUTING rule that enters NATChain.
var natJump = []string{"-m", "comment", "--comment", contract.CommentPrefix + "nat-outgoing", "-j", NATChain}

// natFamily is one family's names.
type natFamily struct {
	v6             bool
	allSet, natSet string
	setFamily      string // the ipset family: inet, inet6
	protocol       iptables.Protocol
}

var natFamilies = []natFamily{
	{false, SetAllPools, SetNATPools, "inet", iptables.ProtocolIPv4},
	{true, SetAllPools + SetSuffixV6, SetNATPools + SetSuffixV6, "inet6", iptables.ProtocolIPv6},
}

// chainRules are the rules of NATChain: masquerade what leaves a
// natOutgoing pool for somewhere outside every pool.
func (f natFamily) chainRules() [][]string {
	return [][]string{{"-m", "set", "--match-set", f.natSet, "src", "-m", "set", "!", "--match-set", f.allSet, "dst", "-j", "MASQUERADE"}}
}

// kernel holds the netfilter engine, found on first use: the iptables
// backend is the one the host already uses (iptbackend.Detect), so NAT and
// the NetworkPolicy chains land where kube-proxy's and everyone else's
// rules are.
type kernel struct {
	backend *iptbackend.Backend
	berr    error
	ipt     [2]*netfilter.IPTables
	errs    [2]error
	sets    *netfilter.IPSets
	serr    error
}

// SetIPTablesBackend makes the Applier use backend b instead of detecting
// one on first use; tabbyd passes the backend it detected (or was told to
// use) once, so that routing and policy always agree. Call it before the
// first Apply.
func (a *Applier) SetIPTablesBackend(b iptbackend.Backend) {
	a.nf = kernel{backend: &b}
}

func (k *kernel) getBackend() (*iptbackend.Backend, error) {
	if k.backend == nil && k.berr == nil {
		b, err := iptbackend.Detect(context.Background(), iptbackend.Options{})
		if err != nil {
			k.berr = fmt.Errorf("finding the iptables backend: %w", err)
		} else {
			k.backend = &b
		}
	}
	return k.backend, k.berr
}

func (k *kernel) iptables(f natFamily) (*netfilter.IPTables, error) {
	i := 0
	if f.v6 {
		i = 1
	}
	if k.ipt[i] == nil && k.errs[i] == nil {
		b, err := k.getBackend()
		if err != nil {
			return nil, err
		}
		k.ipt[i], k.errs[i] = netfilter.NewIPTables(*b, f.protocol, 10)
	}
	return k.ipt[i], k.errs[i]
}

func (k *kernel) ipsets() (*netfilter.IPSets, error) {
	if k.sets == nil && k.serr == nil {
		k.sets, k.serr = netfilter.NewIPSets("")
		if k.serr != nil {
			k.serr = fmt.Errorf("NAT outgoing: %w", k.serr)
		}
	}
	return k.sets, k.serr
}

// applyNAT makes NAT outgoing of each family what n says: the two ipsets
// with the pools, NATChain with its one rule, and the jump to it at the
// top of POSTROUTING; a family without natOutgoing pools has none of them.
// Nothing else in the nat table is changed or moved.
func (a *Applier) applyNAT(n NAT, st *Stats) error {
	ctx := context.Background()
	sets := a.natSets(ctx)
	var errs []error
	for _, f := range natFamilies {
		all, nat := ofFamily(n.AllPools, f.v6), ofFamily(n.NATPools, f.v6)
		var err error
		if len(nat) == 0 {
			err = a.removeNAT(ctx, f, sets, st)
		} else {
			err = a.ensureNAT(ctx, f, all, nat, sets, st)
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// natSets is the ipset engine with the names of the sets in the kernel,
// listed once an applyNAT for both families (err: neither is to be had).
type natSets struct {
	*netfilter.IPSets
	listed []string
	err    error
}

func (a *Applier) natSets(ctx context.Context) natSets {
	var n natSets
	if n.IPSets, n.err = a.nf.ipsets(); n.err == nil {
		n.listed, n.err = n.Names(ctx)
	}
	return n
}

// get reads the family's two sets, those that exist.
func (n natSets) get(ctx context.Context, f natFamily) (map[string]*netfilter.Set, error) {
	if n.err != nil {
		return nil, n.err
	}
	return n.GetListed(ctx, n.listed, f.allSet, f.natSet)
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

func (a *Applier) ensureNAT(ctx context.Context, f natFamily, all, nat []netip.Prefix, sets natSets, st *Stats) error {
	ipt, err := a.nf.iptables(f)
	if err != nil {
		return err
	}
	have, err := sets.get(ctx, f)
	if err != nil {
		return fmt.Errorf("%w (or turn natOutgoing off)", err)
	}
	for _, name := range []string{f.allSet, f.natSet} {
		if s := have[name]; s != nil && (s.Type != "hash:net" || s.Family != f.setFamily) {
			return fmt.Errorf("the ipset %s exists as %s family %s, not hash:net family %s: destroy it (ipset destroy %s) so tabby can recreate it", name, s.Type, s.Family, f.setFamily, name)
		}
	}
	var batch netfilter.SetBatch
	var c Counts
	syncSet(&batch, f.allSet, f.setFamily, have[f.allSet], all, &c)
	syncSet(&batch, f.natSet, f.setFamily, have[f.natSet], nat, &c)
	if err := sets.Apply(ctx, &batch, true); err != nil {
		return fmt.Errorf("updating the NAT outgoing ipsets: %w", err)
	}
	st.SetMembers.add(c)
	if c.Changed() > 0 {
		a.log.Info("NAT outgoing ipsets synced", "sets", []string{f.allSet, f.natSet}, "added", c.Added, "removed", c.Removed)
	}
	if err := a.syncChain(ctx, ipt, f, &st.NATRules); err != nil {
		return err
	}
	return a.syncJump(ctx, ipt, f, &st.NATRules)
}

// syncJump inserts natJump at the top of POSTROUTING unless it is there
// (anywhere: others may insert above it, as kube-proxy does for its own).
func (a *Applier) syncJump(ctx context.Context, ipt *netfilter.IPTables, f natFamily, c *Counts) error {
	post, _, err := ipt.List("nat", "POSTROUTING")
	if err != nil {
		return fmt.Errorf("checking the jump from POSTROUTING to %s: %w", NATChain, err)
	}
	if slices.ContainsFunc(post, func(l string) bool { return slices.Equal(netfilter.SplitArgs(l), natJump) }) {
		c.Unchanged++
		return nil
	}
	tx := netfilter.NewTx("nat")
	tx.Insert("POSTROUTING", 1, natJump)
	if err := ipt.Apply(ctx, tx); err != nil {
		return fmt.Errorf("inserting the jump from POSTROUTING to %s: %w", NATChain, err)
	}
	c.Added++
	a.log.Info("NAT outgoing jump added", "chain", NATChain, "ipv6", f.v6)
	return nil
}

// syncChain rewrites NATChain as a whole, atomically, when its rules are
// not f.chainRules(): one restore transaction replaces that one chain and
// leaves the rest of the table as it is.
func (a *Applier) syncChain(ctx context.Context, ipt *netfilter.IPTables, f natFamily, c *Counts) error {
	want := f.chainRules()
	have, exists, err := ipt.List("nat", NATChain)
	if err != nil {
		return fmt.Errorf("looking for the chain %s: %w", NATChain, err)
	}
	if exists && slices.EqualFunc(have, want, func(h string, w []string) bool { return slices.Equal(netfilter.SplitArgs(h), w) }) {
		c.Unchanged++
		return nil
	}
	tx := netfilter.NewTx("nat")
	tx.Declare(NATChain)
	for _, r := range want {
		tx.Append(NATChain, r)
	}
	if err := ipt.Apply(ctx, tx); err != nil {
		return fmt.Errorf("writing the chain %s: %w", NATChain, err)
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
func (a *Applier) removeNAT(ctx context.Context, f natFamily, sets natSets, st *Stats) error {
	var errs []error
	if ipt, err := a.nf.iptables(f); err == nil {
		errs = append(errs, a.removeChain(ctx, ipt, f, &st.NATRules))
	}
	errs = append(errs, a.removeSets(ctx, f, sets, &st.SetMembers))
	return errors.Join(errs...)
}

// removeChain deletes NATChain and every POSTROUTING rule that jumps to
// it, in one transaction.
func (a *Applier) removeChain(ctx context.Context, ipt *netfilter.IPTables, f natFamily, c *Counts) error {
	_, exists, err := ipt.List("nat", NATChain)
	if err != nil || !exists {
		// Where the nat table cannot even be listed (IPv6 off), tabby
		// cannot have made anything in it; without the chain there is no
		// jump to it either.
		return nil
	}
	post, _, err := ipt.List("nat", "POSTROUTING")
	if err != nil {
		return fmt.Errorf("checking the jump from POSTROUTING to %s: %w", NATChain, err)
	}
	tx := netfilter.NewTx("nat")
	jumps := netfilter.JumpsTo(post, func(chain string) bool { return chain == NATChain })
	for _, j := range jumps {
		tx.Delete("POSTROUTING", j)
	}
	tx.Declare(NATChain)
	tx.DeleteChain(NATChain)
	if err := ipt.Apply(ctx, tx); err != nil {
		return fmt.Errorf("deleting the chain %s and the jumps to it: %w", NATChain, err)
	}
	c.Removed += len(jumps) + 1
	a.log.Info("NAT outgoing chain removed", "chain", NATChain, "ipv6", f.v6)
	return nil
}

// removeSets destroys the family's two sets, where they exist. Without
// the ipset program or the kernel's ipset support there are none.
func (a *Applier) removeSets(ctx context.Context, f natFamily, sets natSets, c *Counts) error {
	have, err := sets.get(ctx, f)
	if err != nil || len(have) == 0 {
		return nil
	}
	var names []string
	for _, name := range []string{f.allSet, f.natSet} {
		if have[name] != nil {
			names = append(names, name)
		}
	}
	done, err := sets.Destroy(ctx, names)
	for _, name := range done {
		c.Removed++
		a.log.Info("ipset destroyed", "set", name)
	}
	if err != nil {
		return fmt.Errorf("destroying the NAT outgoing ipsets: %w", err)
	}
	return nil
}

// syncSet adds to batch what makes the hash:net set name hold exactly
// want: its creation when have is nil (counted as one added), then the
// members to delete and to add.
func syncSet(batch *netfilter.SetBatch, name, family string, have *netfilter.Set, want []netip.Prefix, c *Counts) {
	if have == nil {
		batch.Create(name, "hash:net", family)
		c.Added++
		have = &netfilter.Set{}
	}
	wanted := map[string]bool{}
	for _, p := range want {
		wanted[member(p)] = true
	}
	for _, m := range slices.Sorted(maps.Keys(have.Members)) {
		if wanted[m] {
			delete(wanted, m)
			c.Unchanged++
			continue
		}
		batch.Del(name, m)
		c.Removed++
	}
	for _, p := range want {
		if m := member(p); wanted[m] {
			delete(wanted, m)
			batch.Add(name, m, false)
			c.Added++
		}
	}
}

func (c *Counts) add(o Counts) {
	c.Added += o.Added
	c.Updated += o.Updated
	c.Removed += o.Removed
	c.Unchanged += o.Unchanged
}

// member is a pool's CIDR as `ipset save` prints a hash:net member: masked,
// and a host address without its /32 or /128.
func member(p netip.Prefix) string {
	p = p.Masked()
	if p.Bits() == p.Addr().BitLen() {
		return p.Addr().String()
	}
	return p.String()
}
