package apply

import (
	"context"
	"fmt"
	"maps"
	"math/bits"
	"slices"
	"strconv"

	"github.com/tabbynet/tabby/internal/netfilter"
	"github.com/tabbynet/tabby/policy"
)

// MaxElem is the capacity (maxelem) every set is created with: far above
// any cluster's pod count, and free (hash sets grow with their members,
// not with maxelem). A set of more members cannot be loaded, and fails
// the whole Apply: policy.Limits.SetMembers must stay at most this.
const MaxElem = 1 << 20

// setsPlan is what a sync does to the sets: create some (under their
// own name or, being replaced, under a temporary one), then add members,
// then remove members, now or (later) once the chains are written.
//
// The additions of all sets go first, then the removals, so a pod moving
// from one set to another is in one of them at every moment. When chains
// are to be written too, the removals are left for after them (later): a
// pod moving into a set that only the new chains name stays in its old
// set, under its old rules, until those chains are in place — never in
// neither.
//
// A set of ours with the wrong type or family (made by someone else, or by
// hand) can be neither changed nor renamed while rules name it, so it is
// replaced in two passes: this one fills a new set under a temporary name
// and gives alias[name] = temporary name, the chains are written naming
// the temporary set, and the old set is destroyed once nothing names it
// (doomed); the next pass (Apply runs it at once) creates the set under
// its own name, rewrites the chains, and drops the temporary set.
type setsPlan struct {
	creates    []setCreate
	adds, dels netfilter.SetBatch
	later      bool
	alias      map[string]string
	doomed     []string
	next       map[string]*netfilter.Set

	created, updated, added, removed int
}

// setDels are the members a sync removes from one set.
type setDels struct {
	name, typ string
	minus     []string
}

// setCreate: set name is created as w wants it.
type setCreate struct {
	name string
	w    *wantSet
}

func (c setCreate) to(b *netfilter.SetBatch) {
	b.Create(c.name, string(c.w.typ), c.w.family, "hashsize", strconv.Itoa(hashSize(len(c.w.members))), "maxelem", strconv.Itoa(MaxElem))
}

// planSets compares d's sets with the applier's memory of the kernel.
func (a *Applier) planSets(d *desired) *setsPlan {
	p := &setsPlan{next: map[string]*netfilter.Set{}}
	var dels []setDels
	create := func(name string, w *wantSet) {
		p.creates = append(p.creates, setCreate{name, w})
		p.adds.Typed(name, string(w.typ))
		for _, m := range slices.Sorted(maps.Keys(w.members)) {
			p.adds.Add(name, m, w.members[m])
		}
		p.created++
		p.added += len(w.members)
		p.next[name] = w.kernel()
	}
	for _, name := range d.setNames {
		w := d.sets[name]
		k := a.sets[name]
		if k != nil && (k.Type != string(w.typ) || k.Family != w.family) {
			tmp := a.tempSetName(d)
			a.log.Info("ipset has the wrong type or family; replacing it", "set", name, "have", k.Type+" "+k.Family,
				"want", string(w.typ)+" "+w.family, "meanwhile", tmp)
			if p.alias == nil {
				p.alias = map[string]string{}
			}
			p.alias[name] = tmp
			p.doomed = append(p.doomed, name)
			p.next[name] = k
			create(tmp, w)
			continue
		}
		if k == nil {
			create(name, w)
			continue
		}
		if a.inSync[name] == w {
			p.next[name] = k // the same wantSet the last sync put there
			continue
		}
		p.adds.Typed(name, string(w.typ))
		plus, minus := memberDiff(k, w)
		for _, m := range plus {
			p.adds.Add(name, m, w.members[m]) // with -exist, also updates nomatch in place
		}
		if len(minus) > 0 {
			dels = append(dels, setDels{name, string(w.typ), minus})
		}
		p.added += len(plus)
		p.removed += len(minus)
		if len(plus)+len(minus) > 0 {
			p.updated++
			p.next[name] = w.kernel()
		} else {
			p.next[name] = k
		}
	}
	// Removals in reverse name order: a dispatch bucket's set loses a pod
	// before the signature's set does (see policy.DispatchBuckets).
	for _, d := range slices.Backward(dels) {
		p.dels.Typed(d.name, d.typ)
		for _, m := range d.minus {
			p.dels.Del(d.name, m)
		}
	}
	// Sets we have but do not want stay until the chains naming them are
	// gone (deleteStaleSets).
	for name, k := range a.sets {
		if _, ok := p.next[name]; !ok {
			p.next[name] = k
		}
	}
	p.later = !p.dels.Empty() && (len(p.alias) > 0 || a.chainsChange(d))
	return p
}

// createSets creates p's sets, empty. When chains are written too, the
// restore writing them then reads the rules naming the sets while
// fillSets runs.
func (a *Applier) createSets(ctx context.Context, p *setsPlan) error {
	var b netfilter.SetBatch
	for _, c := range p.creates {
		c.to(&b)
	}
	if err := a.ipsets.Apply(ctx, &b, true); err != nil {
		return fmt.Errorf("creating the ipsets: %w", err)
	}
	return nil
}

// fillSets makes p's additions and, unless left for later, its removals,
// in one batch: a member moving between sets is in one of them at every
// moment.
func (a *Applier) fillSets(ctx context.Context, d *desired, p *setsPlan, st *Stats) error {
	var b netfilter.SetBatch
	b.Append(&p.adds)
	if !p.later {
		b.Append(&p.dels)
	}
	if err := a.ipsets.Apply(ctx, &b, true); err != nil {
		return fmt.Errorf("updating the ipsets: %w", err)
	}
	a.setsSynced(d, p, st)
	return nil
}

// setsSynced records that the kernel's sets are as p made them.
func (a *Applier) setsSynced(d *desired, p *setsPlan, st *Stats) {
	a.sets = p.next
	a.inSync = make(map[string]*wantSet, len(d.setNames))
	for _, name := range d.setNames {
		if _, moved := p.alias[name]; !moved {
			a.inSync[name] = d.sets[name]
		}
	}
	st.SetsCreated += p.created
	st.SetsUpdated += p.updated
	st.MembersAdded += p.added
	st.MembersRemoved += p.removed
}

// memberDiff is what to add to k (missing, or with the wrong nomatch
// flag) and what to delete from it, sorted, for it to hold w's members.
func memberDiff(k *netfilter.Set, w *wantSet) (plus, minus []string) {
	for m, nm := range w.members {
		if knm, ok := k.Members[m]; !ok || knm != nm {
			plus = append(plus, m)
		}
	}
	for m := range k.Members {
		if _, ok := w.members[m]; !ok {
			minus = append(minus, m)
		}
	}
	slices.Sort(plus)
	slices.Sort(minus)
	return plus, minus
}

// kernel is the set as the kernel has it once created or synced.
func (w *wantSet) kernel() *netfilter.Set {
	return &netfilter.Set{Type: string(w.typ), Family: w.family, Members: maps.Clone(w.members)}
}

// removeMembers runs the removals a setsPlan left for after the chains.
func (a *Applier) removeMembers(ctx context.Context, dels *netfilter.SetBatch) error {
	if dels == nil {
		return nil
	}
	if err := a.ipsets.Apply(ctx, dels, true); err != nil {
		return fmt.Errorf("removing ipset members: %w", err)
	}
	return nil
}

// hashSize is the initial hash size for n members: a power of two from 64
// to 65536 (the set grows by itself past it).
func hashSize(n int) int {
	if n <= 64*4 {
		return 64
	}
	s := 1 << bits.Len(uint(n/4-1))
	return min(s, 65536)
}

// tempSetName is a name of ours not in use and not wanted, for a set
// moved out of the way.
func (a *Applier) tempSetName(d *desired) string {
	for {
		a.tmpSeq++
		name := fmt.Sprintf("%sold-%d", policy.SetPrefix, a.tmpSeq)
		if _, used := a.sets[name]; !used && d.sets[name] == nil {
			return name
		}
	}
}

// deleteStaleSets destroys our sets that d does not want, except those
// standing in for a wanted set (alias), and the doomed sets replaced by
// them. It runs after the chains that named them are rewritten or gone; a
// set somebody else's rule still names cannot be destroyed and is
// reported.
func (a *Applier) deleteStaleSets(ctx context.Context, d *desired, alias map[string]string, doomed []string, st *Stats) error {
	stale := slices.Clone(doomed)
	inUse := map[string]bool{}
	for _, tmp := range alias {
		inUse[tmp] = true
	}
	for name := range a.sets {
		if d.sets[name] == nil && !inUse[name] {
			stale = append(stale, name)
		}
	}
	if len(stale) == 0 {
		return nil
	}
	slices.Sort(stale)
	done, err := a.ipsets.Destroy(ctx, stale)
	for _, name := range done {
		delete(a.sets, name)
	}
	st.SetsDeleted += len(done)
	if err != nil {
		return fmt.Errorf("removing ipsets tabby no longer needs (is a rule outside tabby's chains using them?): %w", err)
	}
	return nil
}
