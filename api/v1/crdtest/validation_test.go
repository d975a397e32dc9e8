package crdtest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
)

var dryRun = metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

func newPool(name, cidr string, blockSize int) *tabbyv1.IPPool {
	return &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: tabbyv1.IPPoolSpec{CIDR: cidr, BlockSize: blockSize}}
}

// fieldErrors are the Go validation's messages for an object, one per
// problem, in the API server's format.
func fieldErrors(t *testing.T, err error) []string {
	t.Helper()
	var ve *tabbyv1.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("Go validation gave %v, want a *ValidationError", err)
	}
	var out []string
	for _, e := range ve.Errors {
		out = append(out, e.Error())
	}
	return out
}

// TestInvalidIPPools: the API server refuses invalid pools with the same
// messages as IPPool.Validate, and accepts the pools it accepts.
func TestInvalidIPPools(t *testing.T) {
	ds := clustertest.Client(t)
	ctx := ctxT(t, time.Minute)
	with := func(p *tabbyv1.IPPool, f func(*tabbyv1.IPPoolSpec)) *tabbyv1.IPPool { f(&p.Spec); return p }
	for _, tc := range []struct {
		name string
		pool *tabbyv1.IPPool
		want []string // what the server's message must say (besides Validate's messages)
	}{
		{"bad cidr", newPool("p", "10.244.0.0", 0), []string{`spec.cidr: Invalid value: "10.244.0.0": cidr must be a network in CIDR notation, such as 10.244.0.0/16 or fd00:10:244::/56`}},
		{"garbage cidr", newPool("p", "pods", 0), []string{"cidr must be a network in CIDR notation"}},
		{"v4-mapped cidr", newPool("p", "::ffff:10.0.0.0/104", 0), []string{"cidr must be a network in CIDR notation"}},
		{"host bits", newPool("p", "10.244.1.0/16", 0), []string{`spec.cidr: Invalid value: "10.244.1.0/16": cidr 10.244.1.0/16 has host bits set: write the network address, 10.244.0.0/16`}},
		{"v6 host bits", newPool("p", "fd00:10:244::1/56", 0), []string{"cidr fd00:10:244::1/56 has host bits set: write the network address, fd00:10:244::/56"}},
		{"blockSize 19", newPool("p", "10.0.0.0/8", 19), []string{"blockSize 19 is out of range for an IPv4 pool: use 20 to 32 (the default is 26)"}},
		{"blockSize 33", newPool("p", "10.0.0.0/8", 33), []string{"blockSize 33 is out of range for an IPv4 pool"}},
		{"v6 blockSize 26", newPool("p", "fd00::/48", 26), []string{"blockSize 26 is out of range for an IPv6 pool: use 116 to 128 (the default is 122)"}},
		{"v6 blockSize 129", newPool("p", "fd00::/48", 129), []string{"blockSize 129 is out of range for an IPv6 pool"}},
		{"block bigger than the pool", newPool("p", "10.0.0.0/28", 27), []string{"blockSize 27 is smaller than the prefix length of cidr 10.0.0.0/28, so one block would not fit in the pool: set blockSize to at least 28, or use a larger cidr"}},
		{"default block bigger than the pool", newPool("p", "10.0.0.0/28", 0), []string{"the default blockSize 26 is smaller than the prefix length of cidr 10.0.0.0/28"}},
		{"default v6 block bigger than the pool", newPool("p", "fd00::/124", 0), []string{"the default blockSize 122 is smaller than the prefix length of cidr fd00::/124"}},
		{"ipip and vxlan", with(newPool("p", "10.0.0.0/16", 0), func(s *tabbyv1.IPPoolSpec) {
			s.IPIPMode, s.VXLANMode = tabbyv1.EncapAlways, tabbyv1.EncapCrossSubnet
		}), []string{`spec: Invalid value: ipipMode and vxlanMode cannot both be enabled on one pool: set one of them to Never`}},
		{"bad encap", with(newPool("p", "10.0.0.0/16", 0), func(s *tabbyv1.IPPoolSpec) { s.IPIPMode = "always" }),
			[]string{`spec.ipipMode: Unsupported value: "always": supported values: "Never", "Always", "CrossSubnet"`}},
		{"bad use", with(newPool("p", "10.0.0.0/16", 0), func(s *tabbyv1.IPPoolSpec) {
			s.AllowedUses = []tabbyv1.IPPoolAllowedUse{"Pods"}
		}), []string{`spec.allowedUses[0]: Unsupported value: "Pods"`}},
		{"duplicate use", with(newPool("p", "10.0.0.0/16", 0), func(s *tabbyv1.IPPoolSpec) {
			s.AllowedUses = []tabbyv1.IPPoolAllowedUse{tabbyv1.UseTunnel, tabbyv1.UseTunnel}
		}), []string{`spec.allowedUses[1]: Duplicate value: "Tunnel"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ds.IPPools.Create(ctx, tc.pool, dryRun)
			if err == nil {
				t.Fatalf("the API server accepted %+v", tc.pool.Spec)
			}
			if !apierrors.IsInvalid(err) {
				t.Errorf("error %v is not Invalid (422)", err)
			}
			msg := err.Error()
			t.Logf("server: %s", msg)
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("the server's message lacks %q", w)
				}
			}
			verr := tc.pool.Validate()
			if verr == nil {
				t.Fatalf("IPPool.Validate accepts what the API server refuses")
			}
			for _, w := range fieldErrors(t, verr) {
				if !strings.Contains(msg, w) {
					t.Errorf("the server does not say what Validate says: %q", w)
				}
			}
		})
	}
}

// TestIPPoolValidationAgrees: for many pools, the API server and
// IPPool.Validate agree on which are valid.
func TestIPPoolValidationAgrees(t *testing.T) {
	ds := clustertest.Client(t)
	ctx := ctxT(t, 2*time.Minute)
	cidrs := []string{"10.0.0.0/8", "10.0.0.0/20", "10.0.0.0/26", "10.0.0.0/27", "10.0.0.0/32", "10.0.0.1/32", "0.0.0.0/0",
		"fd00::/48", "fd00::/116", "fd00::/122", "fd00::/123", "fd00::/128", "::/0", "10.0.0.0/33", "fd00::/129", "1.2.3.4"}
	sizes := []int{0, 19, 20, 26, 27, 32, 33, 115, 116, 122, 128, 129}
	n := 0
	for _, c := range cidrs {
		for _, bs := range sizes {
			p := newPool("agree", c, bs)
			_, serr := ds.IPPools.Create(ctx, p, dryRun)
			verr := p.Validate()
			if serr != nil && !apierrors.IsInvalid(serr) {
				t.Fatalf("%s/%d: %v", c, bs, serr)
			}
			if (serr == nil) != (verr == nil) {
				t.Errorf("cidr %s blockSize %d: server says %v, Validate says %v", c, bs, serr, verr)
			}
			n++
		}
	}
	t.Logf("%d pools checked", n)
}

func TestInvalidOtherKinds(t *testing.T) {
	ds := clustertest.Client(t)
	ctx := ctxT(t, time.Minute)
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "a"}}

	t.Run("IPAMConfiguration not named default", func(t *testing.T) {
		c := &tabbyv1.IPAMConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "cluster"}}
		_, err := ds.IPAMConfigurations.Create(ctx, c, dryRun)
		// The rule is on the whole object, so the server names no field
		// ("<nil>: Invalid value: ..."); Validate says metadata.name.
		wantRefused(t, err, "Invalid value: "+tabbyv1.MsgIPAMConfigurationName)
		if verr := c.Validate(); verr == nil || !strings.Contains(verr.Error(), `metadata.name: Invalid value: "cluster": `+tabbyv1.MsgIPAMConfigurationName) {
			t.Errorf("Validate: %v", verr)
		}
		c.Name = "default"
		if _, err := ds.IPAMConfigurations.Create(ctx, c, dryRun); err != nil {
			t.Errorf("IPAMConfiguration default: %v", err)
		}
	})
	peer := func(s tabbyv1.BGPPeerSpec) *tabbyv1.BGPPeer {
		return &tabbyv1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: "peer"}, Spec: s}
	}
	for _, tc := range []struct {
		name string
		peer *tabbyv1.BGPPeer
		want string
	}{
		{"node and nodeSelector", peer(tabbyv1.BGPPeerSpec{Node: "n1", NodeSelector: sel, PeerIP: "192.0.2.1", ASNumber: 64600}),
			`spec: Invalid value: set node or nodeSelector, not both`},
		{"neither peerIP nor peerSelector", peer(tabbyv1.BGPPeerSpec{Node: "n1", ASNumber: 64600}),
			`spec: Invalid value: set exactly one of peerIP (with asNumber) and peerSelector`},
		{"both peerIP and peerSelector", peer(tabbyv1.BGPPeerSpec{PeerIP: "192.0.2.1", ASNumber: 64600, PeerSelector: sel}),
			"set exactly one of peerIP (with asNumber) and peerSelector"},
		{"peerIP without asNumber", peer(tabbyv1.BGPPeerSpec{PeerIP: "192.0.2.1"}),
			"a peer given by peerIP needs its asNumber"},
		{"peerIP with a bad port", peer(tabbyv1.BGPPeerSpec{PeerIP: "192.0.2.1:65536", ASNumber: 64600}),
			`spec.peerIP: Invalid value: "192.0.2.1:65536": peerIP must be an IP address, IPv4:port or [IPv6]:port, with a port from 1 to 65535`},
		{"bad sourceAddress", peer(tabbyv1.BGPPeerSpec{PeerIP: "192.0.2.1", ASNumber: 64600, SourceAddress: "Auto"}),
			`spec.sourceAddress: Unsupported value: "Auto": supported values: "UseNodeIP", "None"`},
	} {
		t.Run("BGPPeer "+tc.name, func(t *testing.T) {
			_, err := ds.BGPPeers.Create(ctx, tc.peer, dryRun)
			wantRefused(t, err, tc.want)
			verr := tc.peer.Validate()
			if verr == nil {
				t.Fatalf("BGPPeer.Validate accepts it")
			}
			for _, w := range fieldErrors(t, verr) {
				wantRefused(t, err, w)
			}
		})
	}
	t.Run("BGPConfiguration cluster ID", func(t *testing.T) {
		c := &tabbyv1.BGPConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: tabbyv1.BGPConfigurationSpec{
			RouteReflectorClusterID: "fd00::1", ServiceClusterIPs: []tabbyv1.ServiceIPBlock{{CIDR: "10.96.0.0"}},
		}}
		_, err := ds.BGPConfigurations.Create(ctx, c, dryRun)
		for _, w := range fieldErrors(t, c.Validate()) {
			wantRefused(t, err, w)
		}
	})
}

// TestPeerIPValidationAgrees: the CEL rule on peerIP and ParsePeerIP accept
// the same strings.
func TestPeerIPValidationAgrees(t *testing.T) {
	ds := clustertest.Client(t)
	ctx := ctxT(t, time.Minute)
	for _, s := range []string{
		"10.0.0.1", "10.0.0.1:179", "10.0.0.1:65535", "10.0.0.1:00179", "fd00::1", "fd00::1:179", "[fd00::1]:179",
		"[64:ff9b::10.0.0.1]:179", "10.0.0.1:0", "10.0.0.1:65536", "10.0.0.1:99999", "10.0.0.1:123456", "10.0.0.1:",
		"10.0.0.1:bgp", "10.0.0.1:+179", "10.0.0.1:179:179", "[10.0.0.1]:179", "[fd00::1]", "[fd00::1]:", "[]:179",
		"fd00::1]:179", "[fd00::1]:179]:180", "fe80::1%eth0", "::ffff:10.0.0.1", "[::ffff:10.0.0.1]:179",
		"router.example", ":179", "010.0.0.1", "10.0.0.1:1_79",
	} {
		p := &tabbyv1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: "peer"}, Spec: tabbyv1.BGPPeerSpec{PeerIP: s, ASNumber: 64600}}
		_, serr := ds.BGPPeers.Create(ctx, p, dryRun)
		_, _, gerr := tabbyv1.ParsePeerIP(s)
		if serr != nil && !apierrors.IsInvalid(serr) {
			t.Fatalf("%q: %v", s, serr)
		}
		if (serr == nil) != (gerr == nil) {
			t.Errorf("peerIP %q: server says %v, ParsePeerIP says %v", s, serr, gerr)
		}
	}
}

func wantRefused(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Errorf("accepted, want refused with %q", want)
		return
	}
	if !apierrors.IsInvalid(err) {
		t.Errorf("error %v is not Invalid (422)", err)
	}
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q lacks %q", err, want)
	}
}

// eventually retries f until ok says its answer is the one expected, for up
// to 15 s, and returns the last answer. The admission policies see other
// objects through the API server's informer cache, a few milliseconds
// behind the writes.
func eventually(t *testing.T, f func() error, ok func(error) bool) error {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := f()
		if ok(err) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func deniedBy(policy string) func(error) bool {
	return func(err error) bool {
		return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy+"'")
	}
}

func isNil(err error) bool { return err == nil }

func cleanupPools(t *testing.T, ds *datastore.Client, names ...string) {
	t.Cleanup(func() {
		for _, n := range names {
			_ = ds.IPPools.Delete(context.Background(), n, metav1.DeleteOptions{})
		}
	})
}

// TestOverlappingPools: a pool that overlaps another is refused, whichever
// contains the other, with a message naming the other pool and its CIDR;
// IPv4 and IPv6 pools never overlap.
func TestOverlappingPools(t *testing.T) {
	ds := clustertest.Client(t)
	ctx := ctxT(t, 2*time.Minute)
	cleanupPools(t, ds, "ov-a", "ov-inner", "ov-outer", "ov-v6", "ov-v6-inner", "ov-other", "ov-all4")
	mustCreate := func(p *tabbyv1.IPPool) {
		t.Helper()
		if _, err := ds.IPPools.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating %s (%s): %v", p.Name, p.Spec.CIDR, err)
		}
	}
	refused := func(p *tabbyv1.IPPool, want string) {
		t.Helper()
		// Wait until the policy sees every pool created so far (dry run),
		// then the real request must be refused.
		eventually(t, func() error { _, err := ds.IPPools.Create(ctx, p, dryRun); return err }, deniedBy(controlplane.PolicyIPPoolOverlap))
		_, err := ds.IPPools.Create(ctx, p, metav1.CreateOptions{})
		wantRefused(t, err, want)
		if err != nil && !strings.Contains(err.Error(), "'"+controlplane.PolicyIPPoolOverlap+"'") {
			t.Errorf("refused, but not by %s: %v", controlplane.PolicyIPPoolOverlap, err)
		}
	}

	mustCreate(newPool("ov-a", "10.1.0.0/16", 0))
	// A pool inside the existing one, and one containing it.
	refused(newPool("ov-inner", "10.1.2.0/24", 0),
		"cidr 10.1.2.0/24 overlaps IPPool ov-a (10.1.0.0/16): pools must not overlap, choose a cidr outside 10.1.0.0/16 or change or delete IPPool ov-a")
	refused(newPool("ov-outer", "10.0.0.0/8", 0), "cidr 10.0.0.0/8 overlaps IPPool ov-a (10.1.0.0/16)")
	refused(newPool("ov-same", "10.1.0.0/16", 0), "cidr 10.1.0.0/16 overlaps IPPool ov-a (10.1.0.0/16)")
	// IPv6 pools never overlap IPv4 ones, even ::/0 and 0.0.0.0/0.
	mustCreate(newPool("ov-v6", "::/0", 122))
	mustCreate(newPool("ov-other", "10.2.0.0/16", 0))
	refused(newPool("ov-v6-inner", "fd00::/48", 0), "cidr fd00::/48 overlaps IPPool ov-v6 (::/0)")
	refused(newPool("ov-all4", "0.0.0.0/0", 0), "cidr 0.0.0.0/0 overlaps IPPool ov-")
	if _, err := ds.IPPools.Create(ctx, newPool("ov-all4", "0.0.0.0/0", 0), dryRun); err != nil {
		t.Logf("a pool overlapping two: %v", err)
	}

	// Changing a pool's cidr onto another pool is refused too; other changes
	// of a pool are not checked against the others.
	err := eventually(t, func() error {
		cur, err := ds.IPPools.Get(ctx, "ov-other", metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Spec.CIDR = "10.1.128.0/17"
		_, err = ds.IPPools.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	}, deniedBy(controlplane.PolicyIPPoolOverlap))
	wantRefused(t, err, "cidr 10.1.128.0/17 overlaps IPPool ov-a (10.1.0.0/16)")
	cur, err := ds.IPPools.Get(ctx, "ov-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Disabled = true
	if _, err := ds.IPPools.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Errorf("disabling a pool: %v", err)
	}
	// Deleting the v6 pool frees its range.
	if err := ds.IPPools.Delete(ctx, "ov-v6", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := eventually(t, func() error {
		_, err := ds.IPPools.Create(ctx, newPool("ov-v6-inner", "fd00::/48", 0), metav1.CreateOptions{})
		return err
	}, isNil); err != nil {
		t.Errorf("a v6 pool after the overlapping one was deleted: %v", err)
	}
}

func newBlock(name, cidr string) *tabbyv1.IPAMBlock {
	return &tabbyv1.IPAMBlock{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: tabbyv1.IPAMBlockSpec{
		CIDR: cidr, Allocations: []int{-1, -1, -1, -1}, Unallocated: []int{0, 1, 2, 3},
	}}
}

// TestPoolLayoutFixedWhileBlocksExist: blockSize and cidr of a pool cannot
// change while a block lies in it; they can when it has none.
func TestPoolLayoutFixedWhileBlocksExist(t *testing.T) {
	ds := clustertest.Client(t)
	ctx := ctxT(t, 2*time.Minute)
	cleanupPools(t, ds, "lay-4", "lay-6", "lay-other")
	t.Cleanup(func() {
		for _, b := range []string{"lay-block-4", "lay-block-6"} {
			_ = ds.IPAMBlocks.Delete(context.Background(), b, metav1.DeleteOptions{})
		}
	})
	update := func(name string, f func(*tabbyv1.IPPoolSpec)) func() error {
		return func() error {
			cur, err := ds.IPPools.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			f(&cur.Spec)
			_, err = ds.IPPools.Update(ctx, cur, metav1.UpdateOptions{})
			return err
		}
	}
	for _, p := range []*tabbyv1.IPPool{newPool("lay-4", "10.50.0.0/16", 0), newPool("lay-6", "fd00:50::/64", 0), newPool("lay-other", "10.60.0.0/16", 0)} {
		if _, err := ds.IPPools.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// No blocks: blockSize and cidr may change.
	if err := update("lay-4", func(s *tabbyv1.IPPoolSpec) { s.BlockSize = 24 })(); err != nil {
		t.Errorf("changing blockSize of a pool without blocks: %v", err)
	}
	if err := update("lay-4", func(s *tabbyv1.IPPoolSpec) { s.BlockSize = 0; s.CIDR = "10.50.0.0/17" })(); err != nil {
		t.Errorf("changing cidr of a pool without blocks: %v", err)
	}
	if err := update("lay-4", func(s *tabbyv1.IPPoolSpec) { s.CIDR = "10.50.0.0/16" })(); err != nil {
		t.Fatal(err)
	}
	// A block in lay-4 and one in lay-6.
	if _, err := ds.IPAMBlocks.Create(ctx, newBlock("lay-block-4", "10.50.3.0/26"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ds.IPAMBlocks.Create(ctx, newBlock("lay-block-6", "fd00:50::40/122"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := eventually(t, update("lay-4", func(s *tabbyv1.IPPoolSpec) { s.BlockSize = 27 }), deniedBy(controlplane.PolicyIPPoolBlockSize))
	wantRefused(t, err, "IPPool lay-4 has blocks (such as IPAMBlock lay-block-4, 10.50.3.0/26), so its blockSize cannot change: delete the pool's blocks first (once no pod uses its addresses), or create a new pool with the new settings and disable this one")
	err = update("lay-4", func(s *tabbyv1.IPPoolSpec) { s.CIDR = "10.50.0.0/15" })()
	wantRefused(t, err, "IPPool lay-4 has blocks (such as IPAMBlock lay-block-4, 10.50.3.0/26), so its cidr cannot change")
	err = update("lay-4", func(s *tabbyv1.IPPoolSpec) { s.CIDR = "10.50.0.0/17" })()
	wantRefused(t, err, "so its cidr cannot change")
	// Writing out the default it already has is no change; other fields may change.
	if err := update("lay-4", func(s *tabbyv1.IPPoolSpec) { s.BlockSize = tabbyv1.DefaultBlockSizeV4; s.NATOutgoing = true })(); err != nil {
		t.Errorf("setting blockSize to its default, 26: %v", err)
	}
	if err := update("lay-4", func(s *tabbyv1.IPPoolSpec) { s.BlockSize = 0; s.Disabled = true })(); err != nil {
		t.Errorf("unsetting blockSize 26: %v", err)
	}
	// IPv6: default 122.
	err = update("lay-6", func(s *tabbyv1.IPPoolSpec) { s.BlockSize = 120 })()
	wantRefused(t, err, "IPPool lay-6 has blocks (such as IPAMBlock lay-block-6, fd00:50::40/122), so its blockSize cannot change")
	if err := update("lay-6", func(s *tabbyv1.IPPoolSpec) { s.BlockSize = tabbyv1.DefaultBlockSizeV6 })(); err != nil {
		t.Errorf("setting a v6 pool's blockSize to its default, 122: %v", err)
	}
	// A pool with no block of its own is free, whatever other pools have.
	if err := update("lay-other", func(s *tabbyv1.IPPoolSpec) { s.BlockSize = 28 })(); err != nil {
		t.Errorf("changing blockSize of a pool without blocks next to pools with blocks: %v", err)
	}
	// Once the block is gone, lay-4 may change again.
	if err := ds.IPAMBlocks.Delete(ctx, "lay-block-4", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := eventually(t, update("lay-4", func(s *tabbyv1.IPPoolSpec) { s.BlockSize = 27 }), isNil); err != nil {
		t.Errorf("changing blockSize after the pool's blocks were deleted: %v", err)
	}
}

// TestPoliciesTypeCheck: kube-controller-manager's
// validatingadmissionpolicy-status-controller (which the tests do not run
// otherwise) type-checks the policies' expressions against the CRD schemas
// without warnings.
func TestPoliciesTypeCheck(t *testing.T) {
	c := clustertest.Cluster(t)
	kc := filepath.Join(t.TempDir(), "kcm.kubeconfig")
	if err := c.WriteKubeconfig(kc, ""); err != nil {
		t.Fatal(err)
	}
	port, err := controlplane.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	kcm, err := c.StartProcess("kube-controller-manager", "--kubeconfig", kc, "--bind-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(port), "--leader-elect=false", "--controllers", "validatingadmissionpolicy-status-controller")
	if err != nil {
		t.Fatal(err)
	}
	defer kcm.Stop(5 * time.Second)
	cs, err := kubernetes.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, time.Minute)
	// A policy with a mistake (and no binding, so nothing enforces it)
	// shows that the type checker knows the CRDs' schemas: it must warn.
	probe := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "tabby-typecheck-probe"},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			ParamKind: &admissionv1.ParamKind{APIVersion: "tabby.io/v1", Kind: "IPAMBlock"},
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Update},
					Rule:       admissionv1.Rule{APIGroups: []string{"tabby.io"}, APIVersions: []string{"v1"}, Resources: []string{"ippools"}},
				},
			}}},
			Validations: []admissionv1.Validation{{Expression: "object.spec.blockSize == params.spec.cidrr"}},
		},
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, probe, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(context.Background(), probe.Name, metav1.DeleteOptions{})
	}()
	for _, name := range []string{probe.Name, controlplane.PolicyIPPoolOverlap, controlplane.PolicyIPPoolBlockSize} {
		var p *admissionv1.ValidatingAdmissionPolicy
		deadline := time.Now().Add(45 * time.Second)
		for {
			p, err = cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if p.Status.TypeChecking != nil && p.Status.ObservedGeneration == p.Generation {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s was not type-checked; the end of kube-controller-manager's log:\n%s", name, tail(kcm.LogPath))
			}
			time.Sleep(100 * time.Millisecond)
		}
		if name == probe.Name {
			w := p.Status.TypeChecking.ExpressionWarnings
			if len(w) != 1 || !strings.Contains(w[0].Warning, "cidrr") {
				t.Fatalf("a policy naming a field IPAMBlock lacks was type-checked with warnings %+v; want one about cidrr", w)
			}
			t.Logf("the probe's warning: %s", strings.Join(strings.Fields(w[0].Warning), " "))
			continue
		}
		if w := p.Status.TypeChecking.ExpressionWarnings; len(w) > 0 {
			t.Errorf("%s: type-checking warnings: %+v", name, w)
		} else {
			t.Logf("%s: type-checked without warnings", name)
		}
	}
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	l := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(l) > 20 {
		l = l[len(l)-20:]
	}
	return strings.Join(l, "\n")
}
