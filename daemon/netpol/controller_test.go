package netpol

// These tests run a controller in this process against the real API
// server (clustertest) with the real compiler and applier, programming the
// real kernel of a network namespace the test makes: the controller's loop
// runs on a thread inside it, while its informers reach the API server
// from the host's namespace.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/contract/agentapi"
	"github.com/tabbynet/tabby/daemon/cniagent"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/events"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/internal/netnstest"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/policy"
	"github.com/tabbynet/tabby/policy/apply"
)

var seq atomic.Int32

// world is one test's node (its Node object, a pool for it, a network
// namespace standing for it) and a namespace for its objects.
type world struct {
	ds      *datastore.Client
	node    string
	ns      string // Kubernetes namespace
	netns   *netnstest.NS
	ipam    *ipam.IPAM
	network string
	// cnpClient, when set, is the controller's ClusterNetworkPolicy
	// client instead of NewClusterPolicyClient's.
	cnpClient *ClusterPolicyClient
	// resync, when set, is the controller's Resync, and the applier's
	// own period is an hour: only the controller reads the kernel back.
	resync time.Duration
}

func newWorld(t *testing.T) *world {
	t.Helper()
	if _, err := exec.LookPath("ipset"); err != nil {
		t.Fatalf("the ipset command is missing (apt-get install ipset): %v", err)
	}
	ds := clustertest.Client(t)
	i := seq.Add(1)
	w := &world{ds: ds, node: fmt.Sprintf("netpol-node-%d", i), ns: fmt.Sprintf("netpol-%d", i), network: "k8s-pod-network"}
	ctx := context.Background()
	label := map[string]string{"netpol-test": w.node}
	if _, err := ds.Nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: w.node, Labels: label}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ds.Nodes.Delete(context.Background(), w.node, metav1.DeleteOptions{}) })
	pool, err := ds.IPPools.Create(ctx, &tabbyv1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("netpol-pool-%d", i)},
		Spec:       tabbyv1.IPPoolSpec{CIDR: fmt.Sprintf("10.93.%d.0/24", i), NodeSelector: &metav1.LabelSelector{MatchLabels: label}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ds.IPPools.Delete(context.Background(), pool.Name, metav1.DeleteOptions{}) })
	if _, err := ds.Namespaces.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.ns, Labels: map[string]string{"team": "a"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ds.Namespaces.Delete(context.Background(), w.ns, metav1.DeleteOptions{}) })
	// No controller-manager makes the namespace's default ServiceAccount,
	// which pods need.
	sa := datastore.NewResource[*corev1.ServiceAccount, *corev1.ServiceAccountList]("serviceaccounts", ds.CoreREST(), datastore.ParameterCodec, w.ns,
		func() *corev1.ServiceAccount { return &corev1.ServiceAccount{} }, func() *corev1.ServiceAccountList { return &corev1.ServiceAccountList{} })
	if _, err := sa.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.ipam = ipam.New(ds)
	w.netns = netnstest.New(t, w.node)
	return w
}

// pod creates a pod of w's namespace bound to node.
func (w *world) pod(t *testing.T, name, node string, labels map[string]string) *corev1.Pod {
	t.Helper()
	p, err := w.ds.Pods(w.ns).Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: w.ns, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		zero := int64(0)
		_ = w.ds.Pods(w.ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})
	return p
}

// assign has IPAM hand the pod an address, as the CNI plugin does before it
// wires the pod (the kubelet has not reported it yet).
func (w *world) assign(t *testing.T, p *corev1.Pod) netip.Addr {
	t.Helper()
	handle := w.network + "." + string(p.UID)
	got, err := w.ipam.Assign(context.Background(), ipam.Request{HandleID: handle, Node: w.node, Namespace: p.Namespace, Pod: p.Name, IPv4: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.ipam.ReleaseHandle(context.Background(), handle, w.node) })
	a, _ := netip.AddrFromSlice(got[0].IP)
	return a.Unmap()
}

func (w *world) policy(t *testing.T, np *networkingv1.NetworkPolicy) {
	t.Helper()
	pc, err := NewPolicyClient(clustertest.Config(t), w.ns)
	if err != nil {
		t.Fatal(err)
	}
	np.Namespace = w.ns
	if _, err := pc.Create(context.Background(), np, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// kernel prints the filter table and the ipsets of netns.
func (w *world) kernel(t *testing.T, b string) string {
	t.Helper()
	var out strings.Builder
	err := w.netns.Run(func() error {
		for _, argv := range [][]string{{b, "-t", "filter"}, {"ipset", "save"}} {
			o, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%v: %v: %s", argv, err, o)
			}
			out.Write(o)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// run runs a command in w's node namespace, failing the test with its
// output if it fails.
func (w *world) run(t *testing.T, argv ...string) {
	t.Helper()
	if err := w.netns.Run(func() error {
		if o, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %v: %s", argv, err, o)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// ingressDispatched says whether a kernel dump (iptables-save -t filter and
// ipset save) sends traffic for the address out the veth to an ingress
// policy chain: the pair is in a dispatch set TABBY-NP-TO-POD goes by.
func ingressDispatched(kernel, ip, veth string) bool {
	re := regexp.MustCompile(`(?m)^add (tabby-np-i[46]-\S+) ` + regexp.QuoteMeta(ip+","+veth) + `$`)
	for _, m := range re.FindAllStringSubmatch(kernel, -1) {
		if strings.Contains(kernel, "-A "+policy.ChainToPod+" -m set --match-set "+m[1]+" dst,dst -g "+policy.PolicyChainPrefix+"I-") {
			return true
		}
	}
	return false
}

// countingRecorder passes Events on to the real recorder and counts them
// by "reason object".
type countingRecorder struct {
	events.Recorder
	mu sync.Mutex
	n  map[string]int
}

func (r *countingRecorder) Event(o k8sruntime.Object, typ, reason, msg string) {
	r.mu.Lock()
	if m, ok := o.(metav1.Object); ok {
		r.n[reason+" "+m.GetNamespace()+"/"+m.GetName()]++
	}
	r.mu.Unlock()
	r.Recorder.Event(o, typ, reason, msg)
}

func (r *countingRecorder) count(k string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[k]
}

type running struct {
	c       *Controller
	applier *apply.Applier
	reg     *prometheus.Registry
	rec     *countingRecorder
}

// start runs a controller for w's node in w's network namespace with the
// real applier and compile (policy.Compile, maybe wrapped) until the test
// ends; on the way out it removes what it programmed.
func (w *world) start(t *testing.T, compile Compiler) *running {
	t.Helper()
	if compile == nil {
		compile = policy.Compile
	}
	pc, err := NewPolicyClient(clustertest.Config(t), metav1.NamespaceAll)
	if err != nil {
		t.Fatal(err)
	}
	cpc := w.cnpClient
	if cpc == nil {
		if cpc, err = NewClusterPolicyClient(clustertest.Config(t)); err != nil {
			t.Fatal(err)
		}
	}
	realRec, stopEvents := NewRecorder(w.ds, w.node, slog.New(slog.DiscardHandler))
	t.Cleanup(stopEvents)
	r := &running{reg: prometheus.NewRegistry(), rec: &countingRecorder{Recorder: realRec, n: map[string]int{}}}
	w.netns.Serve("the controller", func() (err error) {
		opts := apply.Options{Logger: slog.New(slog.DiscardHandler)}
		if w.resync > 0 {
			opts.ResyncPeriod = time.Hour
		}
		if r.applier, err = apply.New(opts); err != nil {
			return err
		}
		r.c, err = New(Config{Node: w.node, DS: w.ds, Policies: pc, ClusterPolicies: cpc, Compile: compile, Applier: r.applier, DenyUnlisted: true,
			Recorder: r.rec, Registerer: r.reg, JumpCheck: 200 * time.Millisecond, Resync: w.resync})
		return err
	}, func(ctx context.Context) error {
		err := r.c.Run(ctx)
		// Leave the namespace as it was (it goes with the test anyway).
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, cerr := r.applier.Cleanup(cctx)
		return errors.Join(err, cerr)
	})
	return r
}

func waitCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func tcpPort(p int32) []networkingv1.NetworkPolicyPort {
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(p)
	return []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}
}

// TestControllerProgramsPods: a pod is programmed, with the address IPAM
// gave it and its host veth, before the kubelet reports any address; a
// WaitProgrammed for it returns only once its rules are in the kernel;
// the kernel holds its peers' addresses in the sets; a label change moves
// set members; an address that never comes times out with the reason.
func TestControllerProgramsPods(t *testing.T) {
	w := newWorld(t)
	server := w.pod(t, "server", w.node, map[string]string{"app": "server"})
	client := w.pod(t, "client", "some-other-node", map[string]string{"app": "client"})
	w.policy(t, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "server-from-client"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
				Ports: tcpPort(80),
			}},
		},
	})
	r := w.start(t, nil)

	// The wait starts before IPAM has handed out the address.
	type result struct {
		gen uint64
		err error
		// kernel is the filter table and ipsets the moment the wait ended.
		kernel string
	}
	waited := make(chan result, 1)
	var serverIP netip.Addr
	ipKnown := make(chan struct{})
	go func() {
		<-ipKnown
		gen, err := r.c.WaitProgrammed(waitCtx(t, 30*time.Second), w.ns, "server", string(server.UID), []netip.Addr{serverIP})
		res := result{gen: gen, err: err}
		if err == nil {
			var out strings.Builder
			_ = w.netns.Run(func() error {
				o, _ := exec.Command(r.applier.Backend().IPTablesSave, "-t", "filter").CombinedOutput()
				out.Write(o)
				o, _ = exec.Command("ipset", "save").CombinedOutput()
				out.Write(o)
				return nil
			})
			res.kernel = out.String()
		}
		waited <- res
	}()
	serverIP = w.assign(t, server)
	close(ipKnown)
	// The client runs elsewhere: its address comes from its status.
	clientIP := netip.MustParseAddr("10.93.250.7")
	client.Status.PodIPs = []corev1.PodIP{{IP: clientIP.String()}}
	client.Status.Phase = corev1.PodRunning
	if _, err := w.ds.Pods(w.ns).UpdateStatus(context.Background(), client, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	res := <-waited
	if res.err != nil {
		t.Fatalf("WaitProgrammed: %v", res.err)
	}
	veth := HostIface(server)
	if !ingressDispatched(res.kernel, serverIP.String(), veth) {
		t.Errorf("when WaitProgrammed returned (sync %d), the kernel did not dispatch %s on %s to an ingress chain:\n%s", res.gen, serverIP, veth, res.kernel)
	}
	if want := `-A FORWARD -m comment --comment "tabby:network-policy" -j ` + policy.ChainForward; !strings.Contains(res.kernel, want) {
		t.Errorf("when WaitProgrammed returned (sync %d), the kernel lacked %q:\n%s", res.gen, want, res.kernel)
	}
	// The client's address reaches the peer set (not necessarily by the
	// same sync: it was assigned after the server's).
	eventually(t, "the client's address in a peer set", func() bool {
		return strings.Contains(w.kernel(t, r.applier.Backend().IPTablesSave), " "+clientIP.String()+"\n")
	})

	// A label change moves set members; the chains stay.
	if _, err := w.ds.Pods(w.ns).Patch(context.Background(), "client", "application/merge-patch+json",
		[]byte(`{"metadata":{"labels":{"app":"other"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the relabelled client's address out of the peer set", func() bool {
		return !strings.Contains(w.kernel(t, r.applier.Backend().IPTablesSave), " "+clientIP.String()+"\n")
	})

	// A wait for an address the pod never gets runs out, saying why.
	_, err := r.c.WaitProgrammed(waitCtx(t, 300*time.Millisecond), w.ns, "server", "", []netip.Addr{netip.MustParseAddr("10.99.99.99")})
	if err == nil || !strings.Contains(err.Error(), "knows the pod's addresses as "+serverIP.String()) {
		t.Errorf("a wait for an unknown address: %v", err)
	}
	_, err = r.c.WaitProgrammed(waitCtx(t, 300*time.Millisecond), w.ns, "client", "", []netip.Addr{clientIP})
	if err == nil || !strings.Contains(err.Error(), `bound to node "some-other-node"`) {
		t.Errorf("a wait for a pod of another node: %v", err)
	}
	_, err = r.c.WaitProgrammed(waitCtx(t, 300*time.Millisecond), w.ns, "server", "older-uid", []netip.Addr{serverIP})
	if err == nil || !strings.Contains(err.Error(), "UID") {
		t.Errorf("a wait for another pod of the same name: %v", err)
	}

	if err := r.c.Ready(); err != nil {
		t.Errorf("Ready: %v", err)
	}
	if v := metric(t, r.reg, "tabby_policy_last_sync_success", ""); v != 1 {
		t.Errorf("tabby_policy_last_sync_success %v", v)
	}
	if v := metric(t, r.reg, "tabby_policy_endpoints", "local"); v < 1 {
		t.Errorf("tabby_policy_endpoints{scope=local} %v", v)
	}
	if v := metric(t, r.reg, "tabby_policy_rules", ""); v < 1 {
		t.Errorf("tabby_policy_rules %v", v)
	}
	if v := metric(t, r.reg, "tabby_policy_syncs_total", "ok"); v < 1 {
		t.Errorf("tabby_policy_syncs_total{result=ok} %v", v)
	}
}

// TestControllerKeepsLeftCombinations: a local pod whose labels flip to
// another local pod's and back moves between dispatch sets, and no flip
// writes or deletes a chain: the chains of the combination of policies
// it left stay while no pod has it (Config.Retention, by default).
func TestControllerKeepsLeftCombinations(t *testing.T) {
	w := newWorld(t)
	solo := w.pod(t, "solo", w.node, map[string]string{"app": "solo"})
	other := w.pod(t, "other", w.node, map[string]string{"app": "other"})
	for app, port := range map[string]int32{"solo": 80, "other": 81} {
		w.policy(t, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: app},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": app}},
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{Ports: tcpPort(port)}},
			},
		})
	}
	r := w.start(t, policy.NewIncremental().Compile)
	soloIP, otherIP := w.assign(t, solo), w.assign(t, other)
	for _, p := range []struct {
		name string
		ip   netip.Addr
	}{{"solo", soloIP}, {"other", otherIP}} {
		if _, err := r.c.WaitProgrammed(waitCtx(t, 30*time.Second), w.ns, p.name, "", []netip.Addr{p.ip}); err != nil {
			t.Fatal(err)
		}
	}
	// The ingress dispatch set each pod is in.
	setOf := func(kernel string, ip netip.Addr, veth string) string {
		m := regexp.MustCompile(`(?m)^add (tabby-np-i4-\S+) ` + regexp.QuoteMeta(ip.String()+","+veth) + `$`).FindStringSubmatch(kernel)
		if m == nil {
			return ""
		}
		return m[1]
	}
	save := r.applier.Backend().IPTablesSave
	kernel := w.kernel(t, save)
	sets := map[string]string{"solo": setOf(kernel, soloIP, HostIface(solo)), "other": setOf(kernel, otherIP, HostIface(other))}
	if sets["solo"] == "" || sets["other"] == "" || sets["solo"] == sets["other"] {
		t.Fatalf("dispatch sets %v:\n%s", sets, kernel)
	}
	chains := metric(t, r.reg, "tabby_policy_kernel_changes_total", "chain")
	for i, app := range []string{"other", "solo", "other"} {
		if _, err := w.ds.Pods(w.ns).Patch(context.Background(), "solo", "application/merge-patch+json",
			[]byte(`{"metadata":{"labels":{"app":"`+app+`"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, fmt.Sprintf("flip %d: solo (app=%s) in the dispatch set %s", i+1, app, sets[app]), func() bool {
			return setOf(w.kernel(t, save), soloIP, HostIface(solo)) == sets[app]
		})
		if got := metric(t, r.reg, "tabby_policy_kernel_changes_total", "chain"); got != chains {
			t.Errorf("flip %d (app=%s): %v chains written or deleted", i+1, app, got-chains)
		}
	}
	// The chain and set of app=solo's combination stayed, its set empty
	// while no pod had it; the flips are in the kernel as set members.
	kernel = w.kernel(t, save)
	if !strings.Contains(kernel, "-A "+policy.ChainToPod+" -m set --match-set "+sets["solo"]+" dst,dst -g ") {
		t.Errorf("the dispatch rule of %s is gone:\n%s", sets["solo"], kernel)
	}
}

// TestControllerRepairsJumps: a jump into tabby's chains that something
// deletes is put back by the periodic check.
func TestControllerRepairsJumps(t *testing.T) {
	w := newWorld(t)
	p := w.pod(t, "a", w.node, map[string]string{"app": "a"})
	r := w.start(t, nil)
	ip := w.assign(t, p)
	if _, err := r.c.WaitProgrammed(waitCtx(t, 30*time.Second), w.ns, "a", "", []netip.Addr{ip}); err != nil {
		t.Fatal(err)
	}
	w.run(t, r.applier.Backend().IPTables, "-D", "FORWARD", "-m", "comment", "--comment", "tabby:network-policy", "-j", policy.ChainForward)
	// The check puts the jump back, then counts it: wait for both (the
	// count read right after the kernel shows the jump can still be 0).
	eventually(t, "the jump put back and counted as a repair", func() bool {
		return strings.Contains(w.kernel(t, r.applier.Backend().IPTablesSave), `-A FORWARD -m comment --comment "tabby:network-policy" -j `+policy.ChainForward) &&
			metric(t, r.reg, "tabby_policy_jump_repairs_total", "") >= 1
	})
}

// TestControllerReadsTheKernelBack: every Resync the controller has the
// kernel read back by an audit between syncs, which rewrites a chain
// something flushed; the applier's own clock (an hour here) has no part in
// it.
func TestControllerReadsTheKernelBack(t *testing.T) {
	w := newWorld(t)
	w.resync = time.Second
	p := w.pod(t, "a", w.node, map[string]string{"app": "a"})
	r := w.start(t, nil)
	ip := w.assign(t, p)
	if _, err := r.c.WaitProgrammed(waitCtx(t, 30*time.Second), w.ns, "a", "", []netip.Addr{ip}); err != nil {
		t.Fatal(err)
	}
	save := r.applier.Backend().IPTablesSave
	rule := "-A " + policy.ChainForward + " "
	if !strings.Contains(w.kernel(t, save), rule) {
		t.Fatalf("no rule in %s after the first sync:\n%s", policy.ChainForward, w.kernel(t, save))
	}
	w.run(t, r.applier.Backend().IPTables, "-F", policy.ChainForward)
	eventually(t, policy.ChainForward+" written again after a read of the kernel", func() bool {
		return strings.Contains(w.kernel(t, save), rule)
	})
}

// TestProblemsBecomeEvents: a policy the compiler refuses is logged and
// reported as one Warning Event on it, once per distinct message however
// many syncs follow; a new message is a new Event; the other policies are
// still enforced. (The API server refuses every policy the compiler would,
// so the test's compiler adds a problem for policies carrying an
// annotation, and compiles the rest with policy.Compile.)
func TestProblemsBecomeEvents(t *testing.T) {
	w := newWorld(t)
	const ann = "test.tabby.io/problem"
	compile := func(in *policy.Input) *policy.Ruleset {
		rs := policy.Compile(in)
		for _, p := range in.Policies {
			if msg := p.Annotations[ann]; msg != "" {
				rs.Problems = append(rs.Problems, policy.Problem{Kind: policy.KindNetworkPolicy, Namespace: p.Namespace, Name: p.Name, Message: msg})
			}
		}
		return rs
	}
	w.policy(t, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "refused", Annotations: map[string]string{ann: "first problem"}},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}}},
	})
	w.policy(t, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "fine"},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}}},
	})
	r := w.start(t, compile)
	key := ReasonNotEnforced + " " + w.ns + "/refused"

	// Several syncs: one per pod whose address arrives.
	var a0 netip.Addr
	for i := range 3 {
		p := w.pod(t, fmt.Sprintf("a%d", i), w.node, map[string]string{"app": "a"})
		ip := w.assign(t, p)
		if i == 0 {
			a0 = ip
		}
		if _, err := r.c.WaitProgrammed(waitCtx(t, 30*time.Second), w.ns, p.Name, "", []netip.Addr{ip}); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.rec.count(key); n != 1 {
		t.Errorf("%d Events for one problem over several syncs, want 1", n)
	}
	// The policy that is fine is enforced: the pods have its chain.
	if k := w.kernel(t, r.applier.Backend().IPTablesSave); !ingressDispatched(k, a0.String(), HostIface(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: "a0"}})) {
		t.Errorf("the policy without a problem is not programmed:\n%s", k)
	}
	events := func() []corev1.Event {
		l, err := w.eventList()
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	eventually(t, "the Event on the refused policy", func() bool { return len(events()) > 0 })
	ev := events()[0]
	if ev.Type != corev1.EventTypeWarning || ev.Reason != ReasonNotEnforced || ev.InvolvedObject.Kind != "NetworkPolicy" ||
		ev.Source.Component != "tabbyd" || ev.Source.Host != w.node || !strings.Contains(ev.Message, "first problem") {
		t.Errorf("the Event: %+v", ev)
	}

	// Another message: another Event.
	pc, _ := NewPolicyClient(clustertest.Config(t), w.ns)
	if _, err := pc.Patch(context.Background(), "refused", "application/merge-patch+json",
		[]byte(`{"metadata":{"annotations":{"`+ann+`":"second problem"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "an Event for the new message", func() bool {
		for _, e := range events() {
			if strings.Contains(e.Message, "second problem") {
				return true
			}
		}
		return false
	})
	if n := r.rec.count(key); n != 2 {
		t.Errorf("%d Events after the message changed, want 2", n)
	}
	if v := metric(t, r.reg, "tabby_policy_problems", ""); v != 1 {
		t.Errorf("tabby_policy_problems %v, want 1", v)
	}
}

// eventList lists the Events of w's namespace about the policy "refused".
func (w *world) eventList() ([]corev1.Event, error) {
	l, err := events.Client(w.ds, w.ns).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", "refused").String(),
	})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// TestAgentPolicyWait: the CNI agent's policy-wait, served by the
// controller, answers only once the pod is programmed; without a
// controller (NetworkPolicy off) it answers at once.
func TestAgentPolicyWait(t *testing.T) {
	w := newWorld(t)
	p := w.pod(t, "waited", w.node, map[string]string{"app": "w"})
	w.policy(t, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "deny"},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "w"}}},
	})
	r := w.start(t, nil)
	cl := startAgent(t, w, r.c)
	ip := w.assign(t, p)
	resp, err := cl.PolicyWait(waitCtx(t, 30*time.Second), agentapi.PolicyWaitRequest{Namespace: w.ns, Pod: "waited", PodUID: string(p.UID), IPs: []net.IP{ip.AsSlice()}, TimeoutMillis: 20000})
	if err != nil {
		t.Fatal(err)
	}
	k := w.kernel(t, r.applier.Backend().IPTablesSave)
	if !resp.Enforced || resp.Generation == 0 || !ingressDispatched(k, ip.String(), HostIface(p)) {
		t.Errorf("policy-wait answered %+v, the kernel then:\n%s", resp, k)
	}
	// An address that never comes: tabbyd's bound, and its reason.
	_, err = cl.PolicyWait(waitCtx(t, 30*time.Second), agentapi.PolicyWaitRequest{Namespace: w.ns, Pod: "waited", IPs: []net.IP{net.ParseIP("10.99.0.1")}, TimeoutMillis: 200})
	if err == nil || !strings.Contains(err.Error(), "has not programmed the NetworkPolicy of pod "+w.ns+"/waited (10.99.0.1)") {
		t.Errorf("a wait that runs out: %v", err)
	}

	// A request without addresses is refused with what it lacks.
	_, err = cl.PolicyWait(waitCtx(t, 5*time.Second), agentapi.PolicyWaitRequest{Namespace: w.ns, Pod: "waited"})
	if err == nil || !strings.Contains(err.Error(), "needs the pod's namespace, name and addresses") {
		t.Errorf("a request without addresses: %v", err)
	}

	off := startAgent(t, w, nil)
	resp, err = off.PolicyWait(waitCtx(t, 5*time.Second), agentapi.PolicyWaitRequest{Namespace: w.ns, Pod: "nobody", IPs: []net.IP{net.ParseIP("10.99.0.2")}})
	if err != nil || resp.Enforced {
		t.Errorf("policy-wait without NetworkPolicy: %+v, %v", resp, err)
	}
}

// startAgent serves a CNI agent for w's node with waiter (nil: none) on a
// new socket, until the test ends.
func startAgent(t *testing.T, w *world, waiter cniagent.PolicyWaiter) *agentapi.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cni.sock")
	cfg := cniagent.Config{Socket: sock, NodeName: w.node, DS: w.ds}
	if waiter != nil {
		cfg.Policy = waiter
	}
	a, err := cniagent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	})
	var cl *agentapi.Client
	eventually(t, "the agent's socket", func() bool {
		c, err := agentapi.Dial(context.Background(), sock)
		cl = c
		return err == nil
	})
	t.Cleanup(cl.Close)
	return cl
}

// eventually polls f until it holds or 20 s pass.
func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !f(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// metric is the value of a gauge or counter of reg; label, when not "",
// is the value its one label must have. -1: no such metric.
func metric(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label != "" && (len(m.GetLabel()) != 1 || m.GetLabel()[0].GetValue() != label) {
				continue
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// TestAgentShutdownEndsPolicyWaits: a policy wait in flight when tabbyd
// stops ends at once with a reason, rather than holding tabbyd's exit for
// its whole bound (the runtime retries the ADD).
func TestAgentShutdownEndsPolicyWaits(t *testing.T) {
	w := newWorld(t)
	r := w.start(t, nil)
	sock := filepath.Join(t.TempDir(), "cni.sock")
	a, err := cniagent.New(cniagent.Config{Socket: sock, NodeName: w.node, DS: w.ds, Policy: r.c})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var cl *agentapi.Client
	eventually(t, "the agent's socket", func() bool {
		c, err := agentapi.Dial(context.Background(), sock)
		cl = c
		return err == nil
	})
	defer cl.Close()
	waited := make(chan error, 1)
	go func() {
		_, err := cl.PolicyWait(waitCtx(t, time.Minute), agentapi.PolicyWaitRequest{Namespace: w.ns, Pod: "never", IPs: []net.IP{net.ParseIP("10.99.0.3")}, TimeoutMillis: 60000})
		waited <- err
	}()
	time.Sleep(time.Second) // the wait is in flight
	cancel()
	if err := <-waited; err == nil || !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("a wait in flight at shutdown: %v", err)
	}
	if err := <-done; err != nil {
		t.Errorf("agent: %v", err)
	}
}
