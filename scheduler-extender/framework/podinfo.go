package framework

import (
	"fmt"
	"unique"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
)

// PodInfo is a pod with what the plugins would otherwise work out from it on
// every request (parsed affinity terms), worked out once when the pod
// enters the cache. A PodInfo is read-only once made.
type PodInfo struct {
	Pod *v1.Pod
	// Namespace is the pod's namespace, interned: comparing two is
	// comparing pointers, and walking many pods does not touch every
	// pod's copy of the name.
	Namespace unique.Handle[string]
	// Labels is the pod's labels, interned (Selector matches them).
	Labels []Label

	// The pod's pod affinity and anti-affinity terms, parsed as
	// kube-scheduler v1.35 parses them (framework.NewPodInfo): label
	// selectors compiled, namespaces resolved. A list whose terms do not all
	// parse is nil, and ParseError says why.
	RequiredAffinityTerms      []AffinityTerm
	RequiredAntiAffinityTerms  []AffinityTerm
	PreferredAffinityTerms     []WeightedAffinityTerm
	PreferredAntiAffinityTerms []WeightedAffinityTerm
	// ParseError is why some terms did not parse (nil when all did), in
	// upstream's words: "requiredAffinityTerms: values[0][service]: Invalid
	// value: ...". The API server's validation rejects such pods, so this
	// only happens with pods that bypassed it.
	ParseError error
}

// AffinityTerm is a parsed v1.PodAffinityTerm.
//
// matchLabelKeys and mismatchLabelKeys are not read here: as in
// kube-scheduler v1.35, the API server merges them into labelSelector when
// the pod is created (MatchLabelKeysInPodAffinity, GA and locked on since
// v1.33), and the scheduler uses labelSelector as stored.
type AffinityTerm struct {
	// Namespaces is the term's namespaces list; when the list is empty and
	// namespaceSelector is nil, the pod's own namespace.
	Namespaces map[string]struct{}
	// Selector is the compiled labelSelector (nil labelSelector: matches
	// nothing).
	Selector labels.Selector
	// LabelSelector is Selector compiled for PodInfos' interned labels.
	LabelSelector *Selector
	// TopologyKey is the node label the term groups nodes by; Key is it
	// interned, to read a NodeInfo's interned labels.
	TopologyKey string
	Key         unique.Handle[string]
	// NamespaceSelector is the compiled namespaceSelector, matched against
	// a namespace's labels: nil selector matches no namespace, {} every
	// namespace.
	NamespaceSelector labels.Selector
	// AllNamespaces says NamespaceSelector is {} (matches every namespace).
	AllNamespaces bool
}

// WeightedAffinityTerm is a parsed v1.WeightedPodAffinityTerm.
type WeightedAffinityTerm struct {
	AffinityTerm
	Weight int32
}

// Matches says whether pod is one the term selects: in one of its
// namespaces or in a namespace with labels nsLabels (the labels of the
// pod's namespace) that NamespaceSelector matches, and with labels that
// Selector matches. As upstream's AffinityTerm.Matches.
func (t *AffinityTerm) Matches(pod *v1.Pod, nsLabels labels.Set) bool {
	if _, ok := t.Namespaces[pod.Namespace]; ok || t.NamespaceSelector.Matches(nsLabels) {
		return t.Selector.Matches(labels.Set(pod.Labels))
	}
	return false
}

// MatchesInfo is Matches for a PodInfo, by its interned labels (cheaper
// when one pod is matched against many terms).
func (t *AffinityTerm) MatchesInfo(p *PodInfo, nsLabels labels.Set) bool {
	if _, ok := t.Namespaces[p.Pod.Namespace]; ok || t.NamespaceSelector.Matches(nsLabels) {
		if t.LabelSelector == nil {
			return t.Selector.Matches(labels.Set(p.Pod.Labels))
		}
		return t.LabelSelector.Matches(p)
	}
	return false
}

// NewPodInfo makes the PodInfo of a pod, parsing its pod affinity terms.
// A term that does not parse is reported in ParseError (upstream's cache
// keeps such pods too).
func NewPodInfo(pod *v1.Pod) *PodInfo {
	pi := &PodInfo{Pod: pod, Namespace: unique.Make(pod.Namespace), Labels: InternLabels(pod.Labels)}
	a := pod.Spec.Affinity
	if a == nil || (a.PodAffinity == nil && a.PodAntiAffinity == nil) {
		return pi
	}
	var errs []error
	var err error
	if pa := a.PodAffinity; pa != nil {
		if pi.RequiredAffinityTerms, err = affinityTerms(pod, pa.RequiredDuringSchedulingIgnoredDuringExecution); err != nil {
			errs = append(errs, fmt.Errorf("requiredAffinityTerms: %w", err))
		}
	}
	if pa := a.PodAntiAffinity; pa != nil {
		if pi.RequiredAntiAffinityTerms, err = affinityTerms(pod, pa.RequiredDuringSchedulingIgnoredDuringExecution); err != nil {
			errs = append(errs, fmt.Errorf("requiredAntiAffinityTerms: %w", err))
		}
	}
	if pa := a.PodAffinity; pa != nil {
		if pi.PreferredAffinityTerms, err = weightedAffinityTerms(pod, pa.PreferredDuringSchedulingIgnoredDuringExecution); err != nil {
			errs = append(errs, fmt.Errorf("preferredAffinityTerms: %w", err))
		}
	}
	if pa := a.PodAntiAffinity; pa != nil {
		if pi.PreferredAntiAffinityTerms, err = weightedAffinityTerms(pod, pa.PreferredDuringSchedulingIgnoredDuringExecution); err != nil {
			errs = append(errs, fmt.Errorf("preferredAntiAffinityTerms: %w", err))
		}
	}
	pi.ParseError = utilerrors.NewAggregate(errs)
	return pi
}

// Update is the PodInfo of pod, an update of p's pod: as upstream's
// PodInfo.Update, when pod is the same pod (same UID) its parsed terms are
// kept, since a pod's affinity and namespace cannot change (and the terms
// do not depend on its labels); otherwise the pod is parsed anew. p is not
// changed (snapshots may hold it); p may be nil.
func (p *PodInfo) Update(pod *v1.Pod) *PodInfo {
	if p == nil || p.Pod == nil || pod.UID == "" || p.Pod.UID != pod.UID {
		return NewPodInfo(pod)
	}
	c := *p
	c.Pod = pod
	c.Labels = InternLabels(pod.Labels)
	return &c
}

func affinityTerms(pod *v1.Pod, in []v1.PodAffinityTerm) ([]AffinityTerm, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make([]AffinityTerm, len(in))
	for i := range in {
		if err := parseAffinityTerm(pod, &in[i], &out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func weightedAffinityTerms(pod *v1.Pod, in []v1.WeightedPodAffinityTerm) ([]WeightedAffinityTerm, error) {
	if len(in) == 0 {
		return nil, nil
	}
	out := make([]WeightedAffinityTerm, len(in))
	for i := range in {
		if err := parseAffinityTerm(pod, &in[i].PodAffinityTerm, &out[i].AffinityTerm); err != nil {
			return nil, err
		}
		out[i].Weight = in[i].Weight
	}
	return out, nil
}

func parseAffinityTerm(pod *v1.Pod, in *v1.PodAffinityTerm, out *AffinityTerm) error {
	sel, err := metav1.LabelSelectorAsSelector(in.LabelSelector)
	if err != nil {
		return err
	}
	nsSel, err := metav1.LabelSelectorAsSelector(in.NamespaceSelector)
	if err != nil {
		return err
	}
	ns := make(map[string]struct{}, max(len(in.Namespaces), 1))
	if len(in.Namespaces) == 0 && in.NamespaceSelector == nil {
		ns[pod.Namespace] = struct{}{}
	}
	for _, n := range in.Namespaces {
		ns[n] = struct{}{}
	}
	*out = AffinityTerm{
		Namespaces:        ns,
		Selector:          sel,
		LabelSelector:     CompileSelector(sel),
		TopologyKey:       in.TopologyKey,
		Key:               unique.Make(in.TopologyKey),
		NamespaceSelector: nsSel,
		AllNamespaces:     nsSel.Empty(),
	}
	return nil
}

// HasAffinity says whether the pod has pod affinity or anti-affinity terms.
func (p *PodInfo) HasAffinity() bool {
	a := p.Pod.Spec.Affinity
	return a != nil && (a.PodAffinity != nil || a.PodAntiAffinity != nil)
}

// HasRequiredAntiAffinity says whether the pod has required anti-affinity.
func (p *PodInfo) HasRequiredAntiAffinity() bool {
	a := p.Pod.Spec.Affinity
	return a != nil && a.PodAntiAffinity != nil && len(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) > 0
}
