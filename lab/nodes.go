package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tabbynet/tabby/installcni"
	"github.com/tabbynet/tabby/test/cluster"
)

// referencePortmap is Debian's portmap plugin, which tabby's image ships
// next to tabby and tabby-ipam (install-cni chains it in the conflist).
const referencePortmap = "/usr/lib/cni/portmap"

// buildNode makes node i's namespace: eth0 on its subnet's bridge, a
// default route through the router, IP forwarding on.
func buildNode(s *State, l Layout, i int) error {
	name := NodeName(i)
	nsName := l.NodeNS(i)
	addr, sn := l.NodeAddr(i), l.NodeSubnet(i)
	dir := filepath.Join(s.Dir, "nodes", name)
	n := Node{
		Name:             name,
		NetNS:            nsName,
		Address:          addr.String(),
		Gateway:          Gateway(sn).Addr().String(),
		Subnet:           sn,
		Dir:              dir,
		CNIConfDir:       filepath.Join(dir, "etc", "cni", "net.d"),
		CNIBinDir:        filepath.Join(s.Dir, "cni", "bin"),
		TabbydKubeconfig: filepath.Join(dir, "tabbyd.kubeconfig"),
		CNISocket:        filepath.Join(dir, "cni.sock"),
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := s.update(func(s *State) { s.Nodes = append(s.Nodes, n) }); err != nil {
		return err
	}
	if err := buildHost(s, l, nsName, name, sn, addr); err != nil {
		return err
	}
	return setSysctl(nsName, "net/ipv4/ip_forward", "1")
}

// makeImage makes the folder install-cni copies the plugins from, as
// tabby's image has it: tabby and tabby-ipam, and Debian's portmap when it
// is installed and speaks the CNI version install-cni writes into the
// conflist (bookworm's stops at 1.0.0: chained under a 1.1.0 conflist it
// fails every ADD, so the lab leaves it out and says so). It reports
// whether portmap is there.
func makeImage(ctx context.Context, s *State, o *Options) (dir string, portmap bool, err error) {
	dir = filepath.Join(s.Dir, "image")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", false, err
	}
	links := map[string]string{
		"tabby":      filepath.Join(s.Binaries.PluginDir, "tabby"),
		"tabby-ipam": filepath.Join(s.Binaries.PluginDir, "tabby-ipam"),
	}
	if why := portmapUnfit(ctx); why == "" {
		links["portmap"], portmap = referencePortmap, true
	} else {
		o.progress("CNI: installing without portmap (hostPort will not work): %s", why)
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			return "", false, err
		}
	}
	return dir, portmap, nil
}

// portmapUnfit says why Debian's portmap cannot be chained in the conflist
// install-cni writes ("" when it can).
func portmapUnfit(ctx context.Context) string {
	if _, err := os.Stat(referencePortmap); err != nil {
		return err.Error()
	}
	info, err := libcni.NewCNIConfig([]string{filepath.Dir(referencePortmap)}, nil).GetVersionInfo(ctx, "portmap")
	if err != nil {
		return fmt.Sprintf("asking %s for its CNI versions: %v", referencePortmap, err)
	}
	if !slices.Contains(info.SupportedVersions(), installcni.CNIVersion) {
		return fmt.Sprintf("%s speaks CNI %s, but install-cni writes cniVersion %s", referencePortmap,
			strings.Join(info.SupportedVersions(), ", "), installcni.CNIVersion)
	}
	return ""
}

// installNode writes the node's credentials and runs the real `tabbyctl
// install-cni` with the node's folder as its host root: the plugins go
// into the lab's shared CNI bin dir, the conflist and the plugin's
// kubeconfig (tabby-cni's token) into the node's CNI config dir.
func installNode(ctx context.Context, s *State, n *Node, cp *controlPlane, image string, portmap bool) error {
	secrets := filepath.Join(n.Dir, "secrets", cniAccount)
	if err := os.MkdirAll(secrets, 0o700); err != nil {
		return err
	}
	tokenFile, caFile := filepath.Join(secrets, "token"), filepath.Join(secrets, "ca.crt")
	if err := os.WriteFile(tokenFile, cp.cni.token, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(caFile, cp.cni.ca, 0o644); err != nil {
		return err
	}
	args := []string{"install-cni",
		"--bin-source", image,
		"--cni-bin-dir", n.CNIBinDir,
		"--cni-conf-dir", n.CNIConfDir,
		"--host-cni-conf-dir", n.CNIConfDir,
		"--nodename", n.Name,
		"--mtu", "0",
		"--apiserver", s.ControlPlane.Server,
		"--token-file", tokenFile,
		"--ca-file", caFile,
		"--portmap=" + strconv.FormatBool(portmap),
	}
	logPath := filepath.Join(n.Dir, "install-cni.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "$ %s %s\n", s.Binaries.Tabbyctl, strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, s.Binaries.Tabbyctl, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("tabbyctl install-cni for %s: %w; its output (%s):\n%s", n.Name, err, logPath, cluster.TailFile(logPath, 15))
	}
	conflist := filepath.Join(n.CNIConfDir, installcni.DefaultConfName)
	added, err := setAgentSocket(conflist, n.CNISocket)
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	if added {
		fmt.Fprintf(logf, "lab: added \"agentSocket\": %q to %s (install-cni has no flag for it; every node's tabbyd serves its own socket)\n", n.CNISocket, conflist)
	}
	return writeKubeconfig(n.TabbydKubeconfig, s.ControlPlane.Server, nodeAccount, cp.node)
}

// setAgentSocket names the node's tabbyd socket in the tabby plugin's entry
// of the conflist, unless the conflist names one already. A real node has
// one tabbyd and the default socket; the lab's nodes share the host's
// filesystem, so each needs its own. It reports whether it changed the file.
func setAgentSocket(conflist, socket string) (bool, error) {
	data, err := os.ReadFile(conflist)
	if err != nil {
		return false, fmt.Errorf("reading the conflist install-cni wrote: %w", err)
	}
	var list map[string]any
	if err := json.Unmarshal(data, &list); err != nil {
		return false, fmt.Errorf("%s: %w", conflist, err)
	}
	plugins, _ := list["plugins"].([]any)
	for _, p := range plugins {
		if m, ok := p.(map[string]any); ok && m["type"] == "tabby" {
			if _, set := m["agentSocket"]; set {
				return false, nil
			}
			m["agentSocket"] = socket
			out, err := json.MarshalIndent(list, "", "  ")
			if err != nil {
				return false, err
			}
			return true, writeFileAtomic(conflist, append(out, '\n'), 0o644)
		}
	}
	return false, fmt.Errorf("%s has no tabby plugin", conflist)
}

// kubeletProc starts node n's lab kubelet in its namespace.
func kubeletProc(s *State, n *Node) (Proc, error) {
	p, _, err := startDetached(procSpec{
		name:  "kubelet",
		netns: NetNSPath(n.NetNS),
		path:  s.Binaries.Tabbyctl,
		args:  []string{"lab", "kubelet", "--dir", s.Dir, "--node", n.Name},
		log:   filepath.Join(n.Dir, "kubelet.log"),
	})
	return p, err
}

// tabbydProc starts node n's tabbyd in its namespace.
func tabbydProc(s *State, n *Node) (Proc, error) {
	args := append([]string{"--nodename", n.Name, "--kubeconfig", n.TabbydKubeconfig, "--node-ip", n.IP(),
		"--cni-socket", n.CNISocket}, s.TabbydArgs...)
	p, _, err := startDetached(procSpec{
		name:  "tabbyd",
		netns: NetNSPath(n.NetNS),
		path:  s.Binaries.Tabbyd,
		args:  args,
		log:   filepath.Join(n.Dir, "tabbyd.log"),
	})
	return p, err
}

// Components of a node that Restart restarts.
const (
	ComponentTabbyd  = "tabbyd"
	ComponentKubelet = "kubelet"
)

// proc is the field of n that records component.
func (n *Node) proc(component string) (*Proc, error) {
	switch component {
	case ComponentTabbyd:
		return &n.Tabbyd, nil
	case ComponentKubelet:
		return &n.Kubelet, nil
	}
	return nil, fmt.Errorf("no component %q: use %s or %s", component, ComponentTabbyd, ComponentKubelet)
}

// startComponent starts tabbyd or the kubelet of node name and records it.
func (s *State) startComponent(name, component string) error {
	n, err := s.Node(name)
	if err != nil {
		return err
	}
	slot, err := n.proc(component)
	if err != nil {
		return err
	}
	start := kubeletProc
	if component == ComponentTabbyd {
		start = tabbydProc
	}
	p, err := start(s, n)
	if err != nil {
		return err
	}
	return s.update(func(*State) { *slot = p })
}

// Restart stops a node's tabbyd or kubelet (SIGTERM, then SIGKILL after
// grace) and starts it again with the same flags. A restarted kubelet
// adopts the pods that run (it does not wire them again); a restarted
// tabbyd is what graceful-restart tests need.
func Restart(s *State, node, component string, grace time.Duration) error {
	n, err := s.Node(node)
	if err != nil {
		return err
	}
	slot, err := n.proc(component)
	if err != nil {
		return err
	}
	p := *slot
	if left := stopProcs([]Proc{p}, grace, false); len(left) > 0 {
		return fmt.Errorf("%s of %s (pid %d) does not stop", component, node, p.Pid)
	}
	return s.startComponent(node, component)
}

// waitNodeRegistered waits until the kubelet of n has created its Node.
func waitNodeRegistered(ctx context.Context, cs kubernetes.Interface, n *Node) error {
	return poll(ctx, 100*time.Millisecond, func() error {
		if err := exited(n.Kubelet, n.Name); err != nil {
			return err
		}
		_, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		return err
	})
}

// exited is a stopError with the end of its log when a node's process has
// exited, else nil.
func exited(p Proc, node string) error {
	if p.Alive() {
		return nil
	}
	return errStop(fmt.Errorf("%s of %s exited; the end of its log (%s):\n%s", p.Name, node, p.Log, cluster.TailFile(p.Log, 20)))
}

// nodeReady reports whether the Node is Ready and schedulable (no
// not-ready taint).
func nodeReady(node *corev1.Node) error {
	ready := false
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			if c.Status != corev1.ConditionTrue {
				return fmt.Errorf("Ready is %s: %s %s", c.Status, c.Reason, c.Message)
			}
			ready = true
		}
	}
	if !ready {
		return errors.New("no Ready condition")
	}
	for _, t := range node.Spec.Taints {
		if t.Key == corev1.TaintNodeNotReady {
			return fmt.Errorf("tainted %s", t.ToString())
		}
	}
	return nil
}

// waitNodeReady waits until node n is Ready and untainted and its tabbyd
// answers /readyz.
func waitNodeReady(ctx context.Context, cs kubernetes.Interface, n *Node) error {
	return poll(ctx, 100*time.Millisecond, func() error {
		if err := exited(n.Tabbyd, n.Name); err != nil {
			return err
		}
		node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if err := nodeReady(node); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
		if err := tabbydReadyz(ctx, n); err != nil {
			return fmt.Errorf("tabbyd of %s: %w", n.Name, err)
		}
		return nil
	})
}

// tabbydReadyz asks node n's tabbyd for /readyz from inside the node.
func tabbydReadyz(ctx context.Context, n *Node) error {
	return httpOK(ctx, TabbydClient(n, 3*time.Second), TabbydURL("/readyz"))
}

// stopError ends poll at once.
type stopError struct{ error }

func errStop(err error) error { return stopError{err} }

// poll calls f every interval until it returns nil, a stopError, or ctx ends.
func poll(ctx context.Context, interval time.Duration, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		var stop stopError
		if errors.As(err, &stop) {
			return stop.error
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}
