// Package apply makes the kernel match a policy.Ruleset: ipsets first
// (created, members added), then the policy chains of the filter table in
// one iptables-restore --noflush transaction per family, then the members
// no longer wanted removed, then the jumps at the top of the built-in
// chains, and last the removal of chains and sets no longer wanted.
//
// It owns only what carries tabby's policy names: ipsets starting with
// policy.SetPrefix, filter-table chains starting with
// policy.PolicyChainPrefix, and the rules of INPUT, FORWARD and OUTPUT whose
// target is such a chain. Nothing else is flushed, moved or deleted; the nat
// table is never touched.
//
// The applier remembers what it last put in the kernel, so an Apply whose
// chains did not change runs no iptables command at all, a set listed as
// before is neither parsed nor compared again, and a pod label change
// costs a few netlink messages. It re-reads the kernel (iptables-save,
// ipset save) every Options.ResyncPeriod and after any error, so what was
// changed behind its back is repaired.
package apply

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/coreos/go-iptables/iptables"

	"github.com/tabbynet/tabby/internal/iptbackend"
	"github.com/tabbynet/tabby/internal/netfilter"
	"github.com/tabbynet/tabby/policy"
)

// Options configure an Applier.
type Options struct {
	// Backend is the iptables backend to program; nil: detect the one the
	// host uses (iptbackend.Detect) in New. tabbyd passes the backend it
	// also gives daemon/routing, so both always agree.
	Backend *iptbackend.Backend
	// Logger receives one line per sync that changed something, and what
	// was repaired; nil: slog.Default().
	Logger *slog.Logger
	// ResyncPeriod is how long the applier trusts its memory of the kernel
	// before an Apply reads the kernel again; 0 means one minute, a
	// negative value reads it on every Apply.
	ResyncPeriod time.Duration
	// DisableIPv6 leaves ip6tables and the inet6 sets alone (a node whose
	// kernel has no IPv6). Without IPv6 in the kernel (no
	// /proc/sys/net/ipv6) it is set by New.
	DisableIPv6 bool
	// IPSet is the ipset binary; "": looked up in $PATH.
	IPSet string
	// IPSetNoNetlink makes every set change run the ipset binary; by
	// default set changes go over netlink: a few members a hundred times
	// faster than starting ipset, a full sync's thousands of sets without
	// ipset's own search of them by name for every line.
	IPSetNoNetlink bool
	// LockWait is how many seconds iptables waits for the xtables lock;
	// 0 means 10.
	LockWait int
}

// Applier programs Rulesets into the network namespace of the calling
// thread (lock the OS thread and enter a namespace, e.g. with ns.Do, to
// program another; New must run there too). It is safe for concurrent use:
// calls are serialized.
type Applier struct {
	mu      sync.Mutex
	log     *slog.Logger
	backend iptbackend.Backend
	ipsets  *netfilter.IPSets
	resync  time.Duration
	fams    [2]*family // nil: family not programmed
	skip    [2]bool

	// What the applier believes is in the kernel; valid only while
	// known is true.
	known    bool
	lastRead time.Time
	sets     map[string]*netfilter.Set
	tmpSeq   int
	// inSync maps a set to the wantSet the last fillSets brought it to:
	// the same wantSet again (validate takes an unchanged set over) is
	// not compared member by member. Reading the kernel forgets it.
	inSync map[string]*wantSet

	// last is the most recent desired state, for CheckJumps.
	last *desired
}

// family is one of iptables (IPv4) and ip6tables (IPv6).
type family struct {
	idx  int
	name string // IPv4, IPv6
	ipt  *netfilter.IPTables
	// chains are the policy chains in the kernel: what the applier wrote
	// (want, when written) and what iptables-save printed for it
	// afterwards.
	chains map[string]*kernelChain
	// jumps are, per built-in chain, the jumps last verified at its top:
	// the rules wanted and how iptables prints them.
	jumps map[string]*kernelJumps
	// printed is how the kernel prints rules, learned from chains read
	// back just after the applier wrote them (printing).
	printed printing
}

type kernelChain struct {
	written bool // false: found in the kernel, content unknown
	want    [][]string
	kernel  []string
}

type kernelJumps struct {
	want  [][]string
	lines []string
}

// Stats say what an Apply did.
type Stats struct {
	SetsCreated, SetsUpdated, SetsDeleted int
	MembersAdded, MembersRemoved          int
	// ChainsWritten counts chains (once per family) flushed and refilled
	// by iptables-restore: 0 when the chains were unchanged.
	ChainsWritten, ChainsDeleted int
	JumpsInserted, JumpsDeleted  int
	// ChainsReadBack counts the chains written that were then listed to
	// learn how the kernel prints them (the others' printing was known).
	ChainsReadBack int
	// Restores is the number of iptables-restore/ip6tables-restore runs.
	Restores int
	// KernelRead says the kernel was read (iptables-save, ipset save)
	// rather than trusted from memory; Retried that a first attempt
	// failed and the sync was redone after reading the kernel.
	KernelRead, Retried bool

	// Durations of the phases: reading the kernel, the set changes,
	// writing and reading back chains, the jumps, removing stale chains
	// and sets; and of the whole Apply (validation included). The set
	// members added while a restore reads its rules count as sets only:
	// ChainsTime is what writing the chains took beyond them.
	ReadTime, SetsTime, ChainsTime, JumpsTime, StaleTime, Total time.Duration
}

// Changed is the number of changes made.
func (s Stats) Changed() int {
	return s.SetsCreated + s.SetsUpdated + s.SetsDeleted + s.ChainsWritten + s.ChainsDeleted + s.JumpsInserted + s.JumpsDeleted
}

// New returns an Applier for the network namespace of the calling thread.
// It changes nothing in the kernel.
func New(opts Options) (*Applier, error) {
	a := &Applier{log: opts.Logger, resync: opts.ResyncPeriod}
	if a.log == nil {
		a.log = slog.Default()
	}
	if a.resync == 0 {
		a.resync = time.Minute
	}
	ipsets, err := netfilter.NewIPSets(opts.IPSet)
	if err != nil {
		return nil, fmt.Errorf("NetworkPolicy: %w", err)
	}
	ipsets.NoNetlink = opts.IPSetNoNetlink
	a.ipsets = ipsets
	if opts.Backend != nil {
		a.backend = *opts.Backend
	} else {
		b, err := iptbackend.Detect(context.Background(), iptbackend.Options{})
		if err != nil {
			return nil, err
		}
		a.backend = b
		a.log.Info("iptables backend detected", "mode", b.Mode, "reason", b.Reason)
	}
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil && !opts.DisableIPv6 {
		a.log.Info("the kernel has no IPv6: NetworkPolicy is enforced for IPv4 only")
		opts.DisableIPv6 = true
	}
	a.skip[v6] = opts.DisableIPv6
	for i, p := range []iptables.Protocol{iptables.ProtocolIPv4, iptables.ProtocolIPv6} {
		if a.skip[i] {
			continue
		}
		ipt, err := netfilter.NewIPTables(a.backend, p, opts.LockWait)
		if err != nil {
			return nil, err
		}
		a.fams[i] = &family{idx: i, name: ipt.Name, ipt: ipt,
			chains: map[string]*kernelChain{}, jumps: map[string]*kernelJumps{},
			printed: newPrinting()}
	}
	return a, nil
}

// Backend is the iptables backend the Applier programs.
func (a *Applier) Backend() iptbackend.Backend { return a.backend }

// Apply makes the kernel match rs. An invalid Ruleset changes nothing and
// returns an error listing every problem. A failure on the way is retried
// once after reading the kernel afresh; the error returned is the second
// failure's, and the next Apply starts from reading the kernel.
func (a *Applier) Apply(ctx context.Context, rs *policy.Ruleset) (Stats, error) {
	start := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	d, err := validate(rs, a.skip, a.last)
	if err != nil {
		return Stats{}, err
	}
	a.last = d
	var st Stats
	read := !a.known || a.resync < 0 || time.Since(a.lastRead) >= a.resync
	err = a.sync(ctx, d, read, &st)
	if err != nil && !read {
		a.log.Warn("NetworkPolicy sync failed; reading the kernel and trying again", "err", err)
		st.Retried = true
		err = a.sync(ctx, d, true, &st)
	}
	if err != nil {
		a.known = false
	}
	st.Total = time.Since(start)
	a.logSync("NetworkPolicy synced", st, err)
	return st, err
}

func (a *Applier) logSync(msg string, st Stats, err error) {
	if st.Changed() > 0 || err != nil {
		a.log.Info(msg, "sets_created", st.SetsCreated, "sets_updated", st.SetsUpdated, "sets_deleted", st.SetsDeleted,
			"members_added", st.MembersAdded, "members_removed", st.MembersRemoved, "chains_written", st.ChainsWritten,
			"chains_deleted", st.ChainsDeleted, "jumps_inserted", st.JumpsInserted, "jumps_deleted", st.JumpsDeleted,
			"kernel_read", st.KernelRead, "duration", st.Total, "err", err)
	}
}

// Audit reads the kernel back and repairs what differs from the last
// Ruleset applied, as an Apply does once ResyncPeriod has passed since the
// last read; a caller that audits on its own schedule gives the applier a
// longer ResyncPeriod. When ctx ends during the read, Audit stops there,
// changes nothing, leaves the applier's memory as trusted as before (what
// it read is remembered), and returns ctx's error: a caller cuts an audit
// short to let an Apply go first. Once the kernel is read, the repair is
// not cut short, though ctx's deadline still bounds it. Before any Apply,
// it does nothing.
func (a *Applier) Audit(ctx context.Context) (Stats, error) {
	start := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	var st Stats
	if a.last == nil {
		return st, nil
	}
	current, err := a.read(ctx, &st)
	if err != nil && ctx.Err() != nil {
		st.Total = time.Since(start)
		return st, ctx.Err()
	}
	if err == nil {
		// Not cut short, but still bound by ctx's deadline, which
		// WithoutCancel drops.
		wctx := context.WithoutCancel(ctx)
		if deadline, ok := ctx.Deadline(); ok {
			var cancel context.CancelFunc
			wctx, cancel = context.WithDeadline(wctx, deadline)
			defer cancel()
		}
		err = a.converge(wctx, a.last, current, &st)
	}
	if err != nil {
		a.known = false
	}
	st.Total = time.Since(start)
	a.logSync("NetworkPolicy audited", st, err)
	return st, err
}

// sync is one attempt: read the kernel if asked, then sets, chains, jumps,
// and the removal of what is no longer wanted, in that order, so that no
// rule ever names a set or chain that is not there.
func (a *Applier) sync(ctx context.Context, d *desired, read bool, st *Stats) error {
	var current [2]map[string][]string
	if read {
		var err error
		if current, err = a.read(ctx, st); err != nil {
			return err
		}
	}
	return a.converge(ctx, d, current, st)
}

// read is readKernel, timed and counted in st.
func (a *Applier) read(ctx context.Context, st *Stats) ([2]map[string][]string, error) {
	t := time.Now()
	b, err := a.readKernel(ctx)
	st.ReadTime += time.Since(t)
	if err == nil {
		st.KernelRead = true
	}
	return b, err
}

// converge makes the kernel match d from the applier's memory of it, and
// from current, the built-in chains' rules, when the kernel was just read.
func (a *Applier) converge(ctx context.Context, d *desired, current [2]map[string][]string, st *Stats) error {
	// A set of the wrong type takes a second pass (setsPlan).
	for pass := 0; ; pass++ {
		alias, err := a.pass(ctx, d, current, st)
		if err != nil || len(alias) == 0 || pass > 0 {
			return err
		}
		current = [2]map[string][]string{}
	}
}

func (a *Applier) pass(ctx context.Context, d *desired, current [2]map[string][]string, st *Stats) (map[string]string, error) {
	t := time.Now()
	sp := a.planSets(d)
	alias, doomed := sp.alias, sp.doomed
	var plans []*chainWrite
	var jumps [2]map[string]jumpWrite
	for _, f := range a.fams {
		if f == nil {
			continue
		}
		w := &d.fams[f.idx]
		if cw := planChains(f, w, alias, foldableStale(f, w, current[f.idx] != nil, alias), current[f.idx]); cw != nil {
			plans = append(plans, cw)
			jumps[f.idx] = cw.jumps
		}
	}
	var written [2][]string
	// The sets are created first, then filled; when chains are written,
	// while the restores read the rules naming the sets, which commit
	// once they are full.
	err := a.createSets(ctx, sp)
	if err == nil && len(plans) == 0 {
		err = a.fillSets(ctx, d, sp, st)
	}
	st.SetsTime += time.Since(t)
	if err != nil {
		return nil, err
	}
	if len(plans) > 0 {
		t = time.Now()
		written, err = a.writeChains(ctx, plans, st, func() error { return a.fillSets(ctx, d, sp, st) })
		st.ChainsTime += time.Since(t)
		if err != nil {
			return nil, err
		}
	}

	// The members leaving their sets go as soon as the chains are in
	// place, before the chains are read back: that is when the kernel
	// enforces the new Ruleset.
	t = time.Now()
	if sp.later {
		err = a.removeMembers(ctx, &sp.dels)
	}
	st.SetsTime += time.Since(t)
	if err != nil {
		return nil, err
	}

	t = time.Now()
	// Both families are read back at once; each is waited for.
	var finish [2]func() (map[string][]string, int, error)
	for _, f := range a.fams {
		if f != nil {
			finish[f.idx] = a.startReadBack(ctx, f, written[f.idx], jumps[f.idx])
		}
	}
	var readErrs []error
	for _, f := range a.fams {
		if f == nil {
			continue
		}
		read, n, err := finish[f.idx]()
		st.ChainsReadBack += n
		readErrs = append(readErrs, err)
		for b, lines := range read {
			current[f.idx][b] = lines // the jumps written with the chains
		}
	}
	st.ChainsTime += time.Since(t)
	if err := errors.Join(readErrs...); err != nil {
		return nil, err
	}

	t = time.Now()
	for _, f := range a.fams {
		if f == nil {
			continue
		}
		if err := a.syncJumps(ctx, f, d.fams[f.idx].jumps, current[f.idx], false, st); err != nil {
			st.JumpsTime += time.Since(t)
			return nil, err
		}
	}
	st.JumpsTime += time.Since(t)

	t = time.Now()
	defer func() { st.StaleTime += time.Since(t) }()
	var errs []error
	for _, f := range a.fams {
		if f != nil {
			errs = append(errs, a.deleteStaleChains(ctx, f, &d.fams[f.idx], st))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return alias, a.deleteStaleSets(ctx, d, alias, doomed, st)
}

// readKernel replaces the applier's memory of the kernel with what is
// there: our sets with their members and, per family, our chains (keeping
// what the applier wrote where the kernel still prints the same) and the
// built-in chains' rules, which it returns.
func (a *Applier) readKernel(ctx context.Context) ([2]map[string][]string, error) {
	var builtins [2]map[string][]string
	// The sets and both families' tables are read at once: each program
	// is started from this thread (so in its namespace), then each is
	// waited for, whatever the others gave.
	waitSets := a.ipsets.StartSave(ctx, policy.SetPrefix)
	var waitTables [2]func() (filterTable, error)
	for _, f := range a.fams {
		if f != nil {
			waitTables[f.idx] = startFilter(ctx, f)
		}
	}
	sets, err := waitSets()
	errs := []error{err}
	for _, f := range a.fams {
		if f == nil {
			continue
		}
		ft, err := waitTables[f.idx]()
		if err != nil || errs[0] != nil {
			errs = append(errs, err)
			continue
		}
		a.remember(f, ft)
		f.prunePrinted()
		builtins[f.idx] = ft.builtins
	}
	if err := errors.Join(errs...); err != nil {
		return builtins, err
	}
	a.sets = sets
	a.inSync = nil
	a.known = true
	a.lastRead = time.Now()
	return builtins, nil
}

func (a *Applier) readFilter(ctx context.Context, f *family) (filterTable, error) {
	return startFilter(ctx, f)()
}

// startFilter starts reading f's filter table (readFilter) from the
// calling thread, so in its namespace, and returns at once: wait returns
// what readFilter would.
func startFilter(ctx context.Context, f *family) (wait func() (filterTable, error)) {
	w := f.ipt.StartSave(ctx, "filter")
	return func() (filterTable, error) {
		t, err := w()
		if err != nil {
			return filterTable{}, err
		}
		return ofFilter(t), nil
	}
}

// remember updates the memory of f's chains from what the kernel prints:
// a chain still printed as after the applier wrote it keeps what was
// written; any other is remembered as unknown content, to be rewritten if
// wanted and deleted if not.
func (a *Applier) remember(f *family, ft filterTable) {
	var changed, deleted []string
	for name, lines := range ft.chains {
		kc := f.chains[name]
		if kc != nil && kc.kernel != nil && slices.Equal(kc.kernel, lines) {
			continue
		}
		if kc != nil && kc.written {
			changed = append(changed, name)
			f.forget(kc.want)
		}
		f.chains[name] = &kernelChain{kernel: lines}
	}
	for name, kc := range f.chains {
		if _, ok := ft.chains[name]; !ok {
			if kc.written {
				deleted = append(deleted, name)
			}
			delete(f.chains, name)
		}
	}
	if len(changed)+len(deleted) > 0 {
		slices.Sort(changed)
		slices.Sort(deleted)
		a.log.Warn("NetworkPolicy chains were changed or deleted behind tabby's back; rewriting them", "family", f.name,
			"changed", len(changed), "deleted", len(deleted), "examples", slices.Concat(first(changed, 5), first(deleted, 5)))
	}
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }

// Invalidate makes the next Apply read the kernel instead of trusting the
// applier's memory of it.
func (a *Applier) Invalidate() {
	a.mu.Lock()
	a.known = false
	a.mu.Unlock()
}
