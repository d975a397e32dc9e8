// Package contract holds the names tabby's CNI plugins, tabbyd and the
// scheduler extender must agree on: the kernel objects one of them creates
// and another finds by name (host veths, route protocols, chain and comment
// prefixes) and the Kubernetes objects one writes and another watches (the
// heartbeat Lease, tabby's namespace). The plugin binary and tabbyd are
// upgraded on different schedules, so what they share lives in neither;
// changing a value here breaks nodes running a mix of versions.
//
// It imports only the standard library, as contract/agentapi (the protocol
// on tabbyd's CNI socket) does, so that the plugin stays small.
package contract

import (
	"crypto/sha1"
	"encoding/hex"
	"strings"
)

// DefaultNamespace is the namespace tabby is installed in (deploy/): where
// tabbyd renews its heartbeat Lease and the CNI token Secret lives.
const DefaultNamespace = "tabby-system"

// NodePodSelector finds the pods of the tabby-node DaemonSet (deploy/), and
// NodeContainer is tabbyd's container in them: tabbyctl execs there to
// ask a node's tabbyd, which serves only on the node's loopback.
const (
	NodePodSelector = "app.kubernetes.io/name=tabby-node"
	NodeContainer   = "tabbyd"
)

// HeartbeatLeasePrefix starts the name of the Lease each tabbyd renews in
// its namespace while it is ready ("tabbyd-<node>"); the scheduler
// extender watches these Leases to tell which nodes can wire pods.
const HeartbeatLeasePrefix = "tabbyd-"

// HeartbeatLeaseName is the name of node's heartbeat Lease.
func HeartbeatLeaseName(node string) string { return HeartbeatLeasePrefix + node }

// NodeOfHeartbeatLease is the node whose heartbeat Lease is called name;
// false when name is no heartbeat Lease.
func NodeOfHeartbeatLease(name string) (string, bool) {
	node, ok := strings.CutPrefix(name, HeartbeatLeasePrefix)
	return node, ok && node != ""
}

// Route protocols (rtm_protocol) mark the routes tabby owns, so that each
// owner lists and deletes only its own and `ip route` shows whose a route
// is. Numbers 80 and 81 are unassigned in iproute2's rt_protos.
const (
	// RouteProtocolPod marks the host-side route to a pod, which the CNI
	// plugin adds with the veth.
	RouteProtocolPod = 80
	// RouteProtocolNode marks the routes tabbyd programs (to other nodes'
	// blocks, through tunnels, blackholes of its own blocks).
	RouteProtocolNode = 81
)

// HostVethPrefix starts the name of every host-side veth the CNI plugin
// creates; tabbyd's policy rules match pod traffic by it (-i/-o tab+).
const HostVethPrefix = "tab"

// DeviceIfacePrefix starts the names of tabbyd's own devices (tabby.vxlan).
// They also start with HostVethPrefix but are no pod's veth (a veth is
// "tab" and 11 hex digits, never "tabby…"), so policy rules exclude them.
const DeviceIfacePrefix = "tabby"

// DefaultIfName is the usual pod interface name; other names are mixed into
// the host veth name so a pod with two tabby interfaces gets two names.
const DefaultIfName = "eth0"

// ChainPrefix starts every iptables chain tabby owns (TABBY-NP-… of the
// policy, TABBY-NAT-OUTGOING of routing); nothing else is tabby's to flush.
const ChainPrefix = "TABBY-"

// CommentPrefix starts the comment (-m comment) of every rule tabby adds to
// a built-in chain, and the alias (IFLA_IFALIAS) of every host veth.
const CommentPrefix = "tabby:"

// PodID is the pod identity a runtime passes in CNI_ARGS.
type PodID struct {
	Namespace, Name string
	// UID (K8S_POD_UID) is passed by some runtimes (containerd, CRI-O).
	UID string
}

// Known tells whether the runtime named the pod.
func (p PodID) Known() bool { return p.Namespace != "" && p.Name != "" }

func (p PodID) String() string {
	if !p.Known() {
		return "(no pod identity)"
	}
	return p.Namespace + "/" + p.Name
}

// HostVethName is the name of the host end of an attachment's veth: "tab"
// and 11 hex digits of the SHA-1 of the pod identity ("namespace/name"),
// or of "containerID/ifname" when the runtime gave no pod identity. A pod
// interface other than eth0 adds "/ifname" to the pod identity. The name is
// stable across sandboxes of one pod, as Calico's cali* names are, so a
// stale link of an earlier sandbox is found and replaced; tabbyd derives it
// from the Pod alone to name the pod's interface in policy rules.
func HostVethName(pod PodID, containerID, ifName string) string {
	var key string
	if pod.Known() {
		key = pod.Namespace + "/" + pod.Name
		if ifName != "" && ifName != DefaultIfName {
			key += "/" + ifName
		}
	} else {
		key = containerID + "/" + ifName
	}
	sum := sha1.Sum([]byte(key))
	return HostVethPrefix + hex.EncodeToString(sum[:])[:11]
}
