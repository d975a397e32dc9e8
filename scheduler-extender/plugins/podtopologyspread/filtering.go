package podtopologyspread

import (
	"context"
	"fmt"
	"math"
	"unique"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// The filter's statuses, shared (read-only) by every failing node.
var (
	statusMissingLabel = &framework.Status{Code: framework.UnschedulableAndUnresolvable, Reason: ErrReasonNodeLabelNotMatch}
	statusSkew         = &framework.Status{Code: framework.Unschedulable, Reason: ErrReasonConstraintsNotMatch}
)

// filterState is upstream's preFilterState without the critical-path
// bookkeeping preemption needs: the counts per domain and, per constraint,
// what the skew of a node is measured against.
type filterState struct {
	constraints []constraint
	// counts[i] maps each eligible domain (topology value, interned) of
	// constraint i to its matching pods (upstream's TpValueToMatchNum).
	counts []map[unique.Handle[string]]int
	// minCount[i] is the least matching pods of an eligible domain
	// (math.MaxInt32 when there is none), upstream's CriticalPaths[i][0].
	minCount []int
	// globalMin[i] is minCount[i], or 0 while there are fewer eligible
	// domains than minDomains.
	globalMin []int
	// self[i] is 1 when the pod matches constraint i's selector.
	self []int
}

// PreFilter implements framework.FilterPlugin: counts the matching pods of
// every domain once; the returned check is O(constraints) per node.
func (pl *Plugin) PreFilter(ctx context.Context, snap framework.Snapshot, pod *v1.Pod) (framework.NodeFilter, error) {
	s, err := pl.preFilterState(snap, pod)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return nil, nil
	}
	return s.filter, nil
}

// preFilterState is nil when the pod has no DoNotSchedule constraints
// (upstream's Skip).
func (pl *Plugin) preFilterState(snap framework.Snapshot, pod *v1.Pod) (*filterState, error) {
	cs, err := pl.constraintsFor(snap, pod, v1.DoNotSchedule, "hard")
	if err != nil {
		return nil, fmt.Errorf("get constraints from pod: %w", err)
	}
	if len(cs) == 0 {
		return nil, nil
	}
	nodes := snap.List()
	s := &filterState{
		constraints: cs,
		counts:      make([]map[unique.Handle[string]]int, len(cs)),
		minCount:    make([]int, len(cs)),
		globalMin:   make([]int, len(cs)),
		self:        make([]int, len(cs)),
	}
	for i := range cs {
		size := 0
		if cs[i].TopologyKey == v1.LabelHostname {
			size = len(nodes)
		}
		s.counts[i] = make(map[unique.Handle[string]]int, size)
	}

	// Which nodes count for which constraint (all keys, inclusion
	// policies), in parallel; then the matching pods of those nodes; then
	// the sums per domain.
	nc := len(cs)
	eligible := marks.Get(len(nodes) * nc)
	defer marks.Put(eligible)
	cnt := newCounter(pod.Namespace, cs)
	need := cnt.need(len(nodes))
	defer putNeed(need)
	incl := newInclusion(pod, cs)
	pl.parallelize(len(nodes), func(lo, hi int) {
		for n := lo; n < hi; n++ {
			if !hasAllKeys(nodes[n], cs) {
				continue
			}
			affOK, taintsOK := incl.node(nodes[n])
			for i := range cs {
				if cs[i].includes(affOK, taintsOK) {
					eligible[n*nc+i] = true
					if g := need[cnt.of[i]]; g != nil {
						g[n] = true
					}
				}
			}
		}
	})
	bySel := pl.podCounts(nodes, cnt, need)
	for n, ni := range nodes {
		var ls []framework.Label
		for i := range cs {
			if !eligible[n*nc+i] {
				continue
			}
			c := 0
			if g := bySel[cnt.of[i]]; g != nil {
				c = int(g[n])
			}
			if ls == nil {
				ls = ni.Labels()
			}
			s.counts[i][domain(ls, cs[i].key)] += c
		}
	}

	podLabels := labels.Set(pod.Labels)
	for i := range cs {
		m := math.MaxInt32
		for _, c := range s.counts[i] {
			m = min(m, c)
		}
		s.minCount[i] = m
		s.globalMin[i] = m
		if len(s.counts[i]) < int(cs[i].MinDomains) {
			s.globalMin[i] = 0
		}
		if cs[i].Selector.Matches(podLabels) {
			s.self[i] = 1
		}
	}
	return s, nil
}

// filter is upstream's Filter: the constraints in order, the first failing
// one deciding.
func (s *filterState) filter(n *framework.NodeInfo) *framework.Status {
	nodeLabels := n.Labels()
	for i := range s.constraints {
		c := &s.constraints[i]
		v, ok := framework.LookupLabel(nodeLabels, c.key)
		if !ok {
			return statusMissingLabel
		}
		if s.counts[i][v]+s.self[i]-s.globalMin[i] > int(c.MaxSkew) {
			return statusSkew
		}
	}
	return nil
}
