package nodeaffinity

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// Required is upstream's RequiredNodeAffinity (nodeSelector and required
// node affinity terms) with the same answers, compiled once per pod. It
// exists for speed: upstream's Match builds a fields.Set of every node it
// is asked about, which at 5,000 nodes was the largest allocation of a
// filter request (and PodTopologySpread asks it about every node too).
// Selectors are compiled to match the node's interned labels
// (framework.Selector): a handle compare per label, not a string hash in
// each node's label map. Terms with matchFields, which need the node's
// fields, still go through upstream's selector.
type Required struct {
	selector *framework.Selector // spec.nodeSelector; nil for none
	affinity bool                // required node affinity is set
	terms    []term              // its terms, empty ones left out as upstream does
}

// term is one node selector term.
type term struct {
	labels *framework.Selector                 // its matchExpressions (terms without matchFields)
	fields *nodeaffinity.LazyErrorNodeSelector // the whole term, when it has matchFields
	bad    bool                                // does not parse: matches nothing
}

// CompileRequired compiles the pod's nodeSelector and required node
// affinity.
func CompileRequired(pod *v1.Pod) Required {
	var r Required
	if len(pod.Spec.NodeSelector) > 0 {
		r.selector = framework.CompileSelector(labels.SelectorFromSet(pod.Spec.NodeSelector))
	}
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return r
	}
	r.affinity = true
	for _, t := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		switch {
		case len(t.MatchExpressions) == 0 && len(t.MatchFields) == 0:
			continue // nil or empty term selects no objects
		case len(t.MatchFields) > 0:
			r.terms = append(r.terms, term{fields: nodeaffinity.NewLazyErrorNodeSelector(&v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{t}})})
		default:
			c := term{bad: true}
			if sel, ok := expressionsAsSelector(t.MatchExpressions); ok {
				c = term{labels: framework.CompileSelector(sel)}
			}
			r.terms = append(r.terms, c)
		}
	}
	return r
}

// expressionsAsSelector is upstream's nodeSelectorRequirementsAsSelector:
// false when a requirement does not parse.
func expressionsAsSelector(reqs []v1.NodeSelectorRequirement) (labels.Selector, bool) {
	sel := labels.NewSelector()
	for _, e := range reqs {
		var op selection.Operator
		switch e.Operator {
		case v1.NodeSelectorOpIn:
			op = selection.In
		case v1.NodeSelectorOpNotIn:
			op = selection.NotIn
		case v1.NodeSelectorOpExists:
			op = selection.Exists
		case v1.NodeSelectorOpDoesNotExist:
			op = selection.DoesNotExist
		case v1.NodeSelectorOpGt:
			op = selection.GreaterThan
		case v1.NodeSelectorOpLt:
			op = selection.LessThan
		default:
			return nil, false
		}
		r, err := labels.NewRequirement(e.Key, op, e.Values)
		if err != nil {
			return nil, false
		}
		sel = sel.Add(*r)
	}
	return sel, true
}

// Match says whether the node satisfies the nodeSelector and one of the
// terms (a term that does not parse matches nothing, as upstream's Match
// with its error ignored).
func (r Required) Match(ni *framework.NodeInfo) bool {
	n := ni.Node
	ls := ni.Labels()
	if r.selector != nil && !r.selector.MatchesLabels(ls, n.Labels) {
		return false
	}
	if !r.affinity {
		return true
	}
	for _, t := range r.terms {
		switch {
		case t.bad:
		case t.fields != nil:
			if ok, _ := t.fields.Match(n); ok {
				return true
			}
		case t.labels.MatchesLabels(ls, n.Labels):
			return true
		}
	}
	return false
}
