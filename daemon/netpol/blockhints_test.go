package netpol

import (
	"context"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/ipam"
)

func hintBlock(name, rv string, allocs ...int) *tabbyv1.IPAMBlock {
	b := &tabbyv1.IPAMBlock{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv}}
	for _, a := range allocs {
		b.Spec.Allocations = append(b.Spec.Allocations, a)
	}
	return b
}

// blockIDs names each block by name@resourceVersion.
func blockIDs(bs []*tabbyv1.IPAMBlock) []string {
	out := make([]string, 0, len(bs))
	for _, b := range bs {
		out = append(out, b.Name+"@"+b.ResourceVersion)
	}
	slices.Sort(out)
	return out
}

func TestBlockHintsOverlay(t *testing.T) {
	for _, tc := range []struct {
		name       string
		hints      []*tabbyv1.IPAMBlock
		store      []*tabbyv1.IPAMBlock
		lastSynced string
		want       []string // the input's blocks
		kept       []string // the hints left
	}{{
		name:  "no hints: the informer's blocks",
		store: []*tabbyv1.IPAMBlock{hintBlock("a", "5"), hintBlock("b", "6")},
		want:  []string{"a@5", "b@6"},
	}, {
		name:       "a hint newer than the informer's copy replaces it",
		hints:      []*tabbyv1.IPAMBlock{hintBlock("a", "9", 0)},
		store:      []*tabbyv1.IPAMBlock{hintBlock("a", "5"), hintBlock("b", "6")},
		lastSynced: "8",
		want:       []string{"a@9", "b@6"},
		kept:       []string{"a@9"},
	}, {
		name:       "the informer's copy at the hint's version: the hint is dropped",
		hints:      []*tabbyv1.IPAMBlock{hintBlock("a", "9", 0)},
		store:      []*tabbyv1.IPAMBlock{hintBlock("a", "9", 0)},
		lastSynced: "9",
		want:       []string{"a@9"},
	}, {
		name:       "a later write the informer has (a release) wins over the hint",
		hints:      []*tabbyv1.IPAMBlock{hintBlock("a", "9", 0)},
		store:      []*tabbyv1.IPAMBlock{hintBlock("a", "12")},
		lastSynced: "12",
		want:       []string{"a@12"},
	}, {
		name:       "a block created ahead of the watch is added",
		hints:      []*tabbyv1.IPAMBlock{hintBlock("new", "9", 0)},
		store:      []*tabbyv1.IPAMBlock{hintBlock("a", "5")},
		lastSynced: "7",
		want:       []string{"a@5", "new@9"},
		kept:       []string{"new@9"},
	}, {
		name:       "a hinted block the informer no longer has after seeing past the hint was deleted",
		hints:      []*tabbyv1.IPAMBlock{hintBlock("gone", "9", 0)},
		store:      []*tabbyv1.IPAMBlock{hintBlock("a", "5")},
		lastSynced: "10",
		want:       []string{"a@5"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var h blockHints
			for _, b := range tc.hints {
				if !h.observe(b) {
					t.Fatalf("hint %s@%s not kept", b.Name, b.ResourceVersion)
				}
			}
			got := blockIDs(h.overlay(slices.Clone(tc.store), tc.lastSynced))
			if !slices.Equal(got, tc.want) {
				t.Errorf("blocks %v, want %v", got, tc.want)
			}
			var kept []*tabbyv1.IPAMBlock
			for _, hint := range h.m {
				kept = append(kept, hint.b)
			}
			if k := blockIDs(kept); !slices.Equal(k, tc.kept) && len(k)+len(tc.kept) > 0 {
				t.Errorf("hints kept %v, want %v", k, tc.kept)
			}
		})
	}
}

func TestBlockHintsObserveAndCatchUp(t *testing.T) {
	var h blockHints
	if h.observe(hintBlock("a", "", 0)) || h.observe(hintBlock("a", "x1", 0)) {
		t.Error("a block without a numeric resourceVersion was kept")
	}
	if !h.observe(hintBlock("a", "10", 0)) {
		t.Fatal("a@10 not kept")
	}
	if h.observe(hintBlock("a", "8")) || h.m["a"].rv != 10 {
		t.Errorf("an older version replaced the hint: %v", h.m["a"].rv)
	}
	// The informer reaching an older version keeps the hint.
	if h.caughtUp(hintBlock("a", "8")) || h.m["a"].rv != 10 {
		t.Error("an older informer version dropped the hint")
	}
	// Reaching its very version: a sync already used it.
	if !h.caughtUp(hintBlock("a", "10", 0)) {
		t.Error("the hint's own version was taken for a change")
	}
	if _, ok := h.m["a"]; ok {
		t.Error("the hint outlived the informer catching up")
	}
	// A newer version than the hint is a change, and drops it.
	h.observe(hintBlock("b", "20", 0))
	if h.caughtUp(hintBlock("b", "21")) {
		t.Error("a version newer than the hint was not taken for a change")
	}
	if _, ok := h.m["b"]; ok {
		t.Error("the hint outlived a newer version")
	}
	if h.caughtUp("not a block") || h.caughtUp(hintBlock("c", "3")) {
		t.Error("caughtUp without a hint")
	}
}

// TestBlockHintOlderThanRelease: against the real API server, a block
// version the agent hands over after the informer has seen a later write
// (the pod's address released) puts nothing back: the release stands.
func TestBlockHintOlderThanRelease(t *testing.T) {
	w := newWorld(t)
	p := w.pod(t, "hinted", w.node, map[string]string{"app": "h"})
	r := w.start(t, nil)
	handle := w.network + "." + string(p.UID)
	got, err := w.ipam.Assign(context.Background(), ipam.Request{HandleID: handle, Node: w.node, Namespace: p.Namespace, Pod: p.Name, IPv4: true})
	if err != nil {
		t.Fatal(err)
	}
	ip, _ := netip.AddrFromSlice(got[0].IP)
	ip = ip.Unmap()
	blocks, err := w.ds.IPAMBlocks.List(context.Background(), metav1.ListOptions{LabelSelector: tabbyv1.LabelNode + "=" + ipam.NodeLabelValue(w.node)})
	if err != nil || len(blocks.Items) != 1 {
		t.Fatalf("the node's blocks: %v, %v", blocks, err)
	}
	allocated := blocks.Items[0].DeepCopy()
	if _, err := r.c.WaitProgrammed(waitCtx(t, 30*time.Second), w.ns, p.Name, string(p.UID), []netip.Addr{ip}); err != nil {
		t.Fatal(err)
	}
	if err := w.ipam.ReleaseHandle(context.Background(), handle, w.node); err != nil {
		t.Fatal(err)
	}
	endpoint := func() bool {
		for _, e := range r.c.Input().Endpoints {
			if e.Pod.Name == p.Name && e.Pod.Namespace == p.Namespace {
				return true
			}
		}
		return false
	}
	eventually(t, "the release to reach the controller", func() bool { return !endpoint() })
	r.c.ObserveBlock(allocated)
	r.c.hints.mu.Lock()
	_, kept := r.c.hints.m[allocated.Name]
	r.c.hints.mu.Unlock()
	if kept {
		t.Errorf("a hint older than the informer's copy of %s was kept", allocated.Name)
	}
	if endpoint() {
		t.Errorf("a hint older than the release (resourceVersion %s) put %s back", allocated.ResourceVersion, ip)
	}
}

// TestInformerHas: a hint of a block version the informer has already (or
// has seen past) changes no sync, so ObserveBlock triggers none.
func TestInformerHas(t *testing.T) {
	for _, tc := range []struct {
		name       string
		hint       *tabbyv1.IPAMBlock
		held       *tabbyv1.IPAMBlock
		lastSynced string
		want       bool
	}{
		{"the informer holds the very version", hintBlock("a", "9", 0), hintBlock("a", "9", 0), "9", true},
		{"the informer holds a later version", hintBlock("a", "9", 0), hintBlock("a", "12"), "12", true},
		{"the informer holds an older version", hintBlock("a", "9", 0), hintBlock("a", "5"), "8", false},
		{"the informer's copy has no numeric version", hintBlock("a", "9", 0), hintBlock("a", ""), "8", false},
		{"a new block the informer has not seen", hintBlock("new", "9", 0), nil, "7", false},
		{"a block the informer saw past and does not hold", hintBlock("gone", "9", 0), nil, "10", true},
		{"an informer that has seen nothing", hintBlock("a", "9", 0), nil, "", false},
		{"a hint without a numeric version", hintBlock("a", "", 0), hintBlock("a", "12"), "12", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := informerHas(tc.hint, tc.held, tc.lastSynced); got != tc.want {
				t.Errorf("informerHas = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestAddressClaims: a claim shows the pod at its address while the block
// records the spare's handle there, never when the block records anything
// else (the transfer, or another holder after a release), and not once
// withdrawn; the blocks handed in are never modified.
func TestAddressClaims(t *testing.T) {
	spare := tabbyv1.AllocationAttribute{HandleID: "_spare.n1.a", Use: tabbyv1.UseWorkload, Node: "n1"}
	pod := tabbyv1.AllocationAttribute{HandleID: "net.c1", Use: tabbyv1.UseWorkload, Namespace: "ns", Pod: "p", Node: "n1"}
	other := tabbyv1.AllocationAttribute{HandleID: "net.c2", Use: tabbyv1.UseWorkload, Namespace: "ns", Pod: "q", Node: "n1"}
	block := func(holder *tabbyv1.AllocationAttribute) *tabbyv1.IPAMBlock {
		b := &tabbyv1.IPAMBlock{ObjectMeta: metav1.ObjectMeta{Name: "10-0-0-0-30", ResourceVersion: "5"},
			Spec: tabbyv1.IPAMBlockSpec{CIDR: "10.0.0.0/30", Allocations: []int{-1, -1, -1, -1}}}
		if holder != nil {
			b.Spec.Attributes = []tabbyv1.AllocationAttribute{*holder}
			b.Spec.Allocations[2] = 0
		}
		return b
	}
	claim := ipam.AddressClaim{Block: "10-0-0-0-30", Ord: 2, Holder: spare.HandleID, Attr: pod}
	podAt := func(bs []*tabbyv1.IPAMBlock) map[string]string {
		out := map[string]string{}
		for _, b := range bs {
			forEachPodAllocation(b, func(a netip.Addr, at *tabbyv1.AllocationAttribute) { out[a.String()] = at.Namespace + "/" + at.Pod })
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		holder *tabbyv1.AllocationAttribute
		forget bool
		want   map[string]string
	}{
		{"the block still records the spare", &spare, false, map[string]string{"10.0.0.2": "ns/p"}},
		{"the block records the transfer", &pod, false, map[string]string{"10.0.0.2": "ns/p"}},
		{"another pod holds the address now", &other, false, map[string]string{"10.0.0.2": "ns/q"}},
		{"the address is free", nil, false, map[string]string{}},
		{"withdrawn", &spare, true, map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c addressClaims
			c.add([]ipam.AddressClaim{claim})
			if tc.forget {
				c.remove([]ipam.AddressClaim{{Block: claim.Block, Ord: 2, Holder: spare.HandleID, Attr: other}}) // another pod's: no effect
				c.remove([]ipam.AddressClaim{claim})
			}
			b := block(tc.holder)
			orig := b.DeepCopy()
			got := podAt(c.apply([]*tabbyv1.IPAMBlock{b}))
			if !maps.Equal(got, tc.want) {
				t.Errorf("pods by address %v, want %v", got, tc.want)
			}
			if !reflect.DeepEqual(b, orig) {
				t.Error("apply modified the block it was given")
			}
		})
	}
}
