package lab

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// The container runtimes a lab node can run.
const (
	// RuntimeContainerd is containerd v2 built from the Go module proxy
	// (test/runtime/build.sh), whose CRI plugin speaks CNI up to 1.1.0.
	RuntimeContainerd = "containerd"
	// RuntimeContainerd16 is Debian 12's containerd 1.6 (/usr/bin), whose
	// libcni speaks CNI only up to 1.0.0: what many clusters still run.
	RuntimeContainerd16 = "containerd1.6"
)

// EnvRuntimeDir names a folder holding containerd, its shim, ctr and
// coredns (what test/runtime/build.sh prints); tabbyctl lab up and the lab
// tests take it as the default of --runtime-dir.
const EnvRuntimeDir = "TABBY_RUNTIME_DIR"

// Runtimes are the values of Options.Runtime.
var Runtimes = []string{RuntimeContainerd, RuntimeContainerd16}

// Fixed paths inside every node (its own, see nodeMounts).
const (
	containerdSocket = "/run/containerd/containerd.sock"
	// runcPath is Debian's runc, which both runtimes run.
	runcPath = "/usr/sbin/runc"
	// debianContainerdDir holds Debian's containerd 1.6, its shim and ctr.
	debianContainerdDir = "/usr/bin"
)

// Images every node has before anything is scheduled. Nodes cannot pull:
// `lab load` imports more.
const (
	PauseImage   = "registry.k8s.io/pause:3.10.1"
	AgnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.59"
)

// Cluster settings shared by the control plane, kubelets, kube-proxy and
// CoreDNS.
const (
	ClusterDomain = "cluster.local"
	// ClusterDNS is the kube-dns Service's address.
	ClusterDNS = "10.96.0.10"
	// KubeletPort is where kubelets serve the API server (exec, logs).
	KubeletPort = 10250
)

// runtimeBinaries are node n's containerd, its shim's folder and ctr.
func (s *State) runtimeBinaries(n *Node) (containerd, ctr, dir string) {
	dir = s.Binaries.RuntimeDir
	if n.Runtime == RuntimeContainerd16 {
		dir = debianContainerdDir
	}
	return filepath.Join(dir, "containerd"), filepath.Join(dir, "ctr"), dir
}

// containerdConfig is node n's containerd configuration. containerd v2 reads
// version 3, Debian's 1.6 version 2; both: the CRI plugin with runc
// (cgroupfs, as kubelet's cgroupDriver), the lab's pause image, CNI from
// /opt/cni/bin and /etc/cni/net.d (the node's own), OOM score adjustments
// kept within what root here may set, and containerd's opt plugin off (it
// would unpack into /opt/containerd).
func containerdConfig(runtime string) string {
	if runtime == RuntimeContainerd16 {
		return `version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]

[grpc]
  address = "` + containerdSocket + `"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "` + PauseImage + `"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "` + runcPath + `"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
`
	}
	return `version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.internal.v1.opt"]

[grpc]
  address = "` + containerdSocket + `"

[plugins]
  [plugins."io.containerd.cri.v1.images"]
    snapshotter = "overlayfs"
    [plugins."io.containerd.cri.v1.images".pinned_images]
      sandbox = "` + PauseImage + `"
  [plugins."io.containerd.cri.v1.runtime"]
    enable_selinux = false
    restrict_oom_score_adj = true
    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
          BinaryName = "` + runcPath + `"
          SystemdCgroup = false
    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = ["/opt/cni/bin"]
      conf_dir = "/etc/cni/net.d"
`
}

// kubeletConfig is node n's KubeletConfiguration: cgroupfs under the node's
// own cgroup root, cgroup v1 allowed (this machine's), x509 client
// certificates of the lab's CA and webhook authorization for the API
// server's calls, the cluster's DNS, and image garbage collection off
// (nodes cannot pull an image again).
func kubeletConfig(n *Node, caFile, resolvConf string) ([]byte, error) {
	cfg := map[string]any{
		"apiVersion":               "kubelet.config.k8s.io/v1beta1",
		"kind":                     "KubeletConfiguration",
		"failCgroupV1":             false,
		"cgroupDriver":             "cgroupfs",
		"cgroupRoot":               n.CgroupRoot,
		"containerRuntimeEndpoint": "unix://" + containerdSocket,
		"address":                  n.IP(),
		"port":                     KubeletPort,
		"readOnlyPort":             0,
		"healthzBindAddress":       "127.0.0.1",
		"healthzPort":              10248,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true, "cacheTTL": "30s"},
			"x509":      map[string]any{"clientCAFile": caFile},
		},
		"authorization":               map[string]any{"mode": "Webhook"},
		"clusterDNS":                  []string{ClusterDNS},
		"clusterDomain":               ClusterDomain,
		"resolvConf":                  resolvConf,
		"failSwapOn":                  false,
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		// Disk and memory are the machine's, shared by every node: a node
		// must not evict its pods because the machine is busy.
		"evictionHard": map[string]string{
			"memory.available":  "1%",
			"nodefs.available":  "1%",
			"nodefs.inodesFree": "1%",
			"imagefs.available": "1%",
		},
		"serializeImagePulls":       false,
		"syncFrequency":             "10s",
		"fileCheckFrequency":        "10s",
		"nodeStatusReportFrequency": "1m",
		"maxPods":                   110,
		"staticPodPath":             "",
		"enableDebuggingHandlers":   true,
		"logging":                   map[string]any{"format": "text"},
	}
	return yaml.Marshal(cfg)
}

// nodeFiles are the paths of a node's configuration and credentials.
type nodeFiles struct {
	containerdConfig, kubeletConfig, kubeconfig, resolvConf string
}

func (n *Node) files() nodeFiles {
	return nodeFiles{
		containerdConfig: filepath.Join(n.Dir, "containerd.toml"),
		kubeletConfig:    filepath.Join(n.Dir, "kubelet.yaml"),
		kubeconfig:       filepath.Join(n.Dir, "kubelet.kubeconfig"),
		resolvConf:       filepath.Join(n.Dir, "pod-resolv.conf"),
	}
}

// writeNodeConfig writes node n's containerd and kubelet configuration and
// the kubelet's kubeconfig (a client certificate of system:node:<name> in
// system:nodes, which the Node authorizer and NodeRestriction expect).
func writeNodeConfig(s *State, n *Node, ca *labCA) error {
	f := n.files()
	if err := os.WriteFile(f.containerdConfig, []byte(containerdConfig(n.Runtime)), 0o644); err != nil {
		return err
	}
	// Pods with dnsPolicy Default get this: nothing of the host's.
	if err := os.WriteFile(f.resolvConf, nil, 0o644); err != nil {
		return err
	}
	kc, err := kubeletConfig(n, ca.CertFile, f.resolvConf)
	if err != nil {
		return err
	}
	if err := os.WriteFile(f.kubeletConfig, kc, 0o644); err != nil {
		return err
	}
	cert, key, err := ca.clientCert(filepath.Join(n.Dir, "kubelet-client"), "system:node:"+n.Name, "system:nodes")
	if err != nil {
		return err
	}
	return writeCertKubeconfig(f.kubeconfig, s.ControlPlane.Server, s.ControlPlane.CAFile, "system:node:"+n.Name, cert, key)
}

// writeCertKubeconfig writes a kubeconfig that authenticates with a client
// certificate.
func writeCertKubeconfig(path, server, caFile, user, cert, key string) error {
	cfg := map[string]any{
		"apiVersion":      "v1",
		"kind":            "Config",
		"current-context": "lab",
		"clusters":        []any{map[string]any{"name": "lab", "cluster": map[string]any{"server": server, "certificate-authority": caFile}}},
		"users":           []any{map[string]any{"name": user, "user": map[string]any{"client-certificate": cert, "client-key": key}}},
		"contexts":        []any{map[string]any{"name": "lab", "context": map[string]any{"cluster": "lab", "user": user}}},
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	return writeFileAtomic(path, data, 0o600)
}

// nodePath is a path inside node n's mount namespace, as seen from the host
// (through its holder's /proc/PID/root).
func (n *Node) nodePath(p string) string {
	return filepath.Join("/proc", strconv.Itoa(n.Root.Pid), "root", p)
}

// nodeMountNS is the file of node n's mount namespace.
func (n *Node) nodeMountNS() string {
	return filepath.Join("/proc", strconv.Itoa(n.Root.Pid), "ns", "mnt")
}

// waitSocket waits until a unix socket inside node n accepts connections.
func waitSocket(ctx context.Context, n *Node, p Proc, path string) error {
	return poll(ctx, 50*time.Millisecond, func() error {
		if err := exited(p, n.Name); err != nil {
			return err
		}
		c, err := net.DialTimeout("unix", n.nodePath(path), time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// runtimePATH is the PATH of a node's containerd: its shim first.
func runtimePATH(dir string) string {
	return "PATH=" + strings.Join([]string{dir, "/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}, ":")
}

// String names the runtime as Node objects do.
func runtimeName(runtime string) string {
	if runtime == RuntimeContainerd16 {
		return "containerd 1.6 (Debian's)"
	}
	return "containerd v2"
}
