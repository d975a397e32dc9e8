package ipam

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
)

func TestBlockName(t *testing.T) {
	for _, tc := range []struct{ cidr, want string }{
		{"10.244.0.64/26", "10-244-0-64-26"},
		{"10.0.0.0/32", "10-0-0-0-32"},
		{"fd00::40/122", "fd00-0-0-0-0-0-0-40-122"},
		{"::/122", "0-0-0-0-0-0-0-0-122"},
	} {
		got := BlockName(netip.MustParsePrefix(tc.cidr))
		if got != tc.want {
			t.Errorf("BlockName(%s) = %s, want %s", tc.cidr, got, tc.want)
		}
		if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
			t.Errorf("BlockName(%s) = %s is not a valid object name: %v", tc.cidr, got, errs)
		}
	}
}

func TestObjectNames(t *testing.T) {
	for _, in := range []string{
		"k8s-pod-network.0123abcd", "K8S_Network.ABC", "ipip-tunnel-addr-node1",
		strings.Repeat("x", 400), "..--", "net.ctr/with:odd chars",
	} {
		got := HandleObjectName(in)
		if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
			t.Errorf("HandleObjectName(%q) = %q is invalid: %v", in, got, errs)
		}
	}
	if HandleObjectName("K8S.a") == HandleObjectName("k8s.a") {
		t.Error("handle IDs that differ only in case must not share an object")
	}
	if got := HandleObjectName("k8s-pod-network.abc"); got != "k8s-pod-network.abc" {
		t.Errorf("a valid handle ID should be its own name, got %q", got)
	}
	long := strings.Repeat("n", 100)
	if v := NodeLabelValue(long); len(validation.IsValidLabelValue(v)) > 0 {
		t.Errorf("NodeLabelValue of a long name is not a label value: %q", v)
	}
	if NodeLabelValue("node1") != "node1" {
		t.Error("short node names are their own label value")
	}
}

func TestAllocateRelease(t *testing.T) {
	p := netip.MustParsePrefix("10.0.0.0/29")
	b := newBlock(p, "pool", "n1")
	if freeCount(b) != 8 || b.Spec.Affinity != "host:n1" || b.Labels[tabbyv1.LabelNode] != "n1" {
		t.Fatalf("new block: %+v", b)
	}
	a1 := tabbyv1.AllocationAttribute{HandleID: "h1", Node: "n1"}
	a2 := tabbyv1.AllocationAttribute{HandleID: "h2", Node: "n1"}
	o1, _ := allocate(b, a1)
	o2, _ := allocate(b, a2)
	o3, _ := allocate(b, a1)
	if o1 != 0 || o2 != 1 || o3 != 2 {
		t.Fatalf("ordinals %d %d %d, want 0 1 2", o1, o2, o3)
	}
	if len(b.Spec.Attributes) != 2 {
		t.Fatalf("attributes shared per holder: got %d", len(b.Spec.Attributes))
	}
	s1, _ := sequenceOf(b, o1)
	s3, _ := sequenceOf(b, o3)
	if s1 != 1 || s3 != 3 || b.Spec.SequenceNumber != 3 {
		t.Fatalf("sequence numbers %d %d %d", s1, s3, b.Spec.SequenceNumber)
	}
	if n := releaseHandle(b, "h1"); n != 2 {
		t.Fatalf("released %d, want 2", n)
	}
	if attributeOf(b, o2).HandleID != "h2" || len(b.Spec.Attributes) != 1 {
		t.Fatalf("compaction broke the remaining holder: %+v", b.Spec)
	}
	// Released addresses go to the back: the next allocation is ordinal 3.
	o4, _ := allocate(b, a1)
	if o4 != 3 {
		t.Fatalf("reuse order: got %d, want 3", o4)
	}
	if !allocateOrdinal(b, 7, a2) || allocateOrdinal(b, 7, a1) {
		t.Fatal("allocateOrdinal must take a free ordinal once")
	}
	for range 10 {
		allocate(b, a1)
	}
	if freeCount(b) != 0 || inUse(b) != 8 {
		t.Fatalf("block should be full: free %d in use %d", freeCount(b), inUse(b))
	}
	if _, ok := allocate(b, a1); ok {
		t.Fatal("allocated from a full block")
	}
	// A corrupt free list never hands out a held address.
	b.Spec.Unallocated = []int{1}
	if _, ok := allocate(b, a1); ok {
		t.Fatal("allocated an address that is held")
	}
}

func TestOrdinals(t *testing.T) {
	for _, tc := range []struct {
		block, ip string
		ord       int
	}{
		{"10.0.1.0/24", "10.0.1.200", 200},
		{"10.0.16.0/20", "10.0.31.255", 4095},
		{"fd00::40/122", "fd00::7f", 63},
		{"fd00::1000/116", "fd00::1fff", 4095},
	} {
		p := netip.MustParsePrefix(tc.block)
		got, ok := ordinalOf(p, netip.MustParseAddr(tc.ip))
		if !ok || got != tc.ord {
			t.Errorf("ordinalOf(%s, %s) = %d %v, want %d", tc.block, tc.ip, got, ok, tc.ord)
		}
		if back := addrAt(p, tc.ord); back != netip.MustParseAddr(tc.ip) {
			t.Errorf("addrAt(%s, %d) = %s, want %s", tc.block, tc.ord, back, tc.ip)
		}
	}
	if _, ok := ordinalOf(netip.MustParsePrefix("10.0.0.0/26"), netip.MustParseAddr("10.0.0.64")); ok {
		t.Error("an address outside the block has no ordinal")
	}
}

func TestCarve(t *testing.T) {
	c := carve(netip.MustParsePrefix("10.244.0.0/16"), 26)
	if c.count.Int64() != 1024 {
		t.Fatalf("count %s", c.count)
	}
	used := map[netip.Prefix]bool{}
	seen := map[netip.Prefix]bool{}
	for range 1024 {
		f := c.freeBlocks("node-a", used, 1)
		if len(f) != 1 {
			t.Fatalf("no free block with %d used", len(used))
		}
		if seen[f[0]] || !netip.MustParsePrefix("10.244.0.0/16").Contains(f[0].Addr()) || f[0].Bits() != 26 {
			t.Fatalf("bad block %s", f[0])
		}
		seen[f[0]], used[f[0]] = true, true
	}
	if f := c.freeBlocks("node-a", used, 1); len(f) != 0 {
		t.Fatalf("a full pool yielded %v", f)
	}
	if c.startIndex("node-a").Cmp(c.startIndex("node-b")) == 0 {
		t.Error("two nodes start at the same block (unlucky hash?)")
	}
	// A huge IPv6 pool is never enumerated.
	c6 := carve(netip.MustParsePrefix("fd00:10::/48"), 122)
	f := c6.freeBlocks("n", nil, 3)
	if len(f) != 3 || f[0].Bits() != 122 || !netip.MustParsePrefix("fd00:10::/48").Contains(f[2].Addr()) {
		t.Fatalf("v6 blocks %v", f)
	}
	if got := c.blockFor(netip.MustParseAddr("10.244.3.77")); got != netip.MustParsePrefix("10.244.3.64/26") {
		t.Errorf("blockFor = %s", got)
	}
}

func pool4(name, cidr string, mut ...func(*tabbyv1.IPPool)) tabbyv1.IPPool {
	p := tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: tabbyv1.IPPoolSpec{CIDR: cidr}}
	for _, m := range mut {
		m(&p)
	}
	return p
}

func TestCandidates(t *testing.T) {
	zoneA := func(p *tabbyv1.IPPool) {
		p.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "a"}}
	}
	disabled := func(p *tabbyv1.IPPool) { p.Spec.Disabled = true }
	tunnelOnly := func(p *tabbyv1.IPPool) { p.Spec.AllowedUses = []tabbyv1.IPPoolAllowedUse{tabbyv1.UseTunnel} }
	set := newPoolSet([]tabbyv1.IPPool{
		pool4("default", "10.244.0.0/16"),
		pool4("zone-a", "10.245.0.0/16", zoneA),
		pool4("off", "10.246.0.0/16", disabled),
		pool4("tun", "10.247.0.0/24", tunnelOnly),
		pool4("v6", "fd00::/48"),
		pool4("broken", "10.1.2.3/8"),
		pool4("late", "10.244.128.0/17", func(p *tabbyv1.IPPool) { p.CreationTimestamp = metav1.Unix(2e9, 0) }),
	})
	nodeB := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b", Labels: map[string]string{"zone": "b"}}}
	nodeA := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"zone": "a"}}}

	names := func(ps []*pool) string {
		var s []string
		for _, p := range ps {
			s = append(s, p.obj.Name)
		}
		return strings.Join(s, ",")
	}
	got, excl, err := set.candidates(4, nil, tabbyv1.UseWorkload, nodeB, "b")
	if err != nil || names(got) != "default" {
		t.Fatalf("node b v4: %v %v", names(got), err)
	}
	joined := strings.Join(excl, "\n")
	for _, want := range []string{`nodeSelector "zone=a" does not match node b`, "pool off (10.246.0.0/16) is disabled", "does not allow use Workload", `IPPool "broken" is invalid: spec.cidr: Invalid value: "10.1.2.3/8": cidr 10.1.2.3/8 has host bits set`, "pool late (10.244.128.0/17) overlaps the older pool default (10.244.0.0/16)"} {
		if !strings.Contains(joined, want) {
			t.Errorf("exclusions lack %q:\n%s", want, joined)
		}
	}
	got, _, _ = set.candidates(4, nil, tabbyv1.UseWorkload, nodeA, "a")
	if names(got) != "default,zone-a" && names(got) != "zone-a,default" {
		t.Errorf("node a v4: %s", names(got))
	}
	got, _, _ = set.candidates(6, nil, tabbyv1.UseWorkload, nodeA, "a")
	if names(got) != "v6" {
		t.Errorf("v6: %s", names(got))
	}
	got, _, _ = set.candidates(4, nil, tabbyv1.UseTunnel, nodeA, "a")
	if !strings.Contains(names(got), "tun") {
		t.Errorf("tunnel use: %s", names(got))
	}
	for _, tc := range []struct {
		names []string
		want  string
	}{
		{[]string{"nope"}, `requested pool "nope" does not exist`},
		{[]string{"off"}, "is disabled"},
		{[]string{"zone-a"}, `nodeSelector "zone=a" does not match node b`},
		{[]string{"v6"}, "is IPv6, not IPv4"},
		{[]string{"broken"}, "is invalid"},
	} {
		_, _, err := set.candidates(4, tc.names, tabbyv1.UseWorkload, nodeB, "b")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("candidates(%v): err %v, want %q", tc.names, err, tc.want)
		}
	}
}

func TestParsePool(t *testing.T) {
	for _, tc := range []struct {
		cidr string
		size int
		want string // error substring, "" = ok
	}{
		{"10.0.0.0/16", 0, ""},
		{"10.0.0.0/28", 0, "the default blockSize 26 is smaller than the prefix length"},
		{"10.0.0.0/28", 30, ""},
		{"10.0.0.0/16", 19, "out of range"},
		{"fd00::/64", 0, ""},
		{"fd00::/64", 100, "out of range"},
		{"nonsense", 0, "cidr must be a network in CIDR notation"},
	} {
		_, err := parsePool(&tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: tabbyv1.IPPoolSpec{CIDR: tc.cidr, BlockSize: tc.size}})
		if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("parsePool(%s,%d) = %v, want %q", tc.cidr, tc.size, err, tc.want)
		}
	}
}
