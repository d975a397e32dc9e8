package framework

import (
	"unique"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// Label is one of a pod's labels, interned: PodInfo keeps its pod's labels
// as a slice of these, so that matching a selector against many pods
// compares pointers in one small slice a pod instead of hashing strings in
// every pod's label map.
type Label struct {
	Key, Value unique.Handle[string]
}

// InternLabels is m as Labels (in no particular order); nil when m is
// empty.
func InternLabels(m map[string]string) []Label {
	if len(m) == 0 {
		return nil
	}
	out := make([]Label, 0, len(m))
	for k, v := range m {
		out = append(out, Label{Key: unique.Make(k), Value: unique.Make(v)})
	}
	return out
}

// LookupLabel is the value of key in ls, and whether ls has it.
func LookupLabel(ls []Label, key unique.Handle[string]) (unique.Handle[string], bool) {
	for i := range ls {
		if ls[i].Key == key {
			return ls[i].Value, true
		}
	}
	return unique.Handle[string]{}, false
}

// Selector is a labels.Selector compiled to match PodInfos by their
// interned labels, with the same answers as the selector's Matches.
type Selector struct {
	nothing bool
	// generic is the selector itself when it has requirements the
	// compiled form does not cover (Gt, Lt: not in pod affinity terms).
	generic labels.Selector
	reqs    []requirement
	// indexed is the requirement key in (values) with the fewest values,
	// by which CandidateNodes narrows the nodes to walk; -1: none.
	indexed int
}

type requirement struct {
	key    unique.Handle[string]
	op     selection.Operator
	values []unique.Handle[string]
}

// CompileSelector compiles s.
func CompileSelector(s labels.Selector) *Selector {
	reqs, selectable := s.Requirements()
	if !selectable {
		return &Selector{nothing: true, indexed: -1} // labels.Nothing()
	}
	out := &Selector{reqs: make([]requirement, 0, len(reqs)), indexed: -1}
	for _, r := range reqs {
		switch r.Operator() {
		case selection.In, selection.Equals, selection.DoubleEquals, selection.NotIn, selection.NotEquals,
			selection.Exists, selection.DoesNotExist:
		default:
			return &Selector{generic: s, indexed: -1}
		}
		c := requirement{key: unique.Make(r.Key()), op: r.Operator()}
		for _, v := range r.ValuesUnsorted() {
			// Unique: CandidateNodes reads each value's nodes once.
			if h := unique.Make(v); !c.hasValue(h) {
				c.values = append(c.values, h)
			}
		}
		switch c.op {
		case selection.In, selection.Equals, selection.DoubleEquals:
			if out.indexed < 0 || len(c.values) < len(out.reqs[out.indexed].values) {
				out.indexed = len(out.reqs)
			}
		}
		out.reqs = append(out.reqs, c)
	}
	return out
}

func (r *requirement) hasValue(v unique.Handle[string]) bool {
	for _, w := range r.values {
		if w == v {
			return true
		}
	}
	return false
}

// Matches says whether the pod's labels match the selector.
func (s *Selector) Matches(p *PodInfo) bool {
	return s.MatchesLabels(p.Labels, p.Pod.Labels)
}

// MatchesLabels says whether labels match the selector: ls is them
// interned, m the same labels as a map (read only by selectors the
// compiled form does not cover).
func (s *Selector) MatchesLabels(ls []Label, m map[string]string) bool {
	switch {
	case s.nothing:
		return false
	case s.generic != nil:
		return s.generic.Matches(labels.Set(m))
	}
	for i := range s.reqs {
		r := &s.reqs[i]
		v, ok := LookupLabel(ls, r.key)
		switch r.op {
		case selection.In, selection.Equals, selection.DoubleEquals:
			if !ok || !r.hasValue(v) {
				return false
			}
		case selection.NotIn, selection.NotEquals:
			if ok && r.hasValue(v) {
				return false
			}
		case selection.Exists:
			if !ok {
				return false
			}
		case selection.DoesNotExist:
			if ok {
				return false
			}
		}
	}
	return true
}
