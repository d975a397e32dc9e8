package extender

import (
	"context"

	v1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// Scheduler holds the placement rules the HTTP layer asks. The protocol
// layer decodes kube-scheduler's requests, resolves the nodes and encodes the
// answers; a Scheduler only decides. framework.Framework is the Scheduler
// tabby-scheduler-extender runs.
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

// Recycler is a Scheduler that reuses the memory of its answers: the HTTP
// layer hands each back once it has written it (and uses it no more).
type Recycler interface {
	Recycle(FilterResult)
	RecyclePriorities(extenderv1.HostPriorityList)
}

// FilterResult is what Scheduler.Filter decides.
type FilterResult = framework.FilterResult

var (
	_ Scheduler = (*framework.Framework)(nil)
	_ Recycler  = (*framework.Framework)(nil)
)
