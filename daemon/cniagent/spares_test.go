package cniagent

import (
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/contract/agentapi"
	"github.com/tabbynet/tabby/ipam"
)

// claimsLog stands in for tabbyd's NetworkPolicy loop (PolicyWaiter): it
// programs nothing and keeps the claims it is told of.
type claimsLog struct {
	mu        sync.Mutex
	claims    map[string]ipam.AddressClaim // by the pod's handle
	forgotten []string
}

func (p *claimsLog) WaitProgrammed(context.Context, string, string, string, []netip.Addr) (uint64, error) {
	return 1, nil
}
func (p *claimsLog) ObserveBlock(*tabbyv1.IPAMBlock) {}
func (p *claimsLog) ObserveClaims(cl []ipam.AddressClaim) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.claims == nil {
		p.claims = map[string]ipam.AddressClaim{}
	}
	for _, c := range cl {
		p.claims[c.Attr.HandleID] = c
	}
}
func (p *claimsLog) ForgetClaims(cl []ipam.AddressClaim) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cl {
		delete(p.claims, c.Attr.HandleID)
		p.forgotten = append(p.forgotten, c.Attr.HandleID)
	}
}

func (p *claimsLog) claim(handle string) (ipam.AddressClaim, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.claims[handle]
	return c, ok
}

func (p *claimsLog) wasForgotten(handle string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Contains(p.forgotten, handle)
}

// sparesAgent makes an agent holding two spares whose transfers wait to be
// asked for (a release, a CHECK, the shutdown), in dir.
func sparesAgent(t *testing.T, w *world, dir string, pol PolicyWaiter, reg prometheus.Registerer, n int) *Agent {
	t.Helper()
	a, err := New(Config{Socket: filepath.Join(dir, "cni.sock"), NodeName: w.node, DS: w.ds, Registerer: reg, Policy: pol, Spares: n})
	if err != nil {
		t.Fatal(err)
	}
	a.writeDelay = time.Hour
	return a
}

// holderOf reads who holds ip in its block, from the API server.
func holderOf(t *testing.T, w *world, ip net.IP, block string) *tabbyv1.AllocationAttribute {
	t.Helper()
	pfx := netip.MustParsePrefix(block)
	b, err := w.ds.IPAMBlocks.Get(context.Background(), ipam.BlockName(pfx), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := netip.AddrFromSlice(ip)
	ord := int(a.Unmap().As4()[3] - pfx.Addr().As4()[3])
	if idx := b.Spec.Allocations[ord]; idx >= 0 {
		at := b.Spec.Attributes[idx]
		return &at
	}
	return nil
}

func journalHandles(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile(JournalPath(filepath.Join(dir, "cni.sock")))
	if err != nil {
		t.Fatal(err)
	}
	var j journal
	if err := json.Unmarshal(data, &j); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, h := range j.Handovers {
		out = append(out, h.Handle)
	}
	return out
}

func nodeSpares(t *testing.T, w *world) []ipam.Spare {
	t.Helper()
	s, err := ipam.New(w.ds).NodeSpares(context.Background(), w.node, true)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func spareIPs(ss []ipam.Spare) []string {
	var out []string
	for _, s := range ss {
		for _, a := range s.Addresses {
			out = append(out, a.IP.String())
		}
	}
	slices.Sort(out)
	return out
}

// TestSpares: after the first ADD the agent holds two addresses ahead; the
// next ADD is answered from one, journaled and claimed for the policy loop
// before the answer, while its block still records the spare; a CHECK has
// the transfer written first (block, handle object, journal, claim); a DEL
// before the transfer puts the address back among the spares without
// writing the pod's handle.
func TestSpares(t *testing.T) {
	w := newWorld(t)
	ctx := testCtx(t)
	dir := filepath.Join(t.TempDir(), "run")
	pol := &claimsLog{}
	a, cl := serve(t, sparesAgent(t, w, dir, pol, prometheus.NewRegistry(), 2))

	if _, err := cl.Assign(ctx, agentapi.AssignRequest{HandleID: "spr.c1", Node: w.node, IPv4: true}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "two spares held after the first ADD", func() bool { return len(nodeSpares(t, w)) == 2 })
	held := spareIPs(nodeSpares(t, w))

	p := w.pod(t, "spare-pod", w.node, nil)
	addrs, err := cl.Assign(ctx, agentapi.AssignRequest{HandleID: "spr.c2", Node: w.node, Namespace: "default", Pod: "spare-pod", PodUID: string(p.UID), IPv4: true})
	if err != nil || len(addrs) != 1 || !slices.Contains(held, addrs[0].IP.String()) || addrs[0].Pool != w.pool.Name || addrs[0].Block == "" {
		t.Fatalf("assign: %+v, %v; want one of the spares %v", addrs, err, held)
	}
	ip := addrs[0].IP
	if got := journalHandles(t, dir); !slices.Equal(got, []string{"spr.c2"}) {
		t.Errorf("journal %v, want the handover of net.c2", got)
	}
	c, ok := pol.claim("spr.c2")
	if h := holderOf(t, w, ip, addrs[0].Block); !ok || h == nil || c.Holder != h.HandleID || !ipam.IsSpareHandle(h.HandleID) ||
		c.Attr.Pod != "spare-pod" || c.Attr.Namespace != "default" || c.Block != ipam.BlockName(netip.MustParsePrefix(addrs[0].Block)) {
		t.Fatalf("claim %+v (%v) for a block that records %+v", c, ok, h)
	}

	// CHECK: the transfer first.
	if ips, err := cl.HandleIPs(ctx, "spr.c2", w.node); err != nil || len(ips) != 1 || !ips[0].Equal(ip) {
		t.Fatalf("handle-ips: %v, %v; want [%s]", ips, err, ip)
	}
	if h := holderOf(t, w, ip, addrs[0].Block); h == nil || h.HandleID != "spr.c2" || h.Pod != "spare-pod" || h.Node != w.node {
		t.Errorf("after the transfer the block records %+v", h)
	}
	if _, err := w.ds.IPAMHandles.Get(ctx, ipam.HandleObjectName("spr.c2"), metav1.GetOptions{}); err != nil {
		t.Errorf("the pod's handle object: %v", err)
	}
	if got := journalHandles(t, dir); len(got) != 0 {
		t.Errorf("journal %v after the transfer, want none", got)
	}
	if _, ok := pol.claim("spr.c2"); ok || !pol.wasForgotten("spr.c2") {
		t.Error("the claim outlived the transfer")
	}

	// DEL before the transfer: back among the spares.
	eventually(t, "two spares again", func() bool { return len(nodeSpares(t, w)) == 2 })
	addrs, err = cl.Assign(ctx, agentapi.AssignRequest{HandleID: "spr.c3", Node: w.node, IPv4: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.ReleaseHandle(ctx, "spr.c3", w.node); err != nil {
		t.Fatal(err)
	}
	if got := spareIPs(nodeSpares(t, w)); !slices.Contains(got, addrs[0].IP.String()) {
		t.Errorf("spares %v after the DEL, want %s among them", got, addrs[0].IP)
	}
	if _, err := w.ds.IPAMHandles.Get(ctx, ipam.HandleObjectName("spr.c3"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the deleted pod's handle object: %v, want NotFound", err)
	}
	if ips, err := cl.HandleIPs(ctx, "spr.c3", w.node); err != nil || len(ips) != 0 {
		t.Errorf("handle-ips of the deleted pod: %v, %v", ips, err)
	}
	if got := journalHandles(t, dir); len(got) != 0 || !pol.wasForgotten("spr.c3") {
		t.Errorf("journal %v after the DEL, claim forgotten %v", got, pol.wasForgotten("spr.c3"))
	}
	// The returned address is handed out again.
	addrs2, err := cl.Assign(ctx, agentapi.AssignRequest{HandleID: "spr.c4", Node: w.node, IPv4: true})
	if err != nil {
		t.Fatal(err)
	}
	if !addrs2[0].IP.Equal(addrs[0].IP) && !slices.Contains(spareIPs(nodeSpares(t, w)), addrs[0].IP.String()) {
		t.Errorf("the returned spare %s is neither handed out again (%s) nor held", addrs[0].IP, addrs2[0].IP)
	}
	if err := cl.ReleaseHandle(ctx, "spr.c4", w.node); err != nil {
		t.Fatal(err)
	}

	counts := map[string]float64{}
	for _, e := range []string{"handed", "transferred", "returned", "missed", "assigned"} {
		counts[e] = testutil.ToFloat64(a.met.spares.WithLabelValues(e))
	}
	if counts["handed"] != 3 || counts["transferred"] != 1 || counts["returned"] != 2 || counts["missed"] != 1 || counts["assigned"] < 2 {
		t.Errorf("spare counts %v", counts)
	}
}

// crashedHandle is the handle of the pod crashed journals.
func crashedHandle(w *world) string { return "crashed." + w.node }

// crashed leaves what a tabbyd that died between an answer and its
// transfer leaves: two spares in the node's block, the first handed to pod
// default/p in the journal (when journal is set).
func crashed(t *testing.T, w *world, dir string, journal bool) (handed, free ipam.Spare) {
	t.Helper()
	ctx := testCtx(t)
	m := ipam.New(w.ds)
	var err error
	if handed, err = m.AssignSpare(ctx, w.node, ipam.SpareHandle(w.node, "one"), true, false); err != nil {
		t.Fatal(err)
	}
	if free, err = m.AssignSpare(ctx, w.node, ipam.SpareHandle(w.node, "two"), true, false); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if !journal {
		return handed, free
	}
	a := handed.Addresses[0]
	data, _ := json.Marshal(map[string]any{"node": w.node, "handovers": []any{map[string]any{
		"spare": handed.Handle, "handle": crashedHandle(w), "namespace": "default", "pod": "p",
		"addresses": []any{map[string]string{"ip": a.IP.String(), "block": a.Block.String()}}}}})
	if err := os.WriteFile(JournalPath(filepath.Join(dir, "cni.sock")), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return handed, free
}

// TestSparesRecovery: a restarted agent transfers the journal's handover
// before it serves (claiming it for the policy loop meanwhile), and holds
// the other spare again: the next ADD gets it.
func TestSparesRecovery(t *testing.T) {
	w := newWorld(t)
	ctx := testCtx(t)
	dir := filepath.Join(t.TempDir(), "run")
	handed, free := crashed(t, w, dir, true)
	pol := &claimsLog{}
	_, cl := serve(t, sparesAgent(t, w, dir, pol, nil, 2))

	a := handed.Addresses[0]
	eventually(t, "the handover transferred", func() bool {
		h := holderOf(t, w, a.IP, a.Block.String())
		return h != nil && h.HandleID == crashedHandle(w) && h.Pod == "p" && h.Namespace == "default"
	})
	eventually(t, "the journal emptied", func() bool { return len(journalHandles(t, dir)) == 0 })
	if _, err := w.ds.IPAMHandles.Get(ctx, ipam.HandleObjectName(crashedHandle(w)), metav1.GetOptions{}); err != nil {
		t.Errorf("the handle object of the handover: %v", err)
	}
	if !pol.wasForgotten(crashedHandle(w)) {
		t.Error("the handover was not claimed for the policy loop")
	}
	addrs, err := cl.Assign(ctx, agentapi.AssignRequest{HandleID: "recov.next", Node: w.node, IPv4: true})
	if err != nil || len(addrs) != 1 || !addrs[0].IP.Equal(free.Addresses[0].IP) {
		t.Errorf("the next ADD got %+v, %v; want the spare held again, %s", addrs, err, free.Addresses[0].IP)
	}
}

// TestSparesUnreadableJournal: with a journal it cannot read, the agent
// neither hands out nor releases the spares it finds (any may be a pod's),
// and keeps the journal aside.
func TestSparesUnreadableJournal(t *testing.T) {
	w := newWorld(t)
	ctx := testCtx(t)
	dir := filepath.Join(t.TempDir(), "run")
	handed, free := crashed(t, w, dir, false)
	if err := os.WriteFile(JournalPath(filepath.Join(dir, "cni.sock")), []byte(`{"node": "`+w.node+`", "handovers": [{"spare"`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, cl := serve(t, sparesAgent(t, w, dir, &claimsLog{}, nil, 2))
	addrs, err := cl.Assign(ctx, agentapi.AssignRequest{HandleID: "unread.next", Node: w.node, IPv4: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []ipam.Spare{handed, free} {
		if addrs[0].IP.Equal(s.Addresses[0].IP) {
			t.Errorf("the ADD got %s, a spare that may be a pod's", addrs[0].IP)
		}
		if h := holderOf(t, w, s.Addresses[0].IP, s.Addresses[0].Block.String()); h == nil || h.HandleID != s.Handle {
			t.Errorf("spare %s now held by %+v", s.Handle, h)
		}
	}
	if _, err := os.Stat(JournalPath(filepath.Join(dir, "cni.sock")) + ".unreadable"); err != nil {
		t.Errorf("the unreadable journal was not kept aside: %v", err)
	}
}

// TestSparesOff: an agent that holds none releases the spares an earlier
// run held, and still transfers the handovers it journaled.
func TestSparesOff(t *testing.T) {
	w := newWorld(t)
	dir := filepath.Join(t.TempDir(), "run")
	handed, _ := crashed(t, w, dir, true)
	serve(t, sparesAgent(t, w, dir, &claimsLog{}, nil, 0))
	eventually(t, "the spares released", func() bool { return len(nodeSpares(t, w)) == 0 })
	a := handed.Addresses[0]
	if h := holderOf(t, w, a.IP, a.Block.String()); h == nil || h.HandleID != crashedHandle(w) {
		t.Errorf("the handover's address is held by %+v, want %s", h, crashedHandle(w))
	}
}

// TestSparesExhausted: when the pools are full, an ADD that finds no
// address has the spares released and tries again.
func TestSparesExhausted(t *testing.T) {
	w := newWorldOf(t, "10.81.%d.0/30", 30) // one block of four addresses
	ctx := testCtx(t)
	_, cl := serve(t, sparesAgent(t, w, filepath.Join(t.TempDir(), "run"), nil, nil, 2))
	if _, err := cl.Assign(ctx, agentapi.AssignRequest{HandleID: "spr.c1", Node: w.node, IPv4: true}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "two spares", func() bool { return len(nodeSpares(t, w)) == 2 })
	named := []string{w.pool.Name} // not answered from a spare
	for _, h := range []string{"spr.c2", "spr.c3"} {
		if _, err := cl.Assign(ctx, agentapi.AssignRequest{HandleID: h, Node: w.node, IPv4: true, IPv4Pools: named}); err != nil {
			t.Fatalf("%s: %v", h, err)
		}
	}
	if got := nodeSpares(t, w); len(got) != 0 {
		t.Errorf("spares %v left in a full pool", spareIPs(got))
	}
	if _, err := cl.Assign(ctx, agentapi.AssignRequest{HandleID: "spr.c4", Node: w.node, IPv4: true}); err != nil {
		t.Fatalf("the last address: %v", err)
	}
	_, err := cl.Assign(ctx, agentapi.AssignRequest{HandleID: "exh.c5", Node: w.node, IPv4: true})
	if err == nil || !strings.Contains(err.Error(), "no IPv4 address") {
		t.Errorf("an ADD in a full pool: %v", err)
	}
}
