// Package v1 holds tabby's resource types, API group tabby.io, version v1.
// They are Kubernetes-style objects, served by the API server as CRDs
// (deploy/crds is generated from these types by controller-gen).
//
// +kubebuilder:object:generate=true
// +groupName=tabby.io
package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of tabby's resources.
const GroupName = "tabby.io"

// SchemeGroupVersion is tabby.io/v1.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1"}

var (
	// SchemeBuilder registers tabby's types with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds tabby's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion,
		&IPPool{}, &IPPoolList{},
		&IPAMBlock{}, &IPAMBlockList{},
		&BlockAffinity{}, &BlockAffinityList{},
		&IPAMHandle{}, &IPAMHandleList{},
		&IPAMConfiguration{}, &IPAMConfigurationList{},
		&BGPConfiguration{}, &BGPConfigurationList{},
		&BGPPeer{}, &BGPPeerList{},
	)
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}

// Resource returns the GroupResource of a resource name such as "ippools".
func Resource(name string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(name).GroupResource()
}

// Labels and annotations tabby reads or writes.
const (
	// LabelNode marks IPAM objects with the node whose affinity they carry.
	LabelNode = "tabby.io/node"
	// LabelPool marks blocks with the name of the pool they were carved from.
	LabelPool = "tabby.io/pool"
	// AnnotationIPv4Pools on a Pod or Namespace: JSON list of IPv4 pool names.
	AnnotationIPv4Pools = "tabby.io/ipv4pools"
	// AnnotationIPv6Pools on a Pod or Namespace: JSON list of IPv6 pool names.
	AnnotationIPv6Pools = "tabby.io/ipv6pools"
	// AnnotationIPAddrs on a Pod: JSON list of specific addresses to assign.
	AnnotationIPAddrs = "tabby.io/ipAddrs"
	// LabelRouteReflector makes a node a BGP route reflector when "true".
	LabelRouteReflector = "tabby.io/route-reflector"
	// LabelRouteReflectorClusterID sets a reflector's cluster ID.
	LabelRouteReflectorClusterID = "tabby.io/route-reflector-cluster-id"
)
