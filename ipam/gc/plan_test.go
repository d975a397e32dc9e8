package gc

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/ipam"
)

// The pure half: which allocations, blocks and records are candidates,
// and which are due, from blocks, pods, nodes and time.

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

const grace = 10 * time.Minute

type held struct {
	ord  int
	attr tabbyv1.AllocationAttribute
	seq  uint64
}

// mkBlock builds a block of cidr affine to node ("" none) holding allocs.
func mkBlock(cidr, node string, allocs ...held) *tabbyv1.IPAMBlock {
	p := netip.MustParsePrefix(cidr)
	n := 1 << (p.Addr().BitLen() - p.Bits())
	b := &tabbyv1.IPAMBlock{
		ObjectMeta: metav1.ObjectMeta{Name: "b-" + cidr, UID: types.UID("uid-" + cidr)},
		Spec: tabbyv1.IPAMBlockSpec{CIDR: cidr, Allocations: make([]int, n),
			SequenceNumberForAllocation: map[string]uint64{}},
	}
	if node != "" {
		b.Spec.Affinity = "host:" + node
	}
	for i := range b.Spec.Allocations {
		b.Spec.Allocations[i] = -1
	}
	for _, h := range allocs {
		b.Spec.Attributes = append(b.Spec.Attributes, h.attr)
		b.Spec.Allocations[h.ord] = len(b.Spec.Attributes) - 1
		b.Spec.SequenceNumberForAllocation[strconv.Itoa(h.ord)] = h.seq
	}
	for i, idx := range b.Spec.Allocations {
		if idx < 0 {
			b.Spec.Unallocated = append(b.Spec.Unallocated, i)
		}
	}
	return b
}

func podAttr(ns, pod, node string, ts *time.Time) tabbyv1.AllocationAttribute {
	a := tabbyv1.AllocationAttribute{HandleID: "net." + pod, Use: tabbyv1.UseWorkload, Namespace: ns, Pod: pod, Node: node}
	if ts != nil {
		mt := metav1.NewTime(*ts)
		a.Timestamp = &mt
	}
	return a
}

func mkPod(ns, name string, phase corev1.PodPhase, ips ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Status: corev1.PodStatus{Phase: phase}}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0]
	}
	return p
}

func TestAllocations(t *testing.T) {
	b := mkBlock("10.1.0.8/29", "n1", held{0, podAttr("ns", "a", "n1", nil), 3}, held{7, podAttr("ns", "b", "n2", nil), 9})
	got := Allocations(b)
	if len(got) != 2 {
		t.Fatalf("got %d allocations, want 2", len(got))
	}
	if got[0].IP != netip.MustParseAddr("10.1.0.8") || got[0].Sequence != 3 || !got[0].HasSequence || got[0].BlockNode != "n1" {
		t.Errorf("first: %+v", got[0])
	}
	if got[1].IP != netip.MustParseAddr("10.1.0.15") || got[1].Attr.Pod != "b" || got[1].Node() != "n2" {
		t.Errorf("second: %+v", got[1])
	}
	v6 := mkBlock("fd00::1:0/122", "n1", held{63, podAttr("ns", "c", "n1", nil), 1})
	if a := Allocations(v6); len(a) != 1 || a[0].IP != netip.MustParseAddr("fd00::1:3f") {
		t.Errorf("IPv6: %+v", a)
	}
	bad := mkBlock("10.1.0.8/29", "n1", held{1, podAttr("ns", "a", "n1", nil), 1})
	bad.Spec.Allocations = bad.Spec.Allocations[:5]
	if a := Allocations(bad); a != nil {
		t.Errorf("a corrupted block gave allocations %+v", a)
	}
}

func TestJudge(t *testing.T) {
	ip := "10.1.0.9"
	alloc := func(attr tabbyv1.AllocationAttribute) Allocation {
		return Allocation{Block: "b", CIDR: netip.MustParsePrefix("10.1.0.8/29"), Ordinal: 1, IP: netip.MustParseAddr(ip), Attr: attr, BlockNode: "n1"}
	}
	pod := podAttr("ns", "p", "n1", nil)
	tunnel := tabbyv1.AllocationAttribute{HandleID: "vxlan-tunnel-addr-n1", Use: tabbyv1.UseTunnel, Node: "n1"}
	tunnelByName := tabbyv1.AllocationAttribute{HandleID: "ipip-tunnel-addr-n1", Node: "n1", Namespace: "ns", Pod: "p"}
	anon := tabbyv1.AllocationAttribute{HandleID: "net.cnitool", Use: tabbyv1.UseWorkload, Node: "n1"}
	// A spare tabbyd holds ahead (ipam.AssignSpare): kept while its node
	// lives, freed once the node is gone.
	spare := tabbyv1.AllocationAttribute{HandleID: ipam.SpareHandle("n1", "0a1b"), Use: tabbyv1.UseWorkload, Node: "n1"}
	noNode := Allocation{IP: netip.MustParseAddr(ip), Attr: tabbyv1.AllocationAttribute{HandleID: "x"}}
	newer := tabbyv1.AllocationAttribute{HandleID: "net.p2", Namespace: "ns", Pod: "p", Node: "n1"}   // the pod's next sandbox
	second := tabbyv1.AllocationAttribute{HandleID: "net2.p", Namespace: "ns", Pod: "p", Node: "n1"}  // the pod's second network
	stranger := tabbyv1.AllocationAttribute{HandleID: "net.q", Namespace: "ns", Pod: "q", Node: "n1"} // another pod
	holders := func(m map[string]tabbyv1.AllocationAttribute) Holders {
		return func(a netip.Addr) *Allocation {
			if at, ok := m[a.String()]; ok {
				return &Allocation{IP: a, Attr: at}
			}
			return nil
		}
	}
	for _, tc := range []struct {
		name       string
		a          Allocation
		pod        *corev1.Pod
		nodeExists bool
		held       map[string]tabbyv1.AllocationAttribute // who holds the pod's listed addresses
		want       Reason                                 // "" = not a candidate
	}{
		{"pod gone", alloc(pod), nil, true, nil, ReasonPodGone},
		{"pod gone, node gone", alloc(pod), nil, false, nil, ReasonPodGone},
		{"pod pending, no addresses yet (between ADD and status)", alloc(pod), mkPod("ns", "p", corev1.PodPending), true, nil, ""},
		{"pod running, no addresses in status yet", alloc(pod), mkPod("ns", "p", corev1.PodRunning), true, nil, ""},
		{"pod running with this address", alloc(pod), mkPod("ns", "p", corev1.PodRunning, ip), true, nil, ""},
		{"pod running dual-stack, this address second", alloc(pod), mkPod("ns", "p", corev1.PodRunning, "fd00::9", ip), true, nil, ""},
		{"pod running in a newer sandbox", alloc(pod), mkPod("ns", "p", corev1.PodRunning, "10.1.0.10"), true,
			map[string]tabbyv1.AllocationAttribute{"10.1.0.10": newer}, ReasonPodOtherAddresses},
		{"pod running, its listed address is its second network's", alloc(pod), mkPod("ns", "p", corev1.PodRunning, "10.1.0.10"), true,
			map[string]tabbyv1.AllocationAttribute{"10.1.0.10": second}, ""},
		{"pod running, its listed address is another pod's", alloc(pod), mkPod("ns", "p", corev1.PodRunning, "10.1.0.10"), true,
			map[string]tabbyv1.AllocationAttribute{"10.1.0.10": stranger}, ""},
		{"pod running with an address tabby did not give (another CNI)", alloc(pod), mkPod("ns", "p", corev1.PodRunning, "192.168.9.9"), true, nil, ""},
		{"pod pending listing a newer sandbox's address", alloc(pod), mkPod("ns", "p", corev1.PodPending, "10.1.0.10"), true,
			map[string]tabbyv1.AllocationAttribute{"10.1.0.10": newer}, ""},
		{"pod phase unknown", alloc(pod), mkPod("ns", "p", corev1.PodUnknown, "10.1.0.10"), true,
			map[string]tabbyv1.AllocationAttribute{"10.1.0.10": newer}, ""},
		{"pod succeeded", alloc(pod), mkPod("ns", "p", corev1.PodSucceeded, ip), true, nil, ReasonPodFinished},
		{"pod failed", alloc(pod), mkPod("ns", "p", corev1.PodFailed, ip), true, nil, ReasonPodFinished},
		{"pod exists on a deleted node", alloc(pod), mkPod("ns", "p", corev1.PodRunning, ip), false, nil, ""},
		{"pod status with podIP only", alloc(pod), &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.0.11"}}, true,
			map[string]tabbyv1.AllocationAttribute{"10.1.0.11": newer}, ReasonPodOtherAddresses},
		{"tunnel, node alive", alloc(tunnel), nil, true, nil, ""},
		{"tunnel, node gone", alloc(tunnel), nil, false, nil, ReasonNodeGone},
		{"tunnel by handle name, pod ignored", alloc(tunnelByName), nil, true, nil, ""},
		{"no pod identity, node alive", alloc(anon), nil, true, nil, ""},
		{"no pod identity, node gone", alloc(anon), nil, false, nil, ReasonNodeGone},
		{"spare, node alive", alloc(spare), nil, true, nil, ""},
		{"spare, node gone", alloc(spare), nil, false, nil, ReasonNodeGone},
		{"no pod identity and no node", noNode, nil, false, nil, ""},
		{"a pod name without namespace is no pod identity", alloc(tabbyv1.AllocationAttribute{HandleID: "h", Pod: "p", Node: "n1"}), nil, true, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Judge(tc.a, tc.pod, tc.nodeExists, holders(tc.held))
			if ok != (tc.want != "") || got != tc.want {
				t.Errorf("Judge = %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
}

// summary renders a plan as sorted lines for comparison.
func summary(p Plan) []string {
	var out []string
	due := func(d bool) string {
		if d {
			return "due"
		}
		return "waiting"
	}
	for _, c := range p.Allocations {
		out = append(out, fmt.Sprintf("alloc %s %s %s", c.IP, c.Reason, due(c.Due)))
	}
	for _, b := range p.Blocks {
		out = append(out, fmt.Sprintf("block %s %s %s", b.Block.Spec.CIDR, b.Kind, due(b.Due)))
	}
	for _, a := range p.Affinities {
		out = append(out, fmt.Sprintf("affinity %s/%s %s %s", a.Node, a.CIDR, a.Kind, due(a.Due)))
	}
	for _, h := range p.Handles {
		out = append(out, fmt.Sprintf("handle %s %s", h.Handle.Spec.HandleID, due(h.Due)))
	}
	sort.Strings(out)
	return out
}

func aff(node, cidr string) *tabbyv1.BlockAffinity {
	return &tabbyv1.BlockAffinity{ObjectMeta: metav1.ObjectMeta{Name: node + "-" + cidr, UID: types.UID("a-" + node + cidr)},
		Spec: tabbyv1.BlockAffinitySpec{State: tabbyv1.AffinityConfirmed, Node: node, CIDR: cidr}}
}

func handle(id string) *tabbyv1.IPAMHandle {
	return &tabbyv1.IPAMHandle{ObjectMeta: metav1.ObjectMeta{Name: id, UID: types.UID("h-" + id)}, Spec: tabbyv1.IPAMHandleSpec{HandleID: id}}
}

func pools(cidrs ...string) []*tabbyv1.IPPool {
	var out []*tabbyv1.IPPool
	for i, c := range cidrs {
		out = append(out, &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "pool" + strconv.Itoa(i)}, Spec: tabbyv1.IPPoolSpec{CIDR: c}})
	}
	return out
}

func TestCompute(t *testing.T) {
	old := t0.Add(-time.Hour)
	young := t0.Add(-time.Minute)
	future := t0.Add(time.Hour)
	// allKeys marks everything the snapshot will produce as seen long ago.
	seenLongAgo := func(s *Snapshot) Seen {
		_, next := Compute(s, Seen{}, t0.Add(-2*grace), grace)
		return next
	}
	for _, tc := range []struct {
		name string
		snap *Snapshot
		// seen: nil = nothing seen before; else computed by seenLongAgo.
		seenBefore bool
		want       []string
	}{
		{
			name: "leaked pod address, first seen now: waits",
			snap: &Snapshot{
				Blocks:     []*tabbyv1.IPAMBlock{mkBlock("10.1.0.0/29", "n1", held{1, podAttr("ns", "gone", "n1", &old), 1})},
				Affinities: []*tabbyv1.BlockAffinity{aff("n1", "10.1.0.0/29")},
				Nodes:      map[string]bool{"n1": true},
			},
			want: []string{"alloc 10.1.0.1 pod-gone waiting"},
		},
		{
			name: "leaked pod address seen through the grace period: due",
			snap: &Snapshot{
				Blocks:     []*tabbyv1.IPAMBlock{mkBlock("10.1.0.0/29", "n1", held{1, podAttr("ns", "gone", "n1", &old), 1})},
				Affinities: []*tabbyv1.BlockAffinity{aff("n1", "10.1.0.0/29")},
				Nodes:      map[string]bool{"n1": true},
			},
			seenBefore: true,
			want:       []string{"alloc 10.1.0.1 pod-gone due"},
		},
		{
			name: "allocated moments ago by its timestamp (pod not in the API yet): never due",
			snap: &Snapshot{
				Blocks: []*tabbyv1.IPAMBlock{mkBlock("10.1.0.0/29", "n1",
					held{1, podAttr("ns", "new", "n1", &young), 1}, held{2, podAttr("ns", "skewed", "n1", &future), 2})},
				Affinities: []*tabbyv1.BlockAffinity{aff("n1", "10.1.0.0/29")},
				Nodes:      map[string]bool{"n1": true},
			},
			seenBefore: true,
			want:       []string{"alloc 10.1.0.1 pod-gone waiting", "alloc 10.1.0.2 pod-gone waiting"},
		},
		{
			name: "no timestamp: the collector's own memory decides",
			snap: &Snapshot{
				Blocks:     []*tabbyv1.IPAMBlock{mkBlock("10.1.0.0/29", "n1", held{1, podAttr("ns", "gone", "n1", nil), 1})},
				Affinities: []*tabbyv1.BlockAffinity{aff("n1", "10.1.0.0/29")},
				Nodes:      map[string]bool{"n1": true},
			},
			seenBefore: true,
			want:       []string{"alloc 10.1.0.1 pod-gone due"},
		},
		{
			name: "live pods keep their addresses; a finished one and a replaced sandbox do not",
			snap: &Snapshot{
				Blocks: []*tabbyv1.IPAMBlock{mkBlock("10.1.0.0/29", "n1",
					held{1, podAttr("ns", "running", "n1", &old), 1},
					held{2, podAttr("ns", "pending", "n1", &old), 2},
					held{3, podAttr("ns", "done", "n1", &old), 3},
					held{4, podAttr("ns", "resandboxed", "n1", &old), 4},
					held{5, podAttr("ns", "noips", "n1", &old), 5},
					held{6, tabbyv1.AllocationAttribute{HandleID: "net.resandboxed-2", Namespace: "ns", Pod: "resandboxed", Node: "n1"}, 6})},
				Affinities: []*tabbyv1.BlockAffinity{aff("n1", "10.1.0.0/29")},
				Pods: map[PodKey]*corev1.Pod{
					{"ns", "running"}:     mkPod("ns", "running", corev1.PodRunning, "10.1.0.1"),
					{"ns", "pending"}:     mkPod("ns", "pending", corev1.PodPending),
					{"ns", "done"}:        mkPod("ns", "done", corev1.PodSucceeded, "10.1.0.3"),
					{"ns", "resandboxed"}: mkPod("ns", "resandboxed", corev1.PodRunning, "10.1.0.6"),
					{"ns", "noips"}:       mkPod("ns", "noips", corev1.PodRunning),
				},
				Nodes: map[string]bool{"n1": true},
			},
			seenBefore: true,
			want:       []string{"alloc 10.1.0.3 pod-finished due", "alloc 10.1.0.4 pod-has-other-addresses due"},
		},
		{
			name: "tunnel and anonymous addresses of a live node are kept",
			snap: &Snapshot{
				Blocks: []*tabbyv1.IPAMBlock{mkBlock("10.1.0.0/29", "n1",
					held{0, tabbyv1.AllocationAttribute{HandleID: "vxlan-tunnel-addr-n1", Use: tabbyv1.UseTunnel, Node: "n1", Timestamp: &metav1.Time{Time: old}}, 1},
					held{1, tabbyv1.AllocationAttribute{HandleID: "net.cnitool", Node: "n1", Timestamp: &metav1.Time{Time: old}}, 2})},
				Affinities: []*tabbyv1.BlockAffinity{aff("n1", "10.1.0.0/29")},
				Nodes:      map[string]bool{"n1": true},
			},
			seenBefore: true,
		},
		{
			name: "deleted node: its tunnel and anonymous addresses go, a live pod's stays, the block waits for them",
			snap: &Snapshot{
				Blocks: []*tabbyv1.IPAMBlock{mkBlock("10.1.0.0/29", "gone",
					held{0, tabbyv1.AllocationAttribute{HandleID: "vxlan-tunnel-addr-gone", Use: tabbyv1.UseTunnel, Node: "gone"}, 1},
					held{1, tabbyv1.AllocationAttribute{HandleID: "net.cnitool", Node: "gone"}, 2},
					held{2, podAttr("ns", "stillthere", "gone", nil), 3},
					held{3, podAttr("ns", "borrower", "n2", nil), 4}),
					mkBlock("10.1.0.8/29", "gone")},
				Affinities: []*tabbyv1.BlockAffinity{aff("gone", "10.1.0.0/29"), aff("gone", "10.1.0.8/29")},
				Pods: map[PodKey]*corev1.Pod{
					{"ns", "stillthere"}: mkPod("ns", "stillthere", corev1.PodRunning, "10.1.0.2"),
					{"ns", "borrower"}:   mkPod("ns", "borrower", corev1.PodRunning, "10.1.0.3"),
				},
				Nodes: map[string]bool{"n2": true},
			},
			seenBefore: true,
			want: []string{
				"alloc 10.1.0.0 node-gone due", "alloc 10.1.0.1 node-gone due",
				"block 10.1.0.0/29 node-deleted due", "block 10.1.0.8/29 node-deleted due",
			},
		},
		{
			name: "deleted node seen gone just now: waits",
			snap: &Snapshot{
				Blocks:     []*tabbyv1.IPAMBlock{mkBlock("10.1.0.8/29", "gone")},
				Affinities: []*tabbyv1.BlockAffinity{aff("gone", "10.1.0.8/29")},
				Nodes:      map[string]bool{},
			},
			want: []string{"block 10.1.0.8/29 node-deleted waiting"},
		},
		{
			name: "a live node keeps its last block of each pool",
			snap: &Snapshot{
				Blocks: []*tabbyv1.IPAMBlock{
					// n1: three empty blocks of pool0: two go (by name order, the last stays).
					mkBlock("10.1.0.0/29", "n1"), mkBlock("10.1.0.8/29", "n1"), mkBlock("10.1.0.16/29", "n1"),
					// n2: one empty block of pool0 and one of pool1: both stay.
					mkBlock("10.1.0.24/29", "n2"), mkBlock("10.2.0.0/29", "n2"),
					// n3: one used and one empty block of pool0: the empty one goes.
					mkBlock("10.1.0.32/29", "n3", held{1, podAttr("ns", "live", "n3", &old), 1}), mkBlock("10.1.0.40/29", "n3"),
					// no affinity, empty: goes.
					mkBlock("10.1.0.48/29", ""),
				},
				Affinities: []*tabbyv1.BlockAffinity{aff("n1", "10.1.0.0/29"), aff("n1", "10.1.0.8/29"), aff("n1", "10.1.0.16/29"),
					aff("n2", "10.1.0.24/29"), aff("n2", "10.2.0.0/29"), aff("n3", "10.1.0.32/29"), aff("n3", "10.1.0.40/29")},
				Pools: pools("10.1.0.0/16", "10.2.0.0/16"),
				Pods:  map[PodKey]*corev1.Pod{{"ns", "live"}: mkPod("ns", "live", corev1.PodRunning, "10.1.0.33")},
				Nodes: map[string]bool{"n1": true, "n2": true, "n3": true},
			},
			seenBefore: true,
			want: []string{
				"block 10.1.0.0/29 empty due", "block 10.1.0.16/29 empty due", "block 10.1.0.24/29 empty waiting",
				"block 10.1.0.40/29 empty due", "block 10.1.0.48/29 empty due", "block 10.1.0.8/29 empty waiting",
				"block 10.2.0.0/29 empty waiting",
			},
		},
		{
			name: "an empty block waits for the grace period",
			snap: &Snapshot{
				Blocks:     []*tabbyv1.IPAMBlock{mkBlock("10.1.0.0/29", "n1"), mkBlock("10.1.0.8/29", "n1")},
				Affinities: []*tabbyv1.BlockAffinity{aff("n1", "10.1.0.0/29"), aff("n1", "10.1.0.8/29")},
				Pools:      pools("10.1.0.0/16"),
				Nodes:      map[string]bool{"n1": true},
			},
			want: []string{"block 10.1.0.0/29 empty waiting", "block 10.1.0.8/29 empty waiting"},
		},
		{
			name: "records: orphan affinities, a missing one, an orphan handle",
			snap: &Snapshot{
				Blocks: []*tabbyv1.IPAMBlock{
					mkBlock("10.1.0.0/29", "n1", held{1, podAttr("ns", "live", "n1", nil), 1}),
					mkBlock("10.1.0.8/29", "n2", held{1, podAttr("ns", "live2", "n2", nil), 1}),
					mkBlock("10.1.0.16/29", "gone", held{1, podAttr("ns", "live3", "gone", nil), 1}),
				},
				Affinities: []*tabbyv1.BlockAffinity{
					aff("n1", "10.1.0.0/29"),  // in order
					aff("n1", "10.1.0.8/29"),  // the block is n2's
					aff("n1", "10.1.0.64/29"), // no block
					aff("gone", "10.1.0.16/29"),
					// n2 has no record of 10.1.0.8/29
				},
				Handles: []*tabbyv1.IPAMHandle{handle("net.live"), handle("net.nothing")},
				Pods: map[PodKey]*corev1.Pod{
					{"ns", "live"}:  mkPod("ns", "live", corev1.PodRunning, "10.1.0.1"),
					{"ns", "live2"}: mkPod("ns", "live2", corev1.PodRunning, "10.1.0.9"),
					{"ns", "live3"}: mkPod("ns", "live3", corev1.PodRunning, "10.1.0.17"),
				},
				Nodes: map[string]bool{"n1": true, "n2": true},
			},
			seenBefore: true,
			want: []string{
				"affinity n1/10.1.0.64/29 orphan due", "affinity n1/10.1.0.8/29 orphan due", "affinity n2/10.1.0.8/29 missing due",
				"block 10.1.0.16/29 node-deleted due", "handle net.nothing due",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var seen Seen
			if tc.seenBefore {
				seen = seenLongAgo(tc.snap)
			}
			plan, _ := Compute(tc.snap, seen, t0, grace)
			if diff := cmp.Diff(tc.want, summary(plan)); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
}

// TestComputeMemory: a candidate must stay one, continuously, through the
// grace period; a new allocation of the same address starts over.
func TestComputeMemory(t *testing.T) {
	ts := t0.Add(-time.Hour)
	leaked := func(seq uint64) *Snapshot {
		return &Snapshot{
			Blocks:     []*tabbyv1.IPAMBlock{mkBlock("10.1.0.0/29", "n1", held{1, podAttr("ns", "p", "n1", &ts), seq})},
			Affinities: []*tabbyv1.BlockAffinity{aff("n1", "10.1.0.0/29")},
			Nodes:      map[string]bool{"n1": true},
		}
	}
	alive := leaked(1)
	alive.Pods = map[PodKey]*corev1.Pod{{"ns", "p"}: mkPod("ns", "p", corev1.PodRunning, "10.1.0.1")}

	step := func(s *Snapshot, seen Seen, at time.Time) (string, Seen) {
		p, next := Compute(s, seen, at, grace)
		if len(p.Allocations) == 0 {
			return "none", next
		}
		c := p.Allocations[0]
		return fmt.Sprintf("%v since %v", c.Due, c.Since.Sub(t0)), next
	}
	seen := Seen{}
	var got []string
	for _, st := range []struct {
		s  *Snapshot
		at time.Duration
	}{
		{leaked(1), 0},
		{leaked(1), 5 * time.Minute},
		{leaked(1), 10 * time.Minute}, // due
		{alive, 11 * time.Minute},     // the pod showed up (a stale cache): forgotten
		{leaked(1), 12 * time.Minute}, // starts over
		{leaked(1), 22 * time.Minute}, // due again
		{leaked(2), 23 * time.Minute}, // the address was released and allocated again: a new candidate
	} {
		var s string
		s, seen = step(st.s, seen, t0.Add(st.at))
		got = append(got, s)
	}
	want := []string{
		"false since 0s", "false since 0s", "true since 0s", "none",
		"false since 12m0s", "true since 12m0s", "false since 23m0s",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if len(seen) != 1 {
		t.Errorf("memory holds %d entries, want only the live candidate's: %v", len(seen), seen)
	}
}

// TestComputeNextDue: the plan says when its first waiting candidate
// becomes due, the later of grace after it was first seen and grace after
// its allocation's timestamp, so a collector can pass again right then.
func TestComputeNextDue(t *testing.T) {
	young := t0.Add(2 * time.Minute)
	old := t0.Add(-time.Hour)
	snap := func(ts *time.Time) *Snapshot {
		return &Snapshot{
			Blocks:     []*tabbyv1.IPAMBlock{mkBlock("10.1.0.0/29", "n1", held{1, podAttr("ns", "p", "n1", ts), 1})},
			Affinities: []*tabbyv1.BlockAffinity{aff("n1", "10.1.0.0/29")},
			Nodes:      map[string]bool{"n1": true},
		}
	}
	p, seen := Compute(snap(&old), Seen{}, t0, grace)
	if want := t0.Add(grace); !p.NextDue.Equal(want) {
		t.Errorf("first seen at t0: next due %v, want %v", p.NextDue.Sub(t0), want.Sub(t0))
	}
	p, _ = Compute(snap(&young), seen, t0.Add(time.Minute), grace)
	if want := young.Add(grace); !p.NextDue.Equal(want) {
		t.Errorf("allocated at t0+2m: next due %v, want %v", p.NextDue.Sub(t0), want.Sub(t0))
	}
	p, _ = Compute(snap(&old), seen, t0.Add(grace), grace)
	if !p.NextDue.IsZero() || len(p.Allocations) != 1 || !p.Allocations[0].Due {
		t.Errorf("at t0+grace it is due and nothing waits: %+v", p)
	}
}

// TestSeenKeys: the keys a collector remembers candidates by keep their
// form (kind/name/uid), and differ by kind for the same object.
func TestSeenKeys(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{seenBlockNodeGone.key("b1", "u1"), "bg/b1/u1"},
		{seenBlockEmpty.key("b1", "u1"), "be/b1/u1"},
		{seenAffinityOrphan.key("n1-10-0-0-0-26", "u2"), "af/n1-10-0-0-0-26/u2"},
		{seenAffinityMissing.key("b1", "u1"), "am/b1/u1"},
		{seenHandle.key("h1", "u3"), "h/h1/u3"},
		{Allocation{Block: "b1", Ordinal: 3, Sequence: 7, Attr: tabbyv1.AllocationAttribute{HandleID: "k8s-pod-network.x"}}.key(), "a/b1/3/k8s-pod-network.x/7"},
	} {
		if c.got != c.want {
			t.Errorf("key %q, want %q", c.got, c.want)
		}
	}
}
