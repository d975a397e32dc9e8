package gc_test

// These tests run the collector against a real kube-apiserver and etcd (one
// control plane for the package, started by TestMain), with IPAM making
// real allocations. Grace periods are short; nothing waits for a time:
// waits poll a condition (with a generous bound), and "never" is checked
// after passes that could have done it.

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/ipam/gc"
)

func TestMain(m *testing.M) { clustertest.Main(m, nil) }

const ns = "default"

// client is an unthrottled client of the package's control plane.
func client(t testing.TB) *datastore.Client { return clustertest.UnthrottledClient(t) }

// fresh removes every IPAM object, pool, node and pod of the test
// namespace now and when the test ends.
func fresh(t testing.TB, ds *datastore.Client) {
	t.Helper()
	clustertest.Fresh(t, ds, ns)
}

func testCtx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return c
}

func logger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

func mkPool(t testing.TB, ds *datastore.Client, name, cidr string, blockSize int) {
	t.Helper()
	p := &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: tabbyv1.IPPoolSpec{CIDR: cidr, BlockSize: blockSize}}
	if _, err := ds.IPPools.Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating pool %s: %v", name, err)
	}
}

func mkNode(t testing.TB, ds *datastore.Client, name string) {
	t.Helper()
	if _, err := ds.Nodes.Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating node %s: %v", name, err)
	}
}

func deleteNode(t testing.TB, ds *datastore.Client, name string) {
	t.Helper()
	if err := ds.Nodes.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting node %s: %v", name, err)
	}
}

// mkPod creates a pod bound to node, Pending with no addresses (as the
// kubelet sees it when it calls CNI ADD).
func mkPod(t testing.TB, ds *datastore.Client, name, node string) *corev1.Pod {
	t.Helper()
	p, err := ds.Pods(ns).Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s: %v", name, err)
	}
	return p
}

// setPodStatus sets a pod's phase and addresses, as the kubelet reports them.
func setPodStatus(t testing.TB, ds *datastore.Client, name string, phase corev1.PodPhase, ips ...net.IP) {
	t.Helper()
	if err := podStatus(context.Background(), ds, name, phase, ips...); err != nil {
		t.Fatal(err)
	}
}

func podStatus(ctx context.Context, ds *datastore.Client, name string, phase corev1.PodPhase, ips ...net.IP) error {
	for range 10 {
		p, err := ds.Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading pod %s: %w", name, err)
		}
		p.Status.Phase = phase
		p.Status.PodIPs = nil
		p.Status.PodIP = ""
		for _, ip := range ips {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip.String()})
		}
		if len(ips) > 0 {
			p.Status.PodIP = ips[0].String()
		}
		if _, err = ds.Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err == nil {
			return nil
		} else if !apierrors.IsConflict(err) {
			return fmt.Errorf("updating pod %s's status: %w", name, err)
		}
	}
	return fmt.Errorf("pod %s's status kept changing", name)
}

func deletePod(t testing.TB, ds *datastore.Client, name string) {
	t.Helper()
	zero := int64(0)
	if err := ds.Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatalf("deleting pod %s: %v", name, err)
	}
}

// assign allocates one IPv4 address through IPAM, as CNI ADD does.
func assign(t testing.TB, m *ipam.IPAM, handle, node, pod string, use tabbyv1.IPPoolAllowedUse) net.IP {
	t.Helper()
	req := ipam.Request{HandleID: handle, Node: node, IPv4: true, Use: use}
	if pod != "" {
		req.Namespace, req.Pod = ns, pod
	}
	got, err := m.Assign(context.Background(), req)
	if err != nil {
		t.Fatalf("assigning for %s: %v", handle, err)
	}
	return got[0].IP
}

// holding is the allocation at an address: its handle and sequence number.
type holding struct {
	handle string
	seq    uint64
}

// holder reads (from the API server) who holds ip: ok false when free.
func holder(ctx context.Context, ds *datastore.Client, ip net.IP) (holding, bool, error) {
	a, _ := netip.AddrFromSlice(ip)
	a = a.Unmap()
	bl, err := ds.IPAMBlocks.List(ctx, metav1.ListOptions{})
	if err != nil {
		return holding{}, false, err
	}
	for i := range bl.Items {
		for _, al := range gc.Allocations(&bl.Items[i]) {
			if al.IP == a {
				return holding{al.Attr.HandleID, al.Sequence}, true, nil
			}
		}
	}
	return holding{}, false, nil
}

func mustHold(t testing.TB, ds *datastore.Client, ip net.IP, handle string) holding {
	t.Helper()
	h, ok, err := holder(context.Background(), ds, ip)
	if err != nil {
		t.Fatal(err)
	}
	if !ok || h.handle != handle {
		t.Fatalf("%s: held by %+v (held: %v), want handle %s", ip, h, ok, handle)
	}
	return h
}

func newGC(t testing.TB, ds *datastore.Client, grace time.Duration) (*gc.GC, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	g, err := gc.New(gc.Config{DS: ds, Grace: grace, Interval: 20 * time.Millisecond, Log: logger(t), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return g, reg
}

// passUntil runs passes until cond holds (bounded generously: this is a
// wait for a condition, not a time limit on the collector).
func passUntil(t testing.TB, g *gc.GC, what string, cond func() bool) {
	t.Helper()
	ctx := testCtx(t)
	for deadline := time.Now().Add(90 * time.Second); ; {
		if _, err := g.Pass(ctx); err != nil {
			t.Fatalf("pass: %v", err)
		}
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func passes(t testing.TB, g *gc.GC, n int) gc.PassResult {
	t.Helper()
	var sum gc.PassResult
	for range n {
		r, err := g.Pass(testCtx(t))
		if err != nil {
			t.Fatalf("pass: %v", err)
		}
		sum.Released += r.Released
		sum.BlocksDeleted += r.BlocksDeleted
		sum.BlocksUnaffined += r.BlocksUnaffined
		sum.Candidates = r.Candidates
		time.Sleep(5 * time.Millisecond)
	}
	return sum
}

func free(t testing.TB, ds *datastore.Client, ip net.IP) func() bool {
	return func() bool {
		_, ok, err := holder(context.Background(), ds, ip)
		if err != nil {
			t.Fatal(err)
		}
		return !ok
	}
}

// TestLeakedAllocationReleasedAfterGrace: the address of a pod deleted
// without CNI DEL is a candidate at once, released only in a later pass
// after the grace period, and its handle record goes with it.
func TestLeakedAllocationReleasedAfterGrace(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	mkPool(t, ds, "leak", "10.61.0.0/24", 28)
	mkNode(t, ds, "n1")
	m := ipam.New(ds)
	mkPod(t, ds, "leaky", "n1")
	ip := assign(t, m, "net.leaky", "n1", "leaky", "")
	setPodStatus(t, ds, "leaky", corev1.PodRunning, ip)
	deletePod(t, ds, "leaky") // and CNI DEL never comes

	g, reg := newGC(t, ds, 300*time.Millisecond)
	r, err := g.Pass(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if r.Candidates != 1 || r.Released != 0 {
		t.Fatalf("first pass: %+v; want 1 candidate, nothing released before the grace period", r)
	}
	mustHold(t, ds, ip, "net.leaky")
	passUntil(t, g, "the leaked address to be released", free(t, ds, ip))
	if v := metric(t, reg, "tabby_ipam_gc_releases_total", "pod-gone"); v != 1 {
		t.Errorf("releases{pod-gone} = %v, want 1", v)
	}
	if _, err := ds.IPAMHandles.Get(context.Background(), ipam.HandleObjectName("net.leaky"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the handle record is still there (err %v)", err)
	}
	// The address is usable again.
	mkPod(t, ds, "next", "n1")
	if got := assign(t, m, "net.next", "n1", "next", ""); got == nil {
		t.Fatal("no address after the release")
	}
	r, err = g.Pass(testCtx(t))
	if err != nil || r.Candidates != 0 {
		t.Errorf("after the release: %+v, %v; want no candidates", r, err)
	}
}

// metric is the value of a counter or gauge child with the given label value
// ("" for a metric without labels).
func metric(t testing.TB, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			if label == "" || (len(mt.GetLabel()) == 1 && mt.GetLabel()[0].GetValue() == label) {
				if mt.GetCounter() != nil {
					return mt.GetCounter().GetValue()
				}
				return mt.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no metric %s{%s}", name, label)
	return 0
}

// TestLivePodNeverReleased: addresses of pods that exist and use them,
// of a pod's second network (which its status does not list), of pods
// between ADD and their status update, of tunnels and of allocations
// without pod identity on live nodes stay, through many passes with a
// grace period of a millisecond; a replaced sandbox's and a finished
// pod's go.
func TestLivePodNeverReleased(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	mkPool(t, ds, "live", "10.62.0.0/24", 27)
	mkNode(t, ds, "n1")
	mkNode(t, ds, "dead")
	m := ipam.New(ds)

	keep := map[string]net.IP{} // handle -> address that must stay
	mkPod(t, ds, "running", "n1")
	keep["net.running"] = assign(t, m, "net.running", "n1", "running", "")
	keep["net2.running"] = assign(t, m, "net2.running", "n1", "running", "") // a second network (Multus): not in the status
	setPodStatus(t, ds, "running", corev1.PodRunning, keep["net.running"])

	mkPod(t, ds, "pending", "n1") // ADD done, status not reported yet
	keep["net.pending"] = assign(t, m, "net.pending", "n1", "pending", "")

	mkPod(t, ds, "noips", "n1") // Running, addresses not reported yet
	keep["net.noips"] = assign(t, m, "net.noips", "n1", "noips", "")
	setPodStatus(t, ds, "noips", corev1.PodRunning)

	mkPod(t, ds, "ondead", "dead") // its node is deleted, the pod is not (yet)
	keep["net.ondead"] = assign(t, m, "net.ondead", "dead", "ondead", "")
	setPodStatus(t, ds, "ondead", corev1.PodRunning, keep["net.ondead"])

	keep["vxlan-tunnel-addr-n1"] = assign(t, m, "vxlan-tunnel-addr-n1", "n1", "", tabbyv1.UseTunnel)
	keep["net.cnitool"] = assign(t, m, "net.cnitool", "n1", "", "")

	mkPod(t, ds, "resandboxed", "n1") // its first sandbox's DEL never came
	stale := assign(t, m, "net.resandboxed-1", "n1", "resandboxed", "")
	keep["net.resandboxed-2"] = assign(t, m, "net.resandboxed-2", "n1", "resandboxed", "")
	setPodStatus(t, ds, "resandboxed", corev1.PodRunning, keep["net.resandboxed-2"])

	mkPod(t, ds, "done", "n1")
	finished := assign(t, m, "net.done", "n1", "done", "")
	setPodStatus(t, ds, "done", corev1.PodSucceeded, finished)

	deleteNode(t, ds, "dead")

	before := map[string]holding{}
	for h, ip := range keep {
		before[h] = mustHold(t, ds, ip, h)
	}
	g, reg := newGC(t, ds, time.Millisecond)
	passUntil(t, g, "the stale sandbox's and the finished pod's addresses to be released", func() bool {
		return free(t, ds, stale)() && free(t, ds, finished)()
	})
	r := passes(t, g, 10)
	if r.Released != 0 {
		t.Errorf("10 more passes released %d addresses", r.Released)
	}
	for h, ip := range keep {
		if got := mustHold(t, ds, ip, h); got != before[h] {
			t.Errorf("%s (%s) changed from %+v to %+v", ip, h, before[h], got)
		}
	}
	for reason, want := range map[string]float64{"pod-has-other-addresses": 1, "pod-finished": 1, "pod-gone": 0, "node-gone": 0} {
		if v := metric(t, reg, "tabby_ipam_gc_releases_total", reason); v != want {
			t.Errorf("releases{%s} = %v, want %v", reason, v, want)
		}
	}
}

// TestYoungAllocationNotReleased: an address allocated for a pod the API
// server does not know yet is not taken, however many passes run within
// the grace period; once the pod appears it is no candidate at all.
func TestYoungAllocationNotReleased(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	mkPool(t, ds, "young", "10.63.0.0/24", 28)
	mkNode(t, ds, "n1")
	m := ipam.New(ds)
	ip := assign(t, m, "net.unborn", "n1", "unborn", "")
	g, _ := newGC(t, ds, time.Hour)
	for i := range 5 {
		r, err := g.Pass(testCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		if r.Candidates != 1 || r.Due != 0 || r.Released != 0 {
			t.Fatalf("pass %d: %+v; want 1 candidate, not due", i, r)
		}
	}
	mustHold(t, ds, ip, "net.unborn")
	mkPod(t, ds, "unborn", "n1")
	r, err := g.Pass(testCtx(t))
	if err != nil || r.Candidates != 0 {
		t.Fatalf("with the pod there: %+v, %v; want no candidates", r, err)
	}
	mustHold(t, ds, ip, "net.unborn")
}

// nodeBlocks lists the blocks affine to node, by CIDR.
func nodeBlocks(t testing.TB, ds *datastore.Client, node string) map[string]*tabbyv1.IPAMBlock {
	t.Helper()
	bl, err := ds.IPAMBlocks.List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*tabbyv1.IPAMBlock{}
	for i := range bl.Items {
		if bl.Items[i].Spec.Affinity == "host:"+node {
			out[bl.Items[i].Spec.CIDR] = &bl.Items[i]
		}
	}
	return out
}

func nodeAffinities(t testing.TB, ds *datastore.Client, node string) map[string]bool {
	t.Helper()
	al, err := ds.BlockAffinities.List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, a := range al.Items {
		if a.Spec.Node == node {
			out[a.Spec.CIDR] = true
		}
	}
	return out
}

func blockOf(t testing.TB, ds *datastore.Client, ip net.IP, bits int) (*tabbyv1.IPAMBlock, bool) {
	t.Helper()
	a, _ := netip.AddrFromSlice(ip)
	p, _ := a.Unmap().Prefix(bits)
	b, err := ds.IPAMBlocks.Get(context.Background(), ipam.BlockName(p), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return b, true
}

// TestNodeDeletion: when a node is deleted, its tunnel and anonymous
// addresses and its deleted pods' addresses are released, a pod that
// still exists keeps its address (and its block) until it is deleted
// too; then the node's empty blocks are deleted, so another node can
// claim them, a block still holding an address another node's pod
// borrowed loses only its affinity, and the node's affinity records go.
func TestNodeDeletion(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	mkPool(t, ds, "nodes", "10.64.0.0/26", 30) // blocks of 4
	_, err := ds.IPAMConfigurations.Create(context.Background(), &tabbyv1.IPAMConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: tabbyv1.IPAMConfigurationName}, Spec: tabbyv1.IPAMConfigurationSpec{MaxBlocksPerHost: 2}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mkNode(t, ds, "n1")
	mkNode(t, ds, "n2")
	m := ipam.New(ds)
	// n1's first block: tunnel, anonymous, p1, p2; its second: p3.
	tun := assign(t, m, "vxlan-tunnel-addr-n1", "n1", "", tabbyv1.UseTunnel)
	anon := assign(t, m, "net.cnitool-n1", "n1", "", "")
	var podIPs []net.IP
	for i := 1; i <= 3; i++ {
		name := "p" + strconv.Itoa(i)
		mkPod(t, ds, name, "n1")
		podIPs = append(podIPs, assign(t, m, "net."+name, "n1", name, ""))
		setPodStatus(t, ds, name, corev1.PodRunning, podIPs[i-1])
	}
	first, _ := blockOf(t, ds, tun, 30)
	second, _ := blockOf(t, ds, podIPs[2], 30)
	if first == nil || second == nil || first.Name == second.Name || len(nodeBlocks(t, ds, "n1")) != 2 {
		t.Fatalf("setup: want n1 to hold two blocks, got %v", nodeBlocks(t, ds, "n1"))
	}
	// n2 fills its two blocks, then borrows from n1's second block.
	for i := range 8 {
		assign(t, m, "net.n2-"+strconv.Itoa(i), "n2", "", "")
	}
	mkPod(t, ds, "borrower", "n2")
	borrowed := assign(t, m, "net.borrower", "n2", "borrower", "")
	setPodStatus(t, ds, "borrower", corev1.PodRunning, borrowed)
	if b, _ := blockOf(t, ds, borrowed, 30); b == nil || b.Name != second.Name {
		t.Fatalf("setup: the borrowed address %s is not in n1's second block %s", borrowed, second.Spec.CIDR)
	}
	n2Before := nodeBlocks(t, ds, "n2")

	deleteNode(t, ds, "n1")
	deletePod(t, ds, "p1")
	deletePod(t, ds, "p3") // p2 still exists (the pod GC has not come yet)

	g, reg := newGC(t, ds, time.Millisecond)
	passUntil(t, g, "n1's tunnel, anonymous and deleted pods' addresses to be released", func() bool {
		return free(t, ds, tun)() && free(t, ds, anon)() && free(t, ds, podIPs[0])() && free(t, ds, podIPs[2])()
	})
	passes(t, g, 5)
	mustHold(t, ds, podIPs[1], "net.p2")
	mustHold(t, ds, borrowed, "net.borrower")
	if b, ok := blockOf(t, ds, podIPs[1], 30); !ok || b.Spec.Affinity != "host:n1" {
		t.Fatalf("the block of p2, which still exists, should stay n1's: %+v", b)
	}

	deletePod(t, ds, "p2")
	passUntil(t, g, "n1's blocks and affinities to be freed", func() bool {
		return len(nodeBlocks(t, ds, "n1")) == 0 && len(nodeAffinities(t, ds, "n1")) == 0
	})
	if _, ok := blockOf(t, ds, tun, 30); ok {
		t.Errorf("n1's first block, empty, was not deleted")
	}
	b, ok := blockOf(t, ds, borrowed, 30)
	if !ok || b.Spec.Affinity != "" || b.Labels[tabbyv1.LabelNode] != "" {
		t.Fatalf("n1's second block should remain, unaffined, for the borrowed address: %+v", b)
	}
	mustHold(t, ds, borrowed, "net.borrower")
	if got := nodeBlocks(t, ds, "n2"); len(got) != len(n2Before) {
		t.Errorf("n2's blocks changed: %d, want %d", len(got), len(n2Before))
	}
	if v := metric(t, reg, "tabby_ipam_gc_blocks_reclaimed_total", "node-deleted"); v != 1 {
		t.Errorf("blocks_reclaimed{node-deleted} = %v, want 1", v)
	}
	if v := metric(t, reg, "tabby_ipam_gc_blocks_reclaimed_total", "unaffined"); v != 1 {
		t.Errorf("blocks_reclaimed{unaffined} = %v, want 1", v)
	}
	// The freed block can be claimed by another node.
	mkNode(t, ds, "n3")
	mkPod(t, ds, "claimer", "n3")
	got, err := m.Assign(context.Background(), ipam.Request{HandleID: "net.claimer", Node: "n3", Namespace: ns, Pod: "claimer", IPs: []net.IP{tun}})
	if err != nil {
		t.Fatalf("n3 asking for %s in the freed block: %v", tun, err)
	}
	if b, _ := blockOf(t, ds, got[0].IP, 30); b == nil || b.Spec.Affinity != "host:n3" {
		t.Errorf("the freed block was not claimed by n3: %+v", b)
	}
	// Once the borrower goes, the unaffined block is deleted too.
	deletePod(t, ds, "borrower")
	passUntil(t, g, "the unaffined block to be deleted", func() bool {
		_, ok := blockOf(t, ds, borrowed, 30)
		return !ok
	})
}

// TestLastEmptyBlockKept: a live node's empty blocks stay through the
// grace period; then all but one are deleted, and the last one stays.
func TestLastEmptyBlockKept(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	mkPool(t, ds, "last", "10.65.0.0/26", 30)
	mkNode(t, ds, "n1")
	m := ipam.New(ds)
	// Fill three blocks, then empty them.
	var handles []string
	for i := range 10 {
		h := "net.q" + strconv.Itoa(i)
		handles = append(handles, h)
		assign(t, m, h, "n1", "", "")
	}
	if n := len(nodeBlocks(t, ds, "n1")); n < 3 {
		t.Fatalf("setup: n1 holds %d blocks, want 3", n)
	}
	for _, h := range handles {
		if err := m.ReleaseHandle(context.Background(), h, "n1"); err != nil {
			t.Fatal(err)
		}
	}
	held := len(nodeBlocks(t, ds, "n1"))

	waiting, _ := newGC(t, ds, time.Hour)
	if r := passes(t, waiting, 3); r.BlocksDeleted != 0 || len(nodeBlocks(t, ds, "n1")) != held {
		t.Fatalf("empty blocks were freed within the grace period: %+v", r)
	}
	g, reg := newGC(t, ds, time.Millisecond)
	passUntil(t, g, "n1 to keep a single block", func() bool { return len(nodeBlocks(t, ds, "n1")) == 1 })
	passes(t, g, 5)
	blocks := nodeBlocks(t, ds, "n1")
	if len(blocks) != 1 {
		t.Fatalf("n1 holds %d blocks after more passes, want its last one", len(blocks))
	}
	affs := nodeAffinities(t, ds, "n1")
	for cidr := range blocks {
		if len(affs) != 1 || !affs[cidr] {
			t.Errorf("n1's affinities %v, want exactly its remaining block %s", affs, cidr)
		}
	}
	if v := metric(t, reg, "tabby_ipam_gc_blocks_reclaimed_total", "empty"); v != float64(held-1) {
		t.Errorf("blocks_reclaimed{empty} = %v, want %d", v, held-1)
	}
	// The node still allocates from its kept block.
	ip := assign(t, m, "net.after", "n1", "", "")
	if b, _ := blockOf(t, ds, ip, 30); b == nil || blocks[b.Spec.CIDR] == nil {
		t.Errorf("the next address %s did not come from the kept block", ip)
	}
}

// TestRecordsRepaired: a BlockAffinity without its block is removed, a
// live node's block without a BlockAffinity gets one, and an IPAMHandle
// that holds nothing is removed; records in order are left alone.
func TestRecordsRepaired(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	mkPool(t, ds, "rec", "10.66.0.0/24", 28)
	mkNode(t, ds, "n1")
	m := ipam.New(ds)
	ip := assign(t, m, "net.live", "n1", "", "")
	b, _ := blockOf(t, ds, ip, 28)
	ctx := context.Background()
	// Lose the block's record.
	pfx := netip.MustParsePrefix(b.Spec.CIDR)
	if err := ds.BlockAffinities.Delete(ctx, ipam.AffinityObjectName("n1", pfx), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// A record of a claim that never made its block, and a handle of nothing.
	ghost := netip.MustParsePrefix("10.66.0.192/28")
	if _, err := ds.BlockAffinities.Create(ctx, &tabbyv1.BlockAffinity{
		ObjectMeta: metav1.ObjectMeta{Name: ipam.AffinityObjectName("n1", ghost)},
		Spec:       tabbyv1.BlockAffinitySpec{State: tabbyv1.AffinityPending, Node: "n1", CIDR: ghost.String()}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ds.IPAMHandles.Create(ctx, &tabbyv1.IPAMHandle{ObjectMeta: metav1.ObjectMeta{Name: "net.nothing"},
		Spec: tabbyv1.IPAMHandleSpec{HandleID: "net.nothing", Block: map[string]int{b.Spec.CIDR: 1}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	g, _ := newGC(t, ds, time.Millisecond)
	passUntil(t, g, "the records to be repaired", func() bool {
		affs := nodeAffinities(t, ds, "n1")
		_, herr := ds.IPAMHandles.Get(ctx, "net.nothing", metav1.GetOptions{})
		return affs[b.Spec.CIDR] && !affs[ghost.String()] && apierrors.IsNotFound(herr)
	})
	a, err := ds.BlockAffinities.Get(ctx, ipam.AffinityObjectName("n1", pfx), metav1.GetOptions{})
	if err != nil || a.Spec.State != tabbyv1.AffinityConfirmed || a.Labels[tabbyv1.LabelNode] != "n1" {
		t.Errorf("the recreated record: %+v, %v", a, err)
	}
	mustHold(t, ds, ip, "net.live")
	if _, err := ds.IPAMHandles.Get(ctx, ipam.HandleObjectName("net.live"), metav1.GetOptions{}); err != nil {
		t.Errorf("the live handle's record: %v", err)
	}
}

// TestPoolUsageMetrics: the pool gauges of a pass match what IPAM
// allocated on the real API server, follow a release, and a deleted
// pool's series go.
func TestPoolUsageMetrics(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	mkPool(t, ds, "usage-a", "10.62.0.0/24", 28)
	mkPool(t, ds, "usage-b", "10.63.0.0/26", 30)
	mkNode(t, ds, "n1")
	mkNode(t, ds, "n2")
	m := ipam.New(ds)
	inPool := func(handle, node, pool string) {
		t.Helper()
		req := ipam.Request{HandleID: handle, Node: node, IPv4: true, IPv4Pools: []string{pool}}
		if _, err := m.Assign(context.Background(), req); err != nil {
			t.Fatalf("assigning for %s in %s: %v", handle, pool, err)
		}
	}
	// a: 3 on n1 and 1 on n2 (a /28 block each); b: 5 on n1 (two /30 blocks).
	for i := range 3 {
		inPool("net.a1-"+strconv.Itoa(i), "n1", "usage-a")
	}
	inPool("net.a2", "n2", "usage-a")
	for i := range 5 {
		inPool("net.b1-"+strconv.Itoa(i), "n1", "usage-b")
	}

	g, reg := newGC(t, ds, time.Hour)
	passes(t, g, 1)
	want := func(pool string, size, allocatable, allocated, blocks float64) {
		t.Helper()
		for name, v := range map[string]float64{"tabby_ipam_pool_size": size, "tabby_ipam_pool_allocatable": allocatable,
			"tabby_ipam_pool_allocated": allocated, "tabby_ipam_pool_blocks": blocks} {
			if got := metric(t, reg, name, pool); got != v {
				t.Errorf("%s{pool=%q} = %v, want %v", name, pool, got, v)
			}
		}
	}
	want("usage-a", 256, 252, 4, 2)
	want("usage-b", 64, 59, 5, 2)

	if err := m.ReleaseHandle(context.Background(), "net.a2", "n2"); err != nil {
		t.Fatal(err)
	}
	if err := ds.IPPools.Delete(context.Background(), "usage-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	passes(t, g, 1)
	want("usage-a", 256, 253, 3, 2) // n2's empty block stays: its node's last
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			for _, l := range mt.GetLabel() {
				if l.GetName() == "pool" && l.GetValue() == "usage-b" {
					t.Errorf("%s still has a series for the deleted pool usage-b", mf.GetName())
				}
			}
		}
	}
}
