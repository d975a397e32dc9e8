package interpodaffinity

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// The oracle is upstream's semantics written the slow, direct way: for
// every node, walk every pod. It resolves the incoming pod's
// namespaceSelectors as upstream does (list the namespaces the selector
// matches into the term's namespaces), where the plugin looks namespaces
// up; and it checks each topology pair against the pods directly, where
// the plugin precomputes counts per node and per pair.

type oracle struct {
	nodes      []*v1.Node
	nodeOf     map[string]*v1.Node
	pods       []*framework.PodInfo // bound to a known node, not terminal
	namespaces []*v1.Namespace
	args       Args
}

func newOracle(nodes []*v1.Node, pods []*v1.Pod, namespaces []*v1.Namespace, args Args) *oracle {
	o := &oracle{nodes: nodes, nodeOf: map[string]*v1.Node{}, namespaces: namespaces, args: args}
	for _, n := range nodes {
		o.nodeOf[n.Name] = n
	}
	for _, p := range pods {
		if o.nodeOf[p.Spec.NodeName] != nil && !framework.Terminal(p) {
			o.pods = append(o.pods, framework.NewPodInfo(p))
		}
	}
	return o
}

// mergeNamespaces is upstream's mergeAffinityTermNamespacesIfNotEmpty on a
// copy of the term.
func (o *oracle) mergeNamespaces(t framework.AffinityTerm) framework.AffinityTerm {
	if t.NamespaceSelector.Empty() {
		return t
	}
	ns := map[string]struct{}{}
	for n := range t.Namespaces {
		ns[n] = struct{}{}
	}
	for _, n := range o.namespaces {
		if t.NamespaceSelector.Matches(labels.Set(n.Labels)) {
			ns[n.Name] = struct{}{}
		}
	}
	t.Namespaces = ns
	t.NamespaceSelector = labels.Nothing()
	return t
}

func (o *oracle) merged(terms []framework.AffinityTerm) []framework.AffinityTerm {
	out := make([]framework.AffinityTerm, len(terms))
	for i := range terms {
		out[i] = o.mergeNamespaces(terms[i])
	}
	return out
}

func (o *oracle) nsLabels(ns string) labels.Set {
	for _, n := range o.namespaces {
		if n.Name == ns {
			return n.Labels
		}
	}
	return nil
}

func sameTopology(a, b *v1.Node, key string) bool {
	va, ok := a.Labels[key]
	vb, okb := b.Labels[key]
	return ok && okb && va == vb
}

func matchesAll(terms []framework.AffinityTerm, p *v1.Pod) bool {
	if len(terms) == 0 {
		return false
	}
	for i := range terms {
		if !terms[i].Matches(p, nil) {
			return false
		}
	}
	return true
}

// filter is the status of each node.
func (o *oracle) filter(pod *v1.Pod) ([]*framework.Status, error) {
	pi := framework.NewPodInfo(pod)
	if pi.ParseError != nil {
		return nil, pi.ParseError
	}
	affinity := o.merged(pi.RequiredAffinityTerms)
	anti := o.merged(pi.RequiredAntiAffinityTerms)
	nsLabels := o.nsLabels(pod.Namespace)
	// Does any pod matching all affinity terms count anywhere?
	anyCount := false
	for _, p := range o.pods {
		if matchesAll(affinity, p.Pod) {
			for _, t := range affinity {
				if _, ok := o.nodeOf[p.Pod.Spec.NodeName].Labels[t.TopologyKey]; ok {
					anyCount = true
				}
			}
		}
	}
	self := !anyCount && matchesAll(affinity, pod)
	out := make([]*framework.Status, len(o.nodes))
nodes:
	for i, n := range o.nodes {
		podsExist := true
		for _, t := range affinity {
			if _, ok := n.Labels[t.TopologyKey]; !ok {
				out[i] = &failAffinity
				continue nodes
			}
			found := false
			for _, p := range o.pods {
				if matchesAll(affinity, p.Pod) && sameTopology(n, o.nodeOf[p.Pod.Spec.NodeName], t.TopologyKey) {
					found = true
				}
			}
			podsExist = podsExist && found
		}
		if !podsExist && !self {
			out[i] = &failAffinity
			continue
		}
		for _, t := range anti {
			for _, p := range o.pods {
				if t.Matches(p.Pod, nil) && sameTopology(n, o.nodeOf[p.Pod.Spec.NodeName], t.TopologyKey) {
					out[i] = &failAnti
					continue nodes
				}
			}
		}
		for _, p := range o.pods {
			for _, t := range p.RequiredAntiAffinityTerms {
				if t.Matches(pod, nsLabels) && sameTopology(n, o.nodeOf[p.Pod.Spec.NodeName], t.TopologyKey) {
					out[i] = &failExisting
					continue nodes
				}
			}
		}
	}
	return out, nil
}

// score is the normalised score of each of the nodes.
func (o *oracle) score(pod *v1.Pod, nodes []*v1.Node) []int64 {
	pi := framework.NewPodInfo(pod)
	hasConstraints := len(pi.PreferredAffinityTerms)+len(pi.PreferredAntiAffinityTerms) > 0
	out := make([]int64, len(nodes))
	if o.args.IgnorePreferredTermsOfExistingPods && !hasConstraints {
		return out
	}
	type wt struct {
		t framework.AffinityTerm
		w int64
	}
	var incoming []wt
	for _, t := range pi.PreferredAffinityTerms {
		incoming = append(incoming, wt{o.mergeNamespaces(t.AffinityTerm), int64(t.Weight)})
	}
	for _, t := range pi.PreferredAntiAffinityTerms {
		incoming = append(incoming, wt{o.mergeNamespaces(t.AffinityTerm), -int64(t.Weight)})
	}
	nsLabels := o.nsLabels(pod.Namespace)
	any := false
	for i, n := range nodes {
		for _, p := range o.pods {
			q := o.nodeOf[p.Pod.Spec.NodeName]
			if len(q.Labels) == 0 {
				continue
			}
			// Every contribution counts towards "some score was
			// recorded" (upstream's Skip when none), whatever node n is.
			contribute := func(t *framework.AffinityTerm, target *v1.Pod, ns labels.Set, w int64) {
				if !t.Matches(target, ns) {
					return
				}
				if _, ok := q.Labels[t.TopologyKey]; ok {
					any = true
				}
				if sameTopology(n, q, t.TopologyKey) {
					out[i] += w
				}
			}
			for _, t := range incoming {
				contribute(&t.t, p.Pod, nil, t.w)
			}
			if o.args.HardPodAffinityWeight > 0 {
				for _, t := range p.RequiredAffinityTerms {
					contribute(&t, pod, nsLabels, int64(o.args.HardPodAffinityWeight))
				}
			}
			for _, t := range p.PreferredAffinityTerms {
				contribute(&t.AffinityTerm, pod, nsLabels, int64(t.Weight))
			}
			for _, t := range p.PreferredAntiAffinityTerms {
				contribute(&t.AffinityTerm, pod, nsLabels, -int64(t.Weight))
			}
		}
	}
	if !any || len(nodes) == 0 {
		return make([]int64, len(nodes))
	}
	lo, hi := slices.Min(out), slices.Max(out)
	for i, s := range out {
		f := float64(0)
		if hi > lo {
			f = float64(framework.MaxNodeScore) * (float64(s-lo) / float64(hi-lo))
		}
		out[i] = int64(f)
	}
	return out
}

// cluster generation

type gen struct{ r *rand.Rand }

func (g gen) pick(vals ...string) string { return vals[g.r.IntN(len(vals))] }

func (g gen) podLabels() map[string]string {
	l := map[string]string{}
	if g.r.IntN(5) > 0 {
		l["app"] = g.pick("a", "b", "c")
	}
	if g.r.IntN(2) == 0 {
		l["tier"] = g.pick("x", "y")
	}
	return l
}

func (g gen) term() v1.PodAffinityTerm {
	var reqs []metav1.LabelSelectorRequirement
	switch g.r.IntN(4) {
	case 0:
		reqs = append(reqs, req("app", metav1.LabelSelectorOpIn, g.pick("a", "b", "c")))
	case 1:
		reqs = append(reqs, req("app", metav1.LabelSelectorOpNotIn, g.pick("a", "b")))
	case 2:
		reqs = append(reqs, req("tier", metav1.LabelSelectorOpExists))
	case 3:
		reqs = append(reqs, req("app", metav1.LabelSelectorOpIn, "a", "b"), req("tier", metav1.LabelSelectorOpDoesNotExist))
	}
	t := v1.PodAffinityTerm{LabelSelector: sel(reqs...), TopologyKey: g.pick("zone", "rack", "hostname", "zone", "nokey")}
	switch g.r.IntN(6) {
	case 0:
		t.Namespaces = []string{g.pick("ns0", "ns1", "ns2", "gone")}
	case 1:
		t.NamespaceSelector = sel(req("team", metav1.LabelSelectorOpIn, g.pick("a", "b")))
	case 2:
		t.NamespaceSelector = &metav1.LabelSelector{}
	case 3:
		t.Namespaces = []string{"ns1"}
		t.NamespaceSelector = sel(req("team", metav1.LabelSelectorOpExists))
	}
	return t
}

func (g gen) terms(b *podB, maxPer int) {
	for _, k := range []kind{reqAffinity, reqAnti, prefAffinity, prefAnti} {
		for range g.r.IntN(maxPer + 1) {
			b.weighted(k, int32(1+g.r.IntN(100)), g.term())
		}
	}
}

func (g gen) cluster(nNodes, nPods int) ([]*v1.Node, []*v1.Pod, []*v1.Namespace) {
	namespaces := []*v1.Namespace{
		mkNamespace("ns0", map[string]string{"team": "a"}),
		mkNamespace("ns1", map[string]string{"team": "b"}),
		mkNamespace("ns2", nil),
		// ns3 has pods but no Namespace object (the informer has not
		// seen it): no namespaceSelector selects it.
	}
	var nodes []*v1.Node
	for i := range nNodes {
		l := map[string]string{"hostname": fmt.Sprintf("n%d", i)}
		if g.r.IntN(6) > 0 {
			l["zone"] = g.pick("z0", "z1", "z2")
		}
		if g.r.IntN(3) > 0 {
			l["rack"] = g.pick("r0", "r1", "r2", "r3", "r4")
		}
		if g.r.IntN(20) == 0 {
			l = nil
		}
		nodes = append(nodes, mkNode(fmt.Sprintf("n%d", i), l))
	}
	var pods []*v1.Pod
	for i := range nPods {
		b := mkPod().name(fmt.Sprintf("p%d", i)).ns(g.pick("ns0", "ns1", "ns2", "ns3")).
			node(fmt.Sprintf("n%d", g.r.IntN(nNodes+1))). // one node in n+1 is unknown
			labels(g.podLabels())
		if g.r.IntN(4) == 0 {
			g.terms(b, 1)
		}
		switch g.r.IntN(20) {
		case 0:
			b.p.DeletionTimestamp = &metav1.Time{Time: time.Unix(1, 0)}
		case 1:
			b.p.Status.Phase = v1.PodSucceeded
		}
		pods = append(pods, b.obj())
	}
	return nodes, pods, namespaces
}

func (g gen) incoming() *v1.Pod {
	b := mkPod().name("incoming").ns(g.pick("ns0", "ns1", "ns2", "ns3")).labels(g.podLabels())
	g.terms(b, 2)
	return b.obj()
}

func checkAgainstOracle(t *testing.T, pl *Plugin, nodes []*v1.Node, pods []*v1.Pod, namespaces []*v1.Namespace, pod *v1.Pod, r *rand.Rand) {
	t.Helper()
	o := newOracle(nodes, pods, namespaces, pl.args)
	snap := framework.NewSnapshot(nodes, pods, namespaces)
	want, err := o.filter(pod)
	if err != nil {
		t.Fatalf("oracle: %v", err)
	}
	check, err := pl.PreFilter(context.Background(), snap, pod)
	if err != nil {
		t.Fatalf("PreFilter: %v", err)
	}
	for i, n := range nodes {
		var got *framework.Status
		if check != nil {
			got = check(snap.Get(n.Name))
		}
		if (got == nil) != (want[i] == nil) || (got != nil && *got != *want[i]) {
			t.Fatalf("pod %s\nnode %s %v: got %+v, want %+v", describe(pod), n.Name, n.Labels, got, want[i])
		}
	}
	// Score a random subset of the nodes (normalisation is over the
	// scored nodes).
	var subset []*v1.Node
	for _, n := range nodes {
		if r.IntN(3) > 0 {
			subset = append(subset, n)
		}
	}
	got, err := scoreNodes(t, pl, snap, pod, subset)
	if err != nil {
		t.Fatalf("Score: %v", err)
	}
	if w := o.score(pod, subset); !slices.Equal(got, w) {
		t.Fatalf("pod %s\nscores %v\n want %v", describe(pod), got, w)
	}
}

func describe(p *v1.Pod) string {
	return fmt.Sprintf("%s/%s labels %v affinity %v", p.Namespace, p.Name, p.Labels, p.Spec.Affinity)
}

// TestAgainstOracle compares the plugin with the oracle on random clusters,
// small ones walked by one goroutine and larger ones split between several.
func TestAgainstOracle(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 35))
	g := gen{r}
	for i := range 400 {
		nodes, pods, namespaces := g.cluster(1+r.IntN(12), r.IntN(40))
		args := DefaultArgs()
		if i%5 == 0 {
			args = Args{HardPodAffinityWeight: int32(r.IntN(101)), IgnorePreferredTermsOfExistingPods: r.IntN(2) == 0}
		}
		pl, err := NewWithArgs(args)
		if err != nil {
			t.Fatal(err)
		}
		checkAgainstOracle(t, pl, nodes, pods, namespaces, g.incoming(), r)
	}
	for range 4 {
		nodes, pods, namespaces := g.cluster(3*minPerWorker+r.IntN(100), 1500)
		pl := New()
		pl.workers = 3 + r.IntN(3)
		for range 3 {
			checkAgainstOracle(t, pl, nodes, pods, namespaces, g.incoming(), r)
		}
	}
}

// TestScoreNormalisationTruncates: upstream truncates the scaled score
// (int64 of a float), it does not round.
func TestScoreNormalisationTruncates(t *testing.T) {
	// Raw scores 3 (zone a: a db pod, weight 2, and a cache pod, weight
	// 1), 2 (zone b: a db pod) and 0: n2 gets 100*2/3 = 66.67 -> 66.
	pod := mkPod().label("app", "x").
		weighted(prefAffinity, 2, v1.PodAffinityTerm{LabelSelector: sel(req("app", metav1.LabelSelectorOpIn, "db")), TopologyKey: "zone"}).
		weighted(prefAffinity, 1, v1.PodAffinityTerm{LabelSelector: sel(req("app", metav1.LabelSelectorOpIn, "cache")), TopologyKey: "zone"}).obj()
	nodes := []*v1.Node{
		mkNode("n1", map[string]string{"zone": "a"}),
		mkNode("n2", map[string]string{"zone": "b"}),
		mkNode("n3", map[string]string{"zone": "c"}),
	}
	pods := []*v1.Pod{
		mkPod().node("n1").label("app", "db").obj(),    // zone a: +2
		mkPod().node("n1").label("app", "cache").obj(), // zone a: +1
		mkPod().node("n2").label("app", "db").obj(),    // zone b: +2
	}
	got, err := scoreNodes(t, New(), framework.NewSnapshot(nodes, pods, nil), pod, nodes)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{100, int64(math.Trunc(100 * 2.0 / 3)), 0}; !slices.Equal(got, want) {
		t.Errorf("scores %v, want %v", got, want)
	}
}
