// Package framework is the shape of tabby-scheduler-extender's placement
// rules, after kube-scheduler's framework: one plugin per concern, each
// precomputing once per pod what its cheap per-node checks need.
//
// A FilterPlugin's PreFilter runs once per request and returns a per-node
// check; a ScorePlugin scores the nodes of a request, normalised to
// 0..MaxNodeScore as the upstream plugin normalises. Framework runs the
// plugins in order and combines scores by weight, as kube-scheduler does.
package framework

import (
	"context"
	"fmt"
	"slices"
	"sync"

	v1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// MaxNodeScore is the top of a plugin's normalised score, as upstream.
const MaxNodeScore int64 = 100

// Code says how a node failed.
type Code int

const (
	// Unschedulable: preemption might make room (kube-scheduler's
	// Unschedulable; the extender's FailedNodes).
	Unschedulable Code = iota + 1
	// UnschedulableAndUnresolvable: no preemption can help
	// (FailedAndUnresolvableNodes).
	UnschedulableAndUnresolvable
)

// Status is why a node failed a filter; nil means it passed.
type Status struct {
	Code   Code
	Reason string
}

// Fail is a Status of code with a reason: format as it is when there are
// no args (filters fail thousands of nodes with a fixed reason per
// request), else formatted.
func Fail(code Code, format string, args ...any) *Status {
	if len(args) == 0 {
		return &Status{Code: code, Reason: format}
	}
	return &Status{Code: code, Reason: fmt.Sprintf(format, args...)}
}

// Plugin is a named placement rule.
type Plugin interface {
	Name() string
}

// NodeFilter checks one node for the pod PreFilter was given.
type NodeFilter func(n *NodeInfo) *Status

// FilterPlugin filters nodes.
type FilterPlugin interface {
	Plugin
	// PreFilter precomputes, from the cluster state and the pod, what the
	// per-node check needs. It returns nil, nil when the plugin has nothing
	// to say about this pod (every node passes), and an error when the pod
	// cannot be placed at all by this plugin's rules (every node fails
	// unresolvably with the error as reason).
	PreFilter(ctx context.Context, snap Snapshot, pod *v1.Pod) (NodeFilter, error)
}

// ScorePlugin scores nodes.
type ScorePlugin interface {
	Plugin
	// Score scores the nodes (in order) from 0 to MaxNodeScore, normalised
	// as the upstream plugin's NormalizeScore does.
	Score(ctx context.Context, snap Snapshot, pod *v1.Pod, nodes []*NodeInfo) ([]int64, error)
}

// WeightedScore is a ScorePlugin with its weight in the sum.
type WeightedScore struct {
	Plugin ScorePlugin
	Weight int64
}

// FilterResult is what Framework.Filter decides.
type FilterResult struct {
	Passing      []*v1.Node
	Failed       map[string]string
	Unresolvable map[string]string
	// FailedBy counts the nodes of Failed and Unresolvable by the plugin
	// that failed them (its Name, as kube-scheduler's metrics name
	// plugins): a count per plugin, not a name per node, as only the
	// metrics read it and thousands of nodes may fail.
	FailedBy map[string]int
}

// Framework runs filter plugins in order (a node's first failure is its
// reason, as kube-scheduler reports) and sums weighted scores.
type Framework struct {
	// Snapshot gives the cluster state for one request.
	Snapshot func() Snapshot
	Filters  []FilterPlugin
	Scores   []WeightedScore
}

// nodeInfos pairs the request's nodes with what the snapshot knows of them
// (their pods), in a slice from the pool (give it back with putInfos). The
// request's Node object wins: with nodeCacheCapable false, kube-scheduler
// sends the Node it decides on.
func nodeInfos(snap Snapshot, nodes []*v1.Node) *[]*NodeInfo {
	p := infoPool.Get().(*[]*NodeInfo)
	out := slices.Grow((*p)[:0], len(nodes))
	for _, n := range nodes {
		ni := snap.Get(n.Name)
		switch {
		case ni == nil:
			ni = NewNodeInfo(n)
		case ni.Node != n:
			c := *ni
			c.SetNode(n)
			ni = &c
		}
		out = append(out, ni)
	}
	*p = out
	return p
}

// A request's per-node slices and maps are as large as its nodes (5,000 at
// Kubernetes' limit: hundreds of kilobytes a request). Fresh ones for every
// request are garbage the collector must chase while it also marks the
// cache's 50,000 pods, and the requests that meet a collection are the
// slow ones; so they come from pools and go back once used.
var (
	infoPool   = sync.Pool{New: func() any { return new([]*NodeInfo) }}
	resultPool = sync.Pool{New: func() any {
		return &FilterResult{Failed: map[string]string{}, Unresolvable: map[string]string{}, FailedBy: map[string]int{}}
	}}
	sumPool, scorePool Slices[int64]
	priorityPool       = sync.Pool{New: func() any { return new(extenderv1.HostPriorityList) }}
)

// Slices hands out zeroed slices of T of any length from a pool: a
// request's per-node slices, given back once nothing reads them. The zero
// value is ready to use.
type Slices[T any] struct{ p sync.Pool }

// Get is a slice of n zero Ts; give it back with Put.
func (s *Slices[T]) Get(n int) []T {
	p, _ := s.p.Get().(*[]T)
	if p == nil {
		p = new([]T)
	}
	out := slices.Grow((*p)[:0], n)[:n]
	clear(out)
	return out
}

// Put gives back a slice Get returned; the caller keeps no reference.
func (s *Slices[T]) Put(x []T) {
	x = x[:0]
	s.p.Put(&x)
}

// NewScores is a ScorePlugin's zeroed slice of n scores. Framework takes
// back what Score returns once it has summed it, so a slice from here
// costs no new memory per request; a plugin must not keep what it returns.
func NewScores(n int) []int64 { return scorePool.Get(n) }

// putInfos gives back a slice of nodeInfos, holding no NodeInfo.
func putInfos(p *[]*NodeInfo) {
	clear(*p)
	*p = (*p)[:0]
	infoPool.Put(p)
}

// Recycle takes back the maps and slice of a FilterResult of Filter once
// the caller is done with it (the answer is written); neither res nor
// anything read from its maps and slice may be used afterwards.
func (f *Framework) Recycle(res FilterResult) {
	if res.Failed == nil || res.Unresolvable == nil || res.FailedBy == nil {
		return
	}
	clear(res.Failed)
	clear(res.Unresolvable)
	clear(res.FailedBy)
	clear(res.Passing[:cap(res.Passing)])
	res.Passing = res.Passing[:0]
	resultPool.Put(&res)
}

// RecyclePriorities takes back a list of Prioritize once the caller is done
// with it; it may not be used afterwards.
func (f *Framework) RecyclePriorities(l extenderv1.HostPriorityList) {
	if l == nil {
		return
	}
	clear(l[:cap(l)])
	l = l[:0]
	priorityPool.Put(&l)
}

// Filter runs the filters.
func (f *Framework) Filter(ctx context.Context, pod *v1.Pod, nodes []*v1.Node) FilterResult {
	res := *resultPool.Get().(*FilterResult)
	res.Passing = slices.Grow(res.Passing[:0], len(nodes))
	snap := f.Snapshot()
	pinfos := nodeInfos(snap, nodes)
	defer putInfos(pinfos)
	infos := *pinfos
	type named struct {
		plugin string
		check  NodeFilter
	}
	checks := make([]named, 0, len(f.Filters))
	for _, p := range f.Filters {
		check, err := p.PreFilter(ctx, snap, pod)
		if err != nil {
			why := err.Error()
			for _, n := range nodes {
				res.Unresolvable[n.Name] = why
			}
			res.FailedBy[p.Name()] += len(nodes)
			return res
		}
		if check != nil {
			checks = append(checks, named{p.Name(), check})
		}
	}
nodes:
	for _, ni := range infos {
		for _, c := range checks {
			if st := c.check(ni); st != nil {
				if st.Code == UnschedulableAndUnresolvable {
					res.Unresolvable[ni.Node.Name] = st.Reason
				} else {
					res.Failed[ni.Node.Name] = st.Reason
				}
				res.FailedBy[c.plugin]++
				continue nodes
			}
		}
		res.Passing = append(res.Passing, ni.Node)
	}
	return res
}

// Prioritize sums the plugins' weighted scores, as kube-scheduler sums its
// plugins', and maps the sums to the extender's 0..10 with ExtenderScores.
// Registered in kube-scheduler with weight TotalWeight(), the extender then
// adds to a node's score what the in-tree plugins with these weights would,
// to within one step.
func (f *Framework) Prioritize(ctx context.Context, pod *v1.Pod, nodes []*v1.Node) (extenderv1.HostPriorityList, error) {
	snap := f.Snapshot()
	pinfos := nodeInfos(snap, nodes)
	defer putInfos(pinfos)
	infos := *pinfos
	sum := sumPool.Get(len(nodes))
	defer sumPool.Put(sum)
	for _, ws := range f.Scores {
		scores, err := ws.Plugin.Score(ctx, snap, pod, infos)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ws.Plugin.Name(), err)
		}
		if len(scores) != len(nodes) {
			return nil, fmt.Errorf("%s scored %d nodes of %d", ws.Plugin.Name(), len(scores), len(nodes))
		}
		for i, s := range scores {
			sum[i] += ws.Weight * min(max(s, 0), MaxNodeScore)
		}
		scorePool.Put(scores)
	}
	ExtenderScores(sum, f.TotalWeight()*MaxNodeScore)
	pout := priorityPool.Get().(*extenderv1.HostPriorityList)
	out := slices.Grow((*pout)[:0], len(nodes))[:len(nodes)]
	for i, n := range nodes {
		out[i] = extenderv1.HostPriority{Host: n.Name, Score: sum[i]}
	}
	return out, nil
}

// ExtenderScores maps weighted sums (each 0..total) in place to the
// extender's 0..MaxExtenderPriority(10): the highest sum gets 10, and every
// other node loses one step for each tenth of total by which it trails the
// highest, rounded up, down to 0.
//
// Why: kube-scheduler picks at random among the nodes with the highest
// final score, so the nodes with the highest sum (the nodes upstream's own
// plugins score highest) must be exactly those that get the extender's
// highest score. Rounding the deficit up gives every node below the top at
// least one step less, and a larger deficit never fewer steps, so order is
// kept as far as eleven values allow (nodes may share a step, never swap).
// The step is a tenth of total because kube-scheduler multiplies the
// extender's score by weight*MaxNodeScore/MaxExtenderPriority: with the
// weight TotalWeight() one step is worth total/10 of the in-tree sum, so
// a node's deficit counts as much as upstream's plugins would make it
// (plus less than one step), next to the in-tree plugins the user keeps
// (resource fit and balance). Scaling the observed range to 0..10 instead
// would make the smallest difference worth up to ten steps and override
// those plugins; rounding to the nearest step (as before) let near-equal
// sums share the top step, which upstream ranks apart.
func ExtenderScores(sums []int64, total int64) {
	if len(sums) == 0 {
		return
	}
	top := slices.Max(sums)
	const steps = extenderv1.MaxExtenderPriority
	for i, s := range sums {
		if total <= 0 {
			sums[i] = steps
			continue
		}
		behind := ((top-s)*steps + total - 1) / total
		sums[i] = max(steps-behind, extenderv1.MinExtenderPriority)
	}
}

// TotalWeight is the sum of the score plugins' weights: the weight to give
// the extender in KubeSchedulerConfiguration.
func (f *Framework) TotalWeight() int64 {
	var w int64
	for _, ws := range f.Scores {
		w += ws.Weight
	}
	return w
}
