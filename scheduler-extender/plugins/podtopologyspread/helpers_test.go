package podtopologyspread

import (
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// Builders shaped like upstream's scheduler testing wrappers, so the ported
// cases read like upstream's.

type podW struct{ v1.Pod }

func makePod(name string) *podW {
	return &podW{v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}}}
}

func (p *podW) obj() *v1.Pod { return &p.Pod }

func (p *podW) ns(ns string) *podW { p.Namespace = ns; return p }

func (p *podW) node(n string) *podW { p.Spec.NodeName = n; return p }

func (p *podW) label(k, v string) *podW {
	if p.Labels == nil {
		p.Labels = map[string]string{}
	}
	p.Labels[k] = v
	return p
}

func (p *podW) terminating() *podW {
	now := metav1.Now()
	p.DeletionTimestamp = &now
	return p
}

func (p *podW) spread(maxSkew int32, key string, mode v1.UnsatisfiableConstraintAction, sel *metav1.LabelSelector, minDomains *int32, affinity, taints *v1.NodeInclusionPolicy, matchLabelKeys []string) *podW {
	p.Spec.TopologySpreadConstraints = append(p.Spec.TopologySpreadConstraints, v1.TopologySpreadConstraint{
		MaxSkew:            maxSkew,
		TopologyKey:        key,
		WhenUnsatisfiable:  mode,
		LabelSelector:      sel,
		MinDomains:         minDomains,
		NodeAffinityPolicy: affinity,
		NodeTaintsPolicy:   taints,
		MatchLabelKeys:     matchLabelKeys,
	})
	return p
}

func (p *podW) nodeSelector(m map[string]string) *podW { p.Spec.NodeSelector = m; return p }

func (p *podW) nodeAffinity(key string, op v1.NodeSelectorOperator, vals ...string) *podW {
	p.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
			MatchExpressions: []v1.NodeSelectorRequirement{{Key: key, Operator: op, Values: vals}},
		}}},
	}}
	return p
}

// toleration is upstream's PodWrapper.Toleration: key Exists, any effect.
func (p *podW) toleration(key string) *podW {
	p.Spec.Tolerations = append(p.Spec.Tolerations, v1.Toleration{Key: key, Operator: v1.TolerationOpExists})
	return p
}

func (p *podW) owner(name, apiVersion, kind string) *podW {
	t := true
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: apiVersion, Kind: kind, Name: name, Controller: &t}}
	return p
}

type nodeW struct{ v1.Node }

func makeNode(name string) *nodeW {
	return &nodeW{v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}}
}

func (n *nodeW) label(k, v string) *nodeW {
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	n.Labels[k] = v
	return n
}

func (n *nodeW) taints(t []v1.Taint) *nodeW { n.Spec.Taints = t; return n }

func (n *nodeW) obj() *v1.Node { return &n.Node }

func exists(key string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: metav1.LabelSelectorOpExists}}}
}

func matchLabels(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func ptr[T any](v T) *T { return &v }

var (
	fooSelector = exists("foo")
	barSelector = exists("bar")
	honor       = v1.NodeInclusionPolicyHonor
	ignore      = v1.NodeInclusionPolicyIgnore
	taints      = []v1.Taint{{Key: v1.TaintNodeUnschedulable, Effect: v1.TaintEffectNoSchedule}}
)

// workloadSnapshot is a MapSnapshot that also knows Services, ReplicaSets,
// ReplicationControllers and StatefulSets.
type workloadSnapshot struct {
	*framework.MapSnapshot
	services []*v1.Service
	rcs      []*v1.ReplicationController
	rss      []*appsv1.ReplicaSet
	sss      []*appsv1.StatefulSet
}

var _ framework.WorkloadLister = (*workloadSnapshot)(nil)

func (w *workloadSnapshot) Services(ns string) []*v1.Service {
	var out []*v1.Service
	for _, s := range w.services {
		if s.Namespace == ns {
			out = append(out, s)
		}
	}
	return out
}

func (w *workloadSnapshot) ReplicationController(ns, name string) *v1.ReplicationController {
	for _, o := range w.rcs {
		if o.Namespace == ns && o.Name == name {
			return o
		}
	}
	return nil
}

func (w *workloadSnapshot) ReplicaSet(ns, name string) *appsv1.ReplicaSet {
	for _, o := range w.rss {
		if o.Namespace == ns && o.Name == name {
			return o
		}
	}
	return nil
}

func (w *workloadSnapshot) StatefulSet(ns, name string) *appsv1.StatefulSet {
	for _, o := range w.sss {
		if o.Namespace == ns && o.Name == name {
			return o
		}
	}
	return nil
}

// snapshot builds a Snapshot; with workload objects, one implementing
// framework.WorkloadLister.
func snapshot(nodes []*v1.Node, pods []*v1.Pod, objs ...any) framework.Snapshot {
	ms := framework.NewSnapshot(nodes, pods, nil)
	if len(objs) == 0 {
		return ms
	}
	w := &workloadSnapshot{MapSnapshot: ms}
	for _, o := range objs {
		switch o := o.(type) {
		case *v1.Service:
			w.services = append(w.services, o)
		case *v1.ReplicationController:
			w.rcs = append(w.rcs, o)
		case *appsv1.ReplicaSet:
			w.rss = append(w.rss, o)
		case *appsv1.StatefulSet:
			w.sss = append(w.sss, o)
		default:
			panic("snapshot: unexpected object")
		}
	}
	return w
}

// listSnapshot is a Snapshot over a given list of NodeInfos (sorted by node
// name), so that successive snapshots can share NodeInfos as the
// extender's copy-on-write cache's do.
type listSnapshot struct {
	list   []*framework.NodeInfo
	byName map[string]*framework.NodeInfo
}

func newListSnapshot(list []*framework.NodeInfo) *listSnapshot {
	s := &listSnapshot{list: list, byName: make(map[string]*framework.NodeInfo, len(list))}
	for _, ni := range list {
		s.byName[ni.Node.Name] = ni
	}
	return s
}

func (s *listSnapshot) List() []*framework.NodeInfo         { return s.list }
func (s *listSnapshot) Get(name string) *framework.NodeInfo { return s.byName[name] }
func (s *listSnapshot) Namespace(name string) *v1.Namespace { return nil }
