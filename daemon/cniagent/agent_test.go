package cniagent

// These tests run the agent against a real kube-apiserver and etcd (one
// control plane for the package, started by TestMain).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/contract/agentapi"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/ipam"
)

func TestMain(m *testing.M) { clustertest.Main(m, nil) }

var seq atomic.Int32

// world is one test's node, its pool and its datastore client.
type world struct {
	ds   *datastore.Client
	node string
	pool *tabbyv1.IPPool
}

func newWorld(t *testing.T) *world {
	t.Helper()
	return newWorldOf(t, "10.80.%d.0/24", 0)
}

// newWorldOf is newWorld with a pool of cidrFormat (filled with the
// test's number) and blockSize (0: the default).
func newWorldOf(t *testing.T, cidrFormat string, blockSize int) *world {
	t.Helper()
	ds, err := datastore.New(clustertest.Cluster(t).RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	i := seq.Add(1)
	w := &world{ds: ds, node: fmt.Sprintf("agent-node-%d", i)}
	ctx := context.Background()
	label := map[string]string{"agent-test": w.node}
	if _, err := ds.Nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: w.node, Labels: label}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ds.Nodes.Delete(context.Background(), w.node, metav1.DeleteOptions{}) })
	w.pool, err = ds.IPPools.Create(ctx, &tabbyv1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("agent-pool-%d", i)},
		Spec: tabbyv1.IPPoolSpec{CIDR: fmt.Sprintf(cidrFormat, i), BlockSize: blockSize, VXLANMode: tabbyv1.EncapAlways,
			NodeSelector: &metav1.LabelSelector{MatchLabels: label}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ds.IPPools.Delete(context.Background(), w.pool.Name, metav1.DeleteOptions{}) })
	return w
}

// pod creates a pod bound to node.
func (w *world) pod(t *testing.T, name, node string, ann map[string]string) *corev1.Pod {
	t.Helper()
	p, err := w.ds.Pods("default").Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Annotations: ann},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		zero := int64(0)
		_ = w.ds.Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})
	return p
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls f until it holds or 10 s pass.
func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !f(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCaches: the informer caches answer IPAM's reads (pools, this node's
// Node, the IPAMConfiguration, the node's blocks), IPAM's own writes win
// over an informer that has not seen them yet (and older copies do not),
// and pods come from the cache unless it lacks them or holds an older pod
// of the same name.
func TestCaches(t *testing.T) {
	w := newWorld(t)
	ctx := testCtx(t)
	c, err := NewCaches(w.ds, datastore.NewInformers(w.ds), w.node)
	if err != nil {
		t.Fatal(err)
	}
	var lookups []string
	c.podLookup = func(s string) { lookups = append(lookups, s) }
	if err := c.Run(ctx); err != nil {
		t.Fatal(err)
	}
	pools, _ := c.Pools(ctx)
	found := false
	for _, p := range pools {
		found = found || p.Name == w.pool.Name
	}
	if !found {
		t.Errorf("pool %s not in the cache (%d pools)", w.pool.Name, len(pools))
	}
	if n, err := c.Node(ctx, w.node); err != nil || n == nil || n.Name != w.node {
		t.Errorf("Node(%s) = %v, %v", w.node, n, err)
	}
	if n, err := c.Node(ctx, "no-such-node"); err != nil || n != nil {
		t.Errorf("Node of a missing node = %v, %v; want nil, nil", n, err)
	}
	if cfg, err := c.IPAMConfig(ctx); err != nil || cfg != nil {
		t.Errorf("IPAMConfig without one = %v, %v", cfg, err)
	}

	// IPAM over the caches claims a block; the caches know it at once.
	m := ipam.New(w.ds, ipam.WithSource(c))
	got, err := m.Assign(ctx, ipam.Request{HandleID: "t.one", Node: w.node, IPv4: true})
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := c.NodeBlocks(ctx, w.node)
	if err != nil || len(blocks) != 1 || blocks[0].Spec.CIDR != got[0].Block.String() {
		t.Fatalf("NodeBlocks right after the claim: %v, %v", blocks, err)
	}
	// A newer copy (as IPAM's next write would give) wins; an older one
	// does not.
	newer := blocks[0].DeepCopy()
	newer.ResourceVersion = fmt.Sprint(mustAtoi(t, newer.ResourceVersion) + 1000)
	newer.Annotations = map[string]string{"test": "newer"}
	c.ObserveBlock(newer)
	older := blocks[0].DeepCopy()
	older.ResourceVersion = "1"
	c.ObserveBlock(older)
	if blocks, _ := c.NodeBlocks(ctx, w.node); len(blocks) != 1 || blocks[0].Annotations["test"] != "newer" {
		t.Errorf("the newer copy should win: %+v", blocks)
	}

	// Pods: from the cache once the informer has them.
	p := w.pod(t, "cached-pod", w.node, nil)
	eventually(t, "the pod in the cache", func() bool { _, ok, _ := c.pods.GetStore().GetByKey("default/cached-pod"); return ok })
	lookups = nil
	l := c.ForPod(string(p.UID))
	if got, err := l.Pod(ctx, "default", "cached-pod"); err != nil || got.UID != p.UID {
		t.Errorf("Pod: %v, %v", got, err)
	}
	if _, err := c.ForPod("some-older-uid").Pod(ctx, "default", "cached-pod"); err != nil {
		t.Errorf("Pod with another UID: %v", err)
	}
	w.pod(t, "elsewhere", "another-node", nil)
	if got, err := l.Pod(ctx, "default", "elsewhere"); err != nil || got.Spec.NodeName != "another-node" {
		t.Errorf("a pod of another node: %v, %v", got, err)
	}
	if _, err := l.Pod(ctx, "default", "missing"); !apierrors.IsNotFound(err) {
		t.Errorf("a missing pod: %v, want NotFound", err)
	}
	if strings.Join(lookups, ",") != "cache,api,api,api" {
		t.Errorf("lookups %v, want cache,api,api,api", lookups)
	}
	if ns, err := l.Namespace(ctx, "default"); err != nil || ns.Name != "default" {
		t.Errorf("Namespace: %v, %v", ns, err)
	}
}

func mustAtoi(t *testing.T, s string) int {
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// runAgent starts an agent for w's node on a new socket and waits for it.
func runAgent(t *testing.T, w *world, reg prometheus.Registerer) (*Agent, *agentapi.Client) {
	t.Helper()
	a, err := New(Config{Socket: filepath.Join(t.TempDir(), "run", "cni.sock"), NodeName: w.node, DS: w.ds, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, a)
}

// serve runs an agent until the test ends, and dials it.
func serve(t *testing.T, a *Agent) (*Agent, *agentapi.Client) {
	t.Helper()
	var err error
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
		if _, err := os.Stat(a.cfg.Socket); !os.IsNotExist(err) {
			t.Errorf("the socket outlived the agent: %v", err)
		}
	})
	var cl *agentapi.Client
	eventually(t, "the agent's socket", func() bool {
		cl, err = agentapi.Dial(context.Background(), a.cfg.Socket)
		return err == nil
	})
	// Closed first: the server's shutdown waits 5 s for a connection on
	// which no request came.
	t.Cleanup(cl.Close)
	return a, cl
}

// TestAgent: the agent serves the endpoints on a socket only its owner may
// use; a release right after an assignment (its handle not yet written)
// frees everything; a handle nobody asks about is written anyway; IPAM's
// errors come back as they are.
func TestAgent(t *testing.T) {
	w := newWorld(t)
	ctx := testCtx(t)
	reg := prometheus.NewRegistry()
	a, cl := runAgent(t, w, reg)
	fi, err := os.Stat(a.cfg.Socket)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Errorf("socket %s: %v %v, want a socket with mode 0600", a.cfg.Socket, fi.Mode(), err)
	}

	pools, err := cl.UsablePools(ctx, w.node)
	if err != nil || len(pools) != 1 || pools[0].Name != w.pool.Name || pools[0].VXLANMode != "Always" {
		t.Errorf("usable-pools: %+v, %v", pools, err)
	}
	if err := cl.Ping(ctx); err != nil {
		t.Errorf("ping: %v", err)
	}

	p := w.pod(t, "agent-pod", w.node, nil)
	addrs, err := cl.Assign(ctx, agentapi.AssignRequest{HandleID: "net.c1", Node: w.node, Namespace: "default", Pod: "agent-pod", PodUID: string(p.UID), IPv4: true})
	if err != nil || len(addrs) != 1 || addrs[0].Pool != w.pool.Name {
		t.Fatalf("assign: %+v, %v", addrs, err)
	}
	// Released at once: the release waits for the handle's write, and
	// nothing is left.
	if err := cl.ReleaseHandle(ctx, "net.c1", w.node); err != nil {
		t.Fatal(err)
	}
	if ips, err := cl.HandleIPs(ctx, "net.c1", w.node); err != nil || len(ips) != 0 {
		t.Errorf("handle-ips after release: %v, %v", ips, err)
	}
	if _, err := w.ds.IPAMHandles.Get(ctx, ipam.HandleObjectName("net.c1"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the handle object after release: %v, want NotFound", err)
	}

	addrs, err = cl.Assign(ctx, agentapi.AssignRequest{HandleID: "net.c2", Node: w.node, IPv4: true})
	if err != nil {
		t.Fatal(err)
	}
	if ips, err := cl.HandleIPs(ctx, "net.c2", w.node); err != nil || len(ips) != 1 || !ips[0].Equal(addrs[0].IP) {
		t.Errorf("handle-ips: %v, %v", ips, err)
	}
	if hs, err := cl.NodeHandles(ctx, w.node); err != nil || strings.Join(hs, ",") != "net.c2" {
		t.Errorf("node-handles: %v, %v", hs, err)
	}

	// A handle nobody asks about is written shortly after the answer
	// (recordDelay), on its own.
	if _, err := cl.Assign(ctx, agentapi.AssignRequest{HandleID: "net.c4", Node: w.node, IPv4: true}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the handle object of an assignment nobody asked about", func() bool {
		h, err := w.ds.IPAMHandles.Get(ctx, ipam.HandleObjectName("net.c4"), metav1.GetOptions{})
		return err == nil && h.Spec.HandleID == "net.c4"
	})

	_, err = cl.Assign(ctx, agentapi.AssignRequest{HandleID: "net.c3", Node: w.node, IPv4: true, IPv4Pools: []string{"no-such-pool"}})
	var ae *agentapi.Error
	if !errors.As(err, &ae) || !strings.Contains(ae.Message, `requested pool "no-such-pool" does not exist`) || ae.Unreachable {
		t.Errorf("a missing pool: %v", err)
	}

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "tabby_cni_agent_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ep, res string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "endpoint":
					ep = l.GetValue()
				case "result":
					res = l.GetValue()
				}
			}
			counts[ep+"/"+res] = m.GetCounter().GetValue()
		}
	}
	if counts["assign/ok"] != 3 || counts["assign/error"] != 1 || counts["release-handle/ok"] != 1 {
		t.Errorf("request counts %v", counts)
	}
}

// TestSocket: a stale socket (its tabbyd died) is replaced; one another
// process serves is refused; the folder is created.
func TestSocket(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	path := filepath.Join(dir, "cni.sock")
	if err := prepareSocket(path); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	if err := prepareSocket(path); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Errorf("a live socket: %v", err)
	}
	// A listener that dies without removing its socket.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = ln.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	ln, err = listen(path)
	if err != nil {
		t.Fatalf("replacing a stale socket: %v", err)
	}
	_ = ln.Close()
}

// TestAgentRefusesOtherNodes: every request that names another node than
// the agent's (or none) is refused with 403 and a message that says what
// to fix, and changes nothing: an address held by the other node stays
// held, and no address is assigned for it.
func TestAgentRefusesOtherNodes(t *testing.T) {
	w := newWorld(t)
	ctx := testCtx(t)
	other := newWorld(t) // another node, with its own pool
	reg := prometheus.NewRegistry()
	_, cl := runAgent(t, w, reg)
	held, err := ipam.New(other.ds).Assign(ctx, ipam.Request{HandleID: "net.other", Node: other.node, IPv4: true})
	if err != nil || len(held) != 1 {
		t.Fatalf("assigning on the other node directly: %v, %v", held, err)
	}
	t.Cleanup(func() { _ = ipam.New(other.ds).ReleaseHandle(context.Background(), "net.other", other.node) })

	for _, node := range []string{other.node, ""} {
		calls := map[string]error{}
		_, calls["assign"] = cl.Assign(ctx, agentapi.AssignRequest{HandleID: "net.stolen", Node: node, IPv4: true})
		calls["release-handle"] = cl.ReleaseHandle(ctx, "net.other", node)
		_, calls["handle-ips"] = cl.HandleIPs(ctx, "net.other", node)
		_, calls["node-handles"] = cl.NodeHandles(ctx, node)
		_, calls["usable-pools"] = cl.UsablePools(ctx, node)
		for ep, err := range calls {
			var ae *agentapi.Error
			if !errors.As(err, &ae) || !ae.Forbidden || !strings.Contains(ae.Message, fmt.Sprintf("serves node %q only, and the request names node %q", w.node, node)) {
				t.Errorf("%s for node %q: %v, want a refusal", ep, node, err)
			}
		}
	}
	ips, err := ipam.New(other.ds).HandleIPs(ctx, "net.other")
	if err != nil || len(ips) != 1 || !ips[0].Equal(held[0].IP) {
		t.Errorf("the other node's address after a refused release: %v, %v, want %v", ips, err, held[0].IP)
	}
	if ips, err := ipam.New(w.ds).HandleIPs(ctx, "net.stolen"); err != nil || len(ips) != 0 {
		t.Errorf("a refused assignment holds %v (%v)", ips, err)
	}
	// Its own node is still served.
	if _, err := cl.UsablePools(ctx, w.node); err != nil {
		t.Errorf("usable-pools for its own node: %v", err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "tabby_cni_agent_other_node_requests_total" {
			if got := mf.GetMetric()[0].GetCounter().GetValue(); got != 10 {
				t.Errorf("tabby_cni_agent_other_node_requests_total = %v, want 10", got)
			}
		}
	}
}

// TestAgentRefusesBadRequests: a request the agent cannot read, or a
// report with values outside what it counts, is answered 400 with a
// message naming what is wrong (a client bug, not a tabbyd failure); a
// good report is counted.
func TestAgentRefusesBadRequests(t *testing.T) {
	w := newWorld(t)
	reg := prometheus.NewRegistry()
	a, _ := runAgent(t, w, reg)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", a.cfg.Socket)
	}}}
	for _, c := range []struct {
		endpoint, body string
		status         int
		says           string
	}{
		{agentapi.EndpointAssign, `{"handleID": `, http.StatusBadRequest, "a malformed assign request"},
		{agentapi.EndpointReport, `[1, 2]`, http.StatusBadRequest, "a malformed report request"},
		{agentapi.EndpointReport, `{"command": "EXPLODE", "result": "ok", "seconds": 1}`, http.StatusBadRequest, `command "EXPLODE"`},
		{agentapi.EndpointReport, `{"command": "ADD", "result": "maybe", "seconds": 1}`, http.StatusBadRequest, `result "maybe"`},
		{agentapi.EndpointReport, `{"command": "ADD", "result": "ok", "seconds": -3}`, http.StatusBadRequest, "lasting -3 seconds"},
		{agentapi.EndpointReport, `{"command": "ADD", "result": "ok", "seconds": 0.02}`, http.StatusOK, ""},
	} {
		resp, err := hc.Post("http://agent"+agentapi.Path+c.endpoint, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		var e agentapi.Error
		err = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != c.status || err != nil || !strings.Contains(e.Message, c.says) || e.Invalid != (c.status == http.StatusBadRequest) {
			t.Errorf("%s %s: %d %+v (%v); want %d and %q", c.endpoint, c.body, resp.StatusCode, e, err, c.status, c.says)
		}
	}
}

// TestAgentBurst: assignments that arrive at once, as when many pods start
// on the node together, each get their own address (those queued behind a
// write share the next one), a failing one among them fails alone, every
// handle holds what its caller was told, and every assignment is counted
// once in tabby_cni_agent_assign_batch_size. Then releases that arrive at
// once (the pods deleted together, and a handle that holds nothing) all
// succeed, free every address, and are counted once each in
// tabby_cni_agent_release_batch_size.
func TestAgentBurst(t *testing.T) {
	w := newWorld(t)
	ctx := testCtx(t)
	reg := prometheus.NewRegistry()
	_, cl := runAgent(t, w, reg)
	const n = 30
	addrs := make([][]agentapi.Address, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req := agentapi.AssignRequest{HandleID: fmt.Sprintf("net.burst%d", i), Node: w.node, IPv4: true}
			if i == n-1 {
				req.IPv4Pools = []string{"no-such-pool"}
			}
			addrs[i], errs[i] = cl.Assign(ctx, req)
		})
	}
	wg.Wait()
	if errs[n-1] == nil {
		t.Errorf("an assignment from a pool that does not exist succeeded: %v", addrs[n-1])
	}
	seen := map[string]int{}
	for i := range n - 1 {
		if errs[i] != nil || len(addrs[i]) != 1 {
			t.Fatalf("assignment %d: %v, %v", i, addrs[i], errs[i])
		}
		ip := addrs[i][0].IP.String()
		if prev, dup := seen[ip]; dup {
			t.Fatalf("%s handed to burst%d and burst%d", ip, prev, i)
		}
		seen[ip] = i
		held, err := cl.HandleIPs(ctx, fmt.Sprintf("net.burst%d", i), w.node)
		if err != nil || len(held) != 1 || !held[0].Equal(addrs[i][0].IP) {
			t.Errorf("handle burst%d holds %v (%v), its caller was told %s", i, held, err, ip)
		}
	}
	batched := func(metric, what string) float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == metric {
				h := mf.GetMetric()[0].GetHistogram()
				t.Logf("%v %s in %d batches", h.GetSampleSum(), what, h.GetSampleCount())
				return h.GetSampleSum()
			}
		}
		return 0
	}
	if counted := batched("tabby_cni_agent_assign_batch_size", "assignments"); counted != n {
		t.Errorf("the batches counted %v assignments, want %d", counted, n)
	}
	for i := range n { // burst29 holds nothing
		wg.Go(func() {
			errs[i] = cl.ReleaseHandle(ctx, fmt.Sprintf("net.burst%d", i), w.node)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("releasing burst%d: %v", i, err)
		}
	}
	if counted := batched("tabby_cni_agent_release_batch_size", "releases"); counted != n {
		t.Errorf("the batches counted %v releases, want %d", counted, n)
	}
	blocks, err := w.ds.IPAMBlocks.List(ctx, metav1.ListOptions{LabelSelector: tabbyv1.LabelNode + "=" + ipam.NodeLabelValue(w.node)})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks.Items {
		for _, idx := range b.Spec.Allocations {
			if idx >= 0 {
				t.Errorf("block %s still holds an address after every handle was released", b.Name)
			}
		}
	}
}
