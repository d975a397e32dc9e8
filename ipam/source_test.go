package ipam_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// countingSource is APISource that counts its reads and records the blocks
// IPAM tells it about; stale, when set, replaces the node's blocks by older
// copies.
type countingSource struct {
	ipam.Source
	mu       sync.Mutex
	calls    map[string]int
	observed []*tabbyv1.IPAMBlock
	stale    []*tabbyv1.IPAMBlock
	// staleBlock, when set, is what Block returns.
	staleBlock *tabbyv1.IPAMBlock
}

func (s *countingSource) Block(ctx context.Context, name string) (*tabbyv1.IPAMBlock, error) {
	s.count("block")
	if s.staleBlock != nil {
		return s.staleBlock, nil
	}
	return s.Source.Block(ctx, name)
}

func (s *countingSource) count(what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[what]++
}

func (s *countingSource) Pools(ctx context.Context) ([]tabbyv1.IPPool, error) {
	s.count("pools")
	return s.Source.Pools(ctx)
}

func (s *countingSource) NodeBlocks(ctx context.Context, node string) ([]*tabbyv1.IPAMBlock, error) {
	s.count("nodeBlocks")
	if s.stale != nil {
		return s.stale, nil
	}
	return s.Source.NodeBlocks(ctx, node)
}

func (s *countingSource) IPAMConfig(ctx context.Context) (*tabbyv1.IPAMConfiguration, error) {
	s.count("config")
	return s.Source.IPAMConfig(ctx)
}

func (s *countingSource) Node(ctx context.Context, name string) (*corev1.Node, error) {
	s.count("node")
	return s.Source.Node(ctx, name)
}

func (s *countingSource) ObserveBlock(b *tabbyv1.IPAMBlock) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.observed = append(s.observed, b)
}

// awaitPool waits until the API server's watch cache, which IPAM lists
// from, has the pool.
func awaitPool(t *testing.T, ds *datastore.Client, name string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		pools, err := ipam.APISource(ds).Pools(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pools {
			if p.Name == name {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s never showed in the watch cache", name)
		}
	}
}

// sourced makes a pool of cidr (blocks of /26) and an IPAM reading through
// a countingSource, and assigns the handle n.first on node a.
func sourced(t *testing.T, cidr string) (context.Context, *datastore.Client, *countingSource, *ipam.IPAM, []ipam.Assigned) {
	t.Helper()
	ds := client(t)
	fresh(t, ds)
	c := ctx(t)
	mkPool(t, ds, "sourced", cidr, 26)
	awaitPool(t, ds, "sourced")
	src := &countingSource{Source: ipam.APISource(ds), calls: map[string]int{}}
	m := ipam.New(ds, ipam.WithSource(src))
	first, err := m.Assign(c, v4("n.first", "a"))
	if err != nil {
		t.Fatal(err)
	}
	return c, ds, src, m, first
}

// TestSourceReads: IPAM reads pools and the node's blocks through its
// Source and tells it about the blocks it writes; a stale copy of the
// node's block (an informer that has not seen the last write yet) costs a
// retry, never a duplicate address; the Source's objects are not modified.
func TestSourceReads(t *testing.T) {
	c, _, src, m, first := sourced(t, "10.71.0.0/24")
	if src.calls["pools"] != 1 || src.calls["nodeBlocks"] != 1 {
		t.Errorf("reads through the source: %v", src.calls)
	}
	if len(src.observed) == 0 || src.observed[len(src.observed)-1].Spec.CIDR != first[0].Block.String() {
		t.Fatalf("the source was not told about the claimed block: %d observed", len(src.observed))
	}
	// The node's block as it was after the first assignment; then another
	// assignment moves it on, so the copy is stale.
	stale := src.observed[len(src.observed)-1]
	staleRV, staleAllocs := stale.ResourceVersion, fmt.Sprint(stale.Spec.Allocations)
	second, err := m.Assign(c, v4("n.second", "a"))
	if err != nil {
		t.Fatal(err)
	}
	src.stale = []*tabbyv1.IPAMBlock{stale}
	third, err := m.Assign(c, v4("n.third", "a"))
	if err != nil {
		t.Fatalf("assigning from a stale copy of the block: %v", err)
	}
	got := map[string]bool{}
	for _, a := range [][]ipam.Assigned{first, second, third} {
		got[a[0].IP.String()] = true
		if a[0].Block.String() != first[0].Block.String() {
			t.Errorf("%s is not in the node's block %s", a[0].IP, first[0].Block)
		}
	}
	if len(got) != 3 {
		t.Errorf("three assignments gave %v", got)
	}
	if stale.ResourceVersion != staleRV || fmt.Sprint(stale.Spec.Allocations) != staleAllocs {
		t.Error("IPAM modified a block the source handed it")
	}
}

// TestAssignDeferred: an assignment from the node's own block can leave
// its handle to be written later; until then the handle's addresses are
// found through the node's blocks (HandleIPsOnNode, NodeHandles,
// ReleaseHandle). A borrowed address is recorded before AssignDeferred
// returns.
func TestAssignDeferred(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	c := ctx(t)
	mkPool(t, ds, "def", "10.72.0.0/26", 26) // one block
	awaitPool(t, ds, "def")
	m := ipam.New(ds)

	got, record, err := m.AssignDeferred(c, v4("n.late", "a"))
	if err != nil || record == nil {
		t.Fatalf("AssignDeferred from the node's own block: record %v, %v", record != nil, err)
	}
	ip := got[0].IP.String()
	if ips, err := m.HandleIPs(c, "n.late"); err != nil || len(ips) != 0 {
		t.Errorf("the handle object should not exist yet: %v %v", ips, err)
	}
	if ips, err := m.HandleIPsOnNode(c, "n.late", "a"); err != nil || fmt.Sprint(ips) != "["+ip+"]" {
		t.Errorf("HandleIPsOnNode before the handle is written: %v %v", ips, err)
	}
	if hs, err := m.NodeHandles(c, "a"); err != nil || strings.Join(hs, ",") != "n.late" {
		t.Errorf("NodeHandles before the handle is written: %v %v", hs, err)
	}
	if err := record(c); err != nil {
		t.Fatal(err)
	}
	if ips, err := m.HandleIPs(c, "n.late"); err != nil || fmt.Sprint(ips) != "["+ip+"]" {
		t.Errorf("HandleIPs after the handle was written: %v %v", ips, err)
	}

	// Never recorded (the agent died): DEL still frees it.
	lost, _, err := m.AssignDeferred(c, v4("n.lost", "a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ReleaseHandle(c, "n.lost", "a"); err != nil {
		t.Fatal(err)
	}
	blk, err := ds.IPAMBlocks.Get(c, ipam.BlockName(netip.MustParsePrefix(lost[0].Block.String())), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range blk.Spec.Attributes {
		if a.HandleID == "n.lost" {
			t.Error("ReleaseHandle left the unrecorded handle's address allocated")
		}
	}

	// Node b has no block left to claim: it borrows from a's, and that is
	// recorded at once (DEL on b would not search a's blocks).
	borrowed, record, err := m.AssignDeferred(c, v4("n.borrow", "b"))
	if err != nil {
		t.Fatal(err)
	}
	if record != nil {
		t.Error("a borrowed address must be recorded before AssignDeferred returns")
	}
	if ips, err := m.HandleIPs(c, "n.borrow"); err != nil || len(ips) != 1 || !ips[0].Equal(borrowed[0].IP) {
		t.Errorf("the borrowed address's handle: %v %v", ips, err)
	}
}

func TestPodAnnotationsApply(t *testing.T) {
	req := ipam.Request{IPv4: true, IPv4Pools: []string{"conf"}, IPv6Pools: []string{"conf6"}}
	ipam.PodAnnotations{IPv4Pools: []string{"ann"}}.Apply(&req)
	if fmt.Sprint(req.IPv4Pools, req.IPv6Pools) != "[ann] [conf6]" || !req.IPv4 || req.IPv6 {
		t.Errorf("pools: %+v", req)
	}
	ipam.PodAnnotations{IPs: []net.IP{net.ParseIP("fd00::5")}}.Apply(&req)
	if req.IPv4 || !req.IPv6 || len(req.IPs) != 1 {
		t.Errorf("requested addresses decide the families: %+v", req)
	}
	ipam.PodAnnotations{}.Apply(&req)
	if len(req.IPs) != 1 || fmt.Sprint(req.IPv4Pools) != "[ann]" {
		t.Errorf("empty annotations changed the request: %+v", req)
	}
}

// TestReleaseFromStaleSource: ReleaseHandle works on the Source's copies of
// the handle and its block, and a copy that shows nothing to release (it
// predates the allocation) is checked against the API server, so nothing
// leaks.
func TestReleaseFromStaleSource(t *testing.T) {
	c, ds, src, m, first := sourced(t, "10.73.0.0/26")
	name := ipam.BlockName(netip.MustParsePrefix(first[0].Block.String()))
	before, err := ds.IPAMBlocks.Get(c, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	second, err := m.Assign(c, v4("n.second", "a"))
	if err != nil {
		t.Fatal(err)
	}
	src.staleBlock = before // does not show n.second's address
	if err := m.ReleaseHandle(c, "n.second", "a"); err != nil {
		t.Fatal(err)
	}
	if src.calls["block"] != 1 {
		t.Errorf("the block was read from the source %d times, want 1", src.calls["block"])
	}
	after, err := ds.IPAMBlocks.Get(c, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range after.Spec.Attributes {
		if a.HandleID == "n.second" {
			t.Errorf("%s is still held by n.second", second[0].IP)
		}
	}
	if ips, err := m.HandleIPs(c, "n.second"); err != nil || len(ips) != 0 {
		t.Errorf("the released handle still holds %v (%v)", ips, err)
	}
	// A stale copy that does show the allocation: the update conflicts and
	// is retried on a fresh read.
	src.staleBlock = before
	if err := m.ReleaseHandle(c, "n.first", "a"); err != nil {
		t.Fatal(err)
	}
	if ips, err := m.HandleIPsOnNode(c, "n.first", "a"); err != nil || len(ips) != 0 {
		t.Errorf("n.first still holds %v (%v)", ips, err)
	}
}
