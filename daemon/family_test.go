package daemon

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
)

func TestMissingFamilies(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"zone": "a"}}}
	pool := func(name, cidr string, mod ...func(*tabbyv1.IPPoolSpec)) tabbyv1.IPPool {
		p := tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: tabbyv1.IPPoolSpec{CIDR: cidr}}
		for _, m := range mod {
			m(&p.Spec)
		}
		return p
	}
	disabled := func(s *tabbyv1.IPPoolSpec) { s.Disabled = true }
	zoneB := func(s *tabbyv1.IPPoolSpec) {
		s.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "b"}}
	}
	tunnelOnly := func(s *tabbyv1.IPPoolSpec) { s.AllowedUses = []tabbyv1.IPPoolAllowedUse{tabbyv1.UseTunnel} }
	block := func(cidr, node string) tabbyv1.IPAMBlock {
		return tabbyv1.IPAMBlock{Spec: tabbyv1.IPAMBlockSpec{CIDR: cidr, Affinity: "host:" + node}}
	}
	v4 := netip.MustParsePrefix("192.168.1.10/24")
	v6 := netip.MustParsePrefix("fd00:1::10/64")
	none := netip.Prefix{}
	p4, p6 := pool("v4", "10.244.0.0/16"), pool("v6", "fd00:10:244::/56")
	for _, c := range []struct {
		name   string
		pools  []tabbyv1.IPPool
		blocks []tabbyv1.IPAMBlock
		v4, v6 netip.Prefix
		want   []string // reason: pool names the message must hold
	}{
		{name: "dual-stack node", pools: []tabbyv1.IPPool{p4, p6}, v4: v4, v6: v6},
		{name: "v4 node, v4 pool", pools: []tabbyv1.IPPool{p4}, v4: v4, v6: none},
		{name: "v4 node, v6 pool", pools: []tabbyv1.IPPool{p4, p6}, v4: v4, v6: none, want: []string{"NoIPv6Address: v6 (fd00:10:244::/56)"}},
		{name: "v6 node, v4 pool", pools: []tabbyv1.IPPool{p4, p6}, v4: none, v6: v6, want: []string{"NoIPv4Address: v4 (10.244.0.0/16)"}},
		{name: "disabled v6 pool", pools: []tabbyv1.IPPool{pool("v6", "fd00:10:244::/56", disabled)}, v4: v4},
		{name: "v6 pool for other nodes", pools: []tabbyv1.IPPool{pool("v6", "fd00:10:244::/56", zoneB)}, v4: v4},
		{name: "v6 pool of tunnel addresses only", pools: []tabbyv1.IPPool{pool("v6", "fd00:10:244::/56", tunnelOnly)}, v4: v4},
		{name: "disabled v6 pool with this node's block", pools: []tabbyv1.IPPool{pool("v6", "fd00:10:244::/56", disabled)},
			blocks: []tabbyv1.IPAMBlock{block("fd00:10:244::40/122", "n1")}, v4: v4, want: []string{"NoIPv6Address: v6 (fd00:10:244::/56)"}},
		{name: "v6 pool with another node's block", pools: []tabbyv1.IPPool{pool("v6", "fd00:10:244::/56", zoneB)},
			blocks: []tabbyv1.IPAMBlock{block("fd00:10:244::40/122", "n2")}, v4: v4},
		{name: "two v6 pools", pools: []tabbyv1.IPPool{p6, pool("w6", "fd00:20::/56")}, v4: v4,
			want: []string{"NoIPv6Address: v6 (fd00:10:244::/56), w6 (fd00:20::/56)"}},
	} {
		got := missingFamilies(c.pools, c.blocks, node, c.v4, c.v6, "", "no IPv6 default route")
		if len(got) != len(c.want) {
			t.Errorf("%s: %+v, want %v", c.name, got, c.want)
			continue
		}
		for i, w := range c.want {
			reason, pools, _ := strings.Cut(w, ": ")
			if got[i].Reason != reason || !strings.Contains(got[i].Message, "from IPPool "+pools+":") || !strings.Contains(got[i].Message, "--node-ip <IPv4>,<IPv6>") {
				t.Errorf("%s: %+v, want %s naming %s and saying what to do", c.name, got[i], reason, pools)
			}
		}
	}
}
