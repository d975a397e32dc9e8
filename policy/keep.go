package policy

import (
	"cmp"
	"slices"
	"time"
)

// Defaults of a Retention.
const (
	// DefaultKeepFor is how long a combination of policies stays kept
	// after its last local pod left it: long enough for a rollout to
	// replace its pods or a label to flip back, short enough that a
	// combination gone for good leaves the kernel soon.
	DefaultKeepFor = 5 * time.Minute
	// DefaultMaxKept bounds the kept combinations without pods: each is a
	// rule every new connection of a local pod may pass in the dispatch
	// chains (an empty set: no match), and chains and sets in the kernel.
	DefaultMaxKept = 64
)

// Retention decides what a caller that compiles the same node again and
// again keeps of its earlier Rulesets (Input.Keep): every signature a
// Ruleset had local pods for, until For has passed since the last Ruleset
// that had pods for it, and of those with no pods left at most Max, the
// most recently used. Observe each Ruleset compiled with Keep's answer.
// The zero value uses the defaults; a Retention is not safe for
// concurrent use.
type Retention struct {
	For time.Duration // 0: DefaultKeepFor; negative: keep nothing
	Max int           // 0: DefaultMaxKept; negative: keep nothing without pods
	// seen are the last Ruleset's signatures with when each last had pods.
	seen []kept
}

type kept struct {
	sig  Signature
	used time.Time
}

// Observe records the signatures of rs, compiled at now. A signature rs
// does not have is forgotten: the compiler left it out (a policy it names
// is gone) or the caller did not keep it.
func (r *Retention) Observe(rs *Ruleset, now time.Time) {
	before := make(map[[2]string]time.Time, len(r.seen))
	for _, k := range r.seen {
		before[[2]string{k.sig.Family, k.sig.Chain}] = k.used
	}
	seen := make([]kept, 0, len(rs.Signatures))
	for _, s := range rs.Signatures {
		used, ok := before[[2]string{s.Family, s.Chain}]
		if s.Pods > 0 || !ok {
			used = now
		}
		seen = append(seen, kept{sig: s, used: used})
	}
	r.seen = seen
}

// Keep is what to keep in the Input of a compile at now: the signatures
// with pods in the last Ruleset observed, and those without pods used
// within For, at most Max of them. Sorted as Ruleset.Signatures are.
func (r *Retention) Keep(now time.Time) []Signature {
	keepFor, most := cmp.Or(r.For, DefaultKeepFor), cmp.Or(r.Max, DefaultMaxKept)
	if keepFor < 0 {
		return nil
	}
	var out []Signature
	var idle []kept
	for _, k := range r.seen {
		switch {
		case k.sig.Pods > 0:
			out = append(out, k.sig)
		case now.Sub(k.used) < keepFor:
			idle = append(idle, k)
		}
	}
	// The most recently used first, then by name, so that equal inputs
	// keep the same.
	slices.SortFunc(idle, func(a, b kept) int {
		return cmp.Or(b.used.Compare(a.used), cmp.Compare(a.sig.Family, b.sig.Family), cmp.Compare(a.sig.Chain, b.sig.Chain))
	})
	for _, k := range idle[:max(0, min(most, len(idle)))] {
		out = append(out, k.sig)
	}
	slices.SortFunc(out, func(a, b Signature) int {
		return cmp.Or(cmp.Compare(a.Family, b.Family), cmp.Compare(a.Chain, b.Chain))
	})
	return out
}
