// Package labtest runs labs (tabbyctl lab) for end-to-end tests: the real
// tabbyctl, tabbyd and CNI plugins, the real control plane, nothing
// faked. A test package calls Setup from its TestMain, then Up in each
// test; the lab is removed when the test ends.
//
//	func TestMain(m *testing.M) { os.Exit(labtest.Setup(m)) }
//
//	func TestX(t *testing.T) {
//		l := labtest.Up(t, "--nodes", "3")
//		l.Create(t, labtest.Netexec("web", "node1", 80))
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
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/tabbynet/tabby/lab"
	"github.com/tabbynet/tabby/test/cluster"
)

// EnvBinDir names a folder holding prebuilt tabbyctl, tabbyd, tabby,
// tabby-ipam and tabby-scheduler-extender (`make build` puts them in
// ./bin); without it Setup builds them.
const EnvBinDir = "TABBY_BIN_DIR"

// Binaries are what the labs run.
var Binaries struct {
	// Dir holds tabbyctl, tabbyd, tabby, tabby-ipam and
	// tabby-scheduler-extender.
	Dir string
	// ControlPlane holds etcd, kube-apiserver, ..., kubectl.
	ControlPlane string
	// Repo is the tabby repository.
	Repo string
}

// Tabbyctl is the path of the tabbyctl under test.
func Tabbyctl() string { return filepath.Join(Binaries.Dir, "tabbyctl") }

// Setup finds or builds the binaries, runs the tests and returns their
// exit status. It fails (never skips) when not root.
func Setup(m *testing.M) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "FAIL: labtest: "+format+"\n", args...)
		return 1
	}
	if os.Geteuid() != 0 {
		return fail("the lab tests need root (network namespaces, a control plane): run them as root, for example with sudo -E go test")
	}
	root, err := cluster.FindRepoRoot()
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
		Binaries.Dir = dir
	}
	for _, b := range []string{"tabbyctl", "tabbyd", "tabby", "tabby-ipam", lab.ExtenderName} {
		if _, err := os.Stat(filepath.Join(Binaries.Dir, b)); err != nil {
			return fail("$%s=%s lacks %s (run make build): %v", EnvBinDir, Binaries.Dir, b, err)
		}
	}
	Binaries.ControlPlane = os.Getenv(cluster.EnvControlPlaneDir)
	if Binaries.ControlPlane == "" {
		cmd := exec.Command("bash", filepath.Join(root, "test", "controlplane", "build.sh"))
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			return fail("building the control plane: %v", err)
		}
		Binaries.ControlPlane = strings.TrimSpace(string(out))
	}
	return m.Run()
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
	l := &Lab{Name: "lt" + randHex(3), Dir: filepath.Join(t.TempDir(), "lab")}
	t.Cleanup(func() {
		if _, err := os.Stat(l.Dir); err == nil {
			if out, code := l.Tabbyctl("down"); code != 0 {
				t.Errorf("lab down: %s", out)
			}
		}
	})
	start := time.Now()
	out, code := l.Tabbyctl(append([]string{"up", "--name", l.Name, "--repo", Binaries.Repo,
		"--controlplane-dir", Binaries.ControlPlane, "--bin-dir", Binaries.Dir}, args...)...)
	l.UpTime = time.Since(start)
	if code != 0 {
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

// Pod is a pod running cmd (host programs by absolute path or $PATH) in
// namespace default, on node when node is not "" (by its hostname label,
// so the scheduler still binds it).
func Pod(name, node string, cmd ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{
			Containers:                    []corev1.Container{{Name: "main", Image: "lab", Command: cmd}},
			TerminationGracePeriodSeconds: ptr.To[int64](5),
		},
	}
	if node != "" {
		p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	}
	return p
}

// Netexec is a pod serving its name on TCP and UDP port (tabbyctl lab
// netexec), Ready once its TCP port answers.
func Netexec(name, node string, port int) *corev1.Pod {
	p := Pod(name, node, Tabbyctl(), "lab", "netexec", "--tcp", fmt.Sprint(port), "--udp", fmt.Sprint(port))
	p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(port)}},
		PeriodSeconds: 1,
	}
	return p
}

// Sleeper is a pod that sleeps.
func Sleeper(name, node string) *corev1.Pod { return Pod(name, node, "sleep", "3600") }

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
