package bgp

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/tabbynet/tabby/api/v1"
)

// block makes an IPAMBlock; holders maps ordinals to the node holding them.
func block(cidr, affinity string, holders map[int]string) v1.IPAMBlock {
	p := netip.MustParsePrefix(cidr)
	b := v1.IPAMBlock{ObjectMeta: metav1.ObjectMeta{Name: cidr}, Spec: v1.IPAMBlockSpec{CIDR: cidr, Affinity: affinity}}
	b.Spec.Allocations = make([]int, 1<<(p.Addr().BitLen()-p.Bits()))
	for i := range b.Spec.Allocations {
		b.Spec.Allocations[i] = -1
	}
	for ord, n := range holders {
		b.Spec.Allocations[ord] = len(b.Spec.Attributes)
		b.Spec.Attributes = append(b.Spec.Attributes, v1.AllocationAttribute{HandleID: fmt.Sprint("h", ord), Node: n})
	}
	return b
}

func pool(name, cidr string, noExport bool) v1.IPPool {
	return v1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.IPPoolSpec{CIDR: cidr, DisableBGPExport: noExport}}
}

func describeAdverts(ads []Advert) string {
	var parts []string
	for _, a := range ads {
		parts = append(parts, fmt.Sprintf("%s via %s (%s)", a.Prefix, a.NextHop, a.Kind))
	}
	return strings.Join(parts, "; ")
}

func TestAdvertisements(t *testing.T) {
	v4, v6 := netip.MustParseAddr("192.168.1.10"), netip.MustParseAddr("fd00:1::10")
	deleted := block("10.244.0.128/26", "host:n1", nil)
	deleted.Spec.Deleted = true
	tests := []struct {
		name     string
		in       AdvertInputs
		want     string
		problems string
	}{
		{name: "own blocks, borrowed addresses, not other nodes' blocks",
			in: AdvertInputs{Node: "n1", IPv4: v4, Blocks: []v1.IPAMBlock{
				block("10.244.0.64/26", "host:n1", map[int]string{0: "n1"}),
				block("10.244.0.0/26", "host:n1", nil),
				block("10.244.1.0/26", "host:n2", map[int]string{1: "n2", 5: "n1", 63: "n1"}),
				block("10.244.2.0/26", "", map[int]string{2: "n1"}),
				deleted,
			}},
			want: "10.244.0.0/26 via 192.168.1.10 (block); 10.244.0.64/26 via 192.168.1.10 (block); " +
				"10.244.1.5/32 via 192.168.1.10 (borrowed); 10.244.1.63/32 via 192.168.1.10 (borrowed); 10.244.2.2/32 via 192.168.1.10 (borrowed)"},
		{name: "pools with disableBGPExport stay out",
			in: AdvertInputs{Node: "n1", IPv4: v4,
				Pools: []v1.IPPool{pool("quiet", "10.245.0.0/16", true), pool("loud", "10.244.0.0/16", false)},
				Blocks: []v1.IPAMBlock{
					block("10.245.0.0/26", "host:n1", nil),
					block("10.245.1.0/26", "host:n2", map[int]string{3: "n1"}),
					block("10.244.0.0/26", "host:n1", nil),
				}},
			want: "10.244.0.0/26 via 192.168.1.10 (block)"},
		{name: "IPv6 blocks and borrowed /128s",
			in: AdvertInputs{Node: "n1", IPv4: v4, IPv6: v6, Blocks: []v1.IPAMBlock{
				block("fd00:244::/122", "host:n1", nil),
				block("fd00:244::40/122", "host:n2", map[int]string{0x3f: "n1"}),
			}},
			want: "fd00:244::/122 via fd00:1::10 (block); fd00:244::7f/128 via fd00:1::10 (borrowed)"},
		{name: "a family without a node address is reported once",
			in: AdvertInputs{Node: "n1", IPv4: v4, Blocks: []v1.IPAMBlock{
				block("fd00:244::/122", "host:n1", nil), block("fd00:244::40/122", "host:n1", nil), block("10.244.0.0/26", "host:n1", nil)}},
			want:     "10.244.0.0/26 via 192.168.1.10 (block)",
			problems: "node n1 has no IPv6 address, so its IPv6 routes (fd00:244::/122 and any others) are not advertised"},
		{name: "service CIDRs, masked and de-duplicated",
			in: AdvertInputs{Node: "n1", IPv4: v4, IPv6: v6, Config: v1.BGPConfigurationSpec{
				ServiceClusterIPs:      []v1.ServiceIPBlock{{CIDR: "10.96.0.0/12"}, {CIDR: "fd00:96::/108"}},
				ServiceExternalIPs:     []v1.ServiceIPBlock{{CIDR: "203.0.113.7/24"}, {CIDR: "bogus"}},
				ServiceLoadBalancerIPs: []v1.ServiceIPBlock{{CIDR: "10.96.0.0/12"}},
			}},
			want:     "10.96.0.0/12 via 192.168.1.10 (service); 203.0.113.0/24 via 192.168.1.10 (service); fd00:96::/108 via fd00:1::10 (service)",
			problems: `service CIDR "bogus" is invalid`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ads, problems := Advertisements(tc.in)
			if got := describeAdverts(ads); got != tc.want {
				t.Errorf("adverts:\n got %s\nwant %s", got, tc.want)
			}
			got := fmt.Sprint(problems)
			if tc.problems == "" && len(problems) != 0 || !strings.Contains(got, tc.problems) {
				t.Errorf("problems = %s, want %q", got, tc.problems)
			}
			if tc.problems != "" && len(problems) != 1 {
				t.Errorf("want exactly one problem, got %s", got)
			}
		})
	}
}

func TestNthAddr(t *testing.T) {
	// prefix and ordinal -> address ("" when out of range)
	want := map[[2]string]string{
		{"10.0.0.0/24", "255"}: "10.0.0.255", {"10.0.0.0/20", "263"}: "10.0.1.7", {"10.0.0.0/20", "4095"}: "10.0.15.255",
		{"fd00::/116", "4095"}: "fd00::fff", {"10.0.0.0/24", "256"}: "", {"10.0.0.0/24", "-1"}: "",
	}
	for in, w := range want {
		var ord int
		fmt.Sscan(in[1], &ord)
		a, ok := nthAddr(netip.MustParsePrefix(in[0]), ord)
		if got := a.String(); !ok && w != "" || ok && got != w {
			t.Errorf("nthAddr(%s, %d) = %s, %v; want %q", in[0], ord, got, ok, w)
		}
	}
}
