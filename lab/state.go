package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// StateFile is the name of the state file in the lab's folder.
const StateFile = "state.json"

// stateVersion changes when State changes incompatibly.
const stateVersion = 2

// State is what a lab made, recorded in Dir/state.json as it is made (so
// that Down finds everything after a crash half-way through Up) and read
// by every other command.
type State struct {
	Version int       `json:"version"`
	Name    string    `json:"name"`
	Dir     string    `json:"dir"`
	Created time.Time `json:"created"`
	// Ready is set when Up finished.
	Ready   bool   `json:"ready"`
	Subnets int    `json:"subnets"`
	PodCIDR string `json:"podCIDR,omitempty"`
	// DualStack says the lab runs IPv4 and IPv6 (lab up --dual-stack):
	// nodes, Services and pods have both; IPv6PodCIDR is the default IPv6
	// IPPool's range.
	DualStack   bool   `json:"dualStack,omitempty"`
	IPv6PodCIDR string `json:"ipv6PodCIDR,omitempty"`
	// CreatedDir says Up created Dir (Down removes it; otherwise only its
	// contents).
	CreatedDir bool `json:"createdDir"`

	Binaries Binaries `json:"binaries"`

	// Namespaces are the network namespaces the lab made (pods' are found
	// by prefix).
	Namespaces []string `json:"namespaces"`

	ControlPlane ControlPlane `json:"controlPlane"`
	// Forward is the host's loopback port forward to the API server.
	Forward Forward `json:"forward"`
	// Kubeconfig is the admin kubeconfig that works from the host.
	Kubeconfig string `json:"kubeconfig"`

	Nodes []Node `json:"nodes"`

	// Images are the image tarballs every node imported at lab up, and
	// TabbyImage the reference of tabby's.
	Images     []string `json:"images"`
	TabbyImage string   `json:"tabbyImage"`

	mu sync.Mutex
}

// Binaries are the programs the lab runs.
type Binaries struct {
	// Tabbyctl holds the nodes' mount namespaces and runs the forward.
	Tabbyctl string `json:"tabbyctl"`
	// Extender is tabby-scheduler-extender.
	Extender string `json:"extender,omitempty"`
	// PluginDir holds tabby's programs, loopback and portmap: what
	// tabby's image is built from.
	PluginDir string `json:"pluginDir"`
	// ControlPlaneDir holds etcd, kube-apiserver, ..., kubectl, kubelet,
	// kube-proxy, agnhost and pause (test/controlplane/build.sh).
	ControlPlaneDir string `json:"controlPlaneDir"`
	// RuntimeDir holds containerd, its shim, ctr and coredns
	// (test/runtime/build.sh).
	RuntimeDir string `json:"runtimeDir"`
	// RepoRoot is the repository whose deploy/ the lab applied.
	RepoRoot string `json:"repoRoot"`
}

// ControlPlane is the control plane's namespace, address and processes.
type ControlPlane struct {
	NetNS   string `json:"netns"`
	Address string `json:"address"`
	// Server is the API server's URL on the underlay.
	Server string `json:"server"`
	// Dir is internal/controlplane's folder (etcd data, certificates, logs).
	Dir    string `json:"dir"`
	CAFile string `json:"caFile"`
	// Kubeconfig is an admin kubeconfig naming Server: it works inside the
	// lab's namespaces (the kubelets use it), and from the host through a
	// dialer into NetNS (RESTConfig).
	Kubeconfig string `json:"kubeconfig"`
	// Extender is tabby-scheduler-extender's URL inside NetNS (the
	// urlPrefix kube-scheduler is configured with).
	Extender string `json:"extender,omitempty"`
	Procs    []Proc `json:"procs"`
}

// Forward is the host's loopback port forward to the API server.
type Forward struct {
	Address string `json:"address"`
	Proc    Proc   `json:"proc"`
}

// Node is one node of the lab.
type Node struct {
	Name  string `json:"name"`
	NetNS string `json:"netns"`
	// Address is eth0's address with its prefix length, Gateway the
	// router's address on the node's subnet.
	Address string `json:"address"`
	Gateway string `json:"gateway"`
	Subnet  int    `json:"subnet"`
	// Address6 is eth0's IPv6 address with its prefix length in a
	// dual-stack lab ("" otherwise).
	Address6 string `json:"address6,omitempty"`
	// Dir holds the node's files: configuration, credentials, logs, and
	// under fs/ what the node keeps at the paths of nodeMounts.
	Dir string `json:"dir"`
	// Runtime is RuntimeContainerd or RuntimeContainerd16.
	Runtime string `json:"runtime"`
	// CgroupRoot is the kubelet's cgroupRoot, in every hierarchy.
	CgroupRoot string `json:"cgroupRoot"`
	// Root holds the node's mount namespace (lab node-root).
	Root       Proc `json:"root"`
	Containerd Proc `json:"containerd"`
	Kubelet    Proc `json:"kubelet"`
}

// IP is the node's address without prefix length.
func (n *Node) IP() string {
	ip, _, _ := strings.Cut(n.Address, "/")
	return ip
}

// IP6 is the node's IPv6 address without prefix length ("" when the lab
// is not dual-stack).
func (n *Node) IP6() string {
	ip, _, _ := strings.Cut(n.Address6, "/")
	return ip
}

// NodeIPs is the kubelet's --node-ip: the IPv4 address, and the IPv6 one
// after it in a dual-stack lab (IPv4 is the primary family).
func (n *Node) NodeIPs() string {
	if n.Address6 == "" {
		return n.IP()
	}
	return n.IP() + "," + n.IP6()
}

// Node returns the node named name.
func (s *State) Node(name string) (*Node, error) {
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			return &s.Nodes[i], nil
		}
	}
	return nil, fmt.Errorf("the lab has no node %s", name)
}

// Prefix starts the names of the lab's namespaces.
func (s *State) Prefix() string { return Prefix(s.Name) }

// Load reads the state of the lab in dir.
func Load(dir string) (*State, error) {
	data, err := os.ReadFile(filepath.Join(dir, StateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no lab in %s (%w): start one with tabbyctl lab up, or pass --dir", dir, err)
	}
	if err != nil {
		return nil, err
	}
	st := &State{}
	if err := json.Unmarshal(data, st); err != nil {
		return nil, fmt.Errorf("reading %s: %w", filepath.Join(dir, StateFile), err)
	}
	if st.Version != stateVersion {
		return nil, fmt.Errorf("%s was written by another version of tabbyctl (state version %d, want %d): run that version's lab down, or remove the lab by hand",
			filepath.Join(dir, StateFile), st.Version, stateVersion)
	}
	return st, nil
}

// update changes the state under its lock and saves it.
func (s *State) update(f func(*State)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(s.Dir, StateFile), append(data, '\n'), 0o644)
}

// writeFileAtomic writes data to a temporary file next to path and renames
// it over path: readers see the old content or the new, never a part.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// lockDir takes an exclusive lock on the lab's folder, so that two up or
// down commands never work on one lab at once. It waits up to a minute.
func lockDir(dir string) (unlock func(), err error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w (another tabbyctl lab up or down is working on it)", dir, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
