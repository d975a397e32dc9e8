package extender

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// Scheduler holds the placement rules the HTTP layer asks. The protocol
// layer decodes kube-scheduler's requests, resolves the nodes and encodes the
// answers; a Scheduler only decides.
type Scheduler interface {
	// Filter splits nodes into those the pod may run on and those it may
	// not. Failed maps a node name to why it failed where preemption could
	// help; Unresolvable where no preemption can.
	Filter(ctx context.Context, pod *v1.Pod, nodes []*v1.Node) FilterResult
	// Prioritize scores every node from MinExtenderPriority to
	// MaxExtenderPriority (0..10), in the order of nodes. An error means the
	// pod cannot be scored (kube-scheduler then ignores this extender's
	// scores for the pod).
	Prioritize(ctx context.Context, pod *v1.Pod, nodes []*v1.Node) (extenderv1.HostPriorityList, error)
}

// FilterResult is what Scheduler.Filter decides.
type FilterResult struct {
	Passing      []*v1.Node
	Failed       map[string]string
	Unresolvable map[string]string
}

// The reasons kube-scheduler v1.35's plugins give, word for word.
const (
	// ReasonNodeName is the NodeName plugin's ErrReason.
	ReasonNodeName = "node(s) didn't match the requested node name"
	// ReasonNodeAffinity is the NodeAffinity plugin's ErrReasonPod.
	ReasonNodeAffinity = "node(s) didn't match Pod's node affinity/selector"
)

// NodeAffinityScheduler implements the NodeName and NodeAffinity plugins of
// kube-scheduler v1.35: spec.nodeName, spec.nodeSelector and required node
// affinity filter (both unresolvable, as upstream); preferred node affinity
// scores, max-normalised to 0..10.
type NodeAffinityScheduler struct{}

var _ Scheduler = NodeAffinityScheduler{}

// Filter implements Scheduler.
func (NodeAffinityScheduler) Filter(_ context.Context, pod *v1.Pod, nodes []*v1.Node) FilterResult {
	res := FilterResult{Failed: map[string]string{}, Unresolvable: map[string]string{}}
	// As upstream: parse errors in the required terms are ignored for
	// backwards compatibility (a term that does not parse matches nothing).
	required := nodeaffinity.GetRequiredNodeAffinity(pod)
	for _, n := range nodes {
		if pod.Spec.NodeName != "" && pod.Spec.NodeName != n.Name {
			res.Unresolvable[n.Name] = ReasonNodeName
			continue
		}
		if ok, _ := required.Match(n); !ok {
			res.Unresolvable[n.Name] = ReasonNodeAffinity
			continue
		}
		res.Passing = append(res.Passing, n)
	}
	return res
}

// Prioritize implements Scheduler.
func (NodeAffinityScheduler) Prioritize(_ context.Context, pod *v1.Pod, nodes []*v1.Node) (extenderv1.HostPriorityList, error) {
	out := make(extenderv1.HostPriorityList, len(nodes))
	for i, n := range nodes {
		out[i].Host = n.Name
	}
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || len(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution) == 0 {
		return out, nil // upstream PreScore skips: every node scores 0
	}
	terms, err := nodeaffinity.NewPreferredSchedulingTerms(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution)
	if err != nil {
		return nil, fmt.Errorf("parsing preferred node affinity: %w", err)
	}
	for i, n := range nodes {
		out[i].Score = terms.Score(n)
	}
	normalize(out, extenderv1.MaxExtenderPriority, false)
	return out, nil
}

// normalize is kube-scheduler's helper.DefaultNormalizeScore with the
// extender's maximum: scores scale so the highest becomes max; all zero stays
// zero (or all max when reversed).
func normalize(scores extenderv1.HostPriorityList, max int64, reverse bool) {
	var top int64
	for _, s := range scores {
		if s.Score > top {
			top = s.Score
		}
	}
	if top == 0 {
		if reverse {
			for i := range scores {
				scores[i].Score = max
			}
		}
		return
	}
	for i := range scores {
		s := max * scores[i].Score / top
		if reverse {
			s = max - s
		}
		scores[i].Score = s
	}
}
