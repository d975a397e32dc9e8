package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tabbynet/tabby/internal/controlplane"
)

// buildNode makes node i's network namespace (eth0 on its subnet's bridge,
// a default route through the router, IP forwarding on; an IPv6 address,
// default route and forwarding too in a dual-stack lab), the sources of
// its private mounts and its cgroup root.
func buildNode(s *State, l Layout, i int, runtime string) error {
	name := NodeName(i)
	nsName := l.NodeNS(i)
	addr, sn := l.NodeAddr(i), l.NodeSubnet(i)
	n := Node{
		Name:       name,
		NetNS:      nsName,
		Address:    addr.String(),
		Gateway:    Gateway(sn).Addr().String(),
		Subnet:     sn,
		Dir:        filepath.Join(s.Dir, "nodes", name),
		Runtime:    runtime,
		CgroupRoot: cgroupRootName(s.Name, name),
	}
	if s.DualStack {
		n.Address6 = l.NodeAddr6(i).String()
	}
	if err := os.MkdirAll(n.Dir, 0o755); err != nil {
		return err
	}
	if err := s.update(func(s *State) { s.Nodes = append(s.Nodes, n) }); err != nil {
		return err
	}
	if err := buildHost(s, l, nsName, name, sn, addr, l.NodeAddr6(i)); err != nil {
		return err
	}
	if err := setForwarding(nsName, s.DualStack); err != nil {
		return err
	}
	// The control plane reaches pods through any node on its subnet (see
	// routePodsFromControlPlane), whose conntrack then sees only one
	// direction of those connections: liberal TCP tracking, with which
	// kube-proxy installs no DROP of INVALID packets, lets them through.
	if err := setSysctl(nsName, "net/netfilter/nf_conntrack_tcp_be_liberal", "1"); err != nil {
		return err
	}
	if err := prepareNodeFS(&n); err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	return makeCgroupRoot(n.CgroupRoot)
}

// Components of a node, as lab restart names them.
const (
	ComponentKubelet    = "kubelet"
	ComponentContainerd = "containerd"
	// ComponentTabbyd is the node's tabby-node pod: restarting it deletes
	// the pod, and the DaemonSet starts a new one.
	ComponentTabbyd = "tabbyd"
)

// Components lists what lab restart can restart.
var Components = []string{ComponentKubelet, ComponentContainerd, ComponentTabbyd}

// startRoot starts node n's mount-namespace holder (lab node-root) in its
// network namespace and waits until it has made the node's mounts.
func startRoot(ctx context.Context, s *State, n *Node) error {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return fmt.Errorf("unshare is missing: %w (install util-linux)", err)
	}
	_ = os.Remove(n.rootReadyFile())
	host, err := netnsInode("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	p, done, err := startDetached(procSpec{
		name:  "node-root",
		netns: NetNSPath(n.NetNS),
		path:  unshare,
		args: []string{"--mount", "--propagation", "private", "--", s.Binaries.Tabbyctl, "lab", "node-root", "--dir", s.Dir, "--node", n.Name,
			"--host-mount-ns", strconv.FormatUint(host, 10)},
		log: filepath.Join(n.Dir, "node-root.log"),
	})
	if err != nil {
		return err
	}
	if err := s.update(func(*State) { n.Root = p }); err != nil {
		return err
	}
	return poll(ctx, 20*time.Millisecond, func() error {
		select {
		case <-done:
			return errStop(fmt.Errorf("the mount namespace of %s could not be made; the end of its log (%s):\n%s", n.Name, p.Log, controlplane.TailFile(p.Log, 15)))
		default:
		}
		_, err := os.Stat(n.rootReadyFile())
		return err
	})
}

// startContainerd starts node n's containerd in the node's namespaces and
// waits until its socket answers.
func startContainerd(ctx context.Context, s *State, n *Node) error {
	bin, _, dir := s.runtimeBinaries(n)
	p, _, err := startDetached(procSpec{
		name:    "containerd",
		netns:   NetNSPath(n.NetNS),
		mountns: n.nodeMountNS(),
		path:    bin,
		args:    []string{"--config", n.files().containerdConfig, "--log-level", "warn"},
		env:     []string{runtimePATH(dir)},
		log:     filepath.Join(n.Dir, "containerd.log"),
	})
	if err != nil {
		return err
	}
	if err := s.update(func(*State) { n.Containerd = p }); err != nil {
		return err
	}
	if err := waitSocket(ctx, n, p, containerdSocket); err != nil {
		return fmt.Errorf("waiting for the containerd of %s: %w", n.Name, err)
	}
	return nil
}

// startKubelet starts node n's kubelet in the node's namespaces.
func startKubelet(s *State, n *Node) error {
	f := n.files()
	p, _, err := startDetached(procSpec{
		name:    "kubelet",
		netns:   NetNSPath(n.NetNS),
		mountns: n.nodeMountNS(),
		path:    filepath.Join(s.Binaries.ControlPlaneDir, "kubelet"),
		args: []string{
			"--config", f.kubeletConfig,
			"--kubeconfig", f.kubeconfig,
			"--hostname-override", n.Name,
			"--node-ip", n.NodeIPs(),
			"--v", "1",
		},
		env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		log: filepath.Join(n.Dir, "kubelet.log"),
	})
	if err != nil {
		return err
	}
	return s.update(func(*State) { n.Kubelet = p })
}

// importImages imports the image tarballs into node n's containerd (the
// namespace the CRI plugin uses), as kind load image-archive does.
func importImages(ctx context.Context, s *State, n *Node, tarballs []string) error {
	_, ctr, _ := s.runtimeBinaries(n)
	for _, t := range tarballs {
		cmd := exec.CommandContext(ctx, ctr, "--address", n.nodePath(containerdSocket), "--namespace", "k8s.io", "images", "import", t)
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("importing %s into the containerd of %s: %w: %s", filepath.Base(t), n.Name, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// startNode brings node n up: its mounts, containerd with the lab's images,
// and its kubelet, and waits until the kubelet has registered the Node.
func startNode(ctx context.Context, s *State, n *Node, ca *labCA, cs kubernetes.Interface, images []string) error {
	if err := startRoot(ctx, s, n); err != nil {
		return err
	}
	if err := writeNodeConfig(s, n, ca); err != nil {
		return err
	}
	if err := startContainerd(ctx, s, n); err != nil {
		return err
	}
	if err := importImages(ctx, s, n, images); err != nil {
		return err
	}
	if err := startKubelet(s, n); err != nil {
		return err
	}
	if err := waitNodeRegistered(ctx, cs, n); err != nil {
		return fmt.Errorf("waiting for the kubelet of %s to register its Node: %w", n.Name, err)
	}
	return nil
}

// proc is the field of n that records component.
func (n *Node) proc(component string) (*Proc, error) {
	switch component {
	case ComponentKubelet:
		return &n.Kubelet, nil
	case ComponentContainerd:
		return &n.Containerd, nil
	}
	return nil, fmt.Errorf("no component %q: use %s", component, strings.Join(Components, ", "))
}

// Restart restarts a component of a node: kubelet or containerd (SIGTERM,
// SIGKILL after grace, started again with the same flags; pods keep
// running, their shims are not the runtime's children), or tabbyd, by
// deleting the node's tabby-node pod as a user would (the DaemonSet starts
// a new one), waiting until the new one is ready.
func Restart(ctx context.Context, s *State, node, component string, grace time.Duration) error {
	n, err := s.Node(node)
	if err != nil {
		return err
	}
	if component == ComponentTabbyd {
		return restartTabbyd(ctx, s, n, grace)
	}
	slot, err := n.proc(component)
	if err != nil {
		return err
	}
	if left := stopProcs([]Proc{*slot}, grace, false); len(left) > 0 {
		return fmt.Errorf("%s of %s (pid %d) does not stop", component, node, slot.Pid)
	}
	if component == ComponentKubelet {
		if err := startKubelet(s, n); err != nil {
			return err
		}
		// Healthy, it has reached the runtime: a kubelet that starts while
		// containerd does not answer exits (systemd would start it again).
		return waitKubeletHealthy(ctx, n)
	}
	return startContainerd(ctx, s, n)
}

// waitKubeletHealthy waits until node n's kubelet answers its /healthz.
func waitKubeletHealthy(ctx context.Context, n *Node) error {
	hc := nsHTTPClient(n.NetNS, 2*time.Second)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := poll(wctx, 100*time.Millisecond, func() error {
		if err := exited(n.Kubelet, n.Name); err != nil {
			return err
		}
		return httpOK(wctx, hc, "http://127.0.0.1:10248/healthz")
	})
	if err != nil {
		return fmt.Errorf("waiting for the kubelet of %s to be healthy: %w", n.Name, err)
	}
	return nil
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
	return errStop(fmt.Errorf("%s of %s exited; the end of its log (%s):\n%s", p.Name, node, p.Log, controlplane.TailFile(p.Log, 20)))
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
