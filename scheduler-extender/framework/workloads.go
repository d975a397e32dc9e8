package framework

import (
	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
)

// WorkloadLister is what a Snapshot may also know: the Services,
// ReplicationControllers, ReplicaSets and StatefulSets a pod belongs to.
// kube-scheduler derives a pod's default topology spread selector from them
// (PodTopologySpread's system default constraints); a Snapshot that does not
// implement WorkloadLister gets no defaulted constraints, as upstream when
// no such object selects the pod.
type WorkloadLister interface {
	// Services is every Service of a namespace.
	Services(namespace string) []*v1.Service
	// ReplicationController is one by name, nil when unknown.
	ReplicationController(namespace, name string) *v1.ReplicationController
	// ReplicaSet is one by name, nil when unknown.
	ReplicaSet(namespace, name string) *appsv1.ReplicaSet
	// StatefulSet is one by name, nil when unknown.
	StatefulSet(namespace, name string) *appsv1.StatefulSet
}
