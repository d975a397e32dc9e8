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
		&BGPFilter{}, &BGPFilterList{},
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

// Node annotations. tabbyd publishes its node's routing identity on the
// Kubernetes Node, where every other node reads it (as Calico does in its
// Kubernetes-datastore mode); users set AnnotationASNumber to override the
// cluster's AS number for one node.
const (
	// AnnotationNodeIPv4Address: the node's IPv4 address with its subnet's
	// prefix length, e.g. "192.168.1.10/24" (the prefix makes CrossSubnet
	// decidable by every peer).
	AnnotationNodeIPv4Address = "tabby.io/ipv4-address"
	// AnnotationNodeIPv6Address: the same for IPv6.
	AnnotationNodeIPv6Address = "tabby.io/ipv6-address"
	// AnnotationASNumber: this node's AS number, overriding BGPConfiguration.
	AnnotationASNumber = "tabby.io/as-number"
	// AnnotationVXLANTunnelMAC: the MAC of the node's VXLAN device.
	AnnotationVXLANTunnelMAC = "tabby.io/vxlan-tunnel-mac"
	// AnnotationVXLANTunnelAddress: the address of the node's VXLAN device.
	AnnotationVXLANTunnelAddress = "tabby.io/vxlan-tunnel-address"
	// AnnotationIPIPTunnelAddress: the address of the node's tunl0.
	AnnotationIPIPTunnelAddress = "tabby.io/ipip-tunnel-address"
)
