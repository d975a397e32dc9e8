package apply

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/tabbynet/tabby/internal/iptbackend"
	"github.com/tabbynet/tabby/internal/netfilter"
	"github.com/tabbynet/tabby/policy"
)

// syncJumps keeps, in each of INPUT, FORWARD and OUTPUT, exactly the
// wanted jumps at positions 1…n in order, and no other rule whose target
// is a policy chain anywhere in the chain. current holds the built-in
// chains' rules when the caller has just read them; otherwise they are
// listed with go-iptables, unless (without force) the jumps wanted are
// those last verified, which the next kernel read or CheckJumps re-checks.
//
// A repair is one iptables-restore --noflush transaction per built-in
// chain: delete tabby's jumps by their text, insert the wanted ones at
// 1…n. It is atomic (there is never a moment without the jumps, as there
// would be between an iptables -D and -I), deletes nothing but rules
// targeting a policy chain, and leaves the order of everybody else's
// rules as it was.
func (a *Applier) syncJumps(ctx context.Context, f *family, want map[string][][]string, current map[string][]string, force bool, st *Stats) error {
	for _, b := range builtins {
		w := want[b]
		known := f.jumps[b]
		var lines []string
		switch {
		case current != nil:
			lines = current[b]
		case !force && known != nil && equalRules(known.want, w):
			continue
		case len(w) == 0 && (known == nil || len(known.want) == 0):
			// None wanted, none made: strays (leftovers of an earlier
			// run) are found when the kernel is read.
			continue
		default:
			if err := ctx.Err(); err != nil {
				return err
			}
			var err error
			if lines, err = a.listRules(f, b); err != nil {
				return err
			}
		}
		mine, repair := f.jumpsRepair(b, w, lines)
		if !repair {
			continue
		}
		if err := a.rewriteJumps(ctx, f, b, mine, w, st); err != nil {
			return err
		}
	}
	return nil
}

// rewriteJumps replaces tabby's jumps in built-in chain b (mine, as
// printed) by w at the top, and remembers how the kernel prints them.
func (a *Applier) rewriteJumps(ctx context.Context, f *family, b string, mine []string, w [][]string, st *Stats) error {
	tx := netfilter.NewTx("filter")
	jumpLines(tx, b, mine, w)
	st.Restores++
	if err := f.ipt.Apply(ctx, tx); err != nil {
		delete(f.jumps, b)
		return fmt.Errorf("putting tabby's jumps at the top of %s %s: %w", f.name, b, err)
	}
	a.jumpsWritten(f, b, mine, w, st)
	lines, err := a.listRules(f, b)
	if err != nil {
		delete(f.jumps, b)
		return err
	}
	return f.jumpsRead(b, w, lines)
}

// jumpsRepair says whether tabby's jumps in built-in chain b, whose rules
// the kernel prints as lines, need rewriting to be w at the top, and
// gives the jumps there now (mine). None wanted and none there is
// recorded as in place.
func (f *family) jumpsRepair(b string, w [][]string, lines []string) (mine []string, repair bool) {
	known := f.jumps[b]
	inPlace := known != nil && equalRules(known.want, w)
	for i, l := range lines {
		if !ours(l) {
			continue
		}
		mine = append(mine, l)
		if i >= len(w) || !inPlace || l != known.lines[i] {
			inPlace = false
		}
	}
	if len(mine) != len(w) {
		inPlace = false
	}
	if len(w) == 0 && len(mine) == 0 {
		f.jumps[b] = &kernelJumps{}
		return nil, false
	}
	return mine, !inPlace
}

// jumpLines are the lines of a transaction that replace mine, tabby's
// jumps in built-in chain b as printed, by w at its top.
func jumpLines(tx *netfilter.Tx, b string, mine []string, w [][]string) {
	for _, l := range mine {
		tx.Delete(b, l)
	}
	for i, r := range w {
		tx.Insert(b, i+1, r)
	}
}

// jumpsWritten counts and logs a rewrite of b's jumps that went through.
func (a *Applier) jumpsWritten(f *family, b string, mine []string, w [][]string, st *Stats) {
	st.JumpsDeleted += len(mine)
	st.JumpsInserted += len(w)
	if len(mine) > 0 || len(w) > 0 {
		a.log.Info("NetworkPolicy jumps written", "chain", b, "family", f.name, "removed", len(mine), "inserted", len(w))
	}
}

// jumpsRead remembers how the kernel prints the jumps w just written at
// the top of b (lines: b's rules), and fails when a jump to a policy chain
// is below them.
func (f *family) jumpsRead(b string, w [][]string, lines []string) error {
	var top []string
	for i, l := range lines {
		if ours(l) && i >= len(w) {
			delete(f.jumps, b)
			return fmt.Errorf("%s %s has a jump to a policy chain at position %d after tabby wrote its %d jumps: is another program writing tabby's chains?", f.name, b, i+1, len(w))
		}
		if i < len(w) {
			top = append(top, l)
		}
	}
	f.jumps[b] = &kernelJumps{want: w, lines: top}
	return nil
}

// listRules lists a filter chain's rules, as printed after "-A CHAIN ";
// a chain that is not there is an error.
func (a *Applier) listRules(f *family, chain string) ([]string, error) {
	rules, ok, err := f.ipt.List("filter", chain)
	if err == nil && !ok {
		err = fmt.Errorf("listing %s filter %s: no such chain", f.name, chain)
	}
	return rules, err
}

// CheckJumps verifies that the jumps of the last Ruleset applied are at
// the top of their built-in chains, in order, in both families, and puts
// them back where they are not (e.g. after `iptables -D` or a program
// inserting its own rule above them). It returns how many jumps it
// inserted and deleted. When a repair fails (a chain was deleted too), it
// applies the last Ruleset again after reading the kernel. The controller
// calls it periodically. With the nft backend it costs one `iptables -S`
// per built-in chain and family, each reading just that chain; the legacy
// backend loads the whole table for each, so there it costs one
// iptables-save per family instead.
//
// When ctx ends on the way, CheckJumps stops between reads (killing an
// iptables-save), repairs nothing more, and returns ctx's error: the
// controller cancels a check to let a sync run first.
func (a *Applier) CheckJumps(ctx context.Context) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.last == nil {
		return 0, nil
	}
	var st Stats
	var err error
	for _, f := range a.fams {
		if f == nil {
			continue
		}
		var current map[string][]string
		if a.backend.Mode == iptbackend.Legacy {
			var ft filterTable
			if ft, err = a.readFilter(ctx, f); err != nil {
				break
			}
			current = ft.builtins
		}
		if err = a.syncJumps(ctx, f, a.last.fams[f.idx].jumps, current, true, &st); err != nil {
			break
		}
	}
	if err != nil && ctx.Err() != nil {
		return st.JumpsInserted + st.JumpsDeleted, ctx.Err()
	}
	if err != nil {
		a.log.Warn("repairing NetworkPolicy jumps failed; applying the last Ruleset again", "err", err)
		a.known = false
		err = a.sync(ctx, a.last, true, &st)
		if err != nil {
			a.known = false
		}
	}
	n := st.JumpsInserted + st.JumpsDeleted
	if n > 0 {
		a.log.Info("NetworkPolicy jumps repaired", "inserted", st.JumpsInserted, "deleted", st.JumpsDeleted)
	}
	return n, err
}

// Cleanup removes everything tabby's NetworkPolicy put in the kernel of
// this namespace: the jumps from INPUT, FORWARD and OUTPUT (one transaction
// per family, with the chains), every filter chain starting with
// policy.PolicyChainPrefix, and every ipset starting with
// policy.SetPrefix. It reads the kernel rather than trusting memory, so a
// fresh Applier cleans up after a previous one (uninstall).
func (a *Applier) Cleanup(ctx context.Context) (Stats, error) {
	start := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.known, a.last, a.sets, a.inSync = false, nil, nil, nil
	var st Stats
	var errs []error
	for _, f := range a.fams {
		if f == nil {
			continue
		}
		f.chains, f.jumps = map[string]*kernelChain{}, map[string]*kernelJumps{}
		ft, err := a.readFilter(ctx, f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		tx := netfilter.NewTx("filter")
		jumps := 0
		for _, b := range builtins {
			for _, l := range netfilter.JumpsTo(ft.builtins[b], ownedChain) {
				tx.Delete(b, l)
				jumps++
			}
		}
		names := slices.Sorted(maps.Keys(ft.chains))
		deleteChains(tx, names)
		if tx.Empty() {
			continue
		}
		st.Restores++
		if err := f.ipt.Apply(ctx, tx); err != nil {
			errs = append(errs, fmt.Errorf("removing tabby's %s policy chains and jumps: %w", f.name, err))
			continue
		}
		st.JumpsDeleted += jumps
		st.ChainsDeleted += len(names)
	}
	sets, err := a.ipsets.Save(ctx, policy.SetPrefix)
	if err == nil {
		a.sets = sets
		err = a.deleteStaleSets(ctx, &desired{}, nil, nil, &st)
	}
	if err != nil {
		errs = append(errs, err)
	}
	a.sets, a.inSync = nil, nil
	st.Total = time.Since(start)
	return st, errors.Join(errs...)
}
