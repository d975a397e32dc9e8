package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultASNumber is the AS number nodes use when BGPConfiguration sets none.
const DefaultASNumber = 64512

// BGPConfigurationName is the name of the cluster-wide BGPConfiguration.
const BGPConfigurationName = "default"

// BGPConfiguration holds cluster-wide BGP settings (the one named "default").
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster
type BGPConfiguration struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec BGPConfigurationSpec `json:"spec"`
}

// BGPConfigurationSpec are the cluster-wide BGP settings.
type BGPConfigurationSpec struct {
	// ASNumber of the nodes (default 64512); a node may override it.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4294967295
	ASNumber *uint32 `json:"asNumber,omitempty"`

	// NodeToNodeMeshEnabled peers every node with every other (default true).
	// Once a route reflector exists, ordinary nodes peer only with reflectors.
	// +optional
	NodeToNodeMeshEnabled *bool `json:"nodeToNodeMeshEnabled,omitempty"`

	// ListenPort of the nodes' BGP speakers (default 179).
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	ListenPort *uint16 `json:"listenPort,omitempty"`

	// ServiceClusterIPs are advertised by every node.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	ServiceClusterIPs []ServiceIPBlock `json:"serviceClusterIPs,omitempty"`
	// ServiceExternalIPs are advertised by every node.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	ServiceExternalIPs []ServiceIPBlock `json:"serviceExternalIPs,omitempty"`
	// ServiceLoadBalancerIPs are advertised by every node.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	ServiceLoadBalancerIPs []ServiceIPBlock `json:"serviceLoadBalancerIPs,omitempty"`

	// NodeMeshPassword is an MD5 password for node-to-node sessions.
	// +optional
	NodeMeshPassword *SecretKeyRef `json:"nodeMeshPassword,omitempty"`

	// NodeMeshMaxRestartTime is the graceful-restart time of node-to-node
	// sessions (default 120s).
	// +optional
	NodeMeshMaxRestartTime *metav1.Duration `json:"nodeMeshMaxRestartTime,omitempty"`

	// RouteReflectorClusterID is the cluster ID of reflectors whose node has no
	// tabby.io/route-reflector-cluster-id label (default 244.0.0.1).
	// +optional
	// +kubebuilder:validation:XValidation:rule="isIP(self) && ip(self).family() == 4",message="routeReflectorClusterID must be written as an IPv4 address, such as 244.0.0.1"
	// +kubebuilder:validation:MaxLength=15
	RouteReflectorClusterID string `json:"routeReflectorClusterID,omitempty"`

	// NodeMeshMaxPrefixes is the most prefixes a node-to-node or
	// route-reflector session may send per address family (default 20000).
	// A peer that sends more is disconnected (BGP Cease, maximum number of
	// prefixes reached) and reconnects after a pause.
	// +optional
	// +kubebuilder:validation:Minimum=1
	NodeMeshMaxPrefixes *uint32 `json:"nodeMeshMaxPrefixes,omitempty"`
}

// ServiceIPBlock is a CIDR advertised over BGP.
type ServiceIPBlock struct {
	// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="cidr must be in CIDR notation"
	// +kubebuilder:validation:MaxLength=43
	CIDR string `json:"cidr"`
}

// SecretKeyRef names one key of a Secret.
type SecretKeyRef struct {
	// Namespace of the Secret (default: the namespace tabbyd runs in).
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`
	// Key in the Secret's data.
	// +kubebuilder:validation:MinLength=1
	Key string `json:"key"`
}

// BGPConfigurationList is a list of BGPConfigurations.
// +kubebuilder:object:root=true
type BGPConfigurationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BGPConfiguration `json:"items"`
}

// BGPPeer adds BGP sessions beyond the node mesh: to a router outside the
// cluster (peerIP and asNumber) or to selected nodes (peerSelector), from
// every node, one node, or the nodes a selector picks.
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:printcolumn:name="PeerIP",type=string,JSONPath=`.spec.peerIP`
// +kubebuilder:printcolumn:name="AS",type=integer,JSONPath=`.spec.asNumber`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`
type BGPPeer struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec BGPPeerSpec `json:"spec"`
}

// BGPPeerSpec says who peers with whom.
//
// +kubebuilder:validation:XValidation:rule="!(has(self.node) && has(self.nodeSelector))",message="set node or nodeSelector, not both"
// +kubebuilder:validation:XValidation:rule="has(self.peerSelector) != has(self.peerIP)",message="set exactly one of peerIP (with asNumber) and peerSelector"
// +kubebuilder:validation:XValidation:rule="!has(self.peerIP) || has(self.asNumber)",message="a peer given by peerIP needs its asNumber"
type BGPPeerSpec struct {
	// Node that peers; with neither node nor nodeSelector, every node peers.
	// +optional
	Node string `json:"node,omitempty"`
	// NodeSelector picks the nodes that peer.
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	// PeerIP of the remote speaker, an address or address:port ([v6]:port).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="isIP(self) || (self.startsWith('[') ? (self.indexOf(']:') > 1 && isIP(self.substring(1, self.indexOf(']:'))) && ip(self.substring(1, self.indexOf(']:'))).family() == 6 && self.substring(self.indexOf(']:') + 2).matches('^[0-9]{1,5}$') && int(self.substring(self.indexOf(']:') + 2)) >= 1 && int(self.substring(self.indexOf(']:') + 2)) <= 65535) : (self.indexOf(':') > 0 && isIP(self.substring(0, self.indexOf(':'))) && self.substring(self.indexOf(':') + 1).matches('^[0-9]{1,5}$') && int(self.substring(self.indexOf(':') + 1)) >= 1 && int(self.substring(self.indexOf(':') + 1)) <= 65535))",message="peerIP must be an IP address, IPv4:port or [IPv6]:port, with a port from 1 to 65535"
	PeerIP string `json:"peerIP,omitempty"`
	// ASNumber of the remote speaker.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=4294967295
	ASNumber uint32 `json:"asNumber,omitempty"`
	// PeerSelector peers with the nodes it selects instead of a peerIP.
	// +optional
	PeerSelector *metav1.LabelSelector `json:"peerSelector,omitempty"`
	// Password (MD5) from a Secret.
	// +optional
	Password *SecretKeyRef `json:"password,omitempty"`
	// SourceAddress: UseNodeIP (default) binds the session to the node's
	// address; None leaves the choice to the kernel.
	// +optional
	// +kubebuilder:validation:Enum=UseNodeIP;None
	SourceAddress string `json:"sourceAddress,omitempty"`
	// KeepOriginalNextHop keeps the next hop of routes sent to this peer.
	// +optional
	KeepOriginalNextHop bool `json:"keepOriginalNextHop,omitempty"`
	// MaxRestartTime is the graceful-restart time for this peer (default 120s).
	// +optional
	MaxRestartTime *metav1.Duration `json:"maxRestartTime,omitempty"`
	// Filters names BGPFilters whose rules apply to this peer's routes, in
	// order: the first rule that matches a route decides. Routes no rule
	// matches get tabby's defaults (see BGPFilter).
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +listType=atomic
	Filters []string `json:"filters,omitempty"`
	// MaxPrefixes is the most prefixes this peer may send per address
	// family (default 20000). A peer that sends more is disconnected (BGP
	// Cease, maximum number of prefixes reached) and reconnects after a
	// pause.
	// +optional
	// +kubebuilder:validation:Minimum=1
	MaxPrefixes *uint32 `json:"maxPrefixes,omitempty"`
}

// BGPPeerList is a list of BGPPeers.
// +kubebuilder:object:root=true
type BGPPeerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BGPPeer `json:"items"`
}

// BGPFilter holds rules that accept or reject routes exchanged with the
// BGPPeers naming it in their filters (as Calico's BGPFilter). Each list is
// evaluated in order and the first rule that matches a route decides; a
// route no rule matches gets tabby's defaults: from an external peer every
// route is accepted except the default route and tabby's own ranges (IP
// pools, node addresses and subnets, service CIDRs); to an external peer
// only the pools' blocks, borrowed addresses and service CIDRs are sent.
// Filters do not apply to sessions between cluster nodes, whose routes are
// always checked against IPAM.
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster
type BGPFilter struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec BGPFilterSpec `json:"spec"`
}

// BGPFilterSpec are the rules, by direction and address family.
type BGPFilterSpec struct {
	// ImportV4 rules apply to IPv4 routes received from the peer.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	// +listType=atomic
	ImportV4 []BGPFilterRuleV4 `json:"importV4,omitempty"`
	// ExportV4 rules apply to IPv4 routes sent to the peer.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	// +listType=atomic
	ExportV4 []BGPFilterRuleV4 `json:"exportV4,omitempty"`
	// ImportV6 rules apply to IPv6 routes received from the peer.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	// +listType=atomic
	ImportV6 []BGPFilterRuleV6 `json:"importV6,omitempty"`
	// ExportV6 rules apply to IPv6 routes sent to the peer.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	// +listType=atomic
	ExportV6 []BGPFilterRuleV6 `json:"exportV6,omitempty"`
}

// BGPFilterMatchOperator says how a rule's cidr matches a route's prefix.
// +kubebuilder:validation:Enum=Equal;In;NotIn
type BGPFilterMatchOperator string

// The match operators.
const (
	// MatchEqual: the prefix is the cidr.
	MatchEqual BGPFilterMatchOperator = "Equal"
	// MatchIn: the prefix is the cidr or inside it.
	MatchIn BGPFilterMatchOperator = "In"
	// MatchNotIn: the prefix is not inside the cidr.
	MatchNotIn BGPFilterMatchOperator = "NotIn"
)

// BGPFilterAction is what a matching rule does with a route.
// +kubebuilder:validation:Enum=Accept;Reject
type BGPFilterAction string

// The actions.
const (
	FilterAccept BGPFilterAction = "Accept"
	FilterReject BGPFilterAction = "Reject"
)

// BGPFilterRuleV4 matches IPv4 routes. A rule without cidr and
// matchOperator matches every route.
//
// +kubebuilder:validation:XValidation:rule="has(self.cidr) == has(self.matchOperator)",message="set cidr and matchOperator together, or neither to match every route"
type BGPFilterRuleV4 struct {
	// CIDR the route's prefix is matched against, e.g. 0.0.0.0/0.
	// +optional
	// +kubebuilder:validation:MaxLength=18
	// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self).ip().family() == 4",message="cidr must be an IPv4 CIDR such as 10.0.0.0/8"
	CIDR string `json:"cidr,omitempty"`
	// MatchOperator: Equal, In or NotIn.
	// +optional
	MatchOperator BGPFilterMatchOperator `json:"matchOperator,omitempty"`
	// Action: Accept or Reject.
	Action BGPFilterAction `json:"action"`
}

// BGPFilterRuleV6 matches IPv6 routes. A rule without cidr and
// matchOperator matches every route.
//
// +kubebuilder:validation:XValidation:rule="has(self.cidr) == has(self.matchOperator)",message="set cidr and matchOperator together, or neither to match every route"
type BGPFilterRuleV6 struct {
	// CIDR the route's prefix is matched against, e.g. ::/0.
	// +optional
	// +kubebuilder:validation:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self).ip().family() == 6",message="cidr must be an IPv6 CIDR such as fd00::/8"
	CIDR string `json:"cidr,omitempty"`
	// MatchOperator: Equal, In or NotIn.
	// +optional
	MatchOperator BGPFilterMatchOperator `json:"matchOperator,omitempty"`
	// Action: Accept or Reject.
	Action BGPFilterAction `json:"action"`
}

// BGPFilterList is a list of BGPFilters.
// +kubebuilder:object:root=true
type BGPFilterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BGPFilter `json:"items"`
}
