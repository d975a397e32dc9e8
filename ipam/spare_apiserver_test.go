package ipam_test

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/ipam"
)

// holder returns the attribute that holds ip in its block (nil: free).
func holder(t *testing.T, m *ipam.IPAM, ip net.IP, block *net.IPNet) *tabbyv1.AllocationAttribute {
	t.Helper()
	ba, _ := netip.AddrFromSlice(block.IP)
	ones, _ := block.Mask.Size()
	pfx := netip.PrefixFrom(ba.Unmap(), ones)
	b, err := client(t).IPAMBlocks.Get(ctx(t), ipam.BlockName(pfx), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := netip.AddrFromSlice(ip)
	for ord, idx := range b.Spec.Allocations {
		if addrAt(pfx, ord) == a.Unmap().String() && idx >= 0 {
			at := b.Spec.Attributes[idx]
			return &at
		}
	}
	return nil
}

// TestSpares: a spare is an allocation in the node's own block under a
// spare handle, without an IPAMHandle; it fits only a plain request of its
// families in a pool the request could get; its transfer moves the address
// to the pod's handle in one block write, records the pod's handle, and is
// idempotent; an address released meanwhile is taken again, one taken by
// another handle is an error; and a spare is never borrowed.
func TestSpares(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	c := ctx(t)
	pool := mkPool(t, ds, "spares", "10.93.0.0/29", 30) // two blocks of four
	m := ipam.New(ds)

	if _, err := m.AssignSpare(c, "n1", ipam.SpareHandle("n2", "x"), true, false); err == nil {
		t.Error("a spare handle of another node was accepted")
	}
	s, err := m.AssignSpare(c, "n1", ipam.SpareHandle("n1", "a"), true, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Addresses) != 1 || s.Addresses[0].Pool == nil || s.Addresses[0].Pool.Name != pool.Name {
		t.Fatalf("spare %+v", s)
	}
	sp := s.Addresses[0]
	if h := holder(t, m, sp.IP, sp.Block); h == nil || h.HandleID != s.Handle || h.Node != "n1" || h.Pod != "" {
		t.Fatalf("the block holds %s for %+v, want the spare's handle", sp.IP, h)
	}
	if _, err := ds.IPAMHandles.Get(c, ipam.HandleObjectName(s.Handle), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a spare has an IPAMHandle object: %v", err)
	}
	found, err := m.NodeSpares(c, "n1", true)
	if err != nil || len(found) != 1 || found[0].Handle != s.Handle || !found[0].Addresses[0].IP.Equal(sp.IP) ||
		found[0].Addresses[0].Pool == nil || found[0].Addresses[0].Block.String() != sp.Block.String() {
		t.Fatalf("NodeSpares = %+v, %v; want %+v", found, err, s)
	}

	pod := ipam.Request{HandleID: "net.c1", Node: "n1", Namespace: "ns", Pod: "p1", IPv4: true}
	for _, tc := range []struct {
		name string
		req  ipam.Request
		want bool
	}{
		{"plain IPv4", pod, true},
		{"dual-stack", ipam.Request{HandleID: "h", Node: "n1", IPv4: true, IPv6: true}, false},
		{"IPv6", ipam.Request{HandleID: "h", Node: "n1", IPv6: true}, false},
		{"named pool", ipam.Request{HandleID: "h", Node: "n1", IPv4: true, IPv4Pools: []string{pool.Name}}, false},
		{"exact address", ipam.Request{HandleID: "h", Node: "n1", IPs: []net.IP{sp.IP}}, false},
		{"tunnel use", ipam.Request{HandleID: "h", Node: "n1", IPv4: true, Use: tabbyv1.UseTunnel}, true},
	} {
		if got := m.SpareFits(c, s, tc.req); got != tc.want {
			t.Errorf("%s: SpareFits = %v, want %v", tc.name, got, tc.want)
		}
	}
	// IPAM reads pools from the API server's watch cache, which may lag a
	// write by a moment (CI once read the pool still enabled): each
	// answer is awaited, not expected at once.
	fits := func(want bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for m.SpareFits(c, s, pod) != want {
			if time.Now().After(deadline) {
				t.Fatalf("SpareFits stayed %v for 10 s after the pool changed", !want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	p := pool.DeepCopy()
	p.Spec.Disabled = true
	if _, err := ds.IPPools.Update(c, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	fits(false) // a spare of a disabled pool does not fit
	p, _ = ds.IPPools.Get(c, pool.Name, metav1.GetOptions{})
	p.Spec.Disabled = false
	if _, err := ds.IPPools.Update(c, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	fits(true)

	// The transfer, twice: the first also makes the next spare in the
	// same write, the second (as after a write whose outcome was not
	// known) finds it.
	next := ipam.SpareHandle("n1", "next")
	var made []ipam.Spare
	for range 2 {
		got, err := m.TransferSpare(c, s, pod, next)
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, got)
	}
	for _, n := range made {
		if n.Handle != next || len(n.Addresses) != 1 || n.Addresses[0].Block.String() != sp.Block.String() || n.Addresses[0].Pool != sp.Pool ||
			!n.Addresses[0].IP.Equal(made[0].Addresses[0].IP) || n.Addresses[0].IP.Equal(sp.IP) {
			t.Fatalf("the next spares made %+v, want one new address of block %s, twice the same", made, sp.Block)
		}
	}
	if h := holder(t, m, made[0].Addresses[0].IP, sp.Block); h == nil || h.HandleID != next || h.Pod != "" {
		t.Fatalf("the next spare's address is held by %+v", h)
	}
	if err := m.ReleaseHandle(c, next, "n1"); err != nil {
		t.Fatal(err)
	}
	if h := holder(t, m, sp.IP, sp.Block); h == nil || h.HandleID != pod.HandleID || h.Pod != "p1" || h.Namespace != "ns" {
		t.Fatalf("after the transfer the block holds %s for %+v", sp.IP, h)
	}
	if ips, err := m.HandleIPs(c, pod.HandleID); err != nil || len(ips) != 1 || !ips[0].Equal(sp.IP) {
		t.Errorf("HandleIPs(%s) = %v, %v; want [%s] from its IPAMHandle", pod.HandleID, ips, err, sp.IP)
	}
	if found, _ := m.NodeSpares(c, "n1", true); len(found) != 0 {
		t.Errorf("spares left after the transfer: %+v", found)
	}
	if _, err := m.TransferSpare(c, s, ipam.Request{HandleID: "net.c9", Node: "n2"}, ""); err == nil {
		t.Error("a transfer to another node's handle was accepted")
	}

	// Released meanwhile: allocated to the pod again.
	s2, err := m.AssignSpare(c, "n1", ipam.SpareHandle("n1", "b"), true, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ReleaseHandle(c, s2.Handle, "n1"); err != nil {
		t.Fatal(err)
	}
	pod2 := ipam.Request{HandleID: "net.c2", Node: "n1", Namespace: "ns", Pod: "p2", IPv4: true}
	if _, err := m.TransferSpare(c, s2, pod2, ""); err != nil {
		t.Fatal(err)
	}
	if h := holder(t, m, s2.Addresses[0].IP, s2.Addresses[0].Block); h == nil || h.HandleID != pod2.HandleID {
		t.Errorf("a released spare's address was not taken again for its pod: %+v", h)
	}

	// Taken by another handle meanwhile: an error that says so.
	s3, err := m.AssignSpare(c, "n1", ipam.SpareHandle("n1", "c"), true, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ReleaseHandle(c, s3.Handle, "n1"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Assign(c, ipam.Request{HandleID: "net.other", Node: "n1", IPs: []net.IP{s3.Addresses[0].IP}}); err != nil {
		t.Fatal(err)
	}
	_, err = m.TransferSpare(c, s3, ipam.Request{HandleID: "net.c3", Node: "n1", IPv4: true}, "")
	if !errors.Is(err, ipam.ErrSpareLost) || !strings.Contains(err.Error(), "in use twice") {
		t.Errorf("transfer of an address another handle took: %v", err)
	}
	if h := holder(t, m, s3.Addresses[0].IP, s3.Addresses[0].Block); h == nil || h.HandleID != "net.other" {
		t.Errorf("the other handle lost its address: %+v", h)
	}

	// n1's block is full now (c1, c2, other, and one left): the last
	// address, then the other block goes to n2, and a spare of n1 would
	// have to be borrowed.
	if _, err := m.AssignSpare(c, "n1", ipam.SpareHandle("n1", "d"), true, false); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Assign(c, v4("net.n2", "n2")); err != nil {
		t.Fatal(err)
	}
	_, err = m.AssignSpare(c, "n1", ipam.SpareHandle("n1", "e"), true, false)
	if !errors.Is(err, ipam.ErrSpareBorrowed) {
		t.Fatalf("a spare with no room in the node's blocks: %v, want ErrSpareBorrowed", err)
	}
	if ips, err := m.HandleIPsOnNode(c, ipam.SpareHandle("n1", "e"), "n2"); err != nil || len(ips) != 0 {
		t.Errorf("the borrowed spare was kept: %v, %v", ips, err)
	}
	if found, _ := m.NodeSpares(c, "n1", true); len(found) != 1 || found[0].Handle != ipam.SpareHandle("n1", "d") {
		t.Errorf("NodeSpares = %+v, want only spare d", found)
	}
}
