package plugin

import (
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/tabbynet/tabby/contract"
)

// aliasPrefix starts the IFLA_IFALIAS tabby writes on host veths.
const aliasPrefix = contract.CommentPrefix

// ParseArgs reads K8S_POD_NAMESPACE, K8S_POD_NAME and K8S_POD_UID from
// CNI_ARGS ("K=V;K=V"), ignoring every other key.
func ParseArgs(args string) (contract.PodID, error) {
	var p contract.PodID
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
