package controlplane_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/internal/netnstest"
)

// netnsWithAddress makes a named namespace whose only way anywhere is a
// veth pair inside it, with addr on one end (a non-loopback address that
// only the namespace reaches).
func netnsWithAddress(t *testing.T, addr string) string {
	t.Helper()
	n := netnstest.New(t, "cpns")
	n.IP("link add up0 type veth peer name up0-peer")
	n.IP("link set up0 up")
	n.IP("link set up0-peer up")
	n.IP("addr add %s dev up0", addr)
	return n.Path()
}

func netnsIno(t *testing.T, path string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestControlPlaneInNetNS runs a whole control plane (etcd, kube-apiserver,
// kube-scheduler, kube-controller-manager) detached inside a namespace on
// a non-loopback address, as the lab does: the processes run there and
// lead sessions of their own, the cluster's clients reach it from the
// host's namespace, the scheduler binds a pod, the controller-manager makes
// ServiceAccounts, the API server mints tabby-cni tokens, and Stop ends it
// all.
func TestControlPlaneInNetNS(t *testing.T) {
	first := clustertest.Cluster(t)
	nsPath := netnsWithAddress(t, "10.123.0.2/24")
	ctx := ctxT(t, 2*time.Minute)
	start := time.Now()
	c, err := controlplane.Start(ctx, controlplane.Options{BinDir: first.BinDir, RepoRoot: first.RepoRoot, NetNS: nsPath, Address: "10.123.0.2", APIServerPort: 6443, Detach: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	if c.Server != "https://10.123.0.2:6443" || c.Address() != "10.123.0.2" {
		t.Errorf("server %s address %s", c.Server, c.Address())
	}
	if _, err := c.StartScheduler(ctx, controlplane.SchedulerOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartControllerManager(ctx, controlplane.ControllerManagerOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane up in the namespace in %v", time.Since(start).Round(time.Millisecond))

	// Every process runs in the namespace and leads its own session.
	ino := netnsIno(t, nsPath)
	procs := c.Processes()
	var names []string
	for _, p := range procs {
		names = append(names, p.Name)
		if got := netnsIno(t, "/proc/"+strconv.Itoa(p.Pid())+"/ns/net"); got != ino {
			t.Errorf("%s (pid %d) runs in namespace %d, want %d", p.Name, p.Pid(), got, ino)
		}
		if sid, err := unix.Getsid(p.Pid()); err != nil || sid != p.Pid() {
			t.Errorf("%s (pid %d) is in session %d (%v), want its own", p.Name, p.Pid(), sid, err)
		}
		if p.NetNS != nsPath {
			t.Errorf("%s: NetNS %q", p.Name, p.NetNS)
		}
	}
	if strings.Join(names, ",") != "etcd,kube-apiserver,kube-scheduler,kube-controller-manager" {
		t.Errorf("processes %v", names)
	}
	// The cluster's clients dial from inside the namespace.
	cs := clientset(t, c.RESTConfig())

	// ApplyManifests: tabby's namespace and RBAC from deploy/base.
	base := filepath.Join(c.RepoRoot, "deploy", "base")
	if err := controlplane.ApplyManifests(ctx, c.RESTConfig(), filepath.Join(base, "namespace.yaml"), filepath.Join(base, "rbac.yaml")); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Get(ctx, "tabby-cni", metav1.GetOptions{}); err != nil {
		t.Errorf("the ClusterRole tabby-cni was not applied: %v", err)
	}
	// Applying again changes nothing and fails nothing.
	if err := controlplane.ApplyManifests(ctx, c.RESTConfig(), filepath.Join(base, "namespace.yaml")); err != nil {
		t.Errorf("applying again: %v", err)
	}

	// The API server mints tokens of tabby-cni (as tabby-node does for the
	// CNI plugin's kubeconfig).
	waitFor(t, 30*time.Second, "a tabby-cni token", func() error {
		tr, err := cs.CoreV1().ServiceAccounts("tabby-system").CreateToken(ctx, "tabby-cni",
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(600))}}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if tr.Status.Token == "" {
			return errors.New("an empty token")
		}
		return nil
	})

	// The scheduler binds a pod to a Ready, untainted node.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{
		Capacity:    corev1.ResourceList{corev1.ResourcePods: resource.MustParse("10"), corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("2Gi")},
		Allocatable: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("10"), corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("2Gi")},
		Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Test"}},
	}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// TaintNodesByCondition tainted it not-ready; nothing else removes it.
	if _, err := cs.CoreV1().Nodes().Patch(ctx, "n1", types.MergePatchType, []byte(`{"spec":{"taints":[]}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "lab"}}}}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the pod to be scheduled", func() error {
		p, err := cs.CoreV1().Pods("default").Get(ctx, "p", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Spec.NodeName != "n1" {
			return errors.New("not bound")
		}
		return nil
	})

	dir := c.Dir
	c.Stop()
	for _, p := range procs {
		if err := syscall.Kill(p.Pid(), 0); !errors.Is(err, syscall.ESRCH) && !isZombie(p.Pid()) {
			t.Errorf("%s (pid %d) survived Stop", p.Name, p.Pid())
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Stop left %s", dir)
	}
}

// TestSpawnDetached: a detached process leads a session of its own (no
// death signal ties it to this program: the lab's processes outlive lab
// up, which the lab's tests check) and gets the environment it is given.
func TestSpawnDetached(t *testing.T) {
	log := filepath.Join(t.TempDir(), "sleep.log")
	p, err := controlplane.Spawn("sleep", "/bin/sleep", log, controlplane.SpawnOptions{Detach: true, Env: []string{"A=1"}}, "600")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(time.Second)
	if sid, _ := unix.Getsid(p.Pid()); sid != p.Pid() {
		t.Errorf("session %d, want %d", sid, p.Pid())
	}
	// Until the child has exec'd, its environ is not yet its own (CI under
	// load read it empty): wait for the exec.
	var env []byte
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		env, _ = os.ReadFile("/proc/" + strconv.Itoa(p.Pid()) + "/environ")
		if string(env) == "A=1\x00" || time.Now().After(deadline) {
			break
		}
	}
	if string(env) != "A=1\x00" {
		t.Errorf("environment %q", env)
	}
}

func waitFor(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		err := f()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
