package framework

import "maps"

// A term that selects app=web needs the nodes running web pods, not every
// node: at 50,000 pods, walking them all on each request is most of the
// request's cost. LabelIndex is, per pod label, the nodes whose pods carry
// it, kept up to date pod by pod (as kube-scheduler's cache keeps its
// lists of nodes with affinity pods) rather than rebuilt per request.
//
// Snapshots share it copy-on-write: Share hands out the current maps and
// starts a new epoch; the first change after that copies the outer map,
// and the first change of a label's nodes in an epoch copies that label's
// map. Between snapshots (the informers' initial sync) changes are made
// in place.

// LabelIndex is the nodes with pods of each label. The zero value is empty
// and ready; it is not safe for concurrent use (the cache holds its lock).
type LabelIndex struct {
	m     map[Label]*labelNodes
	epoch uint64 // the current epoch; Share starts a new one
	owned uint64 // the epoch m was copied in
}

// labelNodes counts a label's pods by node name.
type labelNodes struct {
	epoch uint64
	nodes map[string]int32
}

// Add counts pod p on node (delta 1) or stops counting it (delta -1).
func (x *LabelIndex) Add(p *PodInfo, node string, delta int32) {
	for _, l := range p.Labels {
		x.add(l, node, delta)
	}
}

func (x *LabelIndex) add(l Label, node string, delta int32) {
	if x.m == nil {
		x.m = map[Label]*labelNodes{}
		x.owned = x.epoch
	} else if x.owned != x.epoch {
		x.m = maps.Clone(x.m)
		x.owned = x.epoch
	}
	ln := x.m[l]
	switch {
	case ln == nil:
		ln = &labelNodes{epoch: x.epoch, nodes: map[string]int32{}}
		x.m[l] = ln
	case ln.epoch != x.epoch:
		ln = &labelNodes{epoch: x.epoch, nodes: maps.Clone(ln.nodes)}
		x.m[l] = ln
	}
	if n := ln.nodes[node] + delta; n > 0 {
		ln.nodes[node] = n
	} else {
		delete(ln.nodes, node)
		if len(ln.nodes) == 0 {
			delete(x.m, l)
		}
	}
}

// Share returns the index as it is now, read-only: later changes to x do
// not reach it.
func (x *LabelIndex) Share() SharedLabelIndex {
	m := x.m
	x.epoch++
	return SharedLabelIndex{m}
}

// SharedLabelIndex is a read-only LabelIndex, as a Snapshot holds it.
type SharedLabelIndex struct {
	m map[Label]*labelNodes
}

// Nodes is the nodes with pods labelled l, with how many (read-only; nil
// when none).
func (s SharedLabelIndex) Nodes(l Label) map[string]int32 {
	if ln := s.m[l]; ln != nil {
		return ln.nodes
	}
	return nil
}

// IndexedSnapshot is a Snapshot that knows, without walking every node,
// which nodes run pods of a label or with affinity. MapSnapshot is one;
// plugins walk every node of a Snapshot that is not.
type IndexedSnapshot interface {
	Snapshot
	// NodesWithLabel is the nodes with pods labelled l (read-only).
	NodesWithLabel(l Label) map[string]int32
	// HavePodsWithAffinity is the nodes with pods that have pod affinity
	// or anti-affinity terms; HavePodsWithRequiredAntiAffinity those with
	// pods that have required anti-affinity (upstream's snapshot lists of
	// the same names).
	HavePodsWithAffinity() []*NodeInfo
	HavePodsWithRequiredAntiAffinity() []*NodeInfo
}

// CandidateNodes is the names of the nodes running pods that s may match,
// each once, appended to out (reset first): the nodes with pods labelled
// key=value for some value of s's requirement key in (values). ok is
// false when s has no such requirement (every node may have a match).
func CandidateNodes(snap IndexedSnapshot, s *Selector, out []string) (names []string, ok bool) {
	out = out[:0]
	switch {
	case s == nil || s.generic != nil || (!s.nothing && s.indexed < 0):
		return out, false
	case s.nothing:
		return out, true
	}
	r := &s.reqs[s.indexed]
	for i, v := range r.values {
		for name := range snap.NodesWithLabel(Label{Key: r.key, Value: v}) {
			// A node with pods of two values is listed under both.
			if i == 0 || !seenUnder(snap, r, i, name) {
				out = append(out, name)
			}
		}
	}
	return out, true
}

// seenUnder says whether node name has pods of one of r's values before
// the i-th.
func seenUnder(snap IndexedSnapshot, r *requirement, i int, name string) bool {
	for _, v := range r.values[:i] {
		if _, ok := snap.NodesWithLabel(Label{Key: r.key, Value: v})[name]; ok {
			return true
		}
	}
	return false
}
