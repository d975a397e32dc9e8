package ipam_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/ipam"
)

// TestAssignDeferredBatch: requests of one node that wait at once get
// their addresses from one block in one write; those a shared write
// cannot serve (a specific address, another family, a pool that does not
// exist) go alone with their own outcome; every address is the block's
// record of its handle, and the handles are written by Record.
func TestAssignDeferredBatch(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	c := ctx(t)
	mkPool(t, ds, "batch", "10.61.0.0/24", 26)
	m := ipam.New(ds)
	const node = "batch-node"
	first, err := m.Assign(c, v4("net.first", node)) // claims the block
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := ds.IPAMBlocks.List(c, metav1.ListOptions{})
	if err != nil || len(blocks.Items) != 1 {
		t.Fatalf("blocks %v, %v", blocks, err)
	}
	before := blocks.Items[0]
	var reqs []ipam.Request
	for i := range 10 {
		reqs = append(reqs, v4(fmt.Sprintf("net.b%d", i), node))
	}
	specific := ipam.Request{HandleID: "net.specific", Node: node, IPs: []net.IP{net.ParseIP("10.61.0.200")}}
	v6 := ipam.Request{HandleID: "net.v6", Node: node, IPv6: true}
	nopool := ipam.Request{HandleID: "net.nopool", Node: node, IPv4: true, IPv4Pools: []string{"no-such-pool"}}
	reqs = append(reqs, specific, v6, nopool)
	outs := m.AssignDeferredBatch(c, reqs)
	if len(outs) != len(reqs) {
		t.Fatalf("%d outcomes for %d requests", len(outs), len(reqs))
	}
	seen := map[string]string{first[0].IP.String(): "net.first"}
	for i, o := range outs[:10] {
		if o.Err != nil || len(o.Assigned) != 1 || o.Record == nil {
			t.Fatalf("request %d: %+v", i, o)
		}
		ip := o.Assigned[0].IP.String()
		if prev, dup := seen[ip]; dup {
			t.Fatalf("%s handed to %s and %s", ip, prev, reqs[i].HandleID)
		}
		seen[ip] = reqs[i].HandleID
		if o.Assigned[0].Block.String() != before.Spec.CIDR {
			t.Errorf("%s from block %s, want the node's block %s", ip, o.Assigned[0].Block, before.Spec.CIDR)
		}
	}
	if o := outs[10]; o.Err != nil || len(o.Assigned) != 1 || !o.Assigned[0].IP.Equal(specific.IPs[0]) {
		t.Errorf("the specific address: %+v", o)
	}
	if outs[11].Err == nil || outs[12].Err == nil {
		t.Errorf("no IPv6 pool and no such pool succeeded: %+v, %+v", outs[11], outs[12])
	}
	// The ten shared one write: the block went from the version before
	// the batch to the one that holds them all in one step.
	after, err := ds.IPAMBlocks.Get(c, before.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := ds.IPAMBlocks.Watch(c, metav1.ListOptions{ResourceVersion: before.ResourceVersion, FieldSelector: "metadata.name=" + before.Name})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var held map[string]string
	for writes := 1; ; writes++ {
		ev := <-w.ResultChan()
		if ev.Type != watch.Modified {
			t.Fatalf("watch event %v", ev.Type)
		}
		b := ev.Object.(interface{ GetResourceVersion() string })
		if b.GetResourceVersion() != after.ResourceVersion {
			continue
		}
		if writes > 1 { // the specific address lies in another block
			t.Errorf("the block was written %d times for ten batched requests", writes)
		}
		break
	}
	held = map[string]string{}
	pfx := netip.MustParsePrefix(after.Spec.CIDR)
	for ord, idx := range after.Spec.Allocations {
		if idx >= 0 {
			held[addrAt(pfx, ord)] = after.Spec.Attributes[idx].HandleID
		}
	}
	for ip, h := range seen {
		if held[ip] != h {
			t.Errorf("the block holds %s for %q, the caller %q was told it", ip, held[ip], h)
		}
	}
	for i, o := range outs[:10] {
		if err := o.Record(c); err != nil {
			t.Fatal(err)
		}
		ips, err := m.HandleIPsOnNode(c, reqs[i].HandleID, node)
		if err != nil || len(ips) != 1 || !ips[0].Equal(o.Assigned[0].IP) {
			t.Errorf("handle %s holds %v (%v), want %s", reqs[i].HandleID, ips, err, o.Assigned[0].IP)
		}
	}
}

// TestAssignDeferredBatchRaces: batches of one node race single
// assignments of the same node through another IPAM (the tabbyd-down
// plugin) in the same block: the compare-and-swap writes hand out no
// address twice, and the block records what each caller was told.
func TestAssignDeferredBatchRaces(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	c := ctx(t)
	mkPool(t, ds, "race", "10.62.0.0/24", 24)
	const node = "race-node"
	agent, direct := ipam.New(ds), ipam.New(ds)
	if _, err := agent.Assign(c, v4("net.claim", node)); err != nil {
		t.Fatal(err)
	}
	type got struct{ handle, ip string }
	results := make(chan got, 200)
	errs := make(chan error, 200)
	var wg sync.WaitGroup
	wg.Go(func() {
		for b := range 5 {
			var reqs []ipam.Request
			for i := range 8 {
				reqs = append(reqs, v4(fmt.Sprintf("net.batch%d-%d", b, i), node))
			}
			for i, o := range agent.AssignDeferredBatch(c, reqs) {
				if o.Err != nil {
					errs <- o.Err
					continue
				}
				results <- got{reqs[i].HandleID, o.Assigned[0].IP.String()}
			}
		}
	})
	for w := range 2 {
		wg.Go(func() {
			for i := range 20 {
				h := fmt.Sprintf("net.direct%d-%d", w, i)
				a, err := direct.Assign(c, v4(h, node))
				if err != nil {
					errs <- err
					continue
				}
				results <- got{h, a[0].IP.String()}
			}
		})
	}
	wg.Wait()
	close(results)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	byIP := map[string]string{}
	for r := range results {
		if prev, dup := byIP[r.ip]; dup {
			t.Fatalf("%s handed to %s and %s", r.ip, prev, r.handle)
		}
		byIP[r.ip] = r.handle
	}
	if len(byIP) != 80 {
		t.Fatalf("%d addresses, want 80", len(byIP))
	}
	blocks, err := ds.IPAMBlocks.List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks.Items {
		pfx := netip.MustParsePrefix(b.Spec.CIDR)
		for ord, idx := range b.Spec.Allocations {
			if idx < 0 {
				continue
			}
			ip, h := addrAt(pfx, ord), b.Spec.Attributes[idx].HandleID
			if h != "net.claim" && byIP[ip] != h {
				t.Errorf("block %s holds %s for %q, the caller was told %q", b.Name, ip, h, byIP[ip])
			}
		}
	}
}

// staleHandles is the API source whose handles are the versions it was
// given: a cache a moment behind the handles' later writes.
type staleHandles struct {
	ipam.Source
	handles map[string]*tabbyv1.IPAMHandle
}

func (s staleHandles) Handle(ctx context.Context, name string) (*tabbyv1.IPAMHandle, error) {
	if h, ok := s.handles[name]; ok {
		return h, nil
	}
	return s.Source.Handle(ctx, name)
}

// TestReleaseHandles: handles of one node released together free what
// they hold in one block in one write of it; a handle whose object was
// never written (an ADD that died before recording it), one that holds
// nothing, and one the source has in an older version (it gained an
// address in another block since) are released as ReleaseHandle alone
// would; the handle not released keeps its address.
func TestReleaseHandles(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	c := ctx(t)
	mkPool(t, ds, "rel", "10.64.0.0/24", 28) // 16 addresses a block
	const node = "rel-node"
	plain := ipam.New(ds)
	var ids []string
	for i := range 20 { // two blocks
		id := fmt.Sprintf("net.r%d", i)
		if _, err := plain.Assign(c, v4(id, node)); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if _, rec, err := plain.AssignDeferred(c, v4("net.unrecorded", node)); err != nil || rec == nil {
		t.Fatalf("deferred assignment: %v (record %v)", err, rec != nil)
	}
	if _, err := plain.Assign(c, v4("net.keep", node)); err != nil {
		t.Fatal(err)
	}
	// net.r0 as the source has it, then a second address of it in
	// another block (net.r0's first is in the first block).
	old, err := ds.IPAMHandles.Get(c, ipam.HandleObjectName("net.r0"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Assign(c, ipam.Request{HandleID: "net.r0", Node: node, IPs: []net.IP{net.ParseIP("10.64.0.200")}}); err != nil {
		t.Fatal(err)
	}
	held := func(id string) []net.IP {
		ips, err := plain.HandleIPsOnNode(c, id, node)
		if err != nil {
			t.Fatal(err)
		}
		return ips
	}
	if got := held("net.r0"); len(got) != 2 {
		t.Fatalf("net.r0 holds %v, want two addresses", got)
	}
	blocks, err := ds.IPAMBlocks.List(c, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := ds.IPAMBlocks.Watch(c, metav1.ListOptions{ResourceVersion: blocks.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	m := ipam.New(ds, ipam.WithSource(staleHandles{Source: ipam.APISource(ds), handles: map[string]*tabbyv1.IPAMHandle{old.Name: old}}))
	release := append(slices.Clone(ids), "net.unrecorded", "net.nothing")
	for i, err := range m.ReleaseHandles(c, release, node) {
		if err != nil {
			t.Errorf("releasing %s: %v", release[i], err)
		}
	}
	for _, id := range release {
		if got := held(id); len(got) > 0 {
			t.Errorf("%s still holds %v", id, got)
		}
		if h, err := ds.IPAMHandles.Get(c, ipam.HandleObjectName(id), metav1.GetOptions{}); err == nil {
			t.Errorf("handle object of %s left: %+v", id, h.Spec)
		}
	}
	if got := held("net.keep"); len(got) != 1 {
		t.Errorf("net.keep holds %v after the others were released, want its address", got)
	}
	// One write per block for the twenty (net.r0's first address among
	// them), then one each for net.r0's second address and net.unrecorded.
	writes := 0
	for {
		select {
		case ev := <-w.ResultChan():
			if ev.Type == watch.Modified {
				writes++
			}
			continue
		case <-time.After(2 * time.Second):
		}
		break
	}
	if writes != 4 {
		t.Errorf("%d block writes for the release, want 4 (one per block, then the stale handle's other address and the unrecorded handle)", writes)
	}
}
