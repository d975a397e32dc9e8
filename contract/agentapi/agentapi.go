// Package agentapi is the protocol between tabby's CNI plugins and tabbyd's
// CNI agent (package cniagent): JSON over HTTP on a unix socket, and a
// client for it. It imports only the standard library, so that a plugin
// that speaks only to the agent stays small and starts fast (no client-go,
// no Kubernetes types).
//
// Every endpoint is a POST of a JSON request to Path+name, answered with
// 200 and a JSON response, or with an error status and an Error.
package agentapi

import (
	"fmt"
	"net"
)

// DefaultSocket is where tabbyd serves the agent (tabbyd --cni-socket) and
// where the plugins look for it (the CNI config key "agentSocket").
const DefaultSocket = "/var/run/tabby/cni.sock"

// Path prefixes every endpoint.
const Path = "/v1/"

// Endpoint names.
const (
	EndpointAssign      = "assign"
	EndpointRelease     = "release-handle"
	EndpointHandleIPs   = "handle-ips"
	EndpointNodeHandles = "node-handles"
	EndpointPools       = "usable-pools"
	EndpointPing        = "ping"
	EndpointPolicyWait  = "policy-wait"
	EndpointReport      = "report"
)

// AssignRequest asks for the addresses of one attachment: the fields of an
// IPAM request (ipam.Request). When Namespace and Pod are set, the pod's
// IPAM annotations (tabby.io/ipv4pools, tabby.io/ipv6pools,
// tabby.io/ipAddrs), or its namespace's, override the pool lists and the
// families, as the plugin does on its own.
type AssignRequest struct {
	HandleID  string `json:"handleID"`
	Node      string `json:"node"`
	Namespace string `json:"namespace,omitempty"`
	Pod       string `json:"pod,omitempty"`
	// PodUID (K8S_POD_UID), when the runtime passes it, tells a cached
	// Pod from an older pod of the same name.
	PodUID    string   `json:"podUID,omitempty"`
	IPv4      bool     `json:"ipv4,omitempty"`
	IPv6      bool     `json:"ipv6,omitempty"`
	IPv4Pools []string `json:"ipv4Pools,omitempty"`
	IPv6Pools []string `json:"ipv6Pools,omitempty"`
	IPs       []net.IP `json:"ips,omitempty"`
}

// Address is one address handed out.
type Address struct {
	IP net.IP `json:"ip"`
	// Pool is the IPPool's name, Block the CIDR of the block.
	Pool  string `json:"pool"`
	Block string `json:"block"`
}

// AssignResponse answers AssignRequest.
type AssignResponse struct {
	Addresses []Address `json:"addresses"`
}

// HandleRequest names a handle ("<network>.<containerID>") on a node
// (release-handle, handle-ips).
type HandleRequest struct {
	HandleID string `json:"handleID"`
	Node     string `json:"node"`
}

// HandleIPsResponse answers handle-ips.
type HandleIPsResponse struct {
	IPs []net.IP `json:"ips"`
}

// NodeRequest names a node (node-handles, usable-pools).
type NodeRequest struct {
	Node string `json:"node"`
}

// NodeHandlesResponse answers node-handles.
type NodeHandlesResponse struct {
	Handles []string `json:"handles"`
}

// Pool is what the plugin needs of an IPPool: its family (from CIDR) and
// its encapsulation (for the MTU).
type Pool struct {
	Name      string `json:"name"`
	CIDR      string `json:"cidr"`
	IPIPMode  string `json:"ipipMode,omitempty"`
	VXLANMode string `json:"vxlanMode,omitempty"`
	Disabled  bool   `json:"disabled,omitempty"`
}

// PoolsResponse answers usable-pools: the enabled pools whose nodeSelector
// matches the node.
type PoolsResponse struct {
	Pools []Pool `json:"pools"`
}

// PolicyWaitRequest asks tabbyd to answer once the NetworkPolicy of a pod
// just wired is in the kernel: tabbyd has applied a ruleset whose
// endpoint for Namespace/Pod carries every address of IPs (learnt from
// IPAM) and that enforces every policy selecting the pod.
type PolicyWaitRequest struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	// PodUID (K8S_POD_UID), when known, tells the pod from an older pod of
	// the same name.
	PodUID string   `json:"podUID,omitempty"`
	IPs    []net.IP `json:"ips"`
	// TimeoutMillis bounds the wait on tabbyd's side (it answers with an
	// Error saying what is missing); 0 means tabbyd's own bound.
	TimeoutMillis int64 `json:"timeoutMillis,omitempty"`
}

// PolicyWaitResponse answers policy-wait.
type PolicyWaitResponse struct {
	// Enforced is false when this tabbyd does not enforce NetworkPolicy
	// (tabbyd --network-policy=false): it answers at once.
	Enforced bool `json:"enforced"`
	// Generation is the number of the policy sync that programmed the pod.
	Generation uint64 `json:"generation,omitempty"`
}

// CommandReport is what the tabby plugin measured of one ADD or DEL,
// sent to tabbyd as the command ends: the plugin exits after each command,
// so tabbyd keeps the histogram (tabby_cni_command_duration_seconds).
type CommandReport struct {
	// Command is "ADD" or "DEL"; Result "ok" or "error".
	Command string `json:"command"`
	Result  string `json:"result"`
	// Seconds from the plugin's start of the command to its result.
	Seconds float64 `json:"seconds"`
}

// Commands and results a CommandReport may carry.
const (
	CommandAdd  = "ADD"
	CommandDel  = "DEL"
	ResultOK    = "ok"
	ResultError = "error"
)

// Empty is the request of ping and the response of release-handle and
// ping.
type Empty struct{}

// Error is how the agent reports a failure; the client returns it as an
// error. Message is the same text the plugin would give working on its own.
type Error struct {
	Message string `json:"error"`
	// Unreachable: the agent cannot reach the API server (the runtime
	// should try again later).
	Unreachable bool `json:"unreachable,omitempty"`
	// Exhausted: no pool could satisfy the request (ipam.ErrExhausted).
	Exhausted bool `json:"exhausted,omitempty"`
	// Forbidden: the agent does not serve this request, such as one that
	// names another node than the agent's (fix the CNI config).
	Forbidden bool `json:"forbidden,omitempty"`
	// Invalid: the request itself is wrong (malformed JSON, a value out of
	// range); sending it again cannot help.
	Invalid bool `json:"invalid,omitempty"`
}

func (e *Error) Error() string { return e.Message }

// ErrUnavailable is wrapped by errors of a request that never reached the
// agent: nothing listens on the socket, or the connection could not be
// made. Nothing was done.
var ErrUnavailable = fmt.Errorf("tabbyd's CNI agent is not available")

// ErrUnknownEndpoint is wrapped by the error of a request the agent does
// not know (a tabbyd older than the plugin).
var ErrUnknownEndpoint = fmt.Errorf("tabbyd's CNI agent does not know the request")

// ErrConnectionLost is wrapped by errors of a request whose connection
// broke before the answer came (tabbyd stopped meanwhile): it may or may
// not have been carried out.
var ErrConnectionLost = fmt.Errorf("the connection to tabbyd's CNI agent broke before it answered")
