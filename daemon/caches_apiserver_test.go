package daemon

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
)

// TestCachesCountChanges: through real informers, a block created, given
// another affinity or borrowed from asks for a pass and is in the next
// snapshot; a pod's address in its node's own block asks for none and
// leaves the snapshot as it was.
func TestCachesCountChanges(t *testing.T) {
	ds := clustertest.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	passes := make(chan struct{}, 100)
	c := newCaches(ds, nil, func() { passes <- struct{}{} })
	if err := c.run(ctx); err != nil {
		t.Fatal(err)
	}
	drain := func() int {
		n := 0
		for {
			select {
			case <-passes:
				n++
			case <-time.After(2 * time.Second):
				return n
			}
		}
	}
	drain()
	const name = "10-250-7-0-29"
	t.Cleanup(func() { _ = ds.IPAMBlocks.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	affinity := func() string {
		for _, b := range c.snapshot().blocks {
			if b.Name == name {
				return b.Spec.Affinity
			}
		}
		return "none"
	}
	if got := affinity(); got != "none" {
		t.Fatalf("before the block: %q", got)
	}
	b, err := ds.IPAMBlocks.Create(ctx, &tabbyv1.IPAMBlock{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: tabbyv1.IPAMBlockSpec{CIDR: "10.250.7.0/29", Affinity: "host:n1", Allocations: []int{-1, -1, -1, -1, -1, -1, -1, -1}, Unallocated: []int{0, 1, 2, 3, 4, 5, 6, 7}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := drain(); n == 0 {
		t.Fatal("a new block asked for no pass")
	}
	if got := affinity(); got != "host:n1" {
		t.Fatalf("after the block's creation the snapshot has %q", got)
	}
	// A pod's address in n1's own block: no pass, and the snapshot is
	// the one taken before it.
	b.Spec.Allocations[0], b.Spec.Unallocated = 0, b.Spec.Unallocated[1:]
	b.Spec.Attributes = []tabbyv1.AllocationAttribute{{HandleID: "k8s-pod-network.abc", Node: "n1", Namespace: "ns", Pod: "p"}}
	if b, err = ds.IPAMBlocks.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := drain(); n != 0 {
		t.Errorf("a pod's address in its node's own block asked for %d passes", n)
	}
	gen := c.gen.Load()
	c.snapshot()
	if c.lastGen != gen {
		t.Errorf("snapshot at gen %d, want %d", c.lastGen, gen)
	}
	// n2 borrows an address: a pass, and a new snapshot.
	b.Spec.Allocations[1], b.Spec.Unallocated = 1, b.Spec.Unallocated[1:]
	b.Spec.Attributes = append(b.Spec.Attributes, tabbyv1.AllocationAttribute{HandleID: "k8s-pod-network.def", Node: "n2", Namespace: "ns", Pod: "q"})
	if b, err = ds.IPAMBlocks.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := drain(); n == 0 {
		t.Error("an address borrowed by n2 asked for no pass")
	}
	if c.gen.Load() == gen {
		t.Error("an address borrowed by n2 was not counted")
	}
	// Another affinity: in the next snapshot at once.
	b.Spec.Affinity = "host:n3"
	if _, err = ds.IPAMBlocks.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	drain()
	if got := affinity(); got != "host:n3" {
		t.Errorf("after the affinity changed the snapshot has %q", got)
	}
}
