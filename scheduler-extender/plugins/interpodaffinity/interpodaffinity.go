// Package interpodaffinity is kube-scheduler v1.35's InterPodAffinity
// plugin: required pod affinity and anti-affinity filter, preferred terms
// score, with the same answers as upstream's
// pkg/scheduler/framework/plugins/interpodaffinity.
//
// Filter (upstream's PreFilter + Filter): PreFilter walks the cluster once
// per pod and counts, per topology pair (node label key and value),
//   - existingAntiAffinityCounts: running pods' required anti-affinity
//     terms that select the incoming pod,
//   - affinityCounts: running pods that match all the incoming pod's
//     required affinity terms (one count per term),
//   - antiAffinityCounts: running pods that match each of the incoming
//     pod's required anti-affinity terms,
//
// so that the check of a node is a few map lookups. A node fails
//   - "node(s) didn't match pod affinity rules" (unresolvable) when it lacks
//     a term's topology key, or some term's topology pair has no matching
//     pod, unless no pod in the cluster matches the terms at all and the pod
//     matches its own terms (the first pod of a group with affinity to
//     itself);
//   - "node(s) didn't match pod anti-affinity rules" (preemption may help)
//     when a pod the incoming pod's anti-affinity selects runs in the node's
//     topology;
//   - "node(s) didn't satisfy existing pods anti-affinity rules" (preemption
//     may help) when a running pod's required anti-affinity selects the
//     incoming pod and the node shares a topology pair with that pod's node.
//
// Score (upstream's PreScore + Score + NormalizeScore): per topology pair,
// the sum of the incoming pod's preferred affinity weights (minus preferred
// anti-affinity weights) over the running pods they select, plus,
// symmetrically, running pods' preferred affinity (minus anti-affinity)
// weights and required affinity terms (HardPodAffinityWeight, default 1)
// that select the incoming pod. A node's raw score is the sum over its
// labels; scores are min-max scaled to 0..100 over the scored nodes.
//
// Namespaces: a term selects pods in its namespaces list, or, when the list
// is empty and namespaceSelector nil, in the pod's own namespace; a
// namespaceSelector selects the namespaces whose labels it matches (the
// Namespace objects the snapshot holds; {} selects every namespace).
//
// matchLabelKeys and mismatchLabelKeys: kube-scheduler v1.35 does not read
// them. The API server merges them into labelSelector when the pod is
// created (feature MatchLabelKeysInPodAffinity, GA and locked on since
// v1.33: `key In (value)` / `key NotIn (value)` with the pod's label values
// at creation), and the scheduler uses labelSelector as stored. This plugin
// does the same; merging again here would agree with upstream for pods
// whose labels never changed and disagree for pods relabelled after
// creation.
//
// Pods count while they are bound to a node and not Succeeded or Failed,
// terminating pods (deletionTimestamp set) included, as in kube-scheduler's
// cache.
//
// Cost: running pods' terms are read only on the nodes that have pods with
// affinity (the snapshot's HavePodsWithAffinity and
// HavePodsWithRequiredAntiAffinity lists, as upstream's snapshot keeps).
// The incoming pod's terms read only the nodes whose pods carry a label
// the term requires (key=value or key in (values): the snapshot's label
// index, which the cache keeps pod by pod); a term without such a
// requirement (only NotIn, Exists, DoesNotExist, or {}) walks every node.
// Walks are split between GOMAXPROCS goroutines (at most 16, as
// upstream). Running pods' terms are parsed once, when they enter the
// cache (framework.NewPodInfo); terms are matched against interned
// namespaces and labels (framework.PodInfo.Namespace, Labels), so a pod
// outside a term's namespaces costs a pointer comparison.
package interpodaffinity

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"unique"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// Name is the plugin's name, as upstream.
const Name = "InterPodAffinity"

// The reasons upstream v1.35 gives, word for word.
const (
	// ErrReasonAffinityRulesNotMatch: the incoming pod's required affinity
	// (UnschedulableAndUnresolvable).
	ErrReasonAffinityRulesNotMatch = "node(s) didn't match pod affinity rules"
	// ErrReasonAntiAffinityRulesNotMatch: the incoming pod's required
	// anti-affinity (Unschedulable).
	ErrReasonAntiAffinityRulesNotMatch = "node(s) didn't match pod anti-affinity rules"
	// ErrReasonExistingAntiAffinityRulesNotMatch: running pods' required
	// anti-affinity (Unschedulable).
	ErrReasonExistingAntiAffinityRulesNotMatch = "node(s) didn't satisfy existing pods anti-affinity rules"
)

// Args are upstream's InterPodAffinityArgs.
type Args struct {
	// HardPodAffinityWeight is the score weight of a running pod's required
	// affinity term that selects the incoming pod (0..100; upstream's
	// default is 1).
	HardPodAffinityWeight int32
	// IgnorePreferredTermsOfExistingPods scores only by the incoming pod's
	// preferred terms (and skips scoring when it has none).
	IgnorePreferredTermsOfExistingPods bool
}

// DefaultArgs are upstream's defaults.
func DefaultArgs() Args {
	return Args{HardPodAffinityWeight: v1.DefaultHardPodAffinitySymmetricWeight}
}

// Plugin is the InterPodAffinity filter and score. It holds no state
// between requests; it is safe for concurrent use.
type Plugin struct {
	args Args
	// workers is how many goroutines walk the nodes; 0 means GOMAXPROCS.
	workers int
}

var (
	_ framework.FilterPlugin = (*Plugin)(nil)
	_ framework.ScorePlugin  = (*Plugin)(nil)
)

// New is the plugin with upstream's default arguments.
func New() *Plugin {
	return &Plugin{args: DefaultArgs()}
}

// NewWithArgs is the plugin with args, validated as upstream does.
func NewWithArgs(args Args) (*Plugin, error) {
	if args.HardPodAffinityWeight < 0 || args.HardPodAffinityWeight > 100 {
		return nil, fmt.Errorf("interpodaffinity: hardPodAffinityWeight %d is not in valid range [0, 100]", args.HardPodAffinityWeight)
	}
	return &Plugin{args: args}, nil
}

// Name implements framework.Plugin.
func (*Plugin) Name() string { return Name }

// topologyPair is a node label: the key a term groups nodes by and the
// node's value, interned as the NodeInfo keeps them.
type topologyPair = framework.Label

type pairCounts map[topologyPair]int64

func (m pairCounts) merge(o pairCounts) {
	for k, v := range o {
		m[k] += v
	}
}

// term is one of the incoming pod's terms with its namespaceSelector
// resolved against the snapshot's namespaces.
type term struct {
	*framework.AffinityTerm
	// weight is a preferred term's weight, negative for anti-affinity.
	weight int64
	// namespaces is Namespaces interned, when they are few (the usual
	// one): checking a pod is comparing pointers.
	namespaces []unique.Handle[string]
	// lookup: the namespaces are Namespaces plus those whose labels the
	// (non-empty) NamespaceSelector matches. Upstream lists the namespaces
	// the selector matches into Namespaces; looking up the candidate pod's
	// namespace gives the same set.
	lookup bool
}

// maxInterned is the most namespaces a term compares one by one.
const maxInterned = 8

func resolve(terms []framework.AffinityTerm) []term {
	out := make([]term, len(terms))
	for i := range terms {
		out[i] = newTerm(&terms[i], 0)
	}
	return out
}

func resolveWeighted(terms []framework.WeightedAffinityTerm, sign int64) []term {
	out := make([]term, len(terms))
	for i := range terms {
		out[i] = newTerm(&terms[i].AffinityTerm, sign*int64(terms[i].Weight))
	}
	return out
}

func newTerm(t *framework.AffinityTerm, weight int64) term {
	// A nil namespaceSelector compiles to labels.Nothing(), the only
	// selector without requirements to give.
	_, selects := t.NamespaceSelector.Requirements()
	out := term{AffinityTerm: t, weight: weight, lookup: selects && !t.AllNamespaces}
	if len(t.Namespaces) <= maxInterned {
		out.namespaces = make([]unique.Handle[string], 0, len(t.Namespaces))
		for ns := range t.Namespaces {
			out.namespaces = append(out.namespaces, unique.Make(ns))
		}
	}
	return out
}

// inNamespaces says whether ns is one of the term's Namespaces.
func (t *term) inNamespaces(ns unique.Handle[string]) bool {
	if t.namespaces == nil {
		_, ok := t.Namespaces[ns.Value()]
		return ok
	}
	for _, h := range t.namespaces {
		if h == ns {
			return true
		}
	}
	return false
}

// matcher matches running pods against groups of the incoming pod's terms.
// One per goroutine: it remembers which namespaces each term's
// namespaceSelector matches.
type matcher struct {
	snap   framework.Snapshot
	groups [][]term
	offset []int                            // of each group's first term in memo
	memo   []map[unique.Handle[string]]bool // by term: namespace -> selected
}

func newMatcher(snap framework.Snapshot, groups ...[]term) *matcher {
	m := &matcher{snap: snap, groups: groups, offset: make([]int, len(groups))}
	n := 0
	for g := range groups {
		m.offset[g] = n
		n += len(groups[g])
	}
	m.memo = make([]map[unique.Handle[string]]bool, n)
	return m
}

// matches says whether the incoming pod's term i of group g selects pod p.
func (m *matcher) matches(g, i int, p *framework.PodInfo) bool {
	t := &m.groups[g][i]
	if !t.AllNamespaces && !t.inNamespaces(p.Namespace) {
		if !t.lookup {
			return false
		}
		memo := m.memo[m.offset[g]+i]
		if memo == nil {
			memo = map[unique.Handle[string]]bool{}
			m.memo[m.offset[g]+i] = memo
		}
		selected, seen := memo[p.Namespace]
		if !seen {
			if ns := m.snap.Namespace(p.Namespace.Value()); ns != nil {
				selected = t.NamespaceSelector.Matches(labels.Set(ns.Labels))
			}
			memo[p.Namespace] = selected
		}
		if !selected {
			return false
		}
	}
	return t.LabelSelector.Matches(p)
}

// matchesAll says whether p matches every term of group g (false when the
// group is empty), as upstream's podMatchesAllAffinityTerms.
func (m *matcher) matchesAll(g int, p *framework.PodInfo) bool {
	if len(m.groups[g]) == 0 {
		return false
	}
	for i := range m.groups[g] {
		if !m.matches(g, i, p) {
			return false
		}
	}
	return true
}

// namespaceLabels is the labels of the pod's namespace, nil when the
// snapshot does not know it (upstream assumes an empty set).
func namespaceLabels(snap framework.Snapshot, ns string) labels.Set {
	if n := snap.Namespace(ns); n != nil {
		return n.Labels
	}
	return nil
}

const (
	// minPerWorker is the fewest nodes worth a goroutine of their own.
	minPerWorker = 256
	// maxWorkers is the most goroutines a walk uses (upstream's
	// parallelism default).
	maxWorkers = 16
)

// parallel calls fn(w, lo, hi) on contiguous ranges of [0, n), one range
// per goroutine, w being the goroutine's index (< maxWorkers). It returns
// ctx's error once they are done.
func (pl *Plugin) parallel(ctx context.Context, n int, fn func(w, lo, hi int)) error {
	workers := pl.workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	workers = max(1, min(workers, maxWorkers, n/minPerWorker))
	if workers == 1 {
		fn(0, 0, n)
		return ctx.Err()
	}
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := n*w/workers, n*(w+1)/workers
		wg.Go(func() { fn(w, lo, hi) })
	}
	wg.Wait()
	return ctx.Err()
}

// preFilterState is upstream's: what PreFilter works out once per pod so
// that a node's check is a few map lookups.
type preFilterState struct {
	// Per topology pair, the running pods whose required anti-affinity
	// terms select the incoming pod (one count per term).
	existingAntiAffinityCounts pairCounts
	// Per topology pair, the running pods that match all the incoming
	// pod's required affinity terms (one count per term).
	affinityCounts pairCounts
	// Per topology pair, the running pods that match the incoming pod's
	// required anti-affinity terms (one count per term).
	antiAffinityCounts pairCounts
	// The incoming pod's required terms.
	affinity, anti []term
	// selfAffinity: no running pod matches the affinity terms and the
	// incoming pod matches them itself (the first pod of a group with
	// affinity to itself).
	selfAffinity bool
}

// preFilter works out the preFilterState of pod; nil when the plugin has
// nothing to say about the pod (upstream's Skip).
func (pl *Plugin) preFilter(ctx context.Context, snap framework.Snapshot, pod *v1.Pod) (*preFilterState, error) {
	pi := framework.NewPodInfo(pod)
	if pi.ParseError != nil {
		return nil, fmt.Errorf("parsing pod: %v", pi.ParseError)
	}
	nsLabels := namespaceLabels(snap, pod.Namespace)
	s := &preFilterState{
		existingAntiAffinityCounts: pairCounts{},
		affinityCounts:             pairCounts{},
		antiAffinityCounts:         pairCounts{},
		affinity:                   resolve(pi.RequiredAffinityTerms),
		anti:                       resolve(pi.RequiredAntiAffinityTerms),
	}
	// Running pods' required anti-affinity that selects the incoming pod.
	existing := snap.List()
	if is, ok := snap.(framework.IndexedSnapshot); ok {
		existing = is.HavePodsWithRequiredAntiAffinity()
	}
	err := pl.walk(ctx, existing, s.existingAntiAffinityCounts, func(_ int, ni *framework.NodeInfo, into pairCounts) {
		for _, ep := range ni.PodsWithRequiredAntiAffinity {
			for i := range ep.RequiredAntiAffinityTerms {
				t := &ep.RequiredAntiAffinityTerms[i]
				if tv, ok := ni.Label(t.Key); ok && t.MatchesInfo(pi, nsLabels) {
					into[topologyPair{Key: t.Key, Value: tv}]++
				}
			}
		}
	})
	if err != nil {
		return nil, err
	}
	// Running pods that match all the incoming pod's affinity terms, then
	// those that match each anti-affinity term: counted per node, then
	// added to the node's topology pairs.
	if len(s.affinity) > 0 {
		keys := make([]unique.Handle[string], len(s.affinity))
		for i := range s.affinity {
			keys[i] = s.affinity[i].Key
		}
		err := pl.countPairs(ctx, snap, s.affinity[0].LabelSelector, keys, s.affinityCounts, s.affinity,
			func(m *matcher, ep *framework.PodInfo) bool { return m.matchesAll(0, ep) })
		if err != nil {
			return nil, err
		}
	}
	for i := range s.anti {
		err := pl.countPairs(ctx, snap, s.anti[i].LabelSelector, []unique.Handle[string]{s.anti[i].Key}, s.antiAffinityCounts, s.anti,
			func(m *matcher, ep *framework.PodInfo) bool { return m.matches(0, i, ep) })
		if err != nil {
			return nil, err
		}
	}
	if len(s.existingAntiAffinityCounts) == 0 && len(s.affinity) == 0 && len(s.anti) == 0 {
		return nil, nil
	}
	s.selfAffinity = len(s.affinityCounts) == 0 && newMatcher(snap, s.affinity).matchesAll(0, pi)
	return s, nil
}

// walk calls visit with each node of list that has a Node, adding to into
// what visit adds to its argument (a map of each goroutine's own); w is
// the goroutine's index (< maxWorkers). visit only adds to counts, so the
// first goroutine adds to into itself (nobody else touches it before the
// others' maps are merged): a walk on one goroutine, as most are, makes
// no map of its own to merge.
func (pl *Plugin) walk(ctx context.Context, list []*framework.NodeInfo, into pairCounts, visit func(w int, ni *framework.NodeInfo, into pairCounts)) error {
	partial := make([]pairCounts, maxWorkers)
	err := pl.parallel(ctx, len(list), func(w, lo, hi int) {
		pc := into
		if w > 0 {
			pc = pairCounts{}
		}
		for _, ni := range list[lo:hi] {
			if ctx.Err() != nil {
				return
			}
			if ni.Node != nil {
				visit(w, ni, pc)
			}
		}
		partial[w] = pc
	})
	for _, pc := range partial[1:] {
		into.merge(pc)
	}
	return err
}

// countPairs adds to into, for each node and each of keys the node has,
// the node's pods for which match is true, walking only the nodes whose
// pods sel may match (by the snapshot's label index). match gets a
// matcher of terms of its goroutine's own.
func (pl *Plugin) countPairs(ctx context.Context, snap framework.Snapshot, sel *framework.Selector, keys []unique.Handle[string], into pairCounts,
	terms []term, match func(m *matcher, ep *framework.PodInfo) bool) error {
	matchers := make([]*matcher, maxWorkers)
	c := candidatePool.Get().(*candidateLists)
	defer c.put()
	return pl.walk(ctx, c.of(snap, sel), into, func(w int, ni *framework.NodeInfo, into pairCounts) {
		if matchers[w] == nil {
			matchers[w] = newMatcher(snap, terms)
		}
		var n int64
		for _, ep := range ni.Pods {
			if match(matchers[w], ep) {
				n++
			}
		}
		if n == 0 {
			return
		}
		ls := ni.Labels()
		for _, k := range keys {
			if tv, ok := framework.LookupLabel(ls, k); ok {
				into[topologyPair{Key: k, Value: tv}] += n
			}
		}
	})
}

// candidateLists are the lists candidates are made in, reused by the
// requests that follow (they are dropped once walked): at 5,000 nodes
// fresh ones were a tenth of a filter and prioritize's garbage.
type candidateLists struct {
	names []string
	infos []*framework.NodeInfo
}

var candidatePool = sync.Pool{New: func() any { return new(candidateLists) }}

// put gives c back, holding no name or node.
func (c *candidateLists) put() {
	clear(c.names[:cap(c.names)])
	clear(c.infos[:cap(c.infos)])
	c.names, c.infos = c.names[:0], c.infos[:0]
	candidatePool.Put(c)
}

// of is the nodes whose pods sel may match: those the snapshot's label
// index gives (in c's lists, valid until c is put back), or every node.
func (c *candidateLists) of(snap framework.Snapshot, sel *framework.Selector) []*framework.NodeInfo {
	is, ok := snap.(framework.IndexedSnapshot)
	if !ok {
		return snap.List()
	}
	c.names, ok = framework.CandidateNodes(is, sel, c.names)
	if !ok {
		return snap.List()
	}
	c.infos = c.infos[:0]
	for _, name := range c.names {
		if ni := snap.Get(name); ni != nil {
			c.infos = append(c.infos, ni)
		}
	}
	return c.infos
}

var (
	failAffinity = framework.Status{Code: framework.UnschedulableAndUnresolvable, Reason: ErrReasonAffinityRulesNotMatch}
	failAnti     = framework.Status{Code: framework.Unschedulable, Reason: ErrReasonAntiAffinityRulesNotMatch}
	failExisting = framework.Status{Code: framework.Unschedulable, Reason: ErrReasonExistingAntiAffinityRulesNotMatch}
)

// filter is upstream's Filter: affinity, then anti-affinity, then running
// pods' anti-affinity.
func (s *preFilterState) filter(n *framework.NodeInfo, fails *[3]framework.Status) *framework.Status {
	nodeLabels := n.Labels()
	// Pod affinity: every term's topology key on the node, and a matching
	// pod in each term's topology pair.
	podsExist := true
	for i := range s.affinity {
		key := s.affinity[i].Key
		tv, ok := framework.LookupLabel(nodeLabels, key)
		if !ok {
			return &fails[0]
		}
		if s.affinityCounts[topologyPair{Key: key, Value: tv}] <= 0 {
			podsExist = false
		}
	}
	if !podsExist && !s.selfAffinity {
		return &fails[0]
	}
	// Pod anti-affinity.
	if len(s.antiAffinityCounts) > 0 {
		for i := range s.anti {
			key := s.anti[i].Key
			if tv, ok := framework.LookupLabel(nodeLabels, key); ok && s.antiAffinityCounts[topologyPair{Key: key, Value: tv}] > 0 {
				return &fails[1]
			}
		}
	}
	// Running pods' anti-affinity.
	if len(s.existingAntiAffinityCounts) > 0 {
		for _, l := range nodeLabels {
			if s.existingAntiAffinityCounts[l] > 0 {
				return &fails[2]
			}
		}
	}
	return nil
}

// PreFilter implements framework.FilterPlugin.
func (pl *Plugin) PreFilter(ctx context.Context, snap framework.Snapshot, pod *v1.Pod) (framework.NodeFilter, error) {
	s, err := pl.preFilter(ctx, snap, pod)
	if s == nil || err != nil {
		return nil, err
	}
	// The statuses of this request (the framework only reads them).
	fails := &[3]framework.Status{failAffinity, failAnti, failExisting}
	return func(n *framework.NodeInfo) *framework.Status { return s.filter(n, fails) }, nil
}

// Score implements framework.ScorePlugin: upstream's PreScore, Score and
// NormalizeScore. Every node scores 0 when nothing counts (upstream skips).
func (pl *Plugin) Score(ctx context.Context, snap framework.Snapshot, pod *v1.Pod, nodes []*framework.NodeInfo) ([]int64, error) {
	scores := framework.NewScores(len(nodes))
	a := pod.Spec.Affinity
	hasPreferredAffinity := a != nil && a.PodAffinity != nil && len(a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution) > 0
	hasPreferredAnti := a != nil && a.PodAntiAffinity != nil && len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) > 0
	hasConstraints := hasPreferredAffinity || hasPreferredAnti
	if pl.args.IgnorePreferredTermsOfExistingPods && !hasConstraints {
		return scores, nil // upstream's Skip: every node scores 0
	}
	pi := framework.NewPodInfo(pod)
	if pi.ParseError != nil {
		return nil, fmt.Errorf("failed to parse pod: %v", pi.ParseError)
	}
	nsLabels := namespaceLabels(snap, pod.Namespace)
	// The incoming pod's preferred terms, anti-affinity with negative
	// weights.
	preferred := resolveWeighted(pi.PreferredAffinityTerms, 1)
	preferred = append(preferred, resolveWeighted(pi.PreferredAntiAffinityTerms, -1)...)
	hardWeight := int64(pl.args.HardPodAffinityWeight)
	// Per topology pair: the incoming pod's preferred terms over the
	// running pods each selects (the nodes the label index gives it), then
	// the terms of running pods with affinity that select the incoming pod.
	topo := pairCounts{}
	for i := range preferred {
		weighted := pairCounts{}
		err := pl.countPairs(ctx, snap, preferred[i].LabelSelector, []unique.Handle[string]{preferred[i].Key}, weighted, preferred,
			func(m *matcher, ep *framework.PodInfo) bool { return m.matches(0, i, ep) })
		if err != nil {
			return nil, err
		}
		for k, n := range weighted {
			topo[k] += preferred[i].weight * n
		}
	}
	withAffinity := snap.List()
	if is, ok := snap.(framework.IndexedSnapshot); ok {
		withAffinity = is.HavePodsWithAffinity()
	}
	err := pl.walk(ctx, withAffinity, topo, func(_ int, ni *framework.NodeInfo, into pairCounts) {
		nodeLabels := ni.Labels()
		add := func(t *framework.AffinityTerm, weight int64) {
			if tv, ok := framework.LookupLabel(nodeLabels, t.Key); ok && t.MatchesInfo(pi, nsLabels) {
				into[topologyPair{Key: t.Key, Value: tv}] += weight
			}
		}
		for _, ep := range ni.PodsWithAffinity {
			if hardWeight > 0 {
				for i := range ep.RequiredAffinityTerms {
					add(&ep.RequiredAffinityTerms[i], hardWeight)
				}
			}
			for i := range ep.PreferredAffinityTerms {
				add(&ep.PreferredAffinityTerms[i].AffinityTerm, int64(ep.PreferredAffinityTerms[i].Weight))
			}
			for i := range ep.PreferredAntiAffinityTerms {
				add(&ep.PreferredAntiAffinityTerms[i].AffinityTerm, -int64(ep.PreferredAntiAffinityTerms[i].Weight))
			}
		}
	})
	if err != nil {
		return nil, err
	}
	if len(topo) == 0 {
		return scores, nil // upstream's Skip: every node scores 0
	}
	// By topology key: every node reads each key once.
	type keyScores struct {
		key unique.Handle[string]
		vs  map[unique.Handle[string]]int64
	}
	var keys []keyScores
	for pair, v := range topo {
		i := slices.IndexFunc(keys, func(k keyScores) bool { return k.key == pair.Key })
		if i < 0 {
			i = len(keys)
			keys = append(keys, keyScores{pair.Key, map[unique.Handle[string]]int64{}})
		}
		keys[i].vs[pair.Value] += v
	}

	minScore, maxScore := int64(math.MaxInt64), int64(math.MinInt64)
	for i, ni := range nodes {
		var s int64
		ls := ni.Labels()
		for _, k := range keys {
			if v, ok := framework.LookupLabel(ls, k.key); ok {
				s += k.vs[v]
			}
		}
		scores[i] = s
		minScore, maxScore = min(minScore, s), max(maxScore, s)
	}
	// Upstream's NormalizeScore: min-max scaling, truncated.
	diff := maxScore - minScore
	for i, s := range scores {
		f := float64(0)
		if diff > 0 {
			f = float64(framework.MaxNodeScore) * (float64(s-minScore) / float64(diff))
		}
		scores[i] = int64(f)
	}
	return scores, nil
}
