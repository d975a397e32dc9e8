package controlplane_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
)

const envChild = "TABBY_CLUSTER_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		childMain()
		return
	}
	clustertest.Main(m, nil)
}

// childMain is the test binary run as a child by TestChildrenDieWithParent:
// it starts sleep through the cluster's spawner, prints its pid and waits to
// be killed.
func childMain() {
	// Retire the thread this goroutine runs on after a fork elsewhere, to
	// show that the child's Pdeathsig is tied to the spawner thread only.
	p, err := controlplane.StartProcessForTest("sleep", "/bin/sleep", os.Getenv(envChild), "600")
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread() // exits locked: the runtime terminates this thread
		close(done)
	}()
	<-done
	fmt.Println("pid", p.Pid())
	select {}
}

func clientset(t *testing.T, cfg *rest.Config) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestStartedClusterAnswers(t *testing.T) {
	c := clustertest.Cluster(t)
	ctx := ctxT(t, 30*time.Second)
	cs := clientset(t, c.RESTConfig())
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if v.GitVersion != "v1.35.4" {
		t.Errorf("server version %s, want v1.35.4", v.GitVersion)
	}
	if _, err := cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
		t.Errorf("default ServiceAccount: %v", err)
	}
	// The admin is system:masters: it may do anything.
	ssr, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err == nil {
		if ui := ssr.Status.UserInfo; ui.Username != "admin" || !contains(ui.Groups, "system:masters") {
			t.Errorf("the admin token authenticates as %+v", ui)
		}
	} else {
		t.Logf("SelfSubjectReview: %v", err)
	}
	// A Pod can be created: the ServiceAccount admission plugin finds the
	// default ServiceAccount.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Errorf("creating a pod: %v", err)
	} else {
		_ = cs.CoreV1().Pods("default").Delete(ctx, "p", metav1.DeleteOptions{})
	}
	// The CRDs are installed.
	ds := clustertest.Client(t)
	if _, err := ds.IPPools.List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("listing IPPools: %v", err)
	}
	// Each process leads its own process group.
	for _, name := range []string{"etcd", "kube-apiserver"} {
		pids := pidsOf(t, c, name)
		if len(pids) != 1 {
			t.Fatalf("%s: pids %v", name, pids)
		}
		if pg, err := syscall.Getpgid(pids[0]); err != nil || pg != pids[0] {
			t.Errorf("%s (pid %d) is in process group %d (%v), want its own", name, pids[0], pg, err)
		}
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// pidsOf finds the pids of the processes running BinDir/name whose command
// line mentions the cluster's folder or ports.
func pidsOf(t *testing.T, c *controlplane.Cluster, name string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmd), "\x00")
		if args[0] == filepath.Join(c.BinDir, name) && strings.Contains(string(cmd), c.Dir) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestServingCertificate checks what the API server's self-signed
// certificate names, and that clients really verify it.
func TestServingCertificate(t *testing.T) {
	c := clustertest.Cluster(t)
	data, err := os.ReadFile(c.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	var certs []*x509.Certificate
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		crt, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		certs = append(certs, crt)
	}
	if len(certs) != 2 || !certs[1].IsCA {
		t.Fatalf("apiserver.crt holds %d certificates, want the serving certificate and its CA", len(certs))
	}
	leaf := certs[0]
	var ips []string
	for _, ip := range leaf.IPAddresses {
		ips = append(ips, ip.String())
	}
	t.Logf("serving certificate: DNS %v, IPs %v, CN %s, issuer %s", leaf.DNSNames, ips, leaf.Subject.CommonName, leaf.Issuer.CommonName)
	for _, name := range []string{"127.0.0.1", "10.96.0.1", "kubernetes", "kubernetes.default", "kubernetes.default.svc"} {
		if err := leaf.VerifyHostname(name); err != nil {
			t.Errorf("the serving certificate does not name %s: %v", name, err)
		}
	}
	if err := leaf.VerifyHostname("localhost"); err == nil {
		t.Errorf("the serving certificate names localhost; the tests assume it does not")
	}

	// Without the CA the client refuses the server.
	cfg := c.RESTConfig()
	cfg.CAData = nil
	_, err = clientset(t, cfg).Discovery().ServerVersion()
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a client without the CA: %v, want a certificate error", err)
	}
	// Under a name the certificate does not carry, it is refused too, and
	// accepted again under ServerName.
	cfg = c.RESTConfig()
	cfg.Host = strings.Replace(c.Server, "127.0.0.1", "localhost", 1)
	_, err = clientset(t, cfg).Discovery().ServerVersion()
	if err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a client reaching https://localhost: %v, want a certificate error", err)
	}
	cfg.ServerName = controlplane.ServerName
	if _, err := clientset(t, cfg).Discovery().ServerVersion(); err != nil {
		t.Errorf("with ServerName %s: %v", controlplane.ServerName, err)
	}
}

func TestWriteKubeconfig(t *testing.T) {
	c := clustertest.Cluster(t)
	dir := t.TempDir()

	// The real address.
	kc := filepath.Join(dir, "admin.kubeconfig")
	if err := c.WriteKubeconfig(kc, ""); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Insecure || cfg.ServerName != "" || len(cfg.CAData) == 0 {
		t.Errorf("kubeconfig for %s: insecure %v, server name %q, %d bytes of CA", c.Server, cfg.Insecure, cfg.ServerName, len(cfg.CAData))
	}
	if _, err := clientset(t, cfg).CoreV1().Namespaces().Get(ctxT(t, 10*time.Second), "default", metav1.GetOptions{}); err != nil {
		t.Errorf("client from the kubeconfig: %v", err)
	}
	out, err := exec.Command(filepath.Join(c.BinDir, "kubectl"), "--kubeconfig", kc, "get", "namespace", "default", "-o", "name").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "namespace/default" {
		t.Errorf("kubectl with the kubeconfig: %v: %s", err, out)
	}

	// Another address (a forwarder on 127.0.0.2, which the certificate
	// does not name): tls-server-name makes verification work.
	addr, stop := hostForwarder(t, "127.0.0.2:0", strings.TrimPrefix(c.Server, "https://"))
	defer stop()
	kc2 := filepath.Join(dir, "fwd.kubeconfig")
	if err := c.WriteKubeconfig(kc2, "https://"+addr); err != nil {
		t.Fatal(err)
	}
	cfg2, err := clientcmd.BuildConfigFromFlags("", kc2)
	if err != nil {
		t.Fatal(err)
	}
	if cfg2.ServerName != controlplane.ServerName {
		t.Errorf("kubeconfig for https://%s: tls-server-name %q, want %q", addr, cfg2.ServerName, controlplane.ServerName)
	}
	out, err = exec.Command(filepath.Join(c.BinDir, "kubectl"), "--kubeconfig", kc2, "get", "namespace", "default", "-o", "name").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "namespace/default" {
		t.Errorf("kubectl through %s: %v: %s", addr, err, out)
	}
	cfg2.ServerName = ""
	if _, err := clientset(t, cfg2).Discovery().ServerVersion(); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("through %s without tls-server-name: %v, want a certificate error", addr, err)
	}

	if err := c.WriteKubeconfig(filepath.Join(dir, "bad"), "http://127.0.0.1:1"); err == nil {
		t.Errorf("WriteKubeconfig accepted an http:// server")
	}
}

// TestConnect reaches a running control plane as a qemu guest does: under
// an address its certificate does not name, with its CA and token only.
func TestConnect(t *testing.T) {
	c := clustertest.Cluster(t)
	addr, stop := hostForwarder(t, "127.0.0.2:0", strings.TrimPrefix(c.Server, "https://"))
	defer stop()
	remote, err := controlplane.Connect("https://"+addr, c.CAData(), c.Token)
	if err != nil {
		t.Fatal(err)
	}
	cfg := remote.RESTConfig()
	if cfg.ServerName != controlplane.ServerName || cfg.Host != "https://"+addr {
		t.Errorf("RESTConfig through %s: host %q, server name %q, want %q", addr, cfg.Host, cfg.ServerName, controlplane.ServerName)
	}
	if _, err := clientset(t, cfg).CoreV1().Namespaces().Get(ctxT(t, 10*time.Second), "default", metav1.GetOptions{}); err != nil {
		t.Errorf("client of the connected cluster: %v", err)
	}
	if direct := c.RESTConfig(); direct.ServerName != "" {
		t.Errorf("RESTConfig at the certificate's own address sets server name %q", direct.ServerName)
	}
	remote.Stop() // stops nothing: the cluster still answers
	if _, err := clientset(t, c.RESTConfig()).Discovery().ServerVersion(); err != nil {
		t.Errorf("after Stop of the connected cluster: %v", err)
	}

	for _, bad := range []struct{ server, token, want string }{
		{"http://" + addr, c.Token, "not an https URL"},
		{"https://" + addr, "", "token"},
	} {
		if _, err := controlplane.Connect(bad.server, c.CAData(), bad.token); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Connect(%q, token %q): %v, want an error saying %q", bad.server, bad.token, err, bad.want)
		}
	}
	if _, err := controlplane.Connect("https://"+addr, []byte("not PEM"), c.Token); err == nil {
		t.Error("Connect accepted a CA that is not PEM")
	}
}

// hostForwarder relays connections from listen to target in the host
// namespace (a stand-in for any other route to the API server).
func hostForwarder(t *testing.T, listen, target string) (string, func()) {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer in.Close()
				out, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer out.Close()
				go func() { _, _ = io.Copy(out, in) }()
				_, _ = io.Copy(in, out)
			}()
		}
	}()
	return ln.Addr().String(), func() { ln.Close() }
}

func TestStopAndStartAPIServer(t *testing.T) {
	c := clustertest.Cluster(t)
	ctx := ctxT(t, 2*time.Minute)
	ds := clustertest.Client(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "survives-restart"}}
	if _, err := ds.Namespaces.Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	etcdPids := pidsOf(t, c, "etcd")
	apiPids := pidsOf(t, c, "kube-apiserver")

	start := time.Now()
	c.StopAPIServer()
	t.Logf("StopAPIServer took %v", time.Since(start).Round(time.Millisecond))
	if c.APIServerRunning() {
		t.Errorf("APIServerRunning after StopAPIServer")
	}
	if err := syscall.Kill(apiPids[0], 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("kube-apiserver pid %d still exists (%v)", apiPids[0], err)
	}
	if got := pidsOf(t, c, "etcd"); len(got) != 1 || got[0] != etcdPids[0] {
		t.Errorf("etcd pids %v after StopAPIServer, want %v", got, etcdPids)
	}
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err := ds.Namespaces.Get(qctx, "survives-restart", metav1.GetOptions{})
	cancel()
	if err == nil || !datastore.IsUnreachable(err) {
		t.Errorf("a request while the API server is down: %v, want an unreachable error", err)
	}

	start = time.Now()
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("StartAPIServer took %v", time.Since(start).Round(time.Millisecond))
	// The same client (same address, CA and token) works again, and the
	// data survived in etcd.
	if _, err := ds.Namespaces.Get(ctx, "survives-restart", metav1.GetOptions{}); err != nil {
		t.Errorf("after the restart: %v", err)
	}
	if err := ds.Namespaces.Delete(ctx, "survives-restart", metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
	if err := c.StartAPIServer(ctx); err != nil {
		t.Errorf("StartAPIServer while running: %v", err)
	}
	if got := pidsOf(t, c, "kube-apiserver"); len(got) != 1 {
		t.Errorf("kube-apiserver pids %v, want one", got)
	}
}

func TestForwardIntoNetNS(t *testing.T) {
	c := clustertest.Cluster(t)
	name := "tabby-fwd-" + randHex(4)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	addr, stop, err := controlplane.ForwardIntoNetNS("/var/run/netns/"+name, strings.TrimPrefix(c.Server, "https://"))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Errorf("listen address %s, want 127.0.0.1:PORT", addr)
	}
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := c.WriteKubeconfig(kc, "https://"+addr); err != nil {
		t.Fatal(err)
	}
	kubectl := func(args ...string) (string, error) {
		cmd := exec.Command("ip", append([]string{"netns", "exec", name, filepath.Join(c.BinDir, "kubectl"), "--kubeconfig", kc, "--request-timeout", "5s"}, args...)...)
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	// Several requests over separate connections.
	for i := range 3 {
		out, err := kubectl("get", "namespace", "default", "-o", "name")
		if err != nil || out != "namespace/default" {
			t.Fatalf("kubectl in the namespace (%d): %v: %s", i, err, out)
		}
	}
	// lo is up, and the namespace does not reach the host's API server
	// directly: only through the forwarder.
	out, err := exec.Command("ip", "-n", name, "-o", "link", "show", "lo").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "UP") {
		t.Errorf("lo in the namespace: %v: %s", err, out)
	}
	direct := filepath.Join(t.TempDir(), "direct")
	if err := c.WriteKubeconfig(direct, ""); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", name, filepath.Join(c.BinDir, "kubectl"), "--kubeconfig", direct, "--request-timeout", "3s", "get", "ns")
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("the namespace reached %s without the forwarder: %s", c.Server, out)
	}
	// A watch stays open through the forwarder, and stop cuts it.
	watch := exec.Command("ip", "netns", "exec", name, filepath.Join(c.BinDir, "kubectl"), "--kubeconfig", kc, "get", "namespaces", "--watch", "-o", "name")
	stdout, _ := watch.StdoutPipe()
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = watch.Process.Kill(); _ = watch.Wait() }()
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() {
		t.Fatalf("the watch printed nothing")
	}
	stopped := time.Now()
	stop()
	ended := make(chan struct{})
	go func() {
		for sc.Scan() {
		}
		close(ended)
	}()
	select {
	case <-ended:
		t.Logf("the watch ended %v after stop", time.Since(stopped).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Errorf("the watch through the forwarder did not end after stop")
	}
	if out, err := kubectl("get", "namespace", "default", "-o", "name"); err == nil {
		t.Errorf("kubectl through a stopped forwarder: %s", out)
	}
	stop() // twice is fine
}

func TestForwardIntoNetNSErrors(t *testing.T) {
	if _, _, err := controlplane.ForwardIntoNetNS("/var/run/netns/tabby-no-such-namespace", "127.0.0.1:1"); err == nil {
		t.Errorf("a missing namespace was accepted")
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// TestSecondClusterStopAndKeepDir starts a second, independent cluster in a
// given folder, with KeepDir, and checks Stop ends exactly its processes.
func TestSecondClusterStopAndKeepDir(t *testing.T) {
	first := clustertest.Cluster(t)
	dir := filepath.Join(t.TempDir(), "second")
	start := time.Now()
	c, err := controlplane.Start(ctxT(t, 2*time.Minute), controlplane.Options{Dir: dir, KeepDir: true, BinDir: first.BinDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a second cluster started in %v", time.Since(start).Round(time.Millisecond))
	defer c.Stop()
	if c.Server == first.Server || c.EtcdURL == first.EtcdURL {
		t.Fatalf("the second cluster shares an address with the first: %s %s", c.Server, c.EtcdURL)
	}
	if _, err := clientset(t, c.RESTConfig()).Discovery().ServerVersion(); err != nil {
		t.Fatal(err)
	}
	sleep, err := c.StartProcess("/bin/sleep", "600")
	if err != nil {
		t.Fatal(err)
	}
	pids := append(pidsOf(t, c, "etcd"), pidsOf(t, c, "kube-apiserver")...)
	pids = append(pids, sleep.Pid())
	if len(pids) != 3 {
		t.Fatalf("pids %v", pids)
	}
	firstPids := append(pidsOf(t, first, "etcd"), pidsOf(t, first, "kube-apiserver")...)
	start = time.Now()
	c.Stop()
	t.Logf("Stop took %v", time.Since(start).Round(time.Millisecond))
	c.Stop()
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("pid %d survived Stop (%v)", pid, err)
		}
	}
	for _, pid := range firstPids {
		if err := syscall.Kill(pid, 0); err != nil {
			t.Errorf("pid %d of the first cluster: %v", pid, err)
		}
	}
	for _, f := range []string{"etcd.log", "kube-apiserver.log", "sleep.log", "pki/apiserver.crt"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("KeepDir: %v", err)
		}
	}
	if err := c.StartAPIServer(context.Background()); err == nil {
		t.Errorf("StartAPIServer after Stop succeeded")
	}
}

// TestStartFailureShowsLog: a component that cannot start makes Start fail
// with the end of its log, and leaves nothing behind.
func TestStartFailureShowsLog(t *testing.T) {
	first := clustertest.Cluster(t)
	dir := filepath.Join(t.TempDir(), "failing") // Start makes it, so Stop removes it
	_, err := controlplane.Start(ctxT(t, time.Minute), controlplane.Options{Dir: dir, BinDir: first.BinDir, ExtraAPIServerArgs: []string{"--no-such-flag=1"}})
	if err == nil {
		t.Fatal("Start succeeded with a bad kube-apiserver flag")
	}
	msg := err.Error()
	t.Logf("the error: %.600s", msg)
	if !strings.Contains(msg, "kube-apiserver") || !strings.Contains(msg, "unknown flag: --no-such-flag") {
		t.Errorf("the error does not name kube-apiserver and quote its log: %s", msg)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed Start left %s behind (%v)", dir, err)
	}
	if pids := pidsOfDir(t, dir); len(pids) > 0 {
		t.Errorf("a failed Start left processes behind: %v", pids)
	}
	if _, err := controlplane.Start(context.Background(), controlplane.Options{BinDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("Start with an empty BinDir: %v", err)
	}
}

// pidsOfDir finds processes whose command line mentions dir.
func pidsOfDir(t *testing.T, dir string) []int {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmd), dir) && !isZombie(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestChildrenDieWithParent: processes the cluster starts die when the
// program that started them is killed (Pdeathsig), even after the thread
// that asked for them is gone.
func TestChildrenDieWithParent(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(self)
	child.Env = append(os.Environ(), envChild+"="+filepath.Join(t.TempDir(), "sleep.log"))
	out, _ := child.StdoutPipe()
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		t.Fatal("the child printed nothing")
	}
	f := strings.Fields(sc.Text())
	if len(f) != 2 || f[0] != "pid" {
		t.Fatalf("the child said %q", sc.Text())
	}
	pid, _ := strconv.Atoi(f[1])
	time.Sleep(200 * time.Millisecond)
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the grandchild %d died while its parent lives (its spawning thread was retired?): %v", pid, err)
	}
	_ = child.Process.Kill()
	_ = child.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for {
		// The grandchild is reparented and reaped by init (or is a zombie
		// of ours, the subreaper, which counts as dead).
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) || isZombie(pid) {
			break
		}
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("pid %d survived its parent", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func isZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndex(s, ")")
	return i > 0 && len(s) > i+2 && s[i+2] == 'Z'
}
