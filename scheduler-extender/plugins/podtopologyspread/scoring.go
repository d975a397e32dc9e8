package podtopologyspread

import (
	"context"
	"fmt"
	"math"
	"unique"

	v1 "k8s.io/api/core/v1"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// invalidScore marks a node missing a topology key, as upstream.
const invalidScore = -1

// scoreState is upstream's preScoreState.
type scoreState struct {
	constraints []constraint
	// ignored[j] says request node j lacks some constraint's topology key.
	ignored []bool
	// counts[i] maps the domains of constraint i that hold a request node
	// to their matching pods; nil for hostname constraints, counted per
	// node when scoring (upstream's TopologyValueToPodCounts).
	counts []map[unique.Handle[string]]int64
	// weights[i] is log(domains of constraint i among the scored nodes + 2).
	weights []float64
	// hostCounts[j*len(constraints)+i] is the matching pods on request
	// node j for hostname constraint i, counted in the same pass over the
	// snapshot as the domains; -1 where not counted there.
	hostCounts []int32
	counter    *counter
}

// Score implements framework.ScorePlugin: upstream's PreScore, Score and
// NormalizeScore. A pod without ScheduleAnyway constraints (upstream's
// Skip) scores 0 on every node.
func (pl *Plugin) Score(ctx context.Context, snap framework.Snapshot, pod *v1.Pod, nodes []*framework.NodeInfo) ([]int64, error) {
	scores := framework.NewScores(len(nodes))
	if len(snap.List()) == 0 {
		return scores, nil
	}
	s, err := pl.preScoreState(snap, pod, nodes)
	if err != nil {
		return nil, err
	}
	if s == nil {
		return scores, nil
	}

	// Raw scores: per constraint the node's domain's matching pods times
	// the constraint's weight, plus maxSkew-1; rounded.
	nc := len(s.constraints)
	cnt := s.counter
	pl.parallelize(len(nodes), func(lo, hi int) {
		for j := lo; j < hi; j++ {
			if s.ignored[j] {
				scores[j] = invalidScore
				continue
			}
			ni := nodes[j]
			var score float64
			for i := range s.constraints {
				c := &s.constraints[i]
				v, ok := ni.Label(c.key)
				if !ok {
					continue
				}
				var n int64
				switch {
				case c.TopologyKey != v1.LabelHostname:
					n = s.counts[i][v]
				case s.hostCounts[j*nc+i] >= 0:
					n = int64(s.hostCounts[j*nc+i])
				default: // a node the snapshot's pass did not see
					n = int64(count(ni.Pods, cnt.sels[cnt.of[i]], cnt.ns))
				}
				score += float64(n)*s.weights[i] + float64(c.MaxSkew-1)
			}
			scores[j] = int64(math.Round(score))
		}
	})

	// NormalizeScore: fewest matching pods best; ignored nodes 0.
	var minScore int64 = math.MaxInt64
	var maxScore int64
	for j, sc := range scores {
		if s.ignored[j] {
			continue
		}
		minScore = min(minScore, sc)
		maxScore = max(maxScore, sc)
	}
	for j, sc := range scores {
		switch {
		case sc == invalidScore:
			scores[j] = 0
		case maxScore == 0:
			scores[j] = framework.MaxNodeScore
		default:
			scores[j] = framework.MaxNodeScore * (maxScore + minScore - sc) / maxScore
		}
	}
	return scores, nil
}

// preScoreState is nil when the pod has no ScheduleAnyway constraints.
func (pl *Plugin) preScoreState(snap framework.Snapshot, pod *v1.Pod, nodes []*framework.NodeInfo) (*scoreState, error) {
	cs, err := pl.constraintsFor(snap, pod, v1.ScheduleAnyway, "soft")
	if err != nil {
		return nil, fmt.Errorf("calculating preScoreState: %w", err)
	}
	if len(cs) == 0 {
		return nil, nil
	}
	// Nodes must have every topology key, except with the system defaults:
	// then nodes without a zone still spread by hostname.
	requireAll := len(pod.Spec.TopologySpreadConstraints) > 0 || !pl.systemDefaulted

	s := &scoreState{
		constraints: cs,
		ignored:     make([]bool, len(nodes)),
		counts:      make([]map[unique.Handle[string]]int64, len(cs)),
		weights:     make([]float64, len(cs)),
	}
	zonal, hostname := false, false // some constraint is (not) on hostname
	for i := range cs {
		if cs[i].TopologyKey != v1.LabelHostname {
			s.counts[i] = map[unique.Handle[string]]int64{}
			zonal = true
		} else {
			hostname = true
		}
	}
	ignored := 0
	for j, ni := range nodes {
		if requireAll && !hasAllKeys(ni, cs) {
			s.ignored[j] = true
			ignored++
			continue
		}
		for i := range cs {
			if s.counts[i] != nil {
				// A missing key (only with the system defaults) is
				// the domain "", as upstream.
				s.counts[i][domain(ni.Labels(), cs[i].key)] = 0
			}
		}
	}
	for i := range cs {
		size := len(s.counts[i])
		if cs[i].TopologyKey == v1.LabelHostname {
			size = len(nodes) - ignored
		}
		s.weights[i] = topologyNormalizingWeight(size)
	}
	// One pass over all nodes counts the matching pods of every domain
	// holding a scored node, and of the scored nodes themselves for
	// hostname constraints (as upstream counts them in Score, on the
	// node's pods whatever the inclusion policies).
	all := snap.List()
	nc := len(cs)
	s.counter = newCounter(pod.Namespace, cs)
	cnt := s.counter
	s.hostCounts = make([]int32, len(nodes)*nc)
	for k := range s.hostCounts {
		s.hostCounts[k] = -1
	}
	var scored map[*framework.NodeInfo]int // snapshot NodeInfo -> request index
	if hostname {
		scored = make(map[*framework.NodeInfo]int, len(nodes))
		for j, ni := range nodes {
			if s.ignored[j] {
				continue
			}
			if sn := snap.Get(ni.Node.Name); sn != nil && samePods(sn.Pods, ni.Pods) {
				scored[sn] = j
			}
		}
	}
	if !zonal && len(scored) == 0 {
		return s, nil
	}
	// Which nodes count for which zonal constraint (all keys, inclusion
	// policies, a domain with a scored node), in parallel; then the
	// matching pods of those nodes and of the scored ones; then the sums
	// per domain.
	eligible := marks.Get(len(all) * nc)
	defer marks.Put(eligible)
	need := cnt.need(len(all))
	defer putNeed(need)
	mark := func(i, n int) {
		if g := need[cnt.of[i]]; g != nil {
			g[n] = true
		}
	}
	incl := newInclusion(pod, cs)
	pl.parallelize(len(all), func(lo, hi int) {
		for n := lo; n < hi; n++ {
			ni := all[n]
			if _, ok := scored[ni]; ok {
				for i := range cs {
					if cs[i].TopologyKey == v1.LabelHostname {
						mark(i, n)
					}
				}
			}
			if !zonal || requireAll && !hasAllKeys(ni, cs) {
				continue
			}
			affOK, taintsOK := incl.node(ni)
			for i := range cs {
				if s.counts[i] == nil || !cs[i].includes(affOK, taintsOK) {
					continue
				}
				if _, ok := s.counts[i][domain(ni.Labels(), cs[i].key)]; !ok {
					continue
				}
				eligible[n*nc+i] = true
				mark(i, n)
			}
		}
	})
	bySel := pl.podCounts(all, cnt, need)
	countOf := func(i, n int) int32 {
		if g := bySel[cnt.of[i]]; g != nil {
			return g[n]
		}
		return 0
	}
	for n, ni := range all {
		if j, ok := scored[ni]; ok {
			for i := range cs {
				if cs[i].TopologyKey == v1.LabelHostname {
					s.hostCounts[j*nc+i] = countOf(i, n)
				}
			}
		}
		for i := range cs {
			if eligible[n*nc+i] {
				s.counts[i][domain(ni.Labels(), cs[i].key)] += int64(countOf(i, n))
			}
		}
	}
	return s, nil
}

// samePods says whether two pod lists are the same slice.
func samePods(a, b []*framework.PodInfo) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// topologyNormalizingWeight weighs a constraint by how many domains it has,
// so that the counts of small topologies are not watered down by big ones.
func topologyNormalizingWeight(size int) float64 {
	return math.Log(float64(size + 2))
}
