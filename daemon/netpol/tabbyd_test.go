package netpol

// This test runs the programs: tabbyd in a node's network namespace and
// the CNI plugins driven through libcni as a container runtime would
// (internal/testnet), against the real API server.

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/internal/testnet"
)

var (
	buildOnce            sync.Once
	pluginDir, tabbydBin string
	buildErr             error
)

// binaries builds (once) or finds ($TABBY_BIN_DIR) tabbyd and the plugins.
func binaries(t *testing.T) (plugins, tabbyd string) {
	t.Helper()
	buildOnce.Do(func() {
		dir := filepath.Join(clustertest.Cluster(t).Dir, "netpol-bin")
		if pluginDir, buildErr = testnet.PluginDir(dir); buildErr == nil {
			tabbydBin, buildErr = testnet.Binary(dir, "tabbyd")
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return pluginDir, tabbydBin
}

// e2e is one node namespace with its own tabbyd and a namespace of pods.
type e2e struct {
	*world
	n      *testnet.Node
	list   *libcni.NetworkConfigList
	tabbyd string
	// metrics reads the running tabbyd's metrics.
	metrics func() map[string]float64
	// d is the running tabbyd.
	d *testnet.Tabbyd
}

func newE2E(t *testing.T) *e2e {
	t.Helper()
	w := newWorld(t) // the Node object and pool are replaced by the node's
	plugins, tabbyd := binaries(t)
	i := seq.Add(1)
	name := fmt.Sprintf("netpol-e2e-%d", i)
	label := map[string]string{"netpol-e2e": name}
	n, err := testnet.NewNode(waitCtx(t, time.Minute), testnet.NodeOptions{
		Name: name, Dir: t.TempDir(), PluginDirs: []string{plugins}, Cluster: clustertest.Cluster(t), Labels: label,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("removing node %s: %v", name, err)
		}
	})
	pool, err := w.ds.IPPools.Create(context.Background(), &tabbyv1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       tabbyv1.IPPoolSpec{CIDR: fmt.Sprintf("10.94.%d.0/24", i), NodeSelector: &metav1.LabelSelector{MatchLabels: label}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.ds.IPPools.Delete(context.Background(), pool.Name, metav1.DeleteOptions{}) })
	w.node = name
	e := &e2e{world: w, n: n, tabbyd: tabbyd}
	e.list = e.conf(t, nil)
	return e
}

// conf is the node's conflist with extra keys in tabby's entry.
func (e *e2e) conf(t *testing.T, extra map[string]any) *libcni.NetworkConfigList {
	t.Helper()
	c := e.n.TabbyConf(nil)
	for k, v := range extra {
		c[k] = v
	}
	list, err := testnet.ConfList("1.1.0", c)
	if err != nil {
		t.Fatal(err)
	}
	return list
}

// startTabbyd runs the node's tabbyd until stop (returned) or the test's end.
func (e *e2e) startTabbyd(t *testing.T, args ...string) (stop func()) {
	t.Helper()
	ensureTabbyNamespace(t)
	d, err := e.n.StartTabbyd(waitCtx(t, time.Minute), e.tabbyd, args...)
	if err != nil {
		t.Fatal(err)
	}
	e.d = d
	var once sync.Once
	stop = func() {
		once.Do(func() {
			if err := d.Stop(); err != nil {
				t.Errorf("stopping tabbyd: %v", err)
			}
			if t.Failed() {
				t.Logf("tabbyd's log:\n%s", d.LogTail(40))
			}
		})
	}
	t.Cleanup(stop)
	e.metrics = func() map[string]float64 {
		m, err := d.Metrics(context.Background(), "tabby_")
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	return stop
}

// a running pod: its namespace and the ADD's result.
type e2ePod struct {
	*testnet.Pod
	ip net.IP
}

// add creates the Pod object (bound to node, with labels) and wires it
// with list.
func (e *e2e) add(t *testing.T, list *libcni.NetworkConfigList, name, node string, labels map[string]string) (*e2ePod, error) {
	t.Helper()
	e.pod(t, name, node, labels)
	p, err := testnet.NewPod(e.ns, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.n.Del(context.Background(), list, p, nil)
		_ = p.Close()
	})
	res, err := e.n.Add(waitCtx(t, time.Minute), list, p, nil)
	if err != nil {
		return nil, err
	}
	ips := testnet.ResultIPs(res, false)
	if len(ips) != 1 {
		t.Fatalf("ADD of %s gave %v", name, res)
	}
	return &e2ePod{Pod: p, ip: ips[0]}, nil
}

func (e *e2e) mustAdd(t *testing.T, name string, labels map[string]string) *e2ePod {
	t.Helper()
	p, err := e.add(t, e.list, name, e.node, labels)
	if err != nil {
		t.Fatalf("ADD %s: %v", name, err)
	}
	return p
}

// filter is the node's filter table in both iptables backends, and its
// ipsets.
func (e *e2e) filter(t *testing.T) string {
	t.Helper()
	var out strings.Builder
	err := e.n.Do(func() error {
		for _, save := range []string{"iptables-nft-save", "iptables-legacy-save"} {
			if _, err := exec.LookPath(save); err != nil {
				continue
			}
			o, err := exec.Command(save, "-t", "filter").CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s: %v: %s", save, err, o)
			}
			out.Write(o)
		}
		o, err := exec.Command("ipset", "save").CombinedOutput()
		if err != nil {
			return fmt.Errorf("ipset save: %v: %s", err, o)
		}
		out.Write(o)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// serve answers TCP on port 80 of the pod's address until the test ends.
func serve(t *testing.T, p *e2ePod) string {
	t.Helper()
	addr := net.JoinHostPort(p.ip.String(), "80")
	stop, err := testnet.ServeTCP(p.NS, addr, []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return addr
}

func reaches(from *e2ePod, addr string) bool {
	got, err := testnet.ReadTCP(from.NS, addr, time.Second)
	return err == nil && string(got) == "hello"
}

// TestTabbydPluginWaitsForPolicy: with tabbyd enforcing NetworkPolicy, the
// CNI ADD of a pod returns only once the pod's rules are in the node's
// kernel, so its first packet meets them; a wait that cannot end fails
// the ADD and leaves nothing behind; a pod wired while tabbyd is down is
// cut off until tabbyd is back (DenyUnlisted); and tabbyd
// --network-policy=false removes the rules and lets ADD return at once.
func TestTabbydPluginWaitsForPolicy(t *testing.T) {
	e := newE2E(t)
	e.policy(t, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "server-deny-all"},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}}},
	})
	stop := e.startTabbyd(t)

	server := e.mustAdd(t, "server", map[string]string{"app": "server"})
	// Right as ADD returns, the server's ingress chain is in the kernel.
	if k, veth := e.filter(t), HostIface(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "server"}}); !ingressDispatched(k, server.ip.String(), veth) {
		t.Fatalf("ADD returned before the server's rules were in the kernel (%s on %s not dispatched to an ingress chain):\n%s", server.ip, veth, k)
	}
	client := e.mustAdd(t, "client", map[string]string{"app": "client"})
	addr := serve(t, server)
	if reaches(client, addr) {
		t.Errorf("the client reached the server the moment it started, through a deny-all policy")
	}
	m := e.metrics()
	if got := m[`tabby_cni_agent_requests_total{endpoint="policy-wait",result="ok"}`]; got != 2 {
		t.Errorf("policy-wait answered %v times, want 2", got)
	}
	// A policy that allows it: the same probe passes (the block above was
	// the policy, not a broken network).
	e.policy(t, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "server-from-client"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
				Ports: tcpPort(80),
			}},
		},
	})
	eventually(t, "the client reaching the server once allowed", func() bool { return reaches(client, addr) })

	// A pod tabbyd will never program here (bound to another node): ADD
	// fails after policyWaitTimeout, says why, and leaves no veth.
	short := e.conf(t, map[string]any{"policyWaitTimeout": "1s"})
	_, err := e.add(t, short, "stray", "another-node", map[string]string{"app": "stray"})
	if err == nil || !strings.Contains(err.Error(), `bound to node "another-node"`) || !strings.Contains(err.Error(), "within 1") {
		t.Errorf("ADD of a pod tabbyd cannot program: %v", err)
	}
	if k, veth := e.filter(t), HostIface(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: e.ns, Name: "stray"}}); e.linkExists(t, veth) {
		t.Errorf("the failed ADD left its veth %s behind\n%s", veth, k)
	}

	// tabbyd down: a new pod starts (nothing to wait for) but its traffic
	// is dropped until tabbyd is back and has programmed it.
	stop()
	late := e.mustAdd(t, "late", map[string]string{"app": "late"})
	lateAddr := serve(t, late)
	if reaches(client, lateAddr) {
		t.Errorf("a pod wired while tabbyd was down was reachable before tabbyd knew it")
	}
	stop = e.startTabbyd(t)
	eventually(t, "the late pod reachable once tabbyd is back", func() bool { return reaches(client, lateAddr) })

	// NetworkPolicy off: the rules go, ADD does not wait.
	stop()
	e.startTabbyd(t, "--network-policy=false")
	eventually(t, "tabby's policy chains removed", func() bool { return !strings.Contains(e.filter(t), "TABBY-NP-") })
	free := e.mustAdd(t, "free", map[string]string{"app": "server"})
	if !reaches(client, serve(t, free)) {
		t.Errorf("with NetworkPolicy off, a pod a deny-all policy selects is not reachable")
	}
	if got := e.metrics()[`tabby_cni_agent_requests_total{endpoint="policy-wait",result="ok"}`]; got != 1 {
		t.Errorf("policy-wait with NetworkPolicy off answered %v times, want 1", got)
	}
}

// linkExists says whether the node has a link of that name.
func (e *e2e) linkExists(t *testing.T, name string) bool {
	t.Helper()
	var found bool
	_ = e.n.Do(func() error {
		_, err := net.InterfaceByName(name)
		found = err == nil
		return nil
	})
	return found
}

// ensureTabbyNamespace makes tabbyd's namespace (--namespace's default,
// tabby-system) as deploy/ does: its heartbeat Lease lives there, and
// /readyz fails while the heartbeat cannot renew it.
func ensureTabbyNamespace(t *testing.T) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(clustertest.Cluster(t).RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tabby-system"}}
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}
