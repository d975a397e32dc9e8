// Package v1beta1 mirrors the part of the Kubernetes SIG Network
// ClusterNetworkPolicy API (sigs.k8s.io/network-policy-api v0.3.0,
// policy.networking.k8s.io/v1beta1) that tabby enforces, field for field
// and with the same JSON names, so objects read from the API server decode
// into it unchanged. tabby does not import the upstream module: its Go
// types pull Kubernetes libraries a minor version ahead of tabby's. The
// CRD itself is the upstream one, vendored in deploy/crds.
package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The API's group, version and resource.
const (
	GroupName = "policy.networking.k8s.io"
	Version   = "v1beta1"
	Resource  = "clusternetworkpolicies"
	Kind      = "ClusterNetworkPolicy"
)

// GroupVersionResource is what a dynamic client lists and watches.
var GroupVersionResource = schema.GroupVersionResource{Group: GroupName, Version: Version, Resource: Resource}

// ClusterNetworkPolicy is a cluster-wide network policy.
type ClusterNetworkPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              ClusterNetworkPolicySpec `json:"spec"`
}

// ClusterNetworkPolicySpec is the desired behaviour: the tier (Admin
// before NetworkPolicy, Baseline after), the priority within the tier
// (0-1000, lower first), the pods it applies to and its rules, each list
// evaluated in order.
type ClusterNetworkPolicySpec struct {
	Tier     Tier                              `json:"tier"`
	Priority int32                             `json:"priority"`
	Subject  ClusterNetworkPolicySubject       `json:"subject"`
	Ingress  []ClusterNetworkPolicyIngressRule `json:"ingress,omitempty"`
	Egress   []ClusterNetworkPolicyEgressRule  `json:"egress,omitempty"`
}

// Tier is Admin or Baseline.
type Tier string

// The tiers.
const (
	AdminTier    Tier = "Admin"
	BaselineTier Tier = "Baseline"
)

// ClusterNetworkPolicySubject selects the pods the policy applies to:
// exactly one field is set.
type ClusterNetworkPolicySubject struct {
	Namespaces *metav1.LabelSelector `json:"namespaces,omitempty"`
	Pods       *NamespacedPod        `json:"pods,omitempty"`
}

// ClusterNetworkPolicyIngressRule is an action on traffic to the subject
// from any of From, on any of Protocols (none: all traffic).
type ClusterNetworkPolicyIngressRule struct {
	Name      string                            `json:"name,omitempty"`
	Action    ClusterNetworkPolicyRuleAction    `json:"action"`
	From      []ClusterNetworkPolicyIngressPeer `json:"from"`
	Protocols []ClusterNetworkPolicyProtocol    `json:"protocols,omitempty"`
}

// ClusterNetworkPolicyEgressRule is an action on traffic from the subject
// to any of To, on any of Protocols (none: all traffic).
type ClusterNetworkPolicyEgressRule struct {
	Name      string                           `json:"name,omitempty"`
	Action    ClusterNetworkPolicyRuleAction   `json:"action"`
	To        []ClusterNetworkPolicyEgressPeer `json:"to"`
	Protocols []ClusterNetworkPolicyProtocol   `json:"protocols,omitempty"`
}

// ClusterNetworkPolicyRuleAction is Accept, Deny or Pass.
type ClusterNetworkPolicyRuleAction string

// The actions.
const (
	ActionAccept ClusterNetworkPolicyRuleAction = "Accept"
	ActionDeny   ClusterNetworkPolicyRuleAction = "Deny"
	ActionPass   ClusterNetworkPolicyRuleAction = "Pass"
)

// ClusterNetworkPolicyIngressPeer is a source: exactly one field is set.
type ClusterNetworkPolicyIngressPeer struct {
	Namespaces *metav1.LabelSelector `json:"namespaces,omitempty"`
	Pods       *NamespacedPod        `json:"pods,omitempty"`
}

// ClusterNetworkPolicyEgressPeer is a destination: exactly one field is
// set. Nodes and DomainNames are experimental.
type ClusterNetworkPolicyEgressPeer struct {
	Namespaces  *metav1.LabelSelector `json:"namespaces,omitempty"`
	Pods        *NamespacedPod        `json:"pods,omitempty"`
	Nodes       *metav1.LabelSelector `json:"nodes,omitempty"`
	Networks    []CIDR                `json:"networks,omitempty"`
	DomainNames []DomainName          `json:"domainNames,omitempty"`
}

// NamespacedPod selects the pods matching PodSelector in the namespaces
// matching NamespaceSelector (empty selectors select all).
type NamespacedPod struct {
	NamespaceSelector metav1.LabelSelector `json:"namespaceSelector"`
	PodSelector       metav1.LabelSelector `json:"podSelector"`
}

// ClusterNetworkPolicyProtocol matches one protocol's destination port,
// or a named container port of the destination pod (experimental):
// exactly one field is set.
type ClusterNetworkPolicyProtocol struct {
	TCP                  *ClusterNetworkPolicyProtocolTCP  `json:"tcp,omitempty"`
	UDP                  *ClusterNetworkPolicyProtocolUDP  `json:"udp,omitempty"`
	SCTP                 *ClusterNetworkPolicyProtocolSCTP `json:"sctp,omitempty"`
	DestinationNamedPort string                            `json:"destinationNamedPort,omitempty"`
}

// ClusterNetworkPolicyProtocolTCP matches TCP to a destination port.
type ClusterNetworkPolicyProtocolTCP struct {
	DestinationPort *Port `json:"destinationPort,omitempty"`
}

// ClusterNetworkPolicyProtocolUDP matches UDP to a destination port.
type ClusterNetworkPolicyProtocolUDP struct {
	DestinationPort *Port `json:"destinationPort,omitempty"`
}

// ClusterNetworkPolicyProtocolSCTP matches SCTP to a destination port.
type ClusterNetworkPolicyProtocolSCTP struct {
	DestinationPort *Port `json:"destinationPort,omitempty"`
}

// Port is a port Number or a Range.
type Port struct {
	Number int32      `json:"number,omitempty"`
	Range  *PortRange `json:"range,omitempty"`
}

// PortRange is Start to End, both included.
type PortRange struct {
	Start int32 `json:"start"`
	End   int32 `json:"end"`
}

// CIDR is an address range such as 10.0.0.0/8 or fd00::/8.
type CIDR string

// DomainName is a domain name peer (experimental; tabby does not enforce
// it).
type DomainName string
