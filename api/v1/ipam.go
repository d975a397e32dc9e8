package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IPAMBlock is one block of a pool: a small CIDR whose addresses are handed
// out one by one, normally all to pods of the node the block is affine to.
// Every change is a compare-and-swap on the object's resourceVersion.
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:printcolumn:name="CIDR",type=string,JSONPath=`.spec.cidr`
// +kubebuilder:printcolumn:name="Affinity",type=string,JSONPath=`.spec.affinity`
type IPAMBlock struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec IPAMBlockSpec `json:"spec"`
}

// IPAMBlockSpec is the state of one block.
type IPAMBlockSpec struct {
	// CIDR of the block.
	// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="cidr must be in CIDR notation"
	// +kubebuilder:validation:MaxLength=43
	CIDR string `json:"cidr"`

	// Affinity is "host:<node>" for a block claimed by a node, empty for none.
	// +optional
	Affinity string `json:"affinity,omitempty"`

	// Allocations has one entry per address of the block (by ordinal): the
	// index into Attributes of the allocation holding it, or -1 when free.
	Allocations []int `json:"allocations"`

	// Unallocated lists the free ordinals in the order they will be handed
	// out; released ordinals go to the back, so an address is reused as late
	// as possible.
	Unallocated []int `json:"unallocated"`

	// Attributes describe the holders of allocations.
	// +optional
	Attributes []AllocationAttribute `json:"attributes,omitempty"`

	// SequenceNumber increases with every allocation in the block.
	// +optional
	SequenceNumber uint64 `json:"sequenceNumber,omitempty"`

	// SequenceNumberForAllocation maps an ordinal to the SequenceNumber at the
	// time it was allocated. A release that names an older number is refused,
	// so an address freed and handed out again is never released by a stale
	// request.
	// +optional
	SequenceNumberForAllocation map[string]uint64 `json:"sequenceNumberForAllocation,omitempty"`

	// Deleted marks a block that is being removed; nothing may be allocated from it.
	// +optional
	Deleted bool `json:"deleted,omitempty"`
}

// AllocationAttribute says who holds an allocation.
type AllocationAttribute struct {
	// HandleID names the attachment holding the address: <network>.<containerID>
	// for pods, ipip-tunnel-addr-<node> or vxlan-tunnel-addr-<node> for tunnels.
	HandleID string `json:"handleID"`
	// Use is Workload or Tunnel.
	// +optional
	Use IPPoolAllowedUse `json:"use,omitempty"`
	// Namespace of the pod, when the holder is a pod.
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// Pod name, when the holder is a pod.
	// +optional
	Pod string `json:"pod,omitempty"`
	// Node where the address was allocated.
	// +optional
	Node string `json:"node,omitempty"`
	// Time of the allocation.
	// +optional
	Timestamp *metav1.Time `json:"timestamp,omitempty"`
}

// IPAMBlockList is a list of IPAMBlocks.
// +kubebuilder:object:root=true
type IPAMBlockList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IPAMBlock `json:"items"`
}

// AffinityState is the life cycle of a BlockAffinity.
// +kubebuilder:validation:Enum=pending;confirmed;pendingDeletion
type AffinityState string

const (
	// AffinityPending: the node is claiming the block.
	AffinityPending AffinityState = "pending"
	// AffinityConfirmed: the block is the node's.
	AffinityConfirmed AffinityState = "confirmed"
	// AffinityPendingDeletion: the node is giving the block up.
	AffinityPendingDeletion AffinityState = "pendingDeletion"
)

// BlockAffinity records that a node claimed a block.
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="CIDR",type=string,JSONPath=`.spec.cidr`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.spec.state`
type BlockAffinity struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec BlockAffinitySpec `json:"spec"`
}

// BlockAffinitySpec is a node's claim on a block.
type BlockAffinitySpec struct {
	// State: pending, confirmed or pendingDeletion.
	State AffinityState `json:"state"`
	// Node holding the block.
	// +kubebuilder:validation:MinLength=1
	Node string `json:"node"`
	// CIDR of the block.
	// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="cidr must be in CIDR notation"
	// +kubebuilder:validation:MaxLength=43
	CIDR string `json:"cidr"`
	// Deleted marks an affinity that is being removed.
	// +optional
	Deleted bool `json:"deleted,omitempty"`
}

// BlockAffinityList is a list of BlockAffinities.
// +kubebuilder:object:root=true
type BlockAffinityList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BlockAffinity `json:"items"`
}

// IPAMHandle records every address one attachment holds, so that releasing
// the attachment (CNI DEL) frees them all, once, however often it is called.
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:printcolumn:name="Handle",type=string,JSONPath=`.spec.handleID`
type IPAMHandle struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec IPAMHandleSpec `json:"spec"`
}

// IPAMHandleSpec lists the blocks where a handle holds addresses.
type IPAMHandleSpec struct {
	// HandleID as written in block attributes (the object name is derived from it).
	// +kubebuilder:validation:MinLength=1
	HandleID string `json:"handleID"`
	// Block maps a block CIDR to the number of addresses held in it.
	// +optional
	Block map[string]int `json:"block,omitempty"`
	// Deleted marks a handle that is being removed.
	// +optional
	Deleted bool `json:"deleted,omitempty"`
}

// IPAMHandleList is a list of IPAMHandles.
// +kubebuilder:object:root=true
type IPAMHandleList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IPAMHandle `json:"items"`
}

// IPAMConfigurationName is the name of the one IPAMConfiguration tabby reads.
const IPAMConfigurationName = "default"

// DefaultMaxBlocksPerHost applies when no IPAMConfiguration exists.
const DefaultMaxBlocksPerHost = 20

// IPAMConfiguration holds cluster-wide IPAM settings; tabby reads the one
// named "default".
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster
// +kubebuilder:validation:XValidation:rule="self.metadata.name == 'default'",message="tabby reads only the IPAMConfiguration named default: name it default"
type IPAMConfiguration struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec IPAMConfigurationSpec `json:"spec"`
}

// IPAMConfigurationSpec are the cluster-wide IPAM settings.
type IPAMConfigurationSpec struct {
	// StrictAffinity forbids borrowing addresses from other nodes' blocks.
	// +optional
	StrictAffinity bool `json:"strictAffinity,omitempty"`
	// MaxBlocksPerHost limits how many blocks one node may claim (default 20;
	// 0 means no limit).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=20
	MaxBlocksPerHost int `json:"maxBlocksPerHost"`
}

// IPAMConfigurationList is a list of IPAMConfigurations.
// +kubebuilder:object:root=true
type IPAMConfigurationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IPAMConfiguration `json:"items"`
}
