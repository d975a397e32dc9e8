package ipam_test

// These tests run the allocator against a real kube-apiserver and etcd (one
// control plane for the package, started by TestMain).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/ipam"
)

func TestMain(m *testing.M) { clustertest.Main(m, nil) }

// client is an unthrottled client of the package's control plane.
func client(t testing.TB) *datastore.Client { return clustertest.UnthrottledClient(t) }

// fresh removes every IPAM object and pool when the test ends, so tests do
// not see each other's pools.
func fresh(t testing.TB, ds *datastore.Client) {
	t.Helper()
	clustertest.Fresh(t, ds)
}

func mkPool(t testing.TB, ds *datastore.Client, name, cidr string, blockSize int, mut ...func(*tabbyv1.IPPool)) *tabbyv1.IPPool {
	t.Helper()
	p := &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: tabbyv1.IPPoolSpec{CIDR: cidr, BlockSize: blockSize}}
	for _, m := range mut {
		m(p)
	}
	out, err := ds.IPPools.Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pool %s: %v", name, err)
	}
	return out
}

func setConfig(t testing.TB, ds *datastore.Client, spec tabbyv1.IPAMConfigurationSpec) {
	t.Helper()
	_, err := ds.IPAMConfigurations.Create(context.Background(), &tabbyv1.IPAMConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: tabbyv1.IPAMConfigurationName}, Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func v4(handle, node string) ipam.Request {
	return ipam.Request{HandleID: handle, Node: node, IPv4: true}
}

func ctx(t testing.TB) context.Context {
	return ctxFor(t, 2*time.Minute)
}

// ctxFor is a context that ends after d: a guard against a hang, never a
// measure of speed.
func ctxFor(t testing.TB, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return c
}

// TestConcurrentNodes: many goroutines acting as many nodes claim blocks and
// allocate thousands of addresses at once; afterwards no block has two
// owners and no address two holders, and the objects agree with what each
// caller was told.
func TestConcurrentNodes(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	// 2,000 assignments through one API server take about 90 s alone on 2
	// cores and well over 2 minutes next to other packages' tests.
	c := ctxFor(t, 15*time.Minute)
	mkPool(t, ds, "conc", "10.50.0.0/16", 26)
	m := ipam.New(ds)
	const nodes, workersPerNode, perWorker = 10, 2, 100 // 2,000 addresses
	type got struct {
		handle, node string
		ip           net.IP
	}
	results := make(chan got, nodes*workersPerNode*perWorker)
	var wg sync.WaitGroup
	errs := make(chan error, nodes*workersPerNode)
	for n := range nodes {
		for w := range workersPerNode {
			wg.Add(1)
			go func() {
				defer wg.Done()
				node := fmt.Sprintf("node-%d", n)
				for i := range perWorker {
					h := fmt.Sprintf("net.%s-w%d-%d", node, w, i)
					a, err := m.Assign(c, v4(h, node))
					if err != nil {
						errs <- fmt.Errorf("%s: %w", h, err)
						return
					}
					results <- got{h, node, a[0].IP}
				}
			}()
		}
	}
	wg.Wait()
	close(results)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	byIP := map[string]got{}
	for r := range results {
		if prev, dup := byIP[r.ip.String()]; dup {
			t.Fatalf("address %s handed to %s and %s", r.ip, prev.handle, r.handle)
		}
		byIP[r.ip.String()] = r
	}
	if len(byIP) != nodes*workersPerNode*perWorker {
		t.Fatalf("got %d addresses", len(byIP))
	}
	blocks, err := ds.IPAMBlocks.List(c, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, b := range blocks.Items {
		pfx := netip.MustParsePrefix(b.Spec.CIDR)
		for ord, idx := range b.Spec.Allocations {
			if idx < 0 {
				continue
			}
			held++
			a := b.Spec.Attributes[idx]
			ip := addrAt(pfx, ord)
			r, ok := byIP[ip]
			if !ok || r.handle != a.HandleID {
				t.Fatalf("block %s holds %s for %q, but the caller was told %+v", b.Name, ip, a.HandleID, r)
			}
			if b.Spec.Affinity != "host:"+r.node {
				t.Errorf("%s given to %s from block %s of %s (no borrowing should be needed)", ip, r.node, b.Spec.CIDR, b.Spec.Affinity)
			}
		}
	}
	if held != len(byIP) {
		t.Fatalf("blocks hold %d addresses, callers got %d", held, len(byIP))
	}
	affs, err := ds.BlockAffinities.List(c, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owner := map[string]string{}
	for _, a := range affs.Items {
		if prev, dup := owner[a.Spec.CIDR]; dup {
			t.Fatalf("block %s has two affinities: %s and %s", a.Spec.CIDR, prev, a.Spec.Node)
		}
		owner[a.Spec.CIDR] = a.Spec.Node
		if a.Spec.State != tabbyv1.AffinityConfirmed {
			t.Errorf("affinity %s left %s", a.Name, a.Spec.State)
		}
	}
	for _, b := range blocks.Items {
		if "host:"+owner[b.Spec.CIDR] != b.Spec.Affinity {
			t.Errorf("block %s affine to %s but its BlockAffinity says %q", b.Spec.CIDR, b.Spec.Affinity, owner[b.Spec.CIDR])
		}
	}
	handles, err := ds.IPAMHandles.List(c, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(handles.Items) != len(byIP) {
		t.Errorf("%d handles for %d addresses", len(handles.Items), len(byIP))
	}
	// Release everything concurrently; the pool ends empty.
	var rwg sync.WaitGroup
	rerrs := make(chan error, len(byIP))
	sem := make(chan struct{}, 16)
	for _, r := range byIP {
		rwg.Add(1)
		sem <- struct{}{}
		go func() {
			defer rwg.Done()
			defer func() { <-sem }()
			if err := m.ReleaseHandle(c, r.handle, r.node); err != nil {
				rerrs <- err
			}
		}()
	}
	rwg.Wait()
	close(rerrs)
	for err := range rerrs {
		t.Fatal(err)
	}
	blocks, _ = ds.IPAMBlocks.List(c, metav1.ListOptions{})
	for _, b := range blocks.Items {
		for _, idx := range b.Spec.Allocations {
			if idx >= 0 {
				t.Fatalf("block %s still holds addresses after every handle was released", b.Name)
			}
		}
	}
	handles, _ = ds.IPAMHandles.List(c, metav1.ListOptions{})
	if len(handles.Items) != 0 {
		t.Errorf("%d handles left", len(handles.Items))
	}
}

func addrAt(p netip.Prefix, ord int) string {
	a := p.Addr()
	for range ord {
		a = a.Next()
	}
	return a.String()
}

func TestBorrowAndStrictAffinity(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	c := ctx(t)
	// Two blocks of four addresses.
	mkPool(t, ds, "tiny", "10.60.0.0/29", 30)
	m := ipam.New(ds)
	var aIPs []net.IP
	for i := range 6 { // a: one block full, second block half used
		got, err := m.Assign(c, v4(fmt.Sprintf("n.a%d", i), "a"))
		if err != nil {
			t.Fatal(err)
		}
		aIPs = append(aIPs, got[0].IP)
	}
	got, err := m.Assign(c, v4("n.b0", "b"))
	if err != nil {
		t.Fatalf("b should borrow from a's block: %v", err)
	}
	blk, err := ds.IPAMBlocks.Get(c, ipam.BlockName(netip.MustParsePrefix(got[0].Block.String())), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if blk.Spec.Affinity != "host:a" {
		t.Fatalf("borrowed from block affine to %q", blk.Spec.Affinity)
	}
	// The borrowed address is b's, recorded as allocated on node b.
	handles, err := m.NodeHandles(c, "b")
	if err != nil || len(handles) != 1 || handles[0] != "n.b0" {
		t.Fatalf("NodeHandles(b) = %v, %v", handles, err)
	}
	setConfig(t, ds, tabbyv1.IPAMConfigurationSpec{StrictAffinity: true, MaxBlocksPerHost: 20})
	_, err = m.Assign(c, v4("n.c0", "c"))
	if !errors.Is(err, ipam.ErrExhausted) || !strings.Contains(err.Error(), "strictAffinity") ||
		!strings.Contains(err.Error(), "pool tiny (10.60.0.0/29): 2 blocks claimed of 2 blocks of /30, 8 addresses, 7 addresses in use") {
		t.Fatalf("strict affinity: want an exhaustion error that explains, got %v", err)
	}
	// Nothing was left behind by the failed request.
	if h, _ := ds.IPAMHandles.Get(c, ipam.HandleObjectName("n.c0"), metav1.GetOptions{}); h != nil && h.Name != "" {
		t.Errorf("failed request left handle %s", h.Name)
	}
}

func TestMaxBlocksPerHost(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	c := ctx(t)
	mkPool(t, ds, "limited", "10.61.0.0/28", 30)
	setConfig(t, ds, tabbyv1.IPAMConfigurationSpec{MaxBlocksPerHost: 1, StrictAffinity: true})
	m := ipam.New(ds)
	for i := range 4 {
		if _, err := m.Assign(c, v4(fmt.Sprintf("n.%d", i), "a")); err != nil {
			t.Fatal(err)
		}
	}
	_, err := m.Assign(c, v4("n.4", "a"))
	if err == nil || !strings.Contains(err.Error(), "maxBlocksPerHost=1") {
		t.Fatalf("want the block limit explained, got %v", err)
	}
}

func TestReleaseReuseAndStaleRelease(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	c := ctx(t)
	mkPool(t, ds, "one", "10.62.0.0/30", 30) // one block of 4
	m := ipam.New(ds)
	first, err := m.Assign(c, v4("n.first", "a"))
	if err != nil {
		t.Fatal(err)
	}
	x := first[0].IP
	blockName := ipam.BlockName(netip.MustParsePrefix(first[0].Block.String()))
	b, _ := ds.IPAMBlocks.Get(c, blockName, metav1.GetOptions{})
	staleSeq := b.Spec.SequenceNumberForAllocation["0"]

	if err := m.ReleaseHandle(c, "n.first", "a"); err != nil {
		t.Fatal(err)
	}
	if err := m.ReleaseHandle(c, "n.first", "a"); err != nil {
		t.Fatalf("second release of a handle must succeed: %v", err)
	}
	if ips, _ := m.HandleIPs(c, "n.first"); len(ips) != 0 {
		t.Fatalf("released handle still holds %v", ips)
	}
	// The freed address goes to the back of the queue: it comes back only
	// after the other three.
	var again net.IP
	for i := range 4 {
		got, err := m.Assign(c, v4(fmt.Sprintf("n.next%d", i), "a"))
		if err != nil {
			t.Fatal(err)
		}
		if i < 3 && got[0].IP.Equal(x) {
			t.Fatalf("freed address %s reused at once", x)
		}
		again = got[0].IP
	}
	if !again.Equal(x) {
		t.Fatalf("expected %s to be reused last, got %s", x, again)
	}
	// A release carrying the old sequence number must not free the new holder.
	un, err := m.Release(c, []ipam.ReleaseOptions{{IP: x, SequenceNumber: &staleSeq}})
	if err != nil {
		t.Fatal(err)
	}
	if len(un) != 1 || !un[0].Equal(x) {
		t.Fatalf("stale release was not refused: unreleased %v", un)
	}
	if ips, _ := m.HandleIPs(c, "n.next3"); len(ips) != 1 || !ips[0].Equal(x) {
		t.Fatalf("new holder lost %s: %v", x, ips)
	}
	// Release naming the wrong handle is refused too; the right one works.
	if un, _ := m.Release(c, []ipam.ReleaseOptions{{IP: x, HandleID: "n.other"}}); len(un) != 1 {
		t.Fatal("release under the wrong handle was not refused")
	}
	if un, err := m.Release(c, []ipam.ReleaseOptions{{IP: x, HandleID: "n.next3"}}); err != nil || len(un) != 0 {
		t.Fatalf("release under the right handle: %v %v", un, err)
	}
	if _, err := ds.IPAMHandles.Get(c, ipam.HandleObjectName("n.next3"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("empty handle not deleted: %v", err)
	}
	// Exhaustion says which pool and how full.
	if _, err := m.Assign(c, v4("n.x", "a")); err != nil {
		t.Fatal(err)
	}
	_, err = m.Assign(c, v4("n.y", "b"))
	if err == nil || !strings.Contains(err.Error(), "pool one (10.62.0.0/30)") || !strings.Contains(err.Error(), "4 addresses in use") {
		t.Fatalf("want an exhaustion error naming the pool, got %v", err)
	}
}

func TestSelectorsDisabledAndNamedPools(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	c := ctx(t)
	mkPool(t, ds, "zone-a", "10.63.0.0/24", 28, func(p *tabbyv1.IPPool) {
		p.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "a"}}
	})
	mkPool(t, ds, "off", "10.64.0.0/24", 28, func(p *tabbyv1.IPPool) { p.Spec.Disabled = true })
	m := ipam.New(ds)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"zone": "b"}}}
	if _, err := ds.Nodes.Create(c, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := m.Assign(c, v4("n.1", "n1"))
	if err == nil || !strings.Contains(err.Error(), `pool zone-a (10.63.0.0/24): its nodeSelector "zone=a" does not match node n1`) ||
		!strings.Contains(err.Error(), "pool off (10.64.0.0/24) is disabled") {
		t.Fatalf("want the selector and disabled pool explained, got %v", err)
	}
	req := v4("n.1", "n1")
	req.IPv4Pools = []string{"off"}
	if _, err := m.Assign(c, req); err == nil || !strings.Contains(err.Error(), "requested pool off (10.64.0.0/24) is disabled") {
		t.Fatalf("named disabled pool: %v", err)
	}
	n, _ := ds.Nodes.Get(c, "n1", metav1.GetOptions{})
	n.Labels["zone"] = "a"
	if _, err := ds.Nodes.Update(c, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := m.Assign(c, v4("n.1", "n1"))
	if err != nil || !strings.HasPrefix(got[0].IP.String(), "10.63.0.") || got[0].Pool.Name != "zone-a" {
		t.Fatalf("after labelling: %v %v", got, err)
	}
	pools, err := m.UsablePools(c, "n1")
	if err != nil || len(pools) != 1 || pools[0].Name != "zone-a" {
		t.Fatalf("UsablePools = %v, %v", pools, err)
	}
}

func TestSpecificAddresses(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	c := ctx(t)
	mkPool(t, ds, "fixed", "10.65.0.0/24", 26)
	m := ipam.New(ds)
	want := net.ParseIP("10.65.0.77")
	got, err := m.Assign(c, ipam.Request{HandleID: "n.a", Node: "a", IPs: []net.IP{want}})
	if err != nil || !got[0].IP.Equal(want) {
		t.Fatalf("specific address: %v %v", got, err)
	}
	_, err = m.Assign(c, ipam.Request{HandleID: "n.b", Node: "b", IPs: []net.IP{want}})
	if err == nil || !strings.Contains(err.Error(), "10.65.0.77 is already in use by n.a") {
		t.Fatalf("taken address: %v", err)
	}
	_, err = m.Assign(c, ipam.Request{HandleID: "n.b", Node: "b", IPs: []net.IP{net.ParseIP("192.0.2.1")}})
	if err == nil || !strings.Contains(err.Error(), "is in no IP pool") {
		t.Fatalf("address outside pools: %v", err)
	}
	// An address in another node's block can be had too.
	got, err = m.Assign(c, ipam.Request{HandleID: "n.c", Node: "c", IPs: []net.IP{net.ParseIP("10.65.0.78")}})
	if err != nil || got[0].IP.String() != "10.65.0.78" {
		t.Fatalf("address in a's block for c: %v %v", got, err)
	}
}

func TestIPv6AndDualStack(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	c := ctx(t)
	mkPool(t, ds, "v4", "10.66.0.0/24", 0)
	m := ipam.New(ds)
	// Dual-stack with no IPv6 pool: fails and the IPv4 address is released.
	_, err := m.Assign(c, ipam.Request{HandleID: "n.ds", Node: "a", IPv4: true, IPv6: true})
	if err == nil || !strings.Contains(err.Error(), "dual-stack request got an IPv4 address but no IPv6 address, so it was released") {
		t.Fatalf("dual-stack without v6: %v", err)
	}
	blocks, _ := ds.IPAMBlocks.List(c, metav1.ListOptions{})
	for _, b := range blocks.Items {
		for _, idx := range b.Spec.Allocations {
			if idx >= 0 {
				t.Fatalf("the IPv4 half of a failed dual-stack request stayed allocated in %s", b.Name)
			}
		}
	}
	mkPool(t, ds, "v6", "fd00:66::/64", 0)
	got, err := m.Assign(c, ipam.Request{HandleID: "n.ds", Node: "a", IPv4: true, IPv6: true})
	if err != nil || len(got) != 2 {
		t.Fatalf("dual-stack: %v %v", got, err)
	}
	if got[0].IP.To4() == nil || got[1].IP.To4() != nil || got[1].Block.String() == "" {
		t.Fatalf("families: %v", got)
	}
	if ones, _ := got[1].Net().Mask.Size(); ones != 128 {
		t.Fatalf("v6 host prefix /%d", ones)
	}
	ips, err := m.HandleIPs(c, "n.ds")
	if err != nil || len(ips) != 2 {
		t.Fatalf("HandleIPs = %v %v", ips, err)
	}
	if err := m.ReleaseHandle(c, "n.ds", "a"); err != nil {
		t.Fatal(err)
	}
	if ips, _ := m.HandleIPs(c, "n.ds"); len(ips) != 0 {
		t.Fatalf("after release: %v", ips)
	}
}

func TestPodRequest(t *testing.T) {
	ds := client(t)
	c := ctx(t)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "annot", Annotations: map[string]string{
		tabbyv1.AnnotationIPv4Pools: `["ns-pool"]`, tabbyv1.AnnotationIPv6Pools: `["ns-v6"]`}}}
	if _, err := ds.Namespaces.Create(c, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "annot"}}
	if err := ds.CoreREST().Post().Namespace("annot").Resource("serviceaccounts").Body(sa).Do(c).Error(); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	mk := func(name string, ann map[string]string) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "annot", Annotations: ann},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
		if _, err := ds.Pods("annot").Create(c, p, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	mk("plain", nil)
	mk("own", map[string]string{tabbyv1.AnnotationIPv4Pools: `["pod-pool"]`, tabbyv1.AnnotationIPAddrs: `["10.1.2.3","fd00::5"]`})
	mk("bad", map[string]string{tabbyv1.AnnotationIPv4Pools: `pod-pool`})
	mk("badip", map[string]string{tabbyv1.AnnotationIPAddrs: `["10.1.2"]`})

	got, err := ipam.PodRequest(c, ds, "annot", "plain")
	if err != nil || fmt.Sprint(got.IPv4Pools, got.IPv6Pools) != "[ns-pool] [ns-v6]" {
		t.Fatalf("namespace fallback: %+v %v", got, err)
	}
	got, err = ipam.PodRequest(c, ds, "annot", "own")
	if err != nil || fmt.Sprint(got.IPv4Pools, got.IPv6Pools) != "[pod-pool] [ns-v6]" || len(got.IPs) != 2 {
		t.Fatalf("pod annotations: %+v %v", got, err)
	}
	if _, err = ipam.PodRequest(c, ds, "annot", "bad"); err == nil || !strings.Contains(err.Error(), "pod annot/bad: annotation tabby.io/ipv4pools must be a JSON list") {
		t.Fatalf("bad annotation: %v", err)
	}
	if _, err = ipam.PodRequest(c, ds, "annot", "badip"); err == nil || !strings.Contains(err.Error(), `"10.1.2", which is not an IP address`) {
		t.Fatalf("bad address: %v", err)
	}
	if _, err = ipam.PodRequest(c, ds, "annot", "missing"); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("missing pod: %v", err)
	}
}

// TestDatastoreDown: with no API server listening, requests fail fast with
// an error that says what to check.
func TestDatastoreDown(t *testing.T) {
	cfg := rest.CopyConfig(clustertest.Cluster(t).RESTConfig())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host = "https://" + ln.Addr().String()
	ln.Close()
	ds, err := datastore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = ipam.New(ds).Assign(c, v4("n.down", "a"))
	if err == nil || !strings.Contains(err.Error(), "cannot be reached") || !strings.Contains(err.Error(), cfg.Host) {
		t.Fatalf("want an unreachable-datastore error naming the server, got %v", err)
	}
}

// behindSource is the API source whose pool list lags: it has not seen
// the pools created after it was made, as a watch cache (or an informer) a
// moment behind would not.
type behindSource struct {
	ipam.Source
	pools []tabbyv1.IPPool
}

func (s behindSource) Pools(context.Context) ([]tabbyv1.IPPool, error) { return s.pools, nil }

// TestPoolCreatedMomentsAgo: a pool the (cached) pool list does not show
// yet is found by a consistent list before IPAM says it does not exist.
func TestPoolCreatedMomentsAgo(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	c := ctx(t)
	m := ipam.New(ds, ipam.WithSource(behindSource{Source: ipam.APISource(ds)}))
	mkPool(t, ds, "just-made", "10.66.0.0/24", 26)
	want := net.ParseIP("10.66.0.9")
	if got, err := m.Assign(c, ipam.Request{HandleID: "n.a", Node: "a", IPs: []net.IP{want}}); err != nil || !got[0].IP.Equal(want) {
		t.Fatalf("specific address in a pool the cache does not show yet: %v %v", got, err)
	}
	if got, err := m.Assign(c, ipam.Request{HandleID: "n.b", Node: "a", IPv4: true, IPv4Pools: []string{"just-made"}}); err != nil || got[0].Pool.Name != "just-made" {
		t.Fatalf("named pool the cache does not show yet: %v %v", got, err)
	}
	if got, err := m.Assign(c, ipam.Request{HandleID: "n.c", Node: "a", IPv4: true}); err != nil || got[0].Pool.Name != "just-made" {
		t.Fatalf("any pool, when the cache shows none: %v %v", got, err)
	}
	// A pool that really does not exist is still an error that says so.
	if _, err := m.Assign(c, ipam.Request{HandleID: "n.d", Node: "a", IPv4: true, IPv4Pools: []string{"never-made"}}); err == nil || !strings.Contains(err.Error(), `requested pool "never-made" does not exist`) {
		t.Fatalf("missing pool: %v", err)
	}
}
