package plugin

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
)

// HostVethPrefix starts the name of every host-side veth tabby creates.
const HostVethPrefix = "tab"

// DefaultIfName is the usual pod interface name; other names are mixed into
// the host veth name so a pod with two tabby interfaces gets two names.
const DefaultIfName = "eth0"

// aliasPrefix starts the IFLA_IFALIAS tabby writes on host veths.
const aliasPrefix = "tabby:"

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

// ParseArgs reads K8S_POD_NAMESPACE, K8S_POD_NAME and K8S_POD_UID from
// CNI_ARGS ("K=V;K=V"), ignoring every other key.
func ParseArgs(args string) (PodID, error) {
	var p PodID
	if args == "" {
		return p, nil
	}
	for _, kv := range strings.Split(args, ";") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return p, types.NewError(types.ErrInvalidEnvironmentVariables,
				fmt.Sprintf("tabby: CNI_ARGS entry %q is not KEY=VALUE", kv), "CNI_ARGS must look like K8S_POD_NAMESPACE=ns;K8S_POD_NAME=pod")
		}
		switch k {
		case "K8S_POD_NAMESPACE":
			p.Namespace = v
		case "K8S_POD_NAME":
			p.Name = v
		case "K8S_POD_UID":
			p.UID = v
		}
	}
	return p, nil
}

// HostVethName is the name of the host end of an attachment's veth: "tab"
// and 11 hex digits of the SHA-1 of the pod identity ("namespace/name"),
// or of "containerID/ifname" when the runtime gave no pod identity. A pod
// interface other than eth0 adds "/ifname" to the pod identity. The name is
// stable across sandboxes of one pod, as Calico's cali* names are, so a
// stale link of an earlier sandbox is found and replaced.
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

// Attachment is what the alias on a host veth records.
type Attachment struct {
	Network, ContainerID, IfName string
}

// VethAlias is the IFLA_IFALIAS of an attachment's host veth:
// "tabby:<network>/<containerID>/<ifname>". Network names and container IDs
// cannot contain '/', nor can interface names.
func VethAlias(a Attachment) string {
	return aliasPrefix + a.Network + "/" + a.ContainerID + "/" + a.IfName
}

// ParseVethAlias reads an alias written by VethAlias.
func ParseVethAlias(alias string) (Attachment, bool) {
	rest, ok := strings.CutPrefix(alias, aliasPrefix)
	if !ok {
		return Attachment{}, false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return Attachment{}, false
	}
	return Attachment{Network: parts[0], ContainerID: parts[1], IfName: parts[2]}, true
}
