// Package nodeaffinity is kube-scheduler v1.35's NodeAffinity plugin:
// spec.nodeSelector and required node affinity filter (terms ORed,
// expressions ANDed, matchFields on metadata.name); preferred node affinity
// scores by weight, normalised to the best node.
package nodeaffinity

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// Name is the plugin's name, as upstream.
const Name = "NodeAffinity"

// ErrReasonPod is upstream's reason, word for word.
const ErrReasonPod = "node(s) didn't match Pod's node affinity/selector"

// Plugin is the NodeAffinity filter and score.
type Plugin struct{}

var (
	_ framework.FilterPlugin = Plugin{}
	_ framework.ScorePlugin  = Plugin{}
)

// Name implements framework.Plugin.
func (Plugin) Name() string { return Name }

// PreFilter implements framework.FilterPlugin. As upstream, a required term
// that does not parse is not an error: it matches nothing.
func (Plugin) PreFilter(_ context.Context, _ framework.Snapshot, pod *v1.Pod) (framework.NodeFilter, error) {
	a := pod.Spec.Affinity
	if len(pod.Spec.NodeSelector) == 0 && (a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil) {
		return nil, nil
	}
	required := CompileRequired(pod)
	// One status for every node it fails (the framework only reads it).
	fail := framework.Fail(framework.UnschedulableAndUnresolvable, ErrReasonPod)
	return func(n *framework.NodeInfo) *framework.Status {
		if !required.Match(n) {
			return fail
		}
		return nil
	}, nil
}

// Score implements framework.ScorePlugin: the sum of the weights of the
// preferred terms a node matches, normalised so the best node gets
// MaxNodeScore (upstream's DefaultNormalizeScore).
func (Plugin) Score(_ context.Context, _ framework.Snapshot, pod *v1.Pod, nodes []*framework.NodeInfo) ([]int64, error) {
	scores := framework.NewScores(len(nodes))
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || len(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution) == 0 {
		return scores, nil // upstream PreScore skips: every node scores 0
	}
	terms, err := nodeaffinity.NewPreferredSchedulingTerms(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution)
	if err != nil {
		return nil, fmt.Errorf("parsing preferred node affinity: %w", err)
	}
	for i, n := range nodes {
		scores[i] = terms.Score(n.Node)
	}
	framework.DefaultNormalizeScore(framework.MaxNodeScore, false, scores)
	return scores, nil
}
