// Package podtopologyspread is kube-scheduler v1.35's PodTopologySpread
// plugin, reimplemented on tabby's extender framework with the same answers:
//
//   - DoNotSchedule constraints filter: a node passes a constraint when
//     'matching pods in its domain' + 'the pod itself, if it matches' -
//     'the global minimum' <= maxSkew, the minimum being 0 while fewer than
//     minDomains domains are eligible. A node without a constraint's
//     topology key fails UnschedulableAndUnresolvable ("... (missing required
//     label)"); a skew too large fails Unschedulable.
//   - ScheduleAnyway constraints score: per constraint, matching pods in the
//     node's domain times log(number of domains + 2), plus maxSkew-1;
//     normalised so the fewest matching pods get 100 and nodes missing a
//     topology key get 0.
//   - Counting, as upstream: all nodes of the snapshot (not only the
//     request's), only pods in the pod's namespace that the constraint's
//     selector matches, not terminating pods (deletionTimestamp set); a node
//     counts for a constraint only when it has every constraint's topology
//     key and passes the constraint's nodeAffinityPolicy (default Honor: the
//     pod's nodeSelector and required node affinity) and nodeTaintsPolicy
//     (default Ignore; Honor: the pod tolerates its NoSchedule and NoExecute
//     taints). An empty labelSelector ({}) counts no pods (v1.35's
//     countPodsMatchSelector), a null one matches nothing.
//   - matchLabelKeys: the pod's values of those keys are ANDed into the
//     selector (feature MatchLabelKeysInPodTopologySpread, on in v1.35); keys
//     the pod lacks are ignored, and a null labelSelector stays matching
//     nothing.
//   - Default constraints for a pod without any (New: kube-scheduler's
//     system defaults, ScheduleAnyway hostname maxSkew 3 and zone maxSkew 5)
//     take their selector from the Services selecting the pod and the
//     ReplicationController, ReplicaSet or StatefulSet controlling it. Those
//     come from the Snapshot when it implements framework.WorkloadLister;
//     otherwise, and when none selects the pod (a bare pod), the pod has no
//     constraints: every node passes and every node scores 0 (upstream's
//     Skip).
//
// The extender does not preempt, so upstream's AddPod/RemovePod (the
// preemption what-ifs) have no counterpart: PreFilter counts once per pod
// and the per-node check is O(constraints) map lookups.
//
// Counting reads every pod of the cluster; the plugin remembers, per
// namespace and selector, each node's count with the NodeInfo it came from,
// and recounts only nodes whose NodeInfo is another object (counts.go). That
// relies on the Snapshot contract: a NodeInfo a Snapshot returned is never
// changed afterwards (the extender's cache replaces it instead).
package podtopologyspread

import (
	"fmt"
	"runtime"
	"sync"
	"unique"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
	"github.com/tabbynet/tabby/scheduler-extender/plugins/nodeaffinity"
)

// Name is the plugin's name, as upstream.
const Name = "PodTopologySpread"

// Filter reasons, upstream v1.35's word for word.
const (
	ErrReasonConstraintsNotMatch = "node(s) didn't match pod topology spread constraints"
	ErrReasonNodeLabelNotMatch   = ErrReasonConstraintsNotMatch + " (missing required label)"
)

// Feature gates of v1.35 at their defaults. NodeInclusionPolicy is GA (always
// on) and is not a switch here.
const (
	// MatchLabelKeysInPodTopologySpread: beta, on.
	enableMatchLabelKeys = true
	// TaintTolerationComparisonOperators: alpha, off.
	enableTaintComparisonOperators = false
)

// DefaultingType says where default constraints come from, as
// PodTopologySpreadArgs.defaultingType.
type DefaultingType string

const (
	// SystemDefaulting: kube-scheduler's built-in defaults.
	SystemDefaulting DefaultingType = "System"
	// ListDefaulting: Args.DefaultConstraints.
	ListDefaulting DefaultingType = "List"
)

// Args are PodTopologySpreadArgs: the constraints a pod without any gets.
type Args struct {
	// DefaultConstraints without labelSelector (it is derived per pod);
	// only with ListDefaulting.
	DefaultConstraints []v1.TopologySpreadConstraint
	// DefaultingType, "" meaning SystemDefaulting (as upstream's v1
	// defaulting).
	DefaultingType DefaultingType
}

// systemDefaultConstraints are upstream's.
var systemDefaultConstraints = []v1.TopologySpreadConstraint{
	{TopologyKey: v1.LabelHostname, WhenUnsatisfiable: v1.ScheduleAnyway, MaxSkew: 3},
	{TopologyKey: v1.LabelTopologyZone, WhenUnsatisfiable: v1.ScheduleAnyway, MaxSkew: 5},
}

// Plugin is the PodTopologySpread filter and score.
type Plugin struct {
	defaultConstraints []v1.TopologySpreadConstraint
	systemDefaulted    bool
	// workers bounds the goroutines of the per-node passes (0: GOMAXPROCS).
	workers int
	// counts are the matching pods per node of recent selectors.
	counts countCache
}

var (
	_ framework.FilterPlugin = (*Plugin)(nil)
	_ framework.ScorePlugin  = (*Plugin)(nil)
)

// New is the plugin as kube-scheduler's default profile configures it
// (system default constraints).
func New() *Plugin {
	return &Plugin{defaultConstraints: systemDefaultConstraints, systemDefaulted: true}
}

// NewWithArgs is the plugin with PodTopologySpreadArgs, validated as
// kube-scheduler validates them.
func NewWithArgs(args Args) (*Plugin, error) {
	if args.DefaultingType == "" {
		args.DefaultingType = SystemDefaulting
	}
	if err := validateArgs(args); err != nil {
		return nil, fmt.Errorf("PodTopologySpread args: %w", err)
	}
	if args.DefaultingType == SystemDefaulting {
		return New(), nil
	}
	return &Plugin{defaultConstraints: args.DefaultConstraints}, nil
}

func validateArgs(args Args) error {
	var errs field.ErrorList
	if args.DefaultingType != SystemDefaulting && args.DefaultingType != ListDefaulting {
		errs = append(errs, field.NotSupported(field.NewPath("defaultingType"), args.DefaultingType, []string{string(SystemDefaulting), string(ListDefaulting)}))
	} else if args.DefaultingType == SystemDefaulting && len(args.DefaultConstraints) > 0 {
		errs = append(errs, field.Invalid(field.NewPath("defaultingType"), args.DefaultingType, "must be List when defaultConstraints are not empty"))
	}
	path := field.NewPath("defaultConstraints")
	for i, c := range args.DefaultConstraints {
		p := path.Index(i)
		if c.MaxSkew <= 0 {
			errs = append(errs, field.Invalid(p.Child("maxSkew"), c.MaxSkew, "not in valid range (0, inf)"))
		}
		if c.TopologyKey == "" {
			errs = append(errs, field.Required(p.Child("topologyKey"), "can not be empty"))
		} else {
			errs = append(errs, metav1validation.ValidateLabelName(c.TopologyKey, p.Child("topologyKey"))...)
		}
		switch c.WhenUnsatisfiable {
		case v1.DoNotSchedule, v1.ScheduleAnyway:
		case "":
			errs = append(errs, field.Required(p.Child("whenUnsatisfiable"), "can not be empty"))
		default:
			errs = append(errs, field.NotSupported(p.Child("whenUnsatisfiable"), c.WhenUnsatisfiable, []string{string(v1.DoNotSchedule), string(v1.ScheduleAnyway)}))
		}
		if c.LabelSelector != nil {
			errs = append(errs, field.Forbidden(p.Child("labelSelector"), "constraint must not define a selector, as they deduced for each pod"))
		}
		for _, o := range args.DefaultConstraints[:i] {
			if o.TopologyKey == c.TopologyKey && o.WhenUnsatisfiable == c.WhenUnsatisfiable {
				errs = append(errs, field.Duplicate(p, fmt.Sprintf("{%v, %v}", c.TopologyKey, c.WhenUnsatisfiable)))
				break
			}
		}
	}
	return errs.ToAggregate()
}

// Name implements framework.Plugin.
func (*Plugin) Name() string { return Name }

// constraint is a v1.TopologySpreadConstraint with its selector parsed and
// its defaults applied.
type constraint struct {
	MaxSkew     int32
	TopologyKey string
	// key is TopologyKey interned: nodes' labels are read by it.
	key           unique.Handle[string]
	Selector      labels.Selector
	MinDomains    int32
	HonorAffinity bool // nodeAffinityPolicy Honor (the default)
	HonorTaints   bool // nodeTaintsPolicy Honor (default Ignore)
}

// parseConstraints keeps the constraints of one action, as upstream's
// filterTopologySpreadConstraints.
func parseConstraints(in []v1.TopologySpreadConstraint, podLabels map[string]string, action v1.UnsatisfiableConstraintAction) ([]constraint, error) {
	var out []constraint
	for _, c := range in {
		if c.WhenUnsatisfiable != action {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(c.LabelSelector)
		if err != nil {
			return nil, err
		}
		if enableMatchLabelKeys && len(c.MatchLabelKeys) > 0 {
			match := labels.Set{}
			for _, k := range c.MatchLabelKeys {
				if v, ok := podLabels[k]; ok {
					match[k] = v
				}
			}
			if len(match) > 0 {
				sel = mergeSelector(match, sel)
			}
		}
		tc := constraint{
			MaxSkew:       c.MaxSkew,
			TopologyKey:   c.TopologyKey,
			key:           unique.Make(c.TopologyKey),
			Selector:      sel,
			MinDomains:    1,
			HonorAffinity: true,
		}
		if c.MinDomains != nil {
			tc.MinDomains = *c.MinDomains
		}
		if c.NodeAffinityPolicy != nil {
			tc.HonorAffinity = *c.NodeAffinityPolicy == v1.NodeInclusionPolicyHonor
		}
		if c.NodeTaintsPolicy != nil {
			tc.HonorTaints = *c.NodeTaintsPolicy == v1.NodeInclusionPolicyHonor
		}
		out = append(out, tc)
	}
	return out, nil
}

// mergeSelector ANDs the pod's matchLabelKeys values into the selector; a
// selector that matches nothing (null labelSelector) stays so.
func mergeSelector(match labels.Set, s labels.Selector) labels.Selector {
	reqs, ok := s.Requirements()
	if !ok {
		return s
	}
	return labels.SelectorFromSet(match).Add(reqs...)
}

// constraintsFor is a pod's constraints of one action: its own, or, when it
// has none, the default constraints with the selector derived from its
// workloads. what is "hard" or "soft", for the error.
func (pl *Plugin) constraintsFor(snap framework.Snapshot, pod *v1.Pod, action v1.UnsatisfiableConstraintAction, what string) ([]constraint, error) {
	if len(pod.Spec.TopologySpreadConstraints) > 0 {
		cs, err := parseConstraints(pod.Spec.TopologySpreadConstraints, pod.Labels, action)
		if err != nil {
			return nil, fmt.Errorf("obtaining pod's %s topology spread constraints: %w", what, err)
		}
		return cs, nil
	}
	cs, err := parseConstraints(pl.defaultConstraints, pod.Labels, action)
	if err != nil {
		return nil, fmt.Errorf("setting default %s topology spread constraints: %w", what, err)
	}
	if len(cs) == 0 {
		return nil, nil
	}
	wl, ok := snap.(framework.WorkloadLister)
	if !ok {
		return nil, nil
	}
	sel := defaultSelector(pod, wl)
	if sel.Empty() {
		return nil, nil
	}
	for i := range cs {
		cs[i].Selector = sel
	}
	return cs, nil
}

var (
	rcKind = v1.SchemeGroupVersion.WithKind("ReplicationController")
	rsKind = appsv1.SchemeGroupVersion.WithKind("ReplicaSet")
	ssKind = appsv1.SchemeGroupVersion.WithKind("StatefulSet")
)

// defaultSelector is upstream's helper.DefaultSelector: the selectors of the
// Services selecting the pod, ANDed with its controller's.
func defaultSelector(pod *v1.Pod, wl framework.WorkloadLister) labels.Selector {
	set := labels.Set{}
	podLabels := labels.Set(pod.Labels)
	for _, svc := range wl.Services(pod.Namespace) {
		if svc.Spec.Selector == nil {
			continue // a nil selector matches nothing
		}
		if labels.Set(svc.Spec.Selector).AsSelectorPreValidated().Matches(podLabels) {
			set = labels.Merge(set, svc.Spec.Selector)
		}
	}
	sel := set.AsSelector()
	owner := metav1.GetControllerOfNoCopy(pod)
	if owner == nil {
		return sel
	}
	gv, err := schema.ParseGroupVersion(owner.APIVersion)
	if err != nil {
		return sel
	}
	addLabelSelector := func(ls *metav1.LabelSelector) {
		if other, err := metav1.LabelSelectorAsSelector(ls); err == nil {
			if r, ok := other.Requirements(); ok {
				sel = sel.Add(r...)
			}
		}
	}
	switch gv.WithKind(owner.Kind) {
	case rcKind:
		if rc := wl.ReplicationController(pod.Namespace, owner.Name); rc != nil {
			set = labels.Merge(set, rc.Spec.Selector)
			sel = set.AsSelector()
		}
	case rsKind:
		if rs := wl.ReplicaSet(pod.Namespace, owner.Name); rs != nil {
			addLabelSelector(rs.Spec.Selector)
		}
	case ssKind:
		if ss := wl.StatefulSet(pod.Namespace, owner.Name); ss != nil {
			addLabelSelector(ss.Spec.Selector)
		}
	}
	return sel
}

// hasAllKeys says whether a node has every constraint's topology key.
func hasAllKeys(ni *framework.NodeInfo, cs []constraint) bool {
	ls := ni.Labels()
	for i := range cs {
		if _, ok := framework.LookupLabel(ls, cs[i].key); !ok {
			return false
		}
	}
	return true
}

// noValue is the domain of a node without the topology key, where
// upstream reads a missing label as "".
var noValue = unique.Make("")

// domain is the node's value of the topology key, noValue when it has
// none.
func domain(ls []framework.Label, key unique.Handle[string]) unique.Handle[string] {
	if v, ok := framework.LookupLabel(ls, key); ok {
		return v
	}
	return noValue
}

// counter counts a node's matching pods for several constraints, once per
// distinct selector.
type counter struct {
	ns string
	// sels are the distinct selectors; nil for one that counts no pod
	// (empty, or matching nothing).
	sels []labels.Selector
	// of maps a constraint to its index in sels.
	of []int
}

func newCounter(ns string, cs []constraint) *counter {
	c := &counter{ns: ns, of: make([]int, len(cs))}
	seen := map[string]int{}
	for i := range cs {
		s := cs[i].Selector
		_, ok := s.Requirements()
		if s.Empty() || !ok {
			s = nil
		}
		key := "\x00"
		if s != nil {
			key = s.String()
		}
		j, dup := seen[key]
		if !dup {
			j = len(c.sels)
			seen[key] = j
			c.sels = append(c.sels, s)
		}
		c.of[i] = j
	}
	return c
}

// need is, per distinct selector, a mark per node of the nodes whose count
// is needed; nil for selectors that count no pod.
func (c *counter) need(nodes int) [][]bool {
	out := make([][]bool, len(c.sels))
	for g, sel := range c.sels {
		if sel != nil {
			out[g] = marks.Get(nodes)
		}
	}
	return out
}

// putNeed gives back the marks of need.
func putNeed(need [][]bool) {
	for _, g := range need {
		if g != nil {
			marks.Put(g)
		}
	}
}

// A request's marks per node (which count, which are needed) are as long
// as the cluster's nodes, 5,000 at Kubernetes' limit, and dropped when the
// request's state is worked out: they come from a pool rather than being
// new garbage per request.
var marks framework.Slices[bool]

// count is upstream's countPodsMatchSelector.
func count(pods []*framework.PodInfo, sel labels.Selector, ns string) int {
	if sel == nil {
		return 0
	}
	n := 0
	for _, p := range pods {
		pod := p.Pod
		// Terminating pods do not count (kubernetes#87621).
		if pod.DeletionTimestamp != nil || pod.Namespace != ns {
			continue
		}
		if sel.Matches(labels.Set(pod.Labels)) {
			n++
		}
	}
	return n
}

// inclusion decides a node's nodeAffinityPolicy and nodeTaintsPolicy for the
// pod; both are the same for every constraint, so each is worked out at most
// once per node.
type inclusion struct {
	pod         *v1.Pod
	affinity    nodeaffinity.Required
	logger      klog.Logger
	needAff     bool
	needTaints  bool
	tolerations []v1.Toleration
}

func newInclusion(pod *v1.Pod, cs []constraint) *inclusion {
	in := &inclusion{pod: pod, logger: klog.Background(), tolerations: pod.Spec.Tolerations}
	for i := range cs {
		in.needAff = in.needAff || cs[i].HonorAffinity
		in.needTaints = in.needTaints || cs[i].HonorTaints
	}
	if in.needAff {
		in.affinity = nodeaffinity.CompileRequired(pod)
	}
	return in
}

func doNotScheduleTaint(t *v1.Taint) bool {
	return t.Effect == v1.TaintEffectNoSchedule || t.Effect == v1.TaintEffectNoExecute
}

// node says whether the node passes the pod's node affinity and tolerates its
// taints (each true when not needed).
func (in *inclusion) node(ni *framework.NodeInfo) (affOK, taintsOK bool) {
	n := ni.Node
	affOK, taintsOK = true, true
	if in.needAff {
		// Parsing errors are ignored, as upstream, for backwards
		// compatibility: a term that does not parse matches nothing.
		affOK = in.affinity.Match(ni)
	}
	if in.needTaints {
		_, untolerated := corev1helpers.FindMatchingUntoleratedTaint(in.logger, n.Spec.Taints, in.tolerations, doNotScheduleTaint, enableTaintComparisonOperators)
		taintsOK = !untolerated
	}
	return affOK, taintsOK
}

func (c *constraint) includes(affOK, taintsOK bool) bool {
	return (!c.HonorAffinity || affOK) && (!c.HonorTaints || taintsOK)
}

// minChunk is the fewest nodes worth a goroutine.
const minChunk = 256

// parallelize runs fn over [0, n) in chunks on up to workers goroutines.
func (pl *Plugin) parallelize(n int, fn func(lo, hi int)) {
	workers := pl.workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	workers = min(workers, (n+minChunk-1)/minChunk)
	if workers <= 1 {
		fn(0, n)
		return
	}
	chunk := (n + workers - 1) / workers
	var wg sync.WaitGroup
	for lo := 0; lo < n; lo += chunk {
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			fn(lo, hi)
		}(lo, min(lo+chunk, n))
	}
	wg.Wait()
}
