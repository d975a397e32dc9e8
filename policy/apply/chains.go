package apply

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/tabbynet/tabby/internal/iptbackend"
	"github.com/tabbynet/tabby/internal/netfilter"
)

// chainWrite is what writeChains writes in one family: the chains to
// write with their rules and the stale chains to delete, in one
// transaction.
type chainWrite struct {
	f     *family
	write []string
	rules map[string][][]string
	stale []string
	// jumps are the built-in chains whose jumps the transaction rewrites
	// too (see planChains).
	jumps map[string]jumpWrite
	tx    *netfilter.Tx
}

// jumpWrite: the jumps of a built-in chain, mine as printed, replaced by
// want.
type jumpWrite struct {
	mine []string
	want [][]string
}

// planChains is the transaction that brings f's policy chains to w: every
// wanted chain that is new, differs from what the applier last wrote, or
// was found changed in the kernel; sets being replaced are named by their
// stand-ins (alias). The chains stale lists (not wanted, and no jump goes
// to them) are flushed and deleted in the same transaction, after the
// chains that named them are rewritten: one restore, not two. Declaring a
// chain (":NAME - [0:0]") flushes it; the chains not named are left as
// they are, and so is everything else in the table. nil: nothing to do.
//
// When the caller has just read the built-in chains (current), the jumps
// that need rewriting (syncJumps) are rewritten in the same transaction,
// after the chains they go to: one restore rather than one more per
// built-in chain, each of which, with the legacy backend, loads and
// replaces the whole table.
func planChains(f *family, w *wantFamily, alias map[string]string, stale []string, current map[string][]string) *chainWrite {
	cw := &chainWrite{f: f, rules: map[string][][]string{}, stale: stale}
	for _, name := range w.order {
		want := w.chains[name]
		if namesAny(want, alias) {
			want = substitute(want, alias)
		}
		kc := f.chains[name]
		if kc == nil || !kc.written || !equalRules(kc.want, want) {
			cw.write = append(cw.write, name)
			cw.rules[name] = want
		}
	}
	if len(cw.write)+len(stale) == 0 {
		return nil
	}
	cw.tx = netfilter.NewTx("filter")
	for _, name := range cw.write {
		cw.tx.Declare(name)
	}
	for _, name := range cw.write {
		for _, r := range cw.rules[name] {
			cw.tx.Append(name, r)
		}
	}
	if current != nil {
		for _, b := range builtins {
			if mine, repair := f.jumpsRepair(b, w.jumps[b], current[b]); repair {
				if cw.jumps == nil {
					cw.jumps = map[string]jumpWrite{}
				}
				cw.jumps[b] = jumpWrite{mine, w.jumps[b]}
				jumpLines(cw.tx, b, mine, w.jumps[b])
			}
		}
	}
	deleteChains(cw.tx, stale)
	return cw
}

// writeChains runs the transactions of planChains, one iptables-restore
// --noflush per family; with the nft backend both families' at once (they
// share no lock). So that the next kernel read can tell tabby's content
// from a change behind its back, the applier must know how the kernel
// prints every chain written: it returns, per family, the chains with a
// rule whose printing it has not learned yet, which the caller reads back
// (readBack); the others' printing is known (f.printed).
//
// fill, when not nil, runs while the restores read their rules, before
// they commit (StartHeld): the caller fills the sets the new rules name
// then, and a restore of thousands of rules spends most of its time
// reading them before its COMMIT. When fill fails nothing is committed.
// fill's time counts in st.SetsTime, not st.ChainsTime.
func (a *Applier) writeChains(ctx context.Context, plans []*chainWrite, st *Stats, fill func() error) ([2][]string, error) {
	var unknown [2][]string
	waits := make([]func() error, len(plans))
	parallel := a.backend.Mode == iptbackend.NFT
	if fill != nil {
		// The restores read their rules while fill runs, and commit after
		// it; the legacy backend's second family waits its turn below
		// (both take the xtables lock).
		held := len(plans)
		if !parallel {
			held = min(held, 1)
		}
		commits := make([]func(bool), held)
		for i, cw := range plans[:held] {
			st.Restores++
			commits[i], waits[i] = cw.f.ipt.StartHeld(ctx, cw.tx)
		}
		t := time.Now()
		err := fill()
		d := time.Since(t)
		st.SetsTime += d
		st.ChainsTime -= d
		for _, c := range commits {
			c(err == nil)
		}
		if err != nil {
			for _, w := range waits[:held] {
				w() // its input ended with no COMMIT: it changed nothing
			}
			return unknown, err
		}
	}
	for i, cw := range plans {
		if waits[i] == nil {
			st.Restores++
			waits[i] = cw.f.ipt.Start(ctx, cw.tx)
		}
		if !parallel {
			w := waits[i]
			err := w()
			waits[i] = func() error { return err }
			if err != nil {
				plans = plans[:i+1]
				break
			}
		}
	}
	var errs []error
	for i, cw := range plans {
		if err := waits[i](); err != nil {
			what := fmt.Sprintf("writing %d %s policy chains (and removing %d no longer wanted", len(cw.write), cw.f.name, len(cw.stale))
			if len(cw.jumps) > 0 {
				what += fmt.Sprintf(", rewriting the jumps of %s", strings.Join(slices.Sorted(maps.Keys(cw.jumps)), ", "))
			}
			errs = append(errs, fmt.Errorf("%s): %w", what, err))
			continue
		}
		unknown[cw.f.idx] = a.done(cw, st)
	}
	return unknown, errors.Join(errs...)
}

// done records a transaction that went through; it returns the chains
// written whose printing is not known.
func (a *Applier) done(cw *chainWrite, st *Stats) []string {
	f := cw.f
	for _, b := range builtins {
		if j, ok := cw.jumps[b]; ok {
			delete(f.jumps, b) // known once read back (readBack)
			a.jumpsWritten(f, b, j.mine, j.want, st)
		}
	}
	st.ChainsWritten += len(cw.write)
	st.ChainsDeleted += len(cw.stale)
	for _, name := range cw.stale {
		delete(f.chains, name)
	}
	var unknown []string
	for _, name := range cw.write {
		kc := &kernelChain{written: true, want: cw.rules[name], kernel: f.predict(cw.rules[name])}
		f.chains[name] = kc
		if kc.kernel == nil {
			unknown = append(unknown, name)
		}
	}
	return unknown
}

// startReadBack starts reading back the chains just written whose
// printing was not predicted (readBack), with the built-in chains whose
// jumps were rewritten: the iptables-save of many starts now, from the
// calling thread (so in its namespace), and finish parses it; a few are
// read one by one by finish, from the calling thread too. finish returns
// the built-in chains' rules and how many chains were read back.
//
// With the nft backend, which lists one chain without reading the others,
// only the chains that have a rule unlike the earlier ones' (readBackCover)
// are read first, one by one: what they teach predicts the printing of
// the rest, and the few it does not are read after them.
func (a *Applier) startReadBack(ctx context.Context, f *family, unknown []string, jumps map[string]jumpWrite) (finish func() (map[string][]string, int, error)) {
	first, rest := unknown, []string(nil)
	limit := readBackOneByOne
	if a.backend.Mode == iptbackend.NFT {
		first, rest = f.readBackCover(unknown)
		limit = readBackOneByOneNFT
	}
	if len(first)+len(jumps) > limit {
		wait := startFilter(ctx, f)
		return func() (map[string][]string, int, error) {
			ft, err := wait()
			if err != nil {
				return nil, 0, err
			}
			read, err := a.readBack(ctx, f, unknown, jumps, &ft)
			return read, len(unknown), err
		}
	}
	return func() (map[string][]string, int, error) {
		read, err := a.readBack(ctx, f, first, jumps, nil)
		if err != nil || len(rest) == 0 {
			return read, len(first), err
		}
		var left []string
		for _, name := range rest {
			if kc := f.chains[name]; kc != nil {
				if kc.kernel = f.predict(kc.want); kc.kernel == nil {
					left = append(left, name)
				}
			}
		}
		n := len(first) + len(left)
		if len(left) <= limit {
			_, err = a.readBack(ctx, f, left, nil, nil)
			return read, n, err
		}
		ft, err := a.readFilter(ctx, f)
		if err == nil {
			_, err = a.readBack(ctx, f, left, nil, &ft)
		}
		return read, n, err
	}
}

// readBackCover splits the chains written whose printing was not
// predicted (in order): first, each with a rule unlike all the rules of
// the chains before it (what printing.predict calls unknown), to read back now; rest, whose
// rules are all like those, and whose printing what first teaches will
// likely predict.
func (f *family) readBackCover(unknown []string) (first, rest []string) {
	seen := map[uint64]bool{}
	for _, name := range unknown {
		kc := f.chains[name]
		if kc == nil {
			continue
		}
		new := false
		for _, r := range kc.want {
			if _, ok, id := f.printed.predict(r); !ok && !seen[id] {
				seen[id], new = true, true
			}
		}
		if new {
			first = append(first, name)
		} else {
			rest = append(rest, name)
		}
	}
	return first, rest
}

type listed struct {
	rules []string
	err   error
}

// listChains lists filter chains with one `iptables -S` each: with the
// nft backend all at once (iptables-nft takes no lock), with the legacy
// one after another (each takes the xtables lock, and one finding it
// taken retries a second later). A chain that does not exist is an error.
func (a *Applier) listChains(ctx context.Context, f *family, chains []string) []listed {
	out := make([]listed, len(chains))
	waits := make([]func() ([]string, bool, error), len(chains))
	get := func(i int) {
		rules, ok, err := waits[i]()
		if err == nil && !ok {
			err = fmt.Errorf("listing %s filter %s: no such chain", f.name, chains[i])
		}
		out[i] = listed{rules, err}
	}
	parallel := a.backend.Mode == iptbackend.NFT
	for i, name := range chains {
		waits[i] = f.ipt.StartList(ctx, "filter", name)
		if !parallel {
			get(i)
		}
	}
	if parallel {
		for i := range chains {
			get(i)
		}
	}
	return out
}

// readBack remembers how the kernel prints the chains just written, and
// learns from them how it prints their rules: from ft, the filter table
// as iptables-save printed it after the write, or, with a nil ft, one by
// one (iptables -S prints a rule as iptables-save does). It reads the
// built-in chains whose jumps were rewritten with them (jumps) too, and
// returns their rules.
func (a *Applier) readBack(ctx context.Context, f *family, write []string, jumps map[string]jumpWrite, ft *filterTable) (map[string][]string, error) {
	var read map[string][]string
	if len(jumps) > 0 {
		read = map[string][]string{}
	}
	if ft == nil {
		var names []string
		for _, b := range builtins {
			if _, ok := jumps[b]; ok {
				names = append(names, b)
			}
		}
		lists := a.listChains(ctx, f, append(slices.Clone(write), names...))
		var errs []error
		for i, name := range write {
			if err := lists[i].err; err != nil {
				delete(f.chains, name)
				errs = append(errs, err)
				continue
			}
			f.readBack(name, lists[i].rules)
		}
		for i, b := range names {
			l := lists[len(write)+i]
			err := l.err
			if err == nil {
				err = f.jumpsRead(b, jumps[b].want, l.rules)
			}
			if err != nil {
				errs = append(errs, err)
				continue
			}
			read[b] = l.rules
		}
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		return read, nil
	}
	for _, name := range write {
		lines, ok := ft.chains[name]
		if !ok {
			delete(f.chains, name) // gone already: rewritten on the next kernel read
			continue
		}
		f.readBack(name, lines)
	}
	for _, b := range builtins {
		if j, ok := jumps[b]; ok {
			if err := f.jumpsRead(b, j.want, ft.builtins[b]); err != nil {
				return nil, err
			}
			read[b] = ft.builtins[b]
		}
	}
	return read, nil
}

// readBack records lines as the printing of chain name, written just
// before, and learns the printing of each of its rules.
func (f *family) readBack(name string, lines []string) {
	kc := f.chains[name]
	kc.kernel = lines
	if len(lines) != len(kc.want) {
		return // not as written (a change in between): nothing to learn
	}
	for i, r := range kc.want {
		f.printed.learn(r, lines[i])
	}
}

// predict is how the kernel prints rules, when the printing of each is
// known; nil otherwise.
func (f *family) predict(rules [][]string) []string {
	lines := make([]string, len(rules))
	for i, r := range rules {
		l, ok, _ := f.printed.predict(r)
		if !ok {
			return nil
		}
		lines[i] = l
	}
	return lines
}

// forget drops the printing of rules, found wrong.
func (f *family) forget(rules [][]string) { f.printed.forget(rules) }

// prunePrinted drops, when f.printed has grown well past the rules of the
// chains written, the printings of rules no chain has any more (chains
// come and go with pods' combinations of policies).
func (f *family) prunePrinted() {
	n := 0
	for _, kc := range f.chains {
		if kc.written {
			n += len(kc.want)
		}
	}
	f.printed.prune(n, func(yield func([]string)) {
		for _, kc := range f.chains {
			if kc.written {
				for _, r := range kc.want {
					yield(r)
				}
			}
		}
	})
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
// iptables-legacy loads the whole table for each; iptables-nft lists just
// the chain (3 ms in a table of 20,000 rules, where iptables-nft-save
// takes 120 ms), hence readBackOneByOneNFT.
const (
	readBackOneByOne    = 8
	readBackOneByOneNFT = 32
)

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
