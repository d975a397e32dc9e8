// Package network is what only the network knows about placing a pod: the
// tabby plugin of tabby-scheduler-extender.
//
// Filter: a node fails when the pod could not get an address there (its
// requested pools' nodeSelectors exclude the node; the node's blocks are
// full and it can neither claim another block nor borrow), or when the
// node's tabbyd is not ready (its heartbeat Lease has lapsed). Score: nodes
// where the pod would have to borrow an address come last.
package network

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// Name is the plugin's name.
const Name = "TabbyNetwork"

// Reasons a node fails for its tabbyd (the lab waits for them to go).
const (
	ReasonNoTabbyd       = "node(s) had no tabbyd running (no heartbeat Lease)"
	ReasonTabbydNotReady = "node(s) had tabbyd not ready (its heartbeat Lease lapsed)"
)

// Scores of a node by where the pod's addresses would come from.
//
// Claiming a block is one write, once; borrowing costs a /32 route on
// every node for as long as the pod lives. So borrowing is avoided, and
// claiming is not: the extender's 0..10 gives every node below the top at
// least one whole step (framework.ExtenderScores), worth weight*10 of
// kube-scheduler's score, so any preference for nodes with free addresses
// would pile unconstrained pods onto the nodes that already have blocks,
// overriding kube-scheduler's resource spreading.
const (
	ScoreOwnBlock = framework.MaxNodeScore // a free address in the node's own blocks
	ScoreClaim    = framework.MaxNodeScore // the node would claim a new block
	ScoreBorrow   = 0                      // the node would borrow from another node's block
)

// Block is what the plugin needs of an IPAMBlock.
type Block struct {
	CIDR netip.Prefix
	// Node holds the block's affinity ("" for none).
	Node string
	// Free addresses (none in a block being deleted).
	Free int
}

// BlockOf summarises an IPAMBlock; ok is false when its CIDR does not parse.
func BlockOf(b *tabbyv1.IPAMBlock) (Block, bool) {
	pfx, err := netip.ParsePrefix(b.Spec.CIDR)
	if err != nil {
		return Block{}, false
	}
	out := Block{CIDR: pfx.Masked(), Node: strings.TrimPrefix(b.Spec.Affinity, "host:")}
	if b.Spec.Affinity == "" {
		out.Node = ""
	}
	if !b.Spec.Deleted {
		out.Free = len(b.Spec.Unallocated)
	}
	return out, true
}

// Inputs is the network state one decision reads.
type Inputs struct {
	Pools  []*tabbyv1.IPPool
	Blocks []Block
	// Config is the IPAMConfiguration "default" (the defaults when there is
	// none).
	Config tabbyv1.IPAMConfigurationSpec
	// Heartbeats maps a node to when its tabbyd's heartbeat lapses; nil
	// means heartbeats are not checked.
	Heartbeats map[string]time.Time
	Now        time.Time
	// Version, when not nil, names this state of pools, blocks and
	// configuration: Inputs with the same Version hold the same ones, and
	// what the plugin works out from them is reused. Nil: nothing is.
	Version any
}

// Plugin is the TabbyNetwork filter and score.
type Plugin struct {
	// Inputs gives the state for one request.
	Inputs func() *Inputs
	// Families the pod network gives every pod (the CNI config's ipv4/ipv6),
	// unless a pod's pool annotations say otherwise; default IPv4 only.
	Families []int

	mu   sync.Mutex
	last *index // of the last Inputs.Version seen
	// filtered is what the last few Filters found per node, for Score.
	filtered [filteredKept]*filtered
	next     int // the slot of filtered to use next
}

// filteredKept is how many pods' filter results are kept for Score:
// kube-scheduler sends a pod's prioritize right after its filter, one pod
// at a time, so a few cover retries and a second scheduler.
const filteredKept = 8

// filtered is one pod's filter results, for its prioritize request: Score
// reuses a node's score when the pod (UID and resourceVersion), the
// network state (Inputs.Version), the pod's namespace and the Node object
// are those Filter saw, and works it out again otherwise. Its heartbeat
// was checked at filter time, milliseconds before.
//
// The scores are keyed by the Node object, not its name: an updated node
// is another object (so it misses, as it must), and a pointer hashes
// cheaper than a name. The map is made as large as the snapshot's nodes:
// grown from empty it was half of what a filter and prioritize allocated
// at 500 nodes.
type filtered struct {
	uid     types.UID
	rv      string
	version any
	ns      *v1.Namespace

	mu    sync.Mutex
	nodes map[*v1.Node]int64
}

// remember starts keeping pod's filter results; nil when they cannot be
// told apart from another state's (no UID or no Version).
func (p *Plugin) remember(snap framework.Snapshot, pod *v1.Pod, r *request) *filtered {
	if pod.UID == "" || r.in.Version == nil {
		return nil
	}
	size := 0
	if snap != nil {
		size = len(snap.List())
	}
	f := &filtered{uid: pod.UID, rv: pod.ResourceVersion, version: r.in.Version, ns: namespaceOf(snap, pod), nodes: make(map[*v1.Node]int64, size)}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, old := range p.filtered {
		if old != nil && old.uid == pod.UID {
			p.filtered[i] = f
			return f
		}
	}
	p.filtered[p.next] = f
	p.next = (p.next + 1) % filteredKept
	return f
}

// recall is pod's filter results for in and snap, nil when there are none.
func (p *Plugin) recall(snap framework.Snapshot, pod *v1.Pod, in *Inputs) *filtered {
	if pod.UID == "" || in.Version == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range p.filtered {
		if f != nil && f.uid == pod.UID && f.rv == pod.ResourceVersion && f.version == in.Version && f.ns == namespaceOf(snap, pod) {
			return f
		}
	}
	return nil
}

func (f *filtered) put(n *v1.Node, score int64) {
	if f == nil {
		return
	}
	f.mu.Lock()
	f.nodes[n] = score
	f.mu.Unlock()
}

func (f *filtered) get(n *v1.Node) (int64, bool) {
	if f == nil {
		return 0, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	score, ok := f.nodes[n]
	return score, ok
}

func namespaceOf(snap framework.Snapshot, pod *v1.Pod) *v1.Namespace {
	if snap == nil {
		return nil
	}
	return snap.Namespace(pod.Namespace)
}

// index is what the plugin works out from one version of the pools and
// blocks, whatever the pod: blocks per node and each pool's state.
type index struct {
	version    any
	nodeBlocks map[string]int
	pools      map[string]*poolState // by pool name
	errs       map[string]error      // pools that cannot be used, by name
}

// indexOf works out the index of in, or reuses the last one.
func (p *Plugin) indexOf(in *Inputs) *index {
	if in.Version != nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.last != nil && p.last.version == in.Version {
			return p.last
		}
	}
	x := &index{version: in.Version, nodeBlocks: map[string]int{}, pools: map[string]*poolState{}, errs: map[string]error{}}
	for _, b := range in.Blocks {
		if b.Node != "" {
			x.nodeBlocks[b.Node]++
		}
	}
	for _, o := range in.Pools {
		ps, err := newPoolState(o, in.Blocks)
		if err != nil {
			x.errs[o.Name] = err
			continue
		}
		x.pools[o.Name] = ps
	}
	if in.Version != nil {
		p.last = x
	}
	return x
}

var (
	_ framework.FilterPlugin = (*Plugin)(nil)
	_ framework.ScorePlugin  = (*Plugin)(nil)
)

// Name implements framework.Plugin.
func (*Plugin) Name() string { return Name }

// poolState is one candidate pool, precomputed for a request.
type poolState struct {
	obj      *tabbyv1.IPPool
	prefix   netip.Prefix
	selector labels.Selector // nil: every node
	// match is selector compiled to match nodes' interned labels.
	match *framework.Selector
	// unclaimed says a block of the pool is still free to claim; borrowable
	// that some block has a free address.
	unclaimed, borrowable bool
	// own is the free addresses per node in its own blocks of this pool.
	own map[string]int
}

// familyState is the candidate pools of one address family.
type familyState struct {
	family int
	pools  []*poolState
	// fixed: the pod asks for exact addresses (tabby.io/ipAddrs); only the
	// pools holding them matter, and capacity does not.
	fixed bool
}

// request is what PreFilter works out once per pod.
type request struct {
	in         *Inputs
	idx        *index
	families   []*familyState
	nodeBlocks map[string]int
}

// PreFilter implements framework.FilterPlugin. A hostNetwork pod gets no
// address from tabby and needs no tabbyd (tabbyd's own pods are such):
// the plugin has nothing to say about it. When the pod's address request
// cannot be met anywhere (no pool, a broken annotation), every node fails
// with why, after its tabbyd's state.
func (p *Plugin) PreFilter(_ context.Context, snap framework.Snapshot, pod *v1.Pod) (framework.NodeFilter, error) {
	if pod.Spec.HostNetwork {
		return nil, nil
	}
	r, err := p.prepare(snap, pod)
	if err != nil {
		return func(n *framework.NodeInfo) *framework.Status {
			if st := r.heartbeat(n.Node); st != nil {
				return st
			}
			return framework.Fail(framework.UnschedulableAndUnresolvable, "%s", err.Error())
		}, nil
	}
	f := p.remember(snap, pod, r)
	return func(n *framework.NodeInfo) *framework.Status {
		score, st := r.place(n)
		if st == nil {
			f.put(n.Node, score)
		}
		return st
	}, nil
}

// Score implements framework.ScorePlugin.
func (p *Plugin) Score(_ context.Context, snap framework.Snapshot, pod *v1.Pod, nodes []*framework.NodeInfo) ([]int64, error) {
	scores := framework.NewScores(len(nodes))
	if pod.Spec.HostNetwork {
		return scores, nil
	}
	in := p.Inputs()
	f := p.recall(snap, pod, in)
	var r *request
	for i, n := range nodes {
		if s, ok := f.get(n.Node); ok {
			scores[i] = s
			continue
		}
		if r == nil {
			var err error
			if r, err = p.prepareWith(in, snap, pod); err != nil {
				clear(scores)
				return scores, nil // Filter reported it; every node scores the same
			}
		}
		scores[i], _ = r.place(n)
	}
	return scores, nil
}

// annotation reads a JSON list annotation of the pod, else of its namespace.
func annotation(pod *v1.Pod, ns *v1.Namespace, key string, podOnly bool) ([]string, bool, error) {
	src, v, ok := "pod "+pod.Namespace+"/"+pod.Name, "", false
	if v, ok = pod.Annotations[key]; !ok && ns != nil && !podOnly {
		src = "namespace " + ns.Name
		v, ok = ns.Annotations[key]
	}
	if !ok {
		return nil, false, nil
	}
	var l []string
	if err := json.Unmarshal([]byte(v), &l); err != nil {
		return nil, true, fmt.Errorf("tabby: %s: annotation %s must be a JSON list of strings, like [\"a\",\"b\"]: %v", src, key, err)
	}
	return l, true, nil
}

func (p *Plugin) prepare(snap framework.Snapshot, pod *v1.Pod) (*request, error) {
	return p.prepareWith(p.Inputs(), snap, pod)
}

func (p *Plugin) prepareWith(in *Inputs, snap framework.Snapshot, pod *v1.Pod) (*request, error) {
	ns := namespaceOf(snap, pod)
	idx := p.indexOf(in)
	// On an error r is still returned, for the heartbeats.
	r := &request{in: in, idx: idx, nodeBlocks: idx.nodeBlocks}
	wanted := map[int][]string{}
	families := map[int]bool{}
	for f, key := range map[int]string{4: tabbyv1.AnnotationIPv4Pools, 6: tabbyv1.AnnotationIPv6Pools} {
		names, ok, err := annotation(pod, ns, key, false)
		if err != nil {
			return r, err
		}
		if ok {
			wanted[f], families[f] = names, true
		}
	}
	fixed := map[int][]netip.Addr{}
	addrs, ok, err := annotation(pod, ns, tabbyv1.AnnotationIPAddrs, true)
	if err != nil {
		return r, err
	}
	if ok {
		families = map[int]bool{}
		for _, s := range addrs {
			a, err := netip.ParseAddr(s)
			if err != nil {
				return r, fmt.Errorf("tabby: pod %s/%s: annotation %s holds %q, which is not an IP address", pod.Namespace, pod.Name, tabbyv1.AnnotationIPAddrs, s)
			}
			f := 4
			if a.Is6() && !a.Is4In6() {
				f = 6
			}
			fixed[f] = append(fixed[f], a.Unmap())
			families[f] = true
		}
	}
	if len(families) == 0 {
		fams := p.Families
		if len(fams) == 0 {
			fams = []int{4}
		}
		for _, f := range fams {
			families[f] = true
		}
	}
	for _, f := range []int{4, 6} {
		if !families[f] {
			continue
		}
		fs, err := r.familyState(f, wanted[f], fixed[f])
		if err != nil {
			return r, err
		}
		r.families = append(r.families, fs)
	}
	return r, nil
}

func (r *request) familyState(family int, names []string, fixed []netip.Addr) (*familyState, error) {
	fs := &familyState{family: family, fixed: len(fixed) > 0}
	byName := map[string]*tabbyv1.IPPool{}
	for _, o := range r.in.Pools {
		byName[o.Name] = o
	}
	usable := func(o *tabbyv1.IPPool) bool {
		return o.Family() == family && !o.Spec.Disabled && o.AllowsUse(tabbyv1.UseWorkload)
	}
	var chosen []*tabbyv1.IPPool
	switch {
	case fs.fixed:
		for _, a := range fixed {
			var holder *tabbyv1.IPPool
			for _, o := range r.in.Pools {
				if pfx, err := o.Prefix(); err == nil && pfx.Contains(a) && usable(o) {
					holder = o
				}
			}
			if holder == nil {
				return nil, fmt.Errorf("tabby: the address %s the pod asks for (%s) is in no enabled IPv%d pool", a, tabbyv1.AnnotationIPAddrs, family)
			}
			chosen = append(chosen, holder)
		}
	case len(names) > 0:
		for _, n := range names {
			o := byName[n]
			switch {
			case o == nil:
				return nil, fmt.Errorf("tabby: the pod asks for IPv%d pool %q, which does not exist: create it or fix the annotation", family, n)
			case !usable(o):
				return nil, fmt.Errorf("tabby: the pod asks for pool %q, which is not an enabled IPv%d pool for workloads", n, family)
			}
			chosen = append(chosen, o)
		}
	default:
		for _, o := range r.in.Pools {
			if usable(o) {
				chosen = append(chosen, o)
			}
		}
		if len(chosen) == 0 {
			return nil, fmt.Errorf("tabby: there is no enabled IPv%d IPPool: create one", family)
		}
	}
	for _, o := range chosen {
		ps, err := r.idx.pools[o.Name], r.idx.errs[o.Name]
		if err != nil {
			return nil, err
		}
		fs.pools = append(fs.pools, ps)
	}
	return fs, nil
}

func newPoolState(o *tabbyv1.IPPool, blocks []Block) (*poolState, error) {
	pfx, err := o.Prefix()
	if err != nil {
		return nil, fmt.Errorf("tabby: pool %s: %w", o.Name, err)
	}
	ps := &poolState{obj: o, prefix: pfx.Masked(), own: map[string]int{}}
	if o.Spec.NodeSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(o.Spec.NodeSelector)
		if err != nil {
			return nil, fmt.Errorf("tabby: pool %s has an invalid nodeSelector: %w", o.Name, err)
		}
		if !sel.Empty() {
			ps.selector = sel
			ps.match = framework.CompileSelector(sel)
		}
	}
	claimed := 0
	for _, b := range blocks {
		if !ps.prefix.Contains(b.CIDR.Addr()) {
			continue
		}
		claimed++
		if b.Free > 0 {
			ps.borrowable = true
			if b.Node != "" {
				ps.own[b.Node] += b.Free
			}
		}
	}
	bits := o.EffectiveBlockSize() - ps.prefix.Bits()
	ps.unclaimed = bits >= 31 || claimed < 1<<bits
	return ps, nil
}

// heartbeat says why a node's tabbyd keeps pods off it, nil when it does not.
func (r *request) heartbeat(n *v1.Node) *framework.Status {
	if r.in.Heartbeats == nil {
		return nil
	}
	until, ok := r.in.Heartbeats[n.Name]
	switch {
	case !ok:
		return framework.Fail(framework.UnschedulableAndUnresolvable, ReasonNoTabbyd)
	case !r.in.Now.Before(until):
		return framework.Fail(framework.UnschedulableAndUnresolvable, ReasonTabbydNotReady)
	}
	return nil
}

// place scores a node for the pod, or says why the pod cannot go there.
func (r *request) place(ni *framework.NodeInfo) (int64, *framework.Status) {
	if st := r.heartbeat(ni.Node); st != nil {
		return 0, st
	}
	score := framework.MaxNodeScore
	for _, fs := range r.families {
		s, st := r.placeFamily(fs, ni)
		if st != nil {
			return 0, st
		}
		score = min(score, s)
	}
	return score, nil
}

func (r *request) placeFamily(fs *familyState, ni *framework.NodeInfo) (int64, *framework.Status) {
	n := ni.Node
	var admit []*poolState
	ls := ni.Labels()
	for _, ps := range fs.pools {
		if ps.match == nil || ps.match.MatchesLabels(ls, n.Labels) {
			admit = append(admit, ps)
		}
	}
	if len(admit) == 0 {
		// Why, only now: most nodes are admitted by some pool, and
		// formatting the others' selectors for each was a tenth of
		// the plugin's time.
		var excluded []string
		for _, ps := range fs.pools {
			excluded = append(excluded, fmt.Sprintf("pool %s: its nodeSelector %q does not match", ps.obj.Name, ps.selector))
		}
		sort.Strings(excluded)
		return 0, framework.Fail(framework.UnschedulableAndUnresolvable, "node(s) had no tabby IPv%d pool the pod may use (%s)", fs.family, strings.Join(excluded, "; "))
	}
	if fs.fixed {
		return framework.MaxNodeScore, nil
	}
	canClaim := r.in.Config.MaxBlocksPerHost <= 0 || r.nodeBlocks[n.Name] < r.in.Config.MaxBlocksPerHost
	var claimable, borrowable bool
	var names []string
	for _, ps := range admit {
		if ps.own[n.Name] > 0 {
			return ScoreOwnBlock, nil
		}
		claimable = claimable || ps.unclaimed
		borrowable = borrowable || ps.borrowable
		names = append(names, ps.obj.Name)
	}
	if canClaim && claimable {
		return ScoreClaim, nil
	}
	if !r.in.Config.StrictAffinity && borrowable {
		return ScoreBorrow, nil
	}
	why := "the pools have no unclaimed block left"
	if !canClaim {
		why = fmt.Sprintf("they hold the most blocks a node may (IPAMConfiguration maxBlocksPerHost=%d)", r.in.Config.MaxBlocksPerHost)
	}
	borrow := "borrowing is off (IPAMConfiguration strictAffinity)"
	if !r.in.Config.StrictAffinity {
		borrow = "no other node's block has a free address to borrow"
	}
	return 0, framework.Fail(framework.Unschedulable, "node(s) had no free tabby IPv%d address for the pod: their blocks in pool(s) %s are full, %s, and %s",
		fs.family, strings.Join(names, ", "), why, borrow)
}
