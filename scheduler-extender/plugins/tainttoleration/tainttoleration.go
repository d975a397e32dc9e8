// Package tainttoleration is kube-scheduler v1.35's TaintToleration plugin:
// NoSchedule and NoExecute taints a pod does not tolerate filter the node;
// PreferNoSchedule taints it does not tolerate lower the node's score.
package tainttoleration

import (
	"context"

	v1 "k8s.io/api/core/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// Name is the plugin's name, as upstream.
const Name = "TaintToleration"

// ErrReason is upstream v1.35's reason, word for word.
const ErrReason = "node(s) had untolerated taint(s)"

// comparisonOperators is the TaintTolerationComparisonOperators feature
// gate (alpha in v1.35, off by default): tolerations with Gt and Lt.
const comparisonOperators = false

// Plugin is the TaintToleration filter and score.
type Plugin struct{}

var (
	_ framework.FilterPlugin = Plugin{}
	_ framework.ScorePlugin  = Plugin{}
)

// Name implements framework.Plugin.
func (Plugin) Name() string { return Name }

func doNotSchedule(t *v1.Taint) bool {
	return t.Effect == v1.TaintEffectNoSchedule || t.Effect == v1.TaintEffectNoExecute
}

// PreFilter implements framework.FilterPlugin. Tolerations match as
// upstream: Equal compares values, Exists any value, an empty key with
// Exists tolerates every taint, an empty effect matches every effect.
func (Plugin) PreFilter(_ context.Context, _ framework.Snapshot, pod *v1.Pod) (framework.NodeFilter, error) {
	tolerations := pod.Spec.Tolerations
	// One status for every node it fails (the framework only reads it).
	fail := framework.Fail(framework.UnschedulableAndUnresolvable, ErrReason)
	return func(n *framework.NodeInfo) *framework.Status {
		if _, bad := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), n.Node.Spec.Taints, tolerations, doNotSchedule, comparisonOperators); bad {
			return fail
		}
		return nil
	}, nil
}

// Score implements framework.ScorePlugin: fewer untolerated
// PreferNoSchedule taints is better (upstream's reversed
// DefaultNormalizeScore).
func (Plugin) Score(_ context.Context, _ framework.Snapshot, pod *v1.Pod, nodes []*framework.NodeInfo) ([]int64, error) {
	var tolerations []v1.Toleration
	for _, t := range pod.Spec.Tolerations {
		if t.Effect == "" || t.Effect == v1.TaintEffectPreferNoSchedule {
			tolerations = append(tolerations, t)
		}
	}
	scores := framework.NewScores(len(nodes))
	for i, n := range nodes {
		for _, taint := range n.Node.Spec.Taints {
			if taint.Effect == v1.TaintEffectPreferNoSchedule && !corev1helpers.TolerationsTolerateTaint(klog.Background(), tolerations, &taint, comparisonOperators) {
				scores[i]++
			}
		}
	}
	framework.DefaultNormalizeScore(framework.MaxNodeScore, true, scores)
	return scores, nil
}
