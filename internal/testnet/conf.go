package testnet

import (
	"encoding/json"
	"fmt"
	"net"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// NetworkName is the name of the networks ConfList builds.
const NetworkName = "k8s-pod-network"

// ConfList builds a network configuration list named NetworkName.
func ConfList(version string, plugins ...map[string]any) (*libcni.NetworkConfigList, error) {
	b, err := json.Marshal(map[string]any{"cniVersion": version, "name": NetworkName, "plugins": plugins})
	if err != nil {
		return nil, err
	}
	list, err := libcni.ConfListFromBytes(b)
	if err != nil {
		return nil, fmt.Errorf("conflist %s: %w", b, err)
	}
	return list, nil
}

// TabbyConf is the tabby plugin's entry of a conflist for this node, with
// ipam (nil: {"type": "tabby-ipam"}; a missing type means tabby-ipam). The
// plugins use the node's tabbyd when one runs (StartTabbyd), else reach the
// API server themselves.
func (n *Node) TabbyConf(ipam map[string]any) map[string]any {
	if ipam == nil {
		ipam = map[string]any{}
	}
	if ipam["type"] == nil {
		ipam["type"] = "tabby-ipam"
	}
	return map[string]any{
		"type":        "tabby",
		"kubeconfig":  n.Kubeconfig,
		"nodename":    n.Name,
		"mtu":         0,
		"lockFile":    n.LockFile,
		"agentSocket": n.AgentSocket,
		"timeout":     "20s",
		"ipam":        ipam,
	}
}

// ResultIPs are the addresses of one family (v6 or not) in an ADD result.
func ResultIPs(res *current.Result, v6 bool) []net.IP {
	var out []net.IP
	for _, ipc := range res.IPs {
		if (ipc.Address.IP.To4() == nil) == v6 {
			out = append(out, ipc.Address.IP)
		}
	}
	return out
}
