package gc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/ipam/gc"
)

// TestGCRacesAssignAndRelease runs three collectors with a grace period of
// a millisecond (every candidate is due the second time it is seen, so only
// the fresh reads and the compare-and-swaps protect live addresses): one as
// tabbyd runs it (informer caches, passes back to back), one reading the
// API server directly, and one seeing a stale world (blocks as they were
// four refreshes ago, a refresh every fifth pass, so addresses released and
// handed out again look held by their old holders; no pods at all, so every
// pod looks gone), while workers play kubelet and CNI on four nodes, with
// blocks of four addresses so that addresses are reused soon and blocks
// come and go:
// create a pod, ADD (IPAM Assign), report its address (or not), check
// again and again that the address is still the pod's, delete the pod, DEL
// (ReleaseHandle) or leak it; some pods get a second sandbox whose first
// one leaks. No live pod's address may ever be freed or handed to another
// pod; afterwards the collectors have freed every leaked address and every
// block is consistent.
func TestGCRacesAssignAndRelease(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	mkPool(t, ds, "race", "10.70.0.0/22", 30)
	const nodes, workers, perWorker = 4, 8, 16
	for i := range nodes {
		mkNode(t, ds, fmt.Sprintf("sn-%d", i))
	}
	m := ipam.New(ds)

	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	reg1, reg2 := prometheus.NewRegistry(), prometheus.NewRegistry()
	g1, err := gc.New(gc.Config{DS: ds, Grace: time.Millisecond, Interval: time.Millisecond, Log: logger(t).With("gc", "informers"), Registerer: reg1})
	if err != nil {
		t.Fatal(err)
	}
	g2, err := gc.New(gc.Config{DS: ds, Grace: time.Millisecond, Log: logger(t).With("gc", "direct"), Registerer: reg2})
	if err != nil {
		t.Fatal(err)
	}
	reg3 := prometheus.NewRegistry()
	g3, err := gc.New(gc.Config{DS: ds, Grace: time.Millisecond, Log: logger(t).With("gc", "stale"), Registerer: reg3})
	if err != nil {
		t.Fatal(err)
	}
	// The stale collector's view: taken staleBy refreshes ago (a refresh
	// every fifth pass), with no pods.
	var history []*gc.Snapshot
	var calls int
	var refreshes atomic.Uint64
	staleView := func(ctx context.Context) (*gc.Snapshot, error) {
		if calls%5 == 0 {
			s, err := gc.APISnapshot(ctx, ds)
			if err != nil {
				return nil, err
			}
			s.Pods = map[gc.PodKey]*corev1.Pod{} // its pod cache never synced
			history = append(history, s)
			if len(history) > staleBy+1 {
				history = history[1:]
			}
			refreshes.Add(1)
		}
		calls++
		return history[0], nil
	}
	var gcs sync.WaitGroup
	gcs.Add(3)
	go func() {
		defer gcs.Done()
		if err := g1.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	go func() {
		defer gcs.Done()
		for ctx.Err() == nil {
			if _, err := g2.Pass(ctx); err != nil && ctx.Err() == nil {
				t.Errorf("Pass: %v", err)
			}
		}
	}()
	go func() {
		defer gcs.Done()
		for ctx.Err() == nil {
			if _, err := g3.PassOn(ctx, staleView); err != nil && ctx.Err() == nil {
				t.Errorf("stale pass: %v", err)
			}
		}
	}()
	stopGCs := sync.OnceFunc(func() { cancel(); gcs.Wait() })
	defer stopGCs()

	var mu sync.Mutex
	live := map[string]string{} // address -> live pod holding it
	leaked := 0
	claim := func(ip net.IP, pod string) error {
		mu.Lock()
		defer mu.Unlock()
		if other, ok := live[ip.String()]; ok {
			return fmt.Errorf("%s handed to pod %s while live pod %s holds it", ip, pod, other)
		}
		live[ip.String()] = pod
		return nil
	}
	drop := func(ip net.IP) {
		mu.Lock()
		delete(live, ip.String())
		mu.Unlock()
	}

	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			node := fmt.Sprintf("sn-%d", w%nodes)
			for i := range perWorker {
				name := fmt.Sprintf("r%d-%d", w, i)
				if err := playPod(ctx, ds, m, node, name, i%4, claim, drop, refreshes.Load); err != nil {
					t.Errorf("pod %s: %v", name, err)
					return
				}
				if i%4 == 1 || i%4 == 2 {
					mu.Lock()
					leaked++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	// Every pod is gone now: the collectors free what was leaked.
	waitFor(t, "the collectors to free every leaked address", func() bool {
		n, err := allocated(ctx, ds)
		if err != nil {
			t.Fatal(err)
		}
		return n == 0
	})
	stopGCs()
	released := 0.0
	for _, reg := range []*prometheus.Registry{reg1, reg2, reg3} {
		for _, r := range []string{"pod-gone", "pod-has-other-addresses", "pod-finished", "node-gone"} {
			released += metric(t, reg, "tabby_ipam_gc_releases_total", r)
		}
	}
	// The leaked ones, and any whose pod was gone before its DEL came
	// (the DEL then finds nothing to release).
	if int(released) < leaked || int(released) > workers*perWorker+workers*perWorker/4 {
		t.Errorf("the collectors released %v addresses, want at least the %d leaked", released, leaked)
	}
	t.Logf("%d pods, %d leaked addresses; the collectors released %v (%v through informers, %v reading directly, %v with a stale view; %v before a late DEL) in %d+%d+%d passes",
		workers*perWorker, leaked, released, sumReleases(t, reg1), sumReleases(t, reg2), sumReleases(t, reg3), int(released)-leaked,
		g1.Passes(), g2.Passes(), g3.Passes())
	checkBlocks(t, ds)
}

func sumReleases(t *testing.T, reg *prometheus.Registry) float64 {
	s := 0.0
	for _, r := range []string{"pod-gone", "pod-has-other-addresses", "pod-finished", "node-gone"} {
		s += metric(t, reg, "tabby_ipam_gc_releases_total", r)
	}
	return s
}

// playPod is one pod's life as kubelet and CNI live it. flow 0: DEL after
// the pod is deleted; 1: the DEL never comes; 2: a first sandbox leaked,
// the second is DELeted; 3: the pod never reports its address.
//
// The pod lives, and its address is checked again and again, until the
// stale collector's view (refreshes counts its refreshes; it sees the one
// staleBy refreshes back) has moved on three times past the moment the
// address was given: it has seen the address, with its pod gone, through
// at least ten passes, and tried to release it.
func playPod(ctx context.Context, ds *datastore.Client, m *ipam.IPAM, node, name string, flow int,
	claim func(net.IP, string) error, drop func(net.IP), refreshes func() uint64) error {
	_, err := ds.Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	add := func(handle string) (net.IP, uint64, error) {
		got, err := m.Assign(ctx, ipam.Request{HandleID: handle, Node: node, Namespace: ns, Pod: name, IPv4: true})
		if err != nil {
			return nil, 0, err
		}
		ip := got[0].IP
		if err := claim(ip, name); err != nil {
			return nil, 0, err
		}
		h, ok, err := heldAt(ctx, ds, ip)
		if err != nil {
			return nil, 0, err
		}
		if !ok || h.handle != handle {
			return nil, 0, fmt.Errorf("the address %s it was just given is held by %+v (held %v)", ip, h, ok)
		}
		return ip, h.seq, nil
	}
	var stale net.IP
	if flow == 2 {
		if stale, _, err = add("net." + name + "-1"); err != nil {
			return err
		}
	}
	handle := "net." + name + "-2"
	ip, seq, err := add(handle)
	if err != nil {
		return err
	}
	if flow != 3 {
		if err := podStatus(ctx, ds, name, corev1.PodRunning, ip); err != nil {
			return err
		}
	}
	if stale != nil {
		drop(stale) // the pod runs with its second sandbox only
	}
	for until := refreshes() + staleBy + 3; ; {
		h, ok, err := heldAt(ctx, ds, ip)
		if err != nil {
			return err
		}
		if !ok || h.handle != handle || h.seq != seq {
			return fmt.Errorf("LIVE POD'S ADDRESS FREED: %s of pod %s (handle %s, sequence %d) is now held by %+v (held %v)", ip, name, handle, seq, h, ok)
		}
		if refreshes() >= until {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	drop(ip)
	zero := int64(0)
	if err := ds.Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		return err
	}
	if flow == 1 {
		return nil // DEL never comes
	}
	return m.ReleaseHandle(ctx, handle, node)
}

// staleBy is how many refreshes old the stale collector's view is.
const staleBy = 4

// heldAt reads the holder of ip from its block (a GET from the API server).
func heldAt(ctx context.Context, ds *datastore.Client, ip net.IP) (holding, bool, error) {
	a, _ := netip.AddrFromSlice(ip)
	a = a.Unmap()
	p, _ := a.Prefix(30)
	b, err := ds.IPAMBlocks.Get(ctx, ipam.BlockName(p), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return holding{}, false, nil
	}
	if err != nil {
		return holding{}, false, err
	}
	for _, al := range gc.Allocations(b) {
		if al.IP == a {
			return holding{al.Attr.HandleID, al.Sequence}, true, nil
		}
	}
	return holding{}, false, nil
}

func allocated(ctx context.Context, ds *datastore.Client) (int, error) {
	bl, err := ds.IPAMBlocks.List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, err
	}
	n := 0
	for i := range bl.Items {
		n += len(gc.Allocations(&bl.Items[i]))
	}
	return n, nil
}

// checkBlocks: every block's free list and allocations agree: each ordinal
// is either held or free, exactly once (a double free would list it twice).
func checkBlocks(t *testing.T, ds *datastore.Client) {
	t.Helper()
	bl, err := ds.IPAMBlocks.List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bl.Items {
		if err := blockConsistent(&b); err != nil {
			t.Errorf("block %s: %v", b.Spec.CIDR, err)
		}
	}
}

func blockConsistent(b *tabbyv1.IPAMBlock) error {
	seen := map[int]bool{}
	for _, o := range b.Spec.Unallocated {
		if o < 0 || o >= len(b.Spec.Allocations) {
			return fmt.Errorf("free list holds ordinal %d out of range", o)
		}
		if seen[o] {
			return fmt.Errorf("ordinal %d is free twice", o)
		}
		if b.Spec.Allocations[o] != -1 {
			return fmt.Errorf("ordinal %d is both free and held", o)
		}
		seen[o] = true
	}
	var errs []error
	for o, idx := range b.Spec.Allocations {
		if idx == -1 && !seen[o] {
			errs = append(errs, fmt.Errorf("ordinal %d is neither free nor held", o))
		}
	}
	return errors.Join(errs...)
}
