package interpodaffinity

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// podB builds test pods, after upstream's st.MakePod wrappers.
type podB struct{ p *v1.Pod }

func mkPod() *podB { return &podB{p: &v1.Pod{}} }

func (b *podB) name(n string) *podB { b.p.Name = n; return b }
func (b *podB) ns(ns string) *podB  { b.p.Namespace = ns; return b }
func (b *podB) node(n string) *podB { b.p.Spec.NodeName = n; return b }
func (b *podB) obj() *v1.Pod        { return b.p }

func (b *podB) labels(l map[string]string) *podB {
	for k, v := range l {
		b.label(k, v)
	}
	return b
}

func (b *podB) label(k, v string) *podB {
	if b.p.Labels == nil {
		b.p.Labels = map[string]string{}
	}
	b.p.Labels[k] = v
	return b
}

func (b *podB) affinity(a *v1.Affinity) *podB { b.p.Spec.Affinity = a; return b }

type kind int

const (
	reqAffinity kind = iota
	reqAnti
	prefAffinity
	prefAnti
)

// term adds a term of the kind (preferred terms get weight 1, as upstream's
// wrappers give).
func (b *podB) term(k kind, t v1.PodAffinityTerm) *podB { return b.weighted(k, 1, t) }

func (b *podB) weighted(k kind, weight int32, t v1.PodAffinityTerm) *podB {
	if b.p.Spec.Affinity == nil {
		b.p.Spec.Affinity = &v1.Affinity{}
	}
	a := b.p.Spec.Affinity
	switch k {
	case reqAffinity, prefAffinity:
		if a.PodAffinity == nil {
			a.PodAffinity = &v1.PodAffinity{}
		}
	default:
		if a.PodAntiAffinity == nil {
			a.PodAntiAffinity = &v1.PodAntiAffinity{}
		}
	}
	switch k {
	case reqAffinity:
		a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution = append(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution, t)
	case reqAnti:
		a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution = append(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution, t)
	case prefAffinity:
		a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution = append(a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution, v1.WeightedPodAffinityTerm{Weight: weight, PodAffinityTerm: t})
	case prefAnti:
		a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution = append(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution, v1.WeightedPodAffinityTerm{Weight: weight, PodAffinityTerm: t})
	}
	return b
}

func (b *podB) in(k kind, key, topologyKey string, vals ...string) *podB {
	return b.term(k, v1.PodAffinityTerm{LabelSelector: sel(req(key, metav1.LabelSelectorOpIn, vals...)), TopologyKey: topologyKey})
}

func (b *podB) notIn(k kind, key, topologyKey string, vals ...string) *podB {
	return b.term(k, v1.PodAffinityTerm{LabelSelector: sel(req(key, metav1.LabelSelectorOpNotIn, vals...)), TopologyKey: topologyKey})
}

func (b *podB) exists(k kind, key, topologyKey string) *podB {
	return b.term(k, v1.PodAffinityTerm{LabelSelector: sel(req(key, metav1.LabelSelectorOpExists)), TopologyKey: topologyKey})
}

func req(key string, op metav1.LabelSelectorOperator, vals ...string) metav1.LabelSelectorRequirement {
	return metav1.LabelSelectorRequirement{Key: key, Operator: op, Values: vals}
}

func sel(reqs ...metav1.LabelSelectorRequirement) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: reqs}
}

func mkNode(name string, labels map[string]string) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func mkNamespace(name string, labels map[string]string) *v1.Namespace {
	return &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

// teamNamespaces are upstream's test namespaces.
func teamNamespaces() []*v1.Namespace {
	t1, t2 := map[string]string{"team": "team1"}, map[string]string{"team": "team2"}
	return []*v1.Namespace{
		mkNamespace("subteam1.team1", t1),
		mkNamespace("subteam2.team1", t1),
		mkNamespace("subteam1.team2", t2),
		mkNamespace("subteam2.team2", t2),
	}
}

// podWithRequiredTerms is upstream's createPodWithAffinityTerms.
func podWithRequiredTerms(namespace, nodeName string, labels map[string]string, affinity, anti []v1.PodAffinityTerm) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Labels: labels, Namespace: namespace},
		Spec: v1.PodSpec{
			NodeName: nodeName,
			Affinity: &v1.Affinity{
				PodAffinity:     &v1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: affinity},
				PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: anti},
			},
		},
	}
}
