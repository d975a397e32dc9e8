// Package nodename is kube-scheduler v1.35's NodeName plugin: a pod that
// names its node (spec.nodeName) fits only there.
package nodename

import (
	"context"

	v1 "k8s.io/api/core/v1"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// Name is the plugin's name, as upstream.
const Name = "NodeName"

// ErrReason is upstream's reason, word for word.
const ErrReason = "node(s) didn't match the requested node name"

// Plugin is the NodeName filter.
type Plugin struct{}

var _ framework.FilterPlugin = Plugin{}

// Name implements framework.Plugin.
func (Plugin) Name() string { return Name }

// PreFilter implements framework.FilterPlugin.
func (Plugin) PreFilter(_ context.Context, _ framework.Snapshot, pod *v1.Pod) (framework.NodeFilter, error) {
	want := pod.Spec.NodeName
	if want == "" {
		return nil, nil
	}
	// One status for every node it fails (the framework only reads it).
	fail := framework.Fail(framework.UnschedulableAndUnresolvable, ErrReason)
	return func(n *framework.NodeInfo) *framework.Status {
		if n.Node.Name != want {
			return fail
		}
		return nil
	}, nil
}
