// Package labtest runs labs (tabbyctl lab) for end-to-end tests: the real
// tabbyctl, tabbyd and CNI plugins, the real control plane, nothing
// faked. A test package calls Setup from its TestMain, then Up in each
// test; the lab is removed when the test ends.
//
//	func TestMain(m *testing.M) { os.Exit(labtest.Setup(m)) }
//
//	func TestX(t *testing.T) {
//		l := labtest.Up(t, "--nodes", "3")
//		l.Create(t, labtest.Web("web", "node1", 80))
//		...
//	}
//
// Labs get random names and folders, so tests (and test packages) run
// them side by side.
package labtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/internal/tier"
	"github.com/tabbynet/tabby/lab"
)

// EnvBinDir names a folder holding prebuilt tabby programs and the CNI
// plugins its image ships (`make build` puts them in ./bin); without it
// Setup builds them. EnvRuntimeDir names a folder holding containerd, its
// shim, ctr and coredns (test/runtime/build.sh prints one); without it
// Setup runs that script.
const (
	EnvBinDir     = "TABBY_BIN_DIR"
	EnvRuntimeDir = lab.EnvRuntimeDir
)

// Binaries are what the labs run.
var Binaries struct {
	// Dir holds tabby's programs, loopback and portmap.
	Dir string
	// ControlPlane holds etcd, kube-apiserver, ..., kubectl, kubelet,
	// kube-proxy, agnhost and pause.
	ControlPlane string
	// Runtime holds containerd, containerd-shim-runc-v2, ctr and coredns.
	Runtime string
	// Repo is the tabby repository.
	Repo string
}

// Tabbyctl is the path of the tabbyctl under test.
func Tabbyctl() string { return filepath.Join(Binaries.Dir, "tabbyctl") }

// Setup finds or builds the binaries, runs the tests and returns their
// exit status. As non-root it builds nothing: the tests that bring up a
// lab skip in Up (tier.Root) and the rest run.
func Setup(m *testing.M) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "FAIL: labtest: "+format+"\n", args...)
		return 1
	}
	if os.Geteuid() != 0 {
		return m.Run()
	}
	root, err := controlplane.FindRepoRoot()
	if err != nil {
		return fail("%v", err)
	}
	Binaries.Repo = root
	if d := os.Getenv(EnvBinDir); d != "" {
		Binaries.Dir = d
	} else {
		// Built into the repository's cache (ignored by git), where a
		// test binary that dies leaves nothing in /tmp.
		dir := filepath.Join(root, ".cache", "labtest-bin")
		cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/tabbyctl", "./cmd/tabbyd", "./cmd/tabby", "./cmd/tabby-ipam", "./cmd/tabby-scheduler-extender")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fail("building tabby's programs: %v\n%s", err, out)
		}
		if out, err := exec.Command(filepath.Join(root, "hack", "build-cni-plugins.sh"), dir).CombinedOutput(); err != nil {
			return fail("building loopback and portmap: %v\n%s", err, out)
		}
		Binaries.Dir = dir
	}
	for _, b := range lab.TabbyImagePrograms {
		if _, err := os.Stat(filepath.Join(Binaries.Dir, b)); err != nil {
			return fail("$%s=%s lacks %s (run make build): %v", EnvBinDir, Binaries.Dir, b, err)
		}
	}
	var err2 error
	if Binaries.ControlPlane, err2 = buildDir(root, controlplane.EnvControlPlaneDir, "test/controlplane/build.sh"); err2 != nil {
		return fail("%v", err2)
	}
	if Binaries.Runtime, err2 = buildDir(root, EnvRuntimeDir, "test/runtime/build.sh"); err2 != nil {
		return fail("%v", err2)
	}
	if err := sweepOrphans(os.Stderr, downLab); err != nil {
		// The tests can run beside them; they are slower for it.
		fmt.Fprintf(os.Stderr, "labtest: WARNING: labs of test processes that died are left: %v\n", err)
	}
	return m.Run()
}

// buildDir is $env, else the folder the build script prints.
func buildDir(root, env, script string) (string, error) {
	if d := os.Getenv(env); d != "" {
		return d, nil
	}
	cmd := exec.Command("bash", filepath.Join(root, script))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: %v", script, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// Lab is a running lab.
type Lab struct {
	Name string
	Dir  string
	// State is the lab's state as Up left it (re-read with Reload).
	State *lab.State
	// Kubeconfig is the admin kubeconfig that works from the host.
	Kubeconfig string
	// CS is an admin client (through the host's loopback forward).
	CS kubernetes.Interface
	// UpTime is how long tabbyctl lab up took.
	UpTime time.Duration
	// Suspect is the node a failing test blames: its tabbyd's status and
	// logs are printed first when the test fails.
	Suspect string
}

// logSuspect logs the suspect node's tabbyd: its /status, and the logs of
// its tabby-node pod's tabbyd (and of the container before it, when it
// restarted), without the routine lines.
func (l *Lab) logSuspect(t testing.TB) {
	t.Helper()
	node := l.Suspect
	if st, err := l.TabbydGetErr(node, "/status"); err != nil {
		t.Logf("%s: tabbyd's /status: %v", node, err)
	} else {
		t.Logf("%s: tabbyd's /status:\n%s", node, st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pods, err := l.CS.CoreV1().Pods("tabby-system").List(ctx, metav1.ListOptions{LabelSelector: lab.TabbyNodeLabel, FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Logf("%s: listing its tabby-node pod: %v", node, err)
		return
	}
	routine := regexp.MustCompile(`msg="NetworkPolicy synced"|msg="call set policy"`)
	for _, p := range pods.Items {
		for _, prev := range []bool{true, false} {
			args := []string{"-n", "tabby-system", "logs", p.Name, "-c", "tabbyd", "--timestamps", "--tail", "400"}
			what := "this container"
			if prev {
				args = append(args, "--previous")
				what = "the container before"
			}
			out, code := l.Kubectl(args...)
			if code != 0 {
				if !prev {
					t.Logf("%s: kubectl logs %s: %s", node, p.Name, out)
				}
				continue
			}
			var keep []string
			for _, ln := range strings.Split(strings.TrimSpace(out), "\n") {
				if !routine.MatchString(ln) {
					keep = append(keep, ln)
				}
			}
			if len(keep) > 120 {
				keep = keep[len(keep)-120:]
			}
			t.Logf("%s: tabbyd's logs in pod %s, %s (the last 120 lines but policy syncs):\n%s", node, p.Name, what, strings.Join(keep, "\n"))
		}
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Up runs tabbyctl lab up with args (--nodes, --subnets, ...) in a new
// folder under a random name; the test's cleanup runs lab down (and fails
// the test when it leaves anything behind).
func Up(t testing.TB, args ...string) *Lab {
	t.Helper()
	tier.Root(t, "a lab: network namespaces, a control plane, kubelet and containerd")
	l := &Lab{Name: "lt" + randHex(3), Dir: filepath.Join(t.TempDir(), "lab")}
	// Recorded before it exists: a process killed during lab up leaves
	// a lab too.
	unregister, err := registerOwner(l.Name, l.Dir)
	if err != nil {
		t.Fatalf("recording the lab's owner in %s: %v", OwnersDir, err)
	}
	t.Cleanup(func() {
		if _, err := os.Stat(l.Dir); err == nil {
			if t.Failed() && l.Kubeconfig != "" {
				// What tabbyd said, for failures seen only in CI:
				// the suspect node's first (CI shows the start of
				// a failure's output).
				if l.Suspect != "" {
					l.logSuspect(t)
				}
				out, _ := l.Kubectl("-n", "tabby-system", "logs", "-l", lab.TabbyNodeLabel, "-c", "tabbyd",
					"--tail", "80", "--prefix", "--timestamps", "--max-log-requests", "10")
				t.Logf("tabbyd's logs (the last 80 lines of each tabby-node pod) as the test failed:\n%s", out)
			}
			// --name: a lab that failed before it saved its state is
			// removed by its namespaces' names.
			if out, code := l.Tabbyctl("down", "--name", l.Name); code != 0 {
				t.Errorf("lab down: %s", out)
				return // the record stays: a later run removes the lab
			}
		}
		unregister()
	})
	start := time.Now()
	// --keep-on-failure: a lab that does not come up stays until the
	// cleanup above, which prints tabbyd's logs first; the control
	// plane's programs' are printed below. Without them, a bring-up that
	// failed only in CI left nothing to read.
	out, code := l.Tabbyctl(append([]string{"up", "--name", l.Name, "--keep-on-failure", "--repo", Binaries.Repo,
		"--controlplane-dir", Binaries.ControlPlane, "--runtime-dir", Binaries.Runtime, "--bin-dir", Binaries.Dir}, args...)...)
	l.UpTime = time.Since(start)
	if code != 0 {
		if st, err := lab.Load(l.Dir); err == nil {
			l.State, l.Kubeconfig = st, st.Kubeconfig
			for _, p := range st.ControlPlane.Procs {
				if p.Log != "" && (p.Name == lab.ExtenderName || p.Name == "kube-scheduler") {
					t.Logf("%s's log as the lab failed to come up, the last 40 lines:\n%s", p.Name, controlplane.TailFile(p.Log, 40))
				}
			}
		}
		t.Fatalf("lab up failed:\n%s", out)
	}
	t.Logf("lab %s up in %v", l.Name, l.UpTime.Round(time.Millisecond))
	l.Reload(t)
	l.Kubeconfig = l.State.Kubeconfig
	cfg, err := clientcmd.BuildConfigFromFlags("", l.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	if l.CS, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	return l
}

// Reload reads the lab's state again.
func (l *Lab) Reload(t testing.TB) {
	t.Helper()
	st, err := lab.Load(l.Dir)
	if err != nil {
		t.Fatal(err)
	}
	l.State = st
}

// Tabbyctl runs tabbyctl lab ARGS --dir DIR and returns its combined output
// and exit status.
func (l *Lab) Tabbyctl(args ...string) (string, int) {
	return run(nil, Tabbyctl(), append([]string{"lab", "--dir", l.Dir}, args...)...)
}

// run runs a program with stdin and returns its combined output and exit
// status (-1 when it could not run).
func run(stdin []byte, path string, args ...string) (string, int) {
	cmd := exec.Command(path, args...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	return string(out) + err.Error(), -1
}

// Exec runs argv in a pod's network namespace with tabbyctl lab exec and
// returns its combined output and exit status.
func (l *Lab) Exec(pod string, argv ...string) (string, int) {
	return l.Tabbyctl(append([]string{"exec", pod, "--"}, argv...)...)
}

// ExecIn is Exec with stdin.
func (l *Lab) ExecIn(stdin []byte, pod string, argv ...string) (string, int) {
	return run(stdin, Tabbyctl(), append([]string{"lab", "--dir", l.Dir, "exec", pod, "--"}, argv...)...)
}

// Probe runs tabbyctl lab probe inside pod against addr (host:port) over
// network ("tcp" or "udp") and returns the answer, or an error with what
// the probe said.
func (l *Lab) Probe(pod, network, addr string) (string, error) {
	out, code := l.Exec(pod, Tabbyctl(), "lab", "probe", "--"+network, addr, "--timeout", "2s")
	if code != 0 {
		return "", fmt.Errorf("probe %s %s from %s: exit %d: %s", network, addr, pod, code, strings.TrimSpace(out))
	}
	return strings.TrimSpace(out), nil
}

// Pod is a pod of one agnhost container (lab.AgnhostImage, which every
// node has) run with args (agnhost's subcommand and flags, or with
// Command set, any program of the image), in namespace default, on node
// when node is not "" (by its hostname label, so the scheduler still binds
// it).
func Pod(name, node string, args ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{
			Containers:                    []corev1.Container{{Name: "main", Image: lab.AgnhostImage, Args: args}},
			TerminationGracePeriodSeconds: ptr.To[int64](5),
		},
	}
	if node != "" {
		p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	}
	return p
}

// Shell is a pod that runs a shell script in the agnhost image.
func Shell(name, node, script string) *corev1.Pod {
	p := Pod(name, node, "-c", script)
	p.Spec.Containers[0].Command = []string{"/bin/sh"}
	return p
}

// Web is a pod serving its name on TCP and UDP port (agnhost
// serve-hostname: a TCP connection gets the pod's hostname, so does a UDP
// datagram), Ready once its TCP port answers.
func Web(name, node string, port int) *corev1.Pod {
	p := lab.WebPod(metav1.NamespaceDefault, name, int32(port))
	if node != "" {
		p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	}
	return p
}

// Sleeper is a pod that does nothing (agnhost pause).
func Sleeper(name, node string) *corev1.Pod { return Pod(name, node, "pause") }

// Create creates pods.
func (l *Lab) Create(t testing.TB, pods ...*corev1.Pod) {
	t.Helper()
	for _, p := range pods {
		if _, err := l.CS.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating pod %s: %v", p.Name, err)
		}
	}
}

// WaitPod waits until ok says the pod is as wanted and returns it.
func (l *Lab) WaitPod(t testing.TB, name string, d time.Duration, ok func(*corev1.Pod) error) *corev1.Pod {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		p, err := l.CS.CoreV1().Pods(metav1.NamespaceDefault).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			err = ok(p)
		}
		if err == nil {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s: %v (waited %v)", name, err, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Running is a WaitPod condition: Running with an address (and Ready
// when ready).
func Running(ready bool) func(*corev1.Pod) error {
	return func(p *corev1.Pod) error {
		if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
			return fmt.Errorf("phase %s, IP %q, containers %+v", p.Status.Phase, p.Status.PodIP, p.Status.ContainerStatuses)
		}
		if ready && !IsReady(p) {
			return errors.New("not Ready")
		}
		return nil
	}
}

// IsReady reports the pod's Ready condition.
func IsReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// WaitGone waits until the pod is deleted.
func (l *Lab) WaitGone(t testing.TB, name string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		_, err := l.CS.CoreV1().Pods(metav1.NamespaceDefault).Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pod %s is still there after %v (%v)", name, d, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// PodNetNS is the path of a running pod's network namespace
// (/proc/PID/ns/net of one of its processes), as lab exec finds it.
func (l *Lab) PodNetNS(t testing.TB, ref string) string {
	t.Helper()
	path, err := lab.PodNetNS(context.Background(), l.State, ref)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// TabbydProc is the tabbyd process of a node: tabby-node's container runs
// it in the node's network namespace. While more than one runs there (an
// old container still ending), it waits up to 30 s for one to be left,
// and says who the others were; none is a failure at once.
func (l *Lab) TabbydProc(t testing.TB, node string) lab.Proc {
	t.Helper()
	n := l.Node(t, node)
	var first error
	for deadline := time.Now().Add(30 * time.Second); ; {
		p, err := lab.NodeProcess(n, "tabbyd")
		if err == nil {
			if first != nil {
				// Say who the other one was: it went away, but it
				// is not what the lab runs.
				t.Logf("%s: before one tabbyd was left: %v", node, first)
			}
			return p
		}
		if !errors.Is(err, lab.ErrSeveralProcesses) {
			t.Fatal(err)
		}
		if first == nil {
			first = err
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v (30s after: %v)", first, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Kubectl runs the control plane's kubectl with the lab's admin kubeconfig
// and returns its combined output and exit status.
func (l *Lab) Kubectl(args ...string) (string, int) {
	return run(nil, filepath.Join(Binaries.ControlPlane, "kubectl"), append([]string{"--kubeconfig", l.Kubeconfig}, args...)...)
}
