package apply

import (
	"context"
	"fmt"
	"slices"

	"github.com/tabbynet/tabby/internal/netfilter"
)

// writeChains writes, in one iptables-restore --noflush transaction, every
// wanted chain that is new, differs from what the applier last wrote, or
// was found changed in the kernel; sets being replaced are named by their
// stand-ins (alias). The chains stale lists (not wanted, and no jump goes
// to them) are flushed and deleted in the same transaction, after the
// chains that named them are rewritten: one restore, not two.
// Declaring a chain (":NAME - [0:0]") flushes it; the chains not named are
// left as they are, and so is everything else in the table. With nothing to
// write, no command runs. It returns the chains written, which the caller
// reads back (readBack) so that the next kernel read can tell tabby's
// content from a change behind its back.
func (a *Applier) writeChains(ctx context.Context, f *family, w *wantFamily, alias map[string]string, stale []string, st *Stats) ([]string, error) {
	var write []string
	rules := map[string][][]string{}
	for _, name := range w.order {
		want := w.chains[name]
		if namesAny(want, alias) {
			want = substitute(want, alias)
		}
		kc := f.chains[name]
		if kc == nil || !kc.written || !equalRules(kc.want, want) {
			write = append(write, name)
			rules[name] = want
		}
	}
	if len(write)+len(stale) == 0 {
		return nil, nil
	}
	tx := netfilter.NewTx("filter")
	for _, name := range write {
		tx.Declare(name)
	}
	for _, name := range write {
		for _, r := range rules[name] {
			tx.Append(name, r)
		}
	}
	deleteChains(tx, stale)
	st.Restores++
	if err := f.ipt.Apply(ctx, tx); err != nil {
		return nil, fmt.Errorf("writing %d %s policy chains (and removing %d no longer wanted): %w", len(write), f.name, len(stale), err)
	}
	st.ChainsWritten += len(write)
	st.ChainsDeleted += len(stale)
	for _, name := range stale {
		delete(f.chains, name)
	}
	for _, name := range write {
		f.chains[name] = &kernelChain{written: true, want: rules[name]}
	}
	return write, nil
}

// readBack remembers how the kernel prints the chains just written: a few
// one by one (iptables -S prints a rule as iptables-save does), many with
// one iptables-save.
func (a *Applier) readBack(ctx context.Context, f *family, write []string) error {
	if len(write) <= readBackOneByOne {
		for _, name := range write {
			lines, err := a.listRules(f, name)
			if err != nil {
				delete(f.chains, name)
				return err
			}
			f.chains[name].kernel = lines
		}
		return nil
	}
	ft, err := a.readFilter(ctx, f)
	if err != nil {
		return err
	}
	for _, name := range write {
		lines, ok := ft.chains[name]
		if !ok {
			delete(f.chains, name) // gone already: rewritten on the next kernel read
			continue
		}
		f.chains[name].kernel = lines
	}
	return nil
}

// foldableStale are the chains of f that w does not want, when they can
// go in the transaction that writes the wanted ones: the jumps into them
// are known to be as wanted (so none goes to a stale chain) and no set is
// being replaced. nil otherwise: deleteStaleChains removes them after the
// jumps are synced.
func foldableStale(f *family, w *wantFamily, kernelRead bool, alias map[string]string) []string {
	if kernelRead || len(alias) > 0 {
		return nil
	}
	for _, b := range builtins {
		known := f.jumps[b]
		if known == nil || !equalRules(known.want, w.jumps[b]) {
			return nil
		}
	}
	var stale []string
	for name := range f.chains {
		if _, ok := w.chains[name]; !ok {
			stale = append(stale, name)
		}
	}
	slices.Sort(stale)
	return stale
}

// chainsChange says whether writeChains has chains to write in some
// family (without sets being replaced).
func (a *Applier) chainsChange(d *desired) bool {
	for _, f := range a.fams {
		if f == nil {
			continue
		}
		w := &d.fams[f.idx]
		for _, name := range w.order {
			kc := f.chains[name]
			if kc == nil || !kc.written || !equalRules(kc.want, w.chains[name]) {
				return true
			}
		}
	}
	return false
}

// readBackOneByOne is how many written chains are read back with one
// `iptables -S CHAIN` each rather than one iptables-save of the table
// (which, with thousands of set matches, takes tens of milliseconds).
const readBackOneByOne = 8

// deleteChains adds to tx the deletion of chains: all flushed first, so
// they may name each other, then deleted.
func deleteChains(tx *netfilter.Tx, chains []string) {
	for _, name := range chains {
		tx.Declare(name)
	}
	for _, name := range chains {
		tx.DeleteChain(name)
	}
}

// namesAny reports whether rules name one of the sets alias maps.
func namesAny(rules [][]string, alias map[string]string) bool {
	if len(alias) == 0 {
		return false
	}
	for _, r := range rules {
		for _, a := range r {
			if _, ok := alias[a]; ok {
				return true
			}
		}
	}
	return false
}

// substitute returns rules with every set name alias maps replaced.
func substitute(rules [][]string, alias map[string]string) [][]string {
	out := make([][]string, len(rules))
	for i, r := range rules {
		out[i] = slices.Clone(r)
		for j, a := range r {
			if to, ok := alias[a]; ok {
				out[i][j] = to
			}
		}
	}
	return out
}

// deleteStaleChains removes, in one transaction, the policy chains the
// kernel has and w does not want. It runs after the jumps to them are gone
// and after the chains still wanted were rewritten without them; all are
// flushed before any is deleted, so they may name each other.
func (a *Applier) deleteStaleChains(ctx context.Context, f *family, w *wantFamily, st *Stats) error {
	var stale []string
	for name := range f.chains {
		if _, ok := w.chains[name]; !ok {
			stale = append(stale, name)
		}
	}
	if len(stale) == 0 {
		return nil
	}
	slices.Sort(stale)
	tx := netfilter.NewTx("filter")
	deleteChains(tx, stale)
	st.Restores++
	if err := f.ipt.Apply(ctx, tx); err != nil {
		return fmt.Errorf("removing %d %s policy chains no longer wanted (does a rule outside tabby's chains jump to one?): %w", len(stale), f.name, err)
	}
	for _, name := range stale {
		delete(f.chains, name)
	}
	st.ChainsDeleted += len(stale)
	return nil
}
