package testnet

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
)

// Pod is a pod's network namespace and its identity for the runtime.
type Pod struct {
	NS          ns.NetNS // nil for a pod that has none (an orphan allocation)
	ContainerID string
	// Namespace and Name are the Kubernetes pod; empty: the runtime passes
	// no pod identity (plain cnitool use).
	Namespace, Name string
	IfName          string
	closed          bool
}

// NewPod makes a pod's network namespace, with a new container ID and
// interface eth0. With a name, the runtime passes K8S_POD_NAMESPACE and
// K8S_POD_NAME.
func NewPod(namespace, name string) (*Pod, error) {
	p := &Pod{ContainerID: RandomID(), Namespace: namespace, Name: name, IfName: "eth0"}
	var err error
	if p.NS, err = testutils.NewNS(); err != nil {
		return nil, fmt.Errorf("creating a pod namespace: %w", err)
	}
	return p, nil
}

// Close removes the pod's namespace (and so its end of any veth), as a
// runtime does; it may be called again.
func (p *Pod) Close() error {
	if p.closed || p.NS == nil {
		return nil
	}
	p.closed = true
	return closeNS(p.NS)
}

// HandleID is the tabby IPAM handle of the pod's attachment to NetworkName.
func (p *Pod) HandleID() string { return NetworkName + "." + p.ContainerID }

// RuntimeConf is what the runtime hands libcni for the pod.
func (p *Pod) RuntimeConf(caps map[string]any) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{ContainerID: p.ContainerID, IfName: p.IfName, CapabilityArgs: caps}
	if p.NS != nil {
		rt.NetNS = p.NS.Path()
	}
	if p.Name != "" {
		rt.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", p.Namespace}, {"K8S_POD_NAME", p.Name}, {"K8S_POD_INFRA_CONTAINER_ID", p.ContainerID}}
	}
	return rt
}

// RandomID is a container ID as runtimes make them: 64 hex digits.
func RandomID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
