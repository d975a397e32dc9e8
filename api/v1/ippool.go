package v1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EncapMode says when traffic to a pool's addresses on other nodes is
// encapsulated.
// +kubebuilder:validation:Enum=Never;Always;CrossSubnet
type EncapMode string

const (
	// EncapNever routes natively (the default).
	EncapNever EncapMode = "Never"
	// EncapAlways encapsulates all traffic to other nodes.
	EncapAlways EncapMode = "Always"
	// EncapCrossSubnet encapsulates only when the next hop is off the local subnet.
	EncapCrossSubnet EncapMode = "CrossSubnet"
)

// IPPoolAllowedUse says what addresses of a pool may be used for.
// +kubebuilder:validation:Enum=Workload;Tunnel
type IPPoolAllowedUse string

const (
	// UseWorkload: pod addresses.
	UseWorkload IPPoolAllowedUse = "Workload"
	// UseTunnel: a node's IPIP or VXLAN tunnel address.
	UseTunnel IPPoolAllowedUse = "Tunnel"
)

// Default block sizes (prefix lengths) when an IPPool leaves blockSize unset.
const (
	DefaultBlockSizeV4 = 26
	DefaultBlockSizeV6 = 122
)

// IPPool is a range of addresses that tabby hands out to pods, carved into
// node-affine blocks.
//
// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=ipp
// +kubebuilder:printcolumn:name="CIDR",type=string,JSONPath=`.spec.cidr`
// +kubebuilder:printcolumn:name="BlockSize",type=integer,JSONPath=`.spec.blockSize`
// +kubebuilder:printcolumn:name="IPIP",type=string,JSONPath=`.spec.ipipMode`
// +kubebuilder:printcolumn:name="VXLAN",type=string,JSONPath=`.spec.vxlanMode`
// +kubebuilder:printcolumn:name="Disabled",type=boolean,JSONPath=`.spec.disabled`
type IPPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec IPPoolSpec `json:"spec"`
}

// IPPoolSpec is the desired state of an IPPool.
//
// +kubebuilder:validation:XValidation:rule="!isCIDR(self.cidr) || !has(self.blockSize) || (cidr(self.cidr).ip().family() == 4 ? (self.blockSize >= 20 && self.blockSize <= 32) : (self.blockSize >= 116 && self.blockSize <= 128))",message="blockSize is out of range: use 20 to 32 for an IPv4 pool and 116 to 128 for an IPv6 pool (the defaults are 26 and 122)",messageExpression="'blockSize %d is out of range for an IPv%d pool: use %s'.format([self.blockSize, cidr(self.cidr).ip().family(), cidr(self.cidr).ip().family() == 4 ? '20 to 32 (the default is 26)' : '116 to 128 (the default is 122)'])"
// +kubebuilder:validation:XValidation:rule="!isCIDR(self.cidr) || (has(self.blockSize) ? self.blockSize : (cidr(self.cidr).ip().family() == 4 ? 26 : 122)) >= cidr(self.cidr).prefixLength()",message="blockSize is smaller than the pool's prefix length, so one block would not fit in the pool: set blockSize to at least the CIDR's prefix length, or use a larger CIDR",messageExpression="'%s is smaller than the prefix length of cidr %s, so one block would not fit in the pool: set blockSize to at least %d, or use a larger cidr'.format([has(self.blockSize) ? 'blockSize %d'.format([self.blockSize]) : 'the default blockSize %d'.format([cidr(self.cidr).ip().family() == 4 ? 26 : 122]), self.cidr, cidr(self.cidr).prefixLength()])"
// +kubebuilder:validation:XValidation:rule="!(has(self.ipipMode) && self.ipipMode != 'Never' && has(self.vxlanMode) && self.vxlanMode != 'Never')",message="ipipMode and vxlanMode cannot both be enabled on one pool: set one of them to Never"
type IPPoolSpec struct {
	// CIDR is the pool's range, e.g. 10.244.0.0/16 or fd00:10:244::/56.
	// +kubebuilder:validation:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="isCIDR(self)",message="cidr must be a network in CIDR notation, such as 10.244.0.0/16 or fd00:10:244::/56"
	// +kubebuilder:validation:XValidation:rule="!isCIDR(self) || cidr(self) == cidr(self).masked()",message="cidr has host bits set: write the network address (for example 10.244.0.0/16, not 10.244.1.0/16)",messageExpression="'cidr %s has host bits set: write the network address, %s'.format([self, string(cidr(self).masked())])"
	CIDR string `json:"cidr"`

	// BlockSize is the prefix length of the blocks the pool is carved into
	// (IPv4 20-32, default 26; IPv6 116-128, default 122). It cannot change
	// while the pool has blocks.
	// +optional
	BlockSize int `json:"blockSize,omitempty"`

	// IPIPMode: Never (default), Always or CrossSubnet.
	// +optional
	IPIPMode EncapMode `json:"ipipMode,omitempty"`

	// VXLANMode: Never (default), Always or CrossSubnet.
	// +optional
	VXLANMode EncapMode `json:"vxlanMode,omitempty"`

	// NATOutgoing masquerades traffic from this pool's pods to destinations
	// outside every pool.
	// +optional
	NATOutgoing bool `json:"natOutgoing,omitempty"`

	// Disabled pools give out no new addresses; existing ones stay.
	// +optional
	Disabled bool `json:"disabled,omitempty"`

	// DisableBGPExport keeps this pool's blocks out of BGP advertisements.
	// +optional
	DisableBGPExport bool `json:"disableBGPExport,omitempty"`

	// NodeSelector limits which nodes may claim blocks of this pool; empty or
	// unset means every node.
	// +optional
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`

	// AllowedUses says what the pool's addresses are for (default: Workload and Tunnel).
	// +optional
	// +listType=set
	AllowedUses []IPPoolAllowedUse `json:"allowedUses,omitempty"`
}

// IPPoolList is a list of IPPools.
// +kubebuilder:object:root=true
type IPPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IPPool `json:"items"`
}
