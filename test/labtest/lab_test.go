package labtest

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/tabbynet/tabby/lab"
	"github.com/tabbynet/tabby/lab/labimage"
)

func TestMain(m *testing.M) { os.Exit(Setup(m)) }

// hostLinks lists the links of the host's namespace.
func hostLinks(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("ip", "-o", "link", "show").Output()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			names = append(names, strings.TrimSuffix(strings.SplitN(f[1], "@", 2)[0], ":"))
		}
	}
	return names
}

// nsPids lists the processes inside a named namespace.
func nsPids(t *testing.T, name string) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "pids", name).Output()
	if err != nil {
		t.Fatalf("ip netns pids %s: %v", name, err)
	}
	pids := strings.Fields(string(out))
	sort.Strings(pids)
	return pids
}

// checkNothingLeft fails unless the lab left nothing: no namespace with
// its prefix, no process mentioning its folder or in its namespaces, no
// folder, no new host link.
func checkNothingLeft(t *testing.T, l *Lab, linksBefore []string) {
	t.Helper()
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), lab.Prefix(l.Name)) {
		t.Errorf("namespaces left:\n%s", out)
	}
	if _, err := os.Stat(l.Dir); err == nil {
		t.Errorf("the lab's folder %s is still there", l.Dir)
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if strings.Contains(string(cmdline), l.Dir) || strings.Contains(string(cmdline), lab.Prefix(l.Name)) {
			t.Errorf("process %s is left: %q", e.Name(), strings.ReplaceAll(string(cmdline), "\x00", " "))
		}
	}
	for _, n := range hostLinks(t) {
		if !slices.Contains(linksBefore, n) {
			t.Errorf("link %s appeared in the host's namespace", n)
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), lab.Prefix(l.Name)) || strings.Contains(string(mounts), l.Dir) {
		t.Errorf("mounts of the lab are left")
	}
	// The nodes' cgroups.
	hierarchies, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, h := range append(hierarchies, "/sys/fs/cgroup") {
		if left, _ := filepath.Glob(filepath.Join(h, "tabby-"+l.Name+"-*")); len(left) > 0 {
			t.Errorf("cgroups left: %v", left)
		}
	}
	// What kubelet, containerd and the CNI plugins keep at fixed paths
	// lives in each node's mount namespace, never on the host.
	for _, p := range []string{"/var/lib/kubelet", "/var/lib/containerd", "/var/lib/cni", "/var/log/pods", "/var/log/containers",
		"/run/containerd", "/run/tabby", "/opt/cni/bin/tabby", "/etc/cni/net.d/10-tabby.conflist"} {
		if _, err := os.Lstat(p); err == nil && !hostHad[p] {
			t.Errorf("%s appeared on the host", p)
		}
	}
}

// hostHad records which of the paths checkNothingLeft looks for the host
// had before any lab (a machine may have its own kubelet or containerd).
var hostHad = map[string]bool{}

func init() {
	for _, p := range []string{"/var/lib/kubelet", "/var/lib/containerd", "/var/lib/cni", "/var/log/pods", "/var/log/containers",
		"/run/containerd", "/run/tabby", "/opt/cni/bin/tabby", "/etc/cni/net.d/10-tabby.conflist"} {
		if _, err := os.Lstat(p); err == nil {
			hostHad[p] = true
		}
	}
}

// TestLab brings up 3 real nodes (kubelet, containerd v2, runc) with tabby
// installed from deploy/ and runs pods on them as a user would: the real
// kube-scheduler places them through the extender, the real kubelet and
// containerd run them, tabby's CNI plugin wires them; kubectl exec and logs
// work, Services answer by name, restarts of tabbyd, kubelet and
// containerd keep pods running, deletion gives the address back, and lab
// down leaves the host as it was.
func TestLab(t *testing.T) {
	t.Parallel()
	linksBefore := hostLinks(t)
	l := Up(t, "--nodes", "3")
	st := l.State
	if len(st.Nodes) != 3 || !st.Ready {
		t.Fatalf("state: %+v", st)
	}
	ctx := context.Background()

	// kubectl get nodes -o wide: the real kubelet and containerd.
	out, code := l.Kubectl("get", "nodes", "-o", "wide", "--no-headers")
	if code != 0 || strings.Count(out, " Ready ") != 3 || strings.Count(out, "v1.35.4") != 3 || strings.Count(out, "containerd://2.") != 3 {
		t.Errorf("kubectl get nodes -o wide (exit %d):\n%s", code, out)
	}
	nodeIP := map[string]string{}
	for _, n := range st.Nodes {
		nodeIP[n.Name] = n.IP()
		node, err := l.CS.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(node.Spec.Taints) > 0 || node.Status.Addresses[0].Address != n.IP() || node.Status.Allocatable.Pods().Value() != 110 {
			t.Errorf("node %s: taints %v, addresses %v, allocatable %v", n.Name, node.Spec.Taints, node.Status.Addresses, node.Status.Allocatable)
		}
	}

	t.Run("kubelet's root is the node's one shared mount", func(t *testing.T) {
		// When it is not shared, kubelet binds it over itself at start
		// while it makes its sockets there, and a rename that straddles
		// the bind fails (lab/noderoot.go, nodeMount.Shared).
		for _, n := range st.Nodes {
			data, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", n.Kubelet.Pid))
			if err != nil {
				t.Fatalf("kubelet of %s: %v", n.Name, err)
			}
			var at []string
			for _, line := range strings.Split(string(data), "\n") {
				if f := strings.Fields(line); len(f) > 6 && f[4] == "/var/lib/kubelet" {
					at = append(at, line)
				}
			}
			if len(at) != 1 || !strings.Contains(at[0], " shared:") {
				t.Errorf("kubelet of %s sees %d mounts at /var/lib/kubelet, want one shared mount:\n%s", n.Name, len(at), strings.Join(at, "\n"))
			}
		}
	})

	t.Run("tabby installed as users install it", func(t *testing.T) {
		// install-cni wrote into each node's own, empty /opt/cni/bin.
		for _, n := range st.Nodes {
			log := l.InstallCNILog(t, n.Name)
			for _, want := range []string{"installed loopback", "installed portmap", "cniVersion 1.1.0"} {
				if !strings.Contains(log, want) {
					t.Errorf("install-cni on %s does not say %q:\n%s", n.Name, want, log)
				}
			}
			for _, b := range []string{"tabby", "tabby-ipam", "loopback", "portmap"} {
				if _, err := os.Stat(filepath.Join(n.Dir, "fs", "opt-cni-bin", b)); err != nil {
					t.Errorf("%s's /opt/cni/bin: %v", n.Name, err)
				}
			}
		}
		// The default pool is tabbyd's, from --default-ipv4-pool-cidr.
		pool, err := l.DS(t).IPPools.Get(ctx, "default-ipv4", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the default IPPool: %v", err)
		}
		managers := []string{}
		for _, m := range pool.ManagedFields {
			managers = append(managers, m.Manager)
		}
		if pool.Spec.CIDR != lab.DefaultPodCIDR || !slices.Contains(managers, "tabbyd") {
			t.Errorf("default IPPool: cidr %s, made by %v", pool.Spec.CIDR, managers)
		}
	})

	t.Run("smoke", func(t *testing.T) { Smoke(t, l, "v2") })

	pool := netip.MustParsePrefix(lab.DefaultPodCIDR)
	env := Shell("env", "", `test "$GREETING" = hello && test "$HOSTNAME" = env`)
	env.Spec.RestartPolicy = corev1.RestartPolicyNever
	env.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "GREETING", Value: "hello"}}
	fail := Shell("fail", "", "exit 3")
	fail.Spec.RestartPolicy = corev1.RestartPolicyNever
	crash := Shell("crash", "", "exit 1")
	unready := Sleeper("unready", "")
	unready.Spec.Containers[0].ReadinessProbe = &corev1.Probe{PeriodSeconds: 1,
		ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"false"}}}}
	hostnet := Sleeper("hostnet", "node2")
	hostnet.Spec.HostNetwork = true
	missing := Sleeper("missing", "node3")
	missing.Spec.Containers[0].Image = "registry.example/not-in-the-lab:1.0"
	pods := []*corev1.Pod{Web("srv1", "node1", 8080), Sleeper("cli1", "node1"), env, fail, crash, unready, hostnet}
	for i := range 4 {
		pods = append(pods, Sleeper(fmt.Sprintf("spread-%d", i), ""))
	}
	// The lab's own readiness check asks the extender to filter; only
	// kube-scheduler asks it to prioritize.
	before, err := lab.ExtenderRequests(ctx, st)
	if err != nil {
		t.Fatalf("the extender's metrics: %v", err)
	}
	start := time.Now()
	l.Create(t, pods...)
	l.Create(t, missing)

	srv := l.WaitPod(t, "srv1", time.Minute, Running(true))
	cli := l.WaitPod(t, "cli1", time.Minute, Running(false))
	t.Logf("pods Running in %v", time.Since(start).Round(time.Millisecond))
	nodesUsed := map[string]bool{}
	for _, p := range pods {
		if p.Name == "env" || p.Name == "fail" || p.Name == "crash" {
			continue
		}
		got := l.WaitPod(t, p.Name, time.Minute, Running(p.Name != "unready"))
		ip := netip.MustParseAddr(got.Status.PodIP)
		if p.Spec.HostNetwork {
			if got.Status.PodIP != nodeIP["node2"] {
				t.Errorf("hostNetwork pod %s has IP %s, want node2's %s", p.Name, ip, nodeIP["node2"])
			}
		} else if !pool.Contains(ip) || len(got.Status.PodIPs) != 1 {
			t.Errorf("pod %s has IPs %v, want one from %s", p.Name, got.Status.PodIPs, pool)
		}
		if got.Status.HostIP != nodeIP[got.Spec.NodeName] {
			t.Errorf("pod %s: hostIP %s on %s (%s)", p.Name, got.Status.HostIP, got.Spec.NodeName, nodeIP[got.Spec.NodeName])
		}
		if strings.HasPrefix(p.Name, "spread-") {
			nodesUsed[got.Spec.NodeName] = true
		}
	}
	if len(nodesUsed) < 2 {
		t.Errorf("the scheduler put 4 unconstrained pods on %v only", nodesUsed)
	}
	t.Run("scheduled through the extender", func(t *testing.T) {
		after, err := lab.ExtenderRequests(ctx, st)
		if err != nil {
			t.Fatal(err)
		}
		// One filter request per pod placed (hostnet and the spread pods
		// included), a prioritize request for each pod more than one node
		// could take.
		if after["filter"]-before["filter"] < len(pods) || after["prioritize"]-before["prioritize"] < 4 {
			t.Errorf("extender requests %v before the pods, %v after: kube-scheduler did not ask it for each of %d pods", before, after, len(pods))
		}
		// kube-scheduler's own NodeAffinity is disabled: only the
		// extender keeps a pod whose nodeSelector no node matches off
		// every node.
		nowhere := Sleeper("nowhere", "")
		nowhere.Spec.NodeSelector = map[string]string{"lab.tabby.io/no-such-label": "x"}
		l.Create(t, nowhere)
		p := l.WaitPod(t, "nowhere", 30*time.Second, func(p *corev1.Pod) error {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
					return nil
				}
			}
			return fmt.Errorf("on node %q, conditions %+v", p.Spec.NodeName, p.Status.Conditions)
		})
		if p.Spec.NodeName != "" {
			t.Errorf("pod nowhere was placed on %s", p.Spec.NodeName)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && !strings.Contains(c.Message, "3 node(s) didn't match Pod's node affinity/selector") {
				t.Errorf("PodScheduled says %q, want the extender's node affinity reason for all 3 nodes", c.Message)
			}
		}
		if err := l.CS.CoreV1().Pods("default").Delete(ctx, "nowhere", metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	})

	if IsReady(l.WaitPod(t, "unready", 5*time.Second, Running(false))) {
		t.Errorf("a pod whose readiness probe fails is Ready")
	}
	l.WaitPod(t, "env", time.Minute, func(p *corev1.Pod) error {
		if p.Status.Phase != corev1.PodSucceeded {
			return fmt.Errorf("phase %s (the container saw the wrong environment?) %+v", p.Status.Phase, p.Status.ContainerStatuses)
		}
		return nil
	})
	l.WaitPod(t, "fail", time.Minute, func(p *corev1.Pod) error {
		if p.Status.Phase != corev1.PodFailed || p.Status.ContainerStatuses[0].State.Terminated == nil || p.Status.ContainerStatuses[0].State.Terminated.ExitCode != 3 {
			return fmt.Errorf("phase %s %+v", p.Status.Phase, p.Status.ContainerStatuses)
		}
		return nil
	})
	l.WaitPod(t, "crash", time.Minute, func(p *corev1.Pod) error {
		if p.Status.ContainerStatuses == nil || p.Status.ContainerStatuses[0].RestartCount < 2 {
			return fmt.Errorf("restarts %+v", p.Status.ContainerStatuses)
		}
		return nil
	})

	t.Run("images", func(t *testing.T) {
		// An image the lab does not have: ErrImagePull naming it, as on
		// any cluster whose registry does not answer.
		l.WaitPod(t, "missing", time.Minute, func(p *corev1.Pod) error {
			for _, c := range p.Status.ContainerStatuses {
				if w := c.State.Waiting; w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff") && strings.Contains(w.Message, "registry.example/not-in-the-lab:1.0") {
					return nil
				}
			}
			return fmt.Errorf("statuses %+v", p.Status.ContainerStatuses)
		})
		// lab load imports a docker-archive into every node.
		tarball := filepath.Join(t.TempDir(), "loaded.tar")
		spec := labimage.Pause(filepath.Join(Binaries.ControlPlane, "pause"), "registry.example/loaded:1.0")
		if _, err := labimage.Build(ctx, spec, nil, tarball); err != nil {
			t.Fatal(err)
		}
		if out, code := l.Tabbyctl("load", tarball); code != 0 || !strings.Contains(out, "imported into 3 nodes") {
			t.Fatalf("lab load (exit %d): %s", code, out)
		}
		loaded := Sleeper("loaded", "node3")
		loaded.Spec.Containers[0].Image = "registry.example/loaded:1.0"
		loaded.Spec.Containers[0].Args = nil
		l.Create(t, loaded)
		l.WaitPod(t, "loaded", time.Minute, Running(true))
	})

	t.Run("exec and logs", func(t *testing.T) {
		// tabbyctl lab exec: a host program in the pod's network namespace.
		if out, code := l.Exec("default/cli1", "sh", "-c", "echo out; echo err >&2; exit 7"); code != 7 || !strings.Contains(out, "out") || !strings.Contains(out, "err") {
			t.Errorf("exit status %d, output %q", code, out)
		}
		if out, code := l.ExecIn([]byte("from stdin\n"), "cli1", "cat"); code != 0 || out != "from stdin\n" {
			t.Errorf("stdin: %d %q", code, out)
		}
		if out, code := l.Exec("cli1", "ip", "-o", "-4", "addr", "show", "eth0"); code != 0 || !strings.Contains(out, cli.Status.PodIP+"/32") {
			t.Errorf("the pod's eth0: %d %q", code, out)
		}
		if out, code := l.Exec("hostnet", "ip", "-o", "-4", "addr", "show", "eth0"); code != 0 || !strings.Contains(out, nodeIP["node2"]) {
			t.Errorf("the hostNetwork pod's eth0: %d %q", code, out)
		}
		if out, code := l.Exec("default/no-such-pod", "true"); code == 0 || !strings.Contains(out, "no such pod") {
			t.Errorf("exec into a missing pod: %d %q", code, out)
		}
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				if out, code := l.Exec("cli1", "sh", "-c", "exit "+strconv.Itoa(i)); code != i {
					t.Errorf("exec %d: exit status %d: %s", i, code, out)
				}
			})
		}
		wg.Wait()
		// kubectl exec and logs: through the API server to the kubelet,
		// inside the container.
		if out, code := l.Kubectl("exec", "cli1", "--", "sh", "-c", "hostname; exit 4"); code != 4 || !strings.HasPrefix(out, "cli1\n") {
			t.Errorf("kubectl exec: exit %d, %q", code, out)
		}
		if _, err := l.Probe("cli1", "tcp", srv.Status.PodIP+":8080"); err != nil {
			t.Error(err)
		}
		if out, code := l.Kubectl("logs", "srv1"); code != 0 || !strings.Contains(out, "TCP request from "+cli.Status.PodIP) {
			t.Errorf("kubectl logs srv1: exit %d:\n%s", code, out)
		}
		// kubectl attach: the output of a running container.
		l.Create(t, Shell("ticker", "node2", "while true; do echo tick; sleep 0.2; done"))
		l.WaitPod(t, "ticker", time.Minute, Running(false))
		if out, _ := run(nil, "timeout", "3", filepath.Join(Binaries.ControlPlane, "kubectl"), "--kubeconfig", l.Kubeconfig, "attach", "ticker"); !strings.Contains(out, "tick") {
			t.Errorf("kubectl attach ticker printed %q", out)
		}
		// kubectl port-forward: a port on the host's loopback to the pod.
		pf := exec.Command(filepath.Join(Binaries.ControlPlane, "kubectl"), "--kubeconfig", l.Kubeconfig, "port-forward", "pod/srv1", ":8080", "--address", "127.0.0.1")
		pfOut, err := pf.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		pf.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := pf.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = pf.Process.Kill(); _ = pf.Wait() }()
		line, _ := bufio.NewReader(pfOut).ReadString('\n')
		var port int
		if _, err := fmt.Sscanf(strings.TrimSpace(line), "Forwarding from 127.0.0.1:%d -> 8080", &port); err != nil {
			t.Fatalf("kubectl port-forward said %q: %v", line, err)
		}
		if got, err := lab.Probe(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", port), 5*time.Second); err != nil || got != "srv1" {
			t.Errorf("through kubectl port-forward: %q %v", got, err)
		}
	})

	t.Run("same-node traffic", func(t *testing.T) {
		if out, code := l.Exec("cli1", "ping", "-c", "1", "-W", "2", srv.Status.PodIP); code != 0 {
			t.Errorf("ping %s: %s", srv.Status.PodIP, out)
		}
		for _, network := range []string{"tcp", "udp"} {
			got, err := l.Probe("cli1", network, srv.Status.PodIP+":8080")
			if err != nil || got != "srv1" {
				t.Errorf("%s probe: %q %v", network, got, err)
			}
		}
		// The node reaches its pod, and no packet finds a way out of the
		// lab: the router has no route anywhere else.
		if out, code := l.Exec("cli1", "ping", "-c", "1", "-W", "2", nodeIP["node1"]); code != 0 {
			t.Errorf("ping the node: %s", out)
		}
		if out, code := l.Exec("cli1", "ping", "-c", "1", "-W", "1", "192.0.2.1"); code == 0 {
			t.Errorf("a pod reached 192.0.2.1 outside the lab: %s", out)
		}
	})

	t.Run("status", func(t *testing.T) {
		out, code := l.Tabbyctl("status")
		if code != 0 {
			t.Fatalf("lab status: %s", out)
		}
		for _, want := range []string{"node1", "node2", "node3", "default/srv1", srv.Status.PodIP, "tabby-node-",
			lab.ExtenderName + " running", "scheduler extender: http://127.0.0.1:8888 (kube-scheduler's urlPrefix), /healthz ok"} {
			if !strings.Contains(out, want) {
				t.Errorf("lab status does not show %s:\n%s", want, out)
			}
		}
		if strings.Contains(out, "DEAD") || strings.Count(out, " ok ") != 3 {
			t.Errorf("lab status:\n%s", out)
		}
		if kc, _ := l.Tabbyctl("kubeconfig"); strings.TrimSpace(kc) != l.Kubeconfig {
			t.Errorf("lab kubeconfig printed %q", kc)
		}
	})

	t.Run("restarts keep pods", func(t *testing.T) {
		cliNS := l.PodNetNS(t, "default/cli1")
		pause := strings.Split(cliNS, "/")[2]
		oldTabbyd := l.TabbydProc(t, "node1")
		for _, c := range []string{lab.ComponentTabbyd, lab.ComponentKubelet, lab.ComponentContainerd} {
			start := time.Now()
			if out, code := l.Tabbyctl("restart", "node1", c); code != 0 {
				t.Fatalf("lab restart node1 %s: %s", c, out)
			}
			t.Logf("%s of node1 restarted in %v", c, time.Since(start).Round(time.Millisecond))
			l.Reload(t)
		}
		if p := l.TabbydProc(t, "node1"); p.Pid == oldTabbyd.Pid || oldTabbyd.Alive() {
			t.Errorf("tabbyd of node1: pid %d before, %d after", oldTabbyd.Pid, p.Pid)
		}
		// The pod's sandbox survived all three.
		if got := strings.Split(l.PodNetNS(t, "default/cli1"), "/")[2]; got != pause {
			t.Errorf("cli1's sandbox process changed: %s -> %s", pause, got)
		}
		// A new pod on node1 is wired by the restarted runtime and
		// kubelet, with the restarted tabbyd's IPAM.
		l.Create(t, Sleeper("after", "node1"))
		l.WaitPod(t, "after", time.Minute, Running(true))
		p := l.WaitPod(t, "cli1", time.Minute, Running(true))
		if p.Status.PodIP != cli.Status.PodIP || p.Status.ContainerStatuses[0].RestartCount != 0 {
			t.Errorf("cli1 after the restarts: IP %s (was %s), restarts %d", p.Status.PodIP, cli.Status.PodIP, p.Status.ContainerStatuses[0].RestartCount)
		}
		if got, err := l.Probe("cli1", "tcp", srv.Status.PodIP+":8080"); err != nil || got != "srv1" {
			t.Errorf("probe after the restarts: %q %v", got, err)
		}
	})

	t.Run("delete releases the address", func(t *testing.T) {
		ip := netip.MustParseAddr(srv.Status.PodIP)
		if holder := l.AddressHolder(t, ip); holder != "default/srv1" {
			t.Fatalf("%s is held by %q, want default/srv1", ip, holder)
		}
		start := time.Now()
		if err := l.CS.CoreV1().Pods("default").Delete(ctx, "srv1", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](10)}); err != nil {
			t.Fatal(err)
		}
		l.WaitGone(t, "srv1", 30*time.Second)
		t.Logf("srv1 deleted in %v", time.Since(start).Round(time.Millisecond))
		deadline := time.Now().Add(10 * time.Second)
		for l.AddressHolder(t, ip) != "" {
			if time.Now().After(deadline) {
				t.Fatalf("%s is still held by %s after the pod went", ip, l.AddressHolder(t, ip))
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	start = time.Now()
	if out, code := l.Tabbyctl("down"); code != 0 {
		t.Fatalf("lab down: %s", out)
	}
	t.Logf("lab down took %v", time.Since(start).Round(time.Millisecond))
	checkNothingLeft(t, l, linksBefore)
}

// TestLabContainerd16: the same smoke test on nodes running Debian's
// containerd 1.6, whose CNI library stops at 1.0.0: install-cni writes a
// 1.0.0 conflist there, and pods start.
func TestLabContainerd16(t *testing.T) {
	t.Parallel()
	l := Up(t, "--nodes", "2", "--runtime", lab.RuntimeContainerd16)
	if out, code := l.Kubectl("get", "nodes", "-o", "wide", "--no-headers"); code != 0 || strings.Count(out, "containerd://1.6") != 2 {
		t.Errorf("kubectl get nodes -o wide (exit %d):\n%s", code, out)
	}
	for _, n := range l.State.Nodes {
		if log := l.InstallCNILog(t, n.Name); !strings.Contains(log, "cniVersion 1.0.0") || !strings.Contains(log, "installed loopback") {
			t.Errorf("install-cni on %s:\n%s", n.Name, log)
		}
	}
	Smoke(t, l, "c16")
}

// TestLabDemo runs tabbyctl lab demo (make lab's main job) in a lab of 2
// nodes: its pods are placed through the extender (one by pod affinity),
// reach each other, a NetworkPolicy lets only web1-a reach web2-b (on TCP)
// and the matrix shows exactly that, and once the policy is deleted every
// pair is open again. The demo fails itself when any of that is not so.
func TestLabDemo(t *testing.T) {
	t.Parallel()
	l := Up(t, "--nodes", "2")
	start := time.Now()
	out, code := l.Tabbyctl("demo")
	t.Logf("lab demo took %v", time.Since(start).Round(time.Millisecond))
	if code != 0 {
		t.Fatalf("lab demo exited %d:\n%s", code, out)
	}
	for _, want := range []string{
		"16 of 16 pod pairs reached each other (8 on the same node, 8 across nodes)",
		"near-web2-b: required podAffinity to pod=web2-b (kubernetes.io/hostname) -> node2, as the rule says",
		"NetworkPolicy default/web2-b-only-from-web1-a: only web1-a may reach web2-b, and only on TCP 8080",
		"as the policy says: 2 pairs denied, web1-a -> web2-b TCP only, every other pair open",
		"NetworkPolicy default/web2-b-only-from-web1-a deleted: 16 of 16 pairs reach each other again",
		"Service default/lab-demo (ClusterIP 10.96.",
		"by name from web1-a (node1): lab-demo.default.svc.cluster.local answered web2-b (node2), through CoreDNS and kube-proxy",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the demo's output lacks %q:\n%s", want, out)
		}
	}
	// The matrix under the policy marks the denied pairs.
	for _, row := range []string{"web1-b (node1)", "web2-a (node2)"} {
		found := false
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, row) && strings.HasSuffix(strings.TrimSpace(line), "deny") {
				found = true
			}
		}
		if !found {
			t.Errorf("no matrix row %s ends in deny (its cell to web2-b):\n%s", row, out)
		}
	}
	ctx := context.Background()
	nps, err := l.CS.NetworkingV1().NetworkPolicies("default").List(ctx, metav1.ListOptions{})
	if err != nil || len(nps.Items) != 0 {
		t.Errorf("NetworkPolicies left by the demo: %v %v", nps, err)
	}
	near, err := l.CS.CoreV1().Pods("default").Get(ctx, "near-web2-b", metav1.GetOptions{})
	if err != nil || near.Spec.NodeName != "node2" {
		t.Errorf("near-web2-b: %v", err)
	}
}

func mustConfig(t *testing.T, l *Lab) *rest.Config {
	t.Helper()
	cfg, err := l.State.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestLabCrash: two subnets joined by the router; then every process of
// the lab is killed with SIGKILL, and lab down still leaves nothing.
func TestLabCrash(t *testing.T) {
	t.Parallel()
	linksBefore := hostLinks(t)
	l := Up(t, "--nodes", "2", "--subnets", "2")
	n1, n2 := l.State.Nodes[0], l.State.Nodes[1]
	if n1.Subnet == n2.Subnet || !strings.HasPrefix(n2.Address, "10.78.0.") {
		t.Fatalf("nodes %s (%s) and %s (%s) share a subnet", n1.Name, n1.Address, n2.Name, n2.Address)
	}
	// The nodes reach each other through the router, and nothing else.
	if out, err := exec.Command("ip", "netns", "exec", n1.NetNS, "ping", "-c", "1", "-W", "2", n2.IP()).CombinedOutput(); err != nil {
		t.Errorf("node1 to node2 across the router: %v\n%s", err, out)
	}
	if out, err := exec.Command("ip", "netns", "exec", n1.NetNS, "ping", "-c", "1", "-W", "1", "192.0.2.1").CombinedOutput(); err == nil {
		t.Errorf("node1 reached 192.0.2.1 outside the lab:\n%s", out)
	}
	start := time.Now()
	l.Create(t, Sleeper("a", "node1"), Sleeper("b", "node2"))
	a := l.WaitPod(t, "a", time.Minute, Running(true))
	l.WaitPod(t, "b", time.Minute, Running(true))
	t.Logf("pods Running in %v", time.Since(start).Round(time.Millisecond))

	// Kill -9 everything: every process in the lab's namespaces (control
	// plane, tabbyd, kubelets, containerd, shims), in its nodes' cgroups
	// (the pods' containers) and the host's forward.
	var pids []int
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], lab.Prefix(l.Name)) {
			continue
		}
		name := f[0]
		for _, p := range nsPids(t, name) {
			pid, _ := strconv.Atoi(p)
			pids = append(pids, pid)
		}
	}
	pids = append(pids, l.State.Forward.Proc.Pid)
	for _, n := range l.State.Nodes {
		procs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/pids", n.CgroupRoot, "*", "*", "*", "cgroup.procs"))
		more, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/pids", n.CgroupRoot, "*", "*", "cgroup.procs"))
		for _, f := range append(procs, more...) {
			data, _ := os.ReadFile(f)
			for _, p := range strings.Fields(string(data)) {
				pid, _ := strconv.Atoi(p)
				pids = append(pids, pid)
			}
		}
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	t.Logf("killed %d processes", len(pids))
	time.Sleep(200 * time.Millisecond)
	if out, code := l.Tabbyctl("status"); code != 0 || strings.Count(out, "DEAD") < 9 {
		t.Errorf("lab status after the crash (exit %d):\n%s", code, out)
	}
	_ = a
	if out, code := l.Tabbyctl("down"); code != 0 {
		t.Fatalf("lab down after the crash: %s", out)
	}
	checkNothingLeft(t, l, linksBefore)
}
