package v1

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func pool(cidr string, blockSize int) *IPPool {
	return &IPPool{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: IPPoolSpec{CIDR: cidr, BlockSize: blockSize}}
}

func TestIPPoolValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		pool *IPPool
		want []string // substrings of the error, in order; none: valid
	}{
		{"v4 default block", pool("10.244.0.0/16", 0), nil},
		{"v6 default block", pool("fd00:10:244::/56", 0), nil},
		{"v4 /32 blocks", pool("10.0.0.0/24", 32), nil},
		{"v4 /20 blocks in a /20", pool("10.0.0.0/20", 20), nil},
		{"v6 116", pool("fd00::/64", 116), nil},
		{"v6 128", pool("fd00::/120", 128), nil},
		{"v4 pool as small as its default block", pool("10.0.0.0/26", 0), nil},
		{"empty cidr", pool("", 0), []string{`spec.cidr: Required value: ` + MsgCIDRInvalid}},
		{"not a cidr", pool("10.0.0.0", 0), []string{`spec.cidr: Invalid value: "10.0.0.0": ` + MsgCIDRInvalid}},
		{"garbage", pool("ten/8", 26), []string{MsgCIDRInvalid}},
		{"prefix too long", pool("10.0.0.0/33", 0), []string{MsgCIDRInvalid}},
		{"leading zeros", pool("010.0.0.0/8", 0), []string{MsgCIDRInvalid}},
		{"v4-mapped v6", pool("::ffff:10.0.0.0/104", 0), []string{MsgCIDRInvalid}},
		{"host bits", pool("10.244.1.0/16", 0), []string{`spec.cidr: Invalid value: "10.244.1.0/16": cidr 10.244.1.0/16 has host bits set: write the network address, 10.244.0.0/16`}},
		{"v6 host bits", pool("fd00::1/64", 0), []string{"cidr fd00::1/64 has host bits set: write the network address, fd00::/64"}},
		{"v4 block too big", pool("10.0.0.0/8", 19), []string{`spec: Invalid value: blockSize 19 is out of range for an IPv4 pool: use 20 to 32 (the default is 26)`}},
		{"v4 block too small", pool("10.0.0.0/8", 33), []string{"blockSize 33 is out of range for an IPv4 pool: use 20 to 32 (the default is 26)"}},
		{"v4 block with a v6 size", pool("10.0.0.0/8", 122), []string{"blockSize 122 is out of range for an IPv4 pool"}},
		{"v6 block with a v4 size", pool("fd00::/48", 26), []string{
			"blockSize 26 is out of range for an IPv6 pool: use 116 to 128 (the default is 122)",
			"blockSize 26 is smaller than the prefix length of cidr fd00::/48, so one block would not fit in the pool: set blockSize to at least 48, or use a larger cidr",
		}},
		{"v6 block 129", pool("fd00::/48", 129), []string{"blockSize 129 is out of range for an IPv6 pool"}},
		{"block bigger than the pool", pool("10.0.0.0/28", 27), []string{"blockSize 27 is smaller than the prefix length of cidr 10.0.0.0/28, so one block would not fit in the pool: set blockSize to at least 28, or use a larger cidr"}},
		{"default block bigger than the pool", pool("10.0.0.0/28", 0), []string{"the default blockSize 26 is smaller than the prefix length of cidr 10.0.0.0/28, so one block would not fit in the pool: set blockSize to at least 28"}},
		{"default v6 block bigger than the pool", pool("fd00::/124", 0), []string{"the default blockSize 122 is smaller than the prefix length of cidr fd00::/124"}},
		{"a /20 block in a /24", pool("10.0.0.0/24", 20), []string{"blockSize 20 is smaller than the prefix length of cidr 10.0.0.0/24"}},
		{"ipip and vxlan", func() *IPPool {
			p := pool("10.0.0.0/16", 0)
			p.Spec.IPIPMode, p.Spec.VXLANMode = EncapAlways, EncapCrossSubnet
			return p
		}(), []string{`spec: Invalid value: ` + MsgIPIPAndVXLAN}},
		{"ipip and vxlan Never", func() *IPPool {
			p := pool("10.0.0.0/16", 0)
			p.Spec.IPIPMode, p.Spec.VXLANMode = EncapAlways, EncapNever
			return p
		}(), nil},
		{"bad modes", func() *IPPool {
			p := pool("10.0.0.0/16", 0)
			p.Spec.IPIPMode, p.Spec.VXLANMode = "always", "Sometimes"
			return p
		}(), []string{`spec.ipipMode: Unsupported value: "always": supported values: "Never", "Always", "CrossSubnet"`, `spec.vxlanMode: Unsupported value: "Sometimes"`}},
		{"uses", func() *IPPool {
			p := pool("10.0.0.0/16", 0)
			p.Spec.AllowedUses = []IPPoolAllowedUse{UseTunnel, "Pods", UseTunnel}
			return p
		}(), []string{`spec.allowedUses[1]: Unsupported value: "Pods": supported values: "Workload", "Tunnel"`, `spec.allowedUses[2]: Duplicate value: "Tunnel"`}},
		{"bad node selector", func() *IPPool {
			p := pool("10.0.0.0/16", 0)
			p.Spec.NodeSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "zone", Operator: "Near"}}}
			return p
		}(), []string{`spec.nodeSelector: Invalid value`, `"Near" is not a valid label selector operator`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.pool.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate accepted the pool, want %q", tc.want)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, `IPPool "p" is invalid: `) {
				t.Errorf("error %q does not name the pool", msg)
			}
			rest := msg
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("error %q lacks %q (in this order)", msg, w)
				}
				rest = rest[i+len(w):]
			}
		})
	}
}

func TestIPPoolHelpers(t *testing.T) {
	for _, tc := range []struct {
		cidr      string
		blockSize int
		family    int
		eff       int
		ipnet     string
	}{
		{"10.244.0.0/16", 0, 4, 26, "10.244.0.0/16"},
		{"10.244.0.0/16", 24, 4, 24, "10.244.0.0/16"},
		{"fd00:10:244::/56", 0, 6, 122, "fd00:10:244::/56"},
		{"fd00::/64", 120, 6, 120, "fd00::/64"},
		{"10.244.1.0/16", 0, 4, 26, "10.244.0.0/16"}, // parsed even with host bits, as its network
		{"bad", 0, 0, 26, ""},
		{"::ffff:1.2.3.0/120", 0, 0, 26, ""},
	} {
		p := pool(tc.cidr, tc.blockSize)
		if got := p.Family(); got != tc.family {
			t.Errorf("%s: Family %d, want %d", tc.cidr, got, tc.family)
		}
		if got := p.EffectiveBlockSize(); got != tc.eff {
			t.Errorf("%s/%d: EffectiveBlockSize %d, want %d", tc.cidr, tc.blockSize, got, tc.eff)
		}
		n, err := p.ParsedCIDR()
		if tc.ipnet == "" {
			if err == nil || !strings.Contains(err.Error(), MsgCIDRInvalid) || !strings.Contains(err.Error(), "IPPool p") {
				t.Errorf("%s: ParsedCIDR %v, %v; want an error naming the pool", tc.cidr, n, err)
			}
			continue
		}
		if err != nil || n.String() != tc.ipnet {
			t.Errorf("%s: ParsedCIDR %v, %v; want %s", tc.cidr, n, err, tc.ipnet)
			continue
		}
		if tc.family == 4 && len(n.IP) != net.IPv4len {
			t.Errorf("%s: ParsedCIDR gives a %d-byte IP, want 4", tc.cidr, len(n.IP))
		}
		if ones, bits := n.Mask.Size(); bits != len(n.IP)*8 || ones == 0 {
			t.Errorf("%s: mask %v", tc.cidr, n.Mask)
		}
	}
}

func TestIPPoolAllowsUse(t *testing.T) {
	all := pool("10.0.0.0/16", 0)
	tun := pool("10.0.0.0/16", 0)
	tun.Spec.AllowedUses = []IPPoolAllowedUse{UseTunnel}
	wl := pool("10.0.0.0/16", 0)
	wl.Spec.AllowedUses = []IPPoolAllowedUse{UseWorkload}
	both := pool("10.0.0.0/16", 0)
	both.Spec.AllowedUses = []IPPoolAllowedUse{UseTunnel, UseWorkload}
	for _, tc := range []struct {
		p    *IPPool
		use  IPPoolAllowedUse
		want bool
	}{
		{all, UseWorkload, true}, {all, UseTunnel, true}, {all, "", true}, {all, "Other", false},
		{tun, UseWorkload, false}, {tun, UseTunnel, true}, {tun, "", false},
		{wl, UseWorkload, true}, {wl, UseTunnel, false}, {wl, "", true},
		{both, UseWorkload, true}, {both, UseTunnel, true},
	} {
		if got := tc.p.AllowsUse(tc.use); got != tc.want {
			t.Errorf("uses %v: AllowsUse(%q) = %v, want %v", tc.p.Spec.AllowedUses, tc.use, got, tc.want)
		}
	}
}

func TestIPPoolOverlaps(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"10.0.0.0/16", "10.0.0.0/16", true},
		{"10.0.0.0/16", "10.0.1.0/24", true},
		{"10.0.1.0/24", "10.0.0.0/16", true},
		{"10.0.0.0/8", "10.255.255.0/24", true},
		{"10.0.0.0/16", "10.1.0.0/16", false},
		{"10.0.0.0/16", "fd00::/64", false},
		{"0.0.0.0/0", "::/0", false},
		{"fd00::/48", "fd00:0:0:1::/64", true},
		{"fd00::/64", "fd00:0:0:1::/64", false},
		{"bad", "10.0.0.0/8", false},
	} {
		if got := pool(tc.a, 0).Overlaps(pool(tc.b, 0)); got != tc.want {
			t.Errorf("%s overlaps %s: %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestParsePeerIP(t *testing.T) {
	for _, tc := range []struct {
		in   string
		ip   string
		port uint16
		ok   bool
	}{
		{"10.0.0.1", "10.0.0.1", 0, true},
		{"10.0.0.1:179", "10.0.0.1", 179, true},
		{"10.0.0.1:1790", "10.0.0.1", 1790, true},
		{"10.0.0.1:65535", "10.0.0.1", 65535, true},
		{"fd00::1", "fd00::1", 0, true},
		{"fd00::1:179", "fd00::1:179", 0, true}, // an IPv6 address, not a port
		{"[fd00::1]:179", "fd00::1", 179, true},
		{"[fd00::1]:00179", "fd00::1", 179, true},
		{"[64:ff9b::10.0.0.1]:179", "64:ff9b::a00:1", 179, true},
		{"10.0.0.1:0", "", 0, false},
		{"10.0.0.1:65536", "", 0, false},
		{"10.0.0.1:99999", "", 0, false},
		{"10.0.0.1:123456", "", 0, false},
		{"10.0.0.1:", "", 0, false},
		{"10.0.0.1:bgp", "", 0, false},
		{"10.0.0.1:+179", "", 0, false},
		{"10.0.0.1:179:179", "", 0, false},
		{"[10.0.0.1]:179", "", 0, false},
		{"[fd00::1]", "", 0, false},
		{"[fd00::1]:", "", 0, false},
		{"[]:179", "", 0, false},
		{"fd00::1]:179", "", 0, false},
		{"[fd00::1]:179]:180", "", 0, false},
		{"fe80::1%eth0", "", 0, false},
		{"::ffff:10.0.0.1", "", 0, false},
		{"router.example", "", 0, false},
		{":179", "", 0, false},
		{"", "", 0, false},
	} {
		ip, port, err := ParsePeerIP(tc.in)
		if !tc.ok {
			if err == nil {
				t.Errorf("ParsePeerIP(%q) = %v, %d; want an error", tc.in, ip, port)
			} else if !strings.Contains(err.Error(), MsgBGPPeerIP) {
				t.Errorf("ParsePeerIP(%q): %v", tc.in, err)
			}
			continue
		}
		if err != nil || ip != netip.MustParseAddr(tc.ip) || port != tc.port {
			t.Errorf("ParsePeerIP(%q) = %v, %d, %v; want %s, %d", tc.in, ip, port, err, tc.ip, tc.port)
		}
	}
}

func TestBGPPeerValidate(t *testing.T) {
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "a"}}
	for _, tc := range []struct {
		name string
		spec BGPPeerSpec
		want []string
	}{
		{"global external peer", BGPPeerSpec{PeerIP: "192.0.2.1", ASNumber: 64600}, nil},
		{"one node", BGPPeerSpec{Node: "n1", PeerIP: "[2001:db8::1]:1179", ASNumber: 64600, SourceAddress: "None"}, nil},
		{"selected nodes to selected nodes", BGPPeerSpec{NodeSelector: sel, PeerSelector: sel}, nil},
		{"node and nodeSelector", BGPPeerSpec{Node: "n1", NodeSelector: sel, PeerIP: "192.0.2.1", ASNumber: 1},
			[]string{`spec: Invalid value: ` + MsgBGPPeerNodeAndSelector}},
		{"neither peer", BGPPeerSpec{Node: "n1"}, []string{`spec: Invalid value: ` + MsgBGPPeerIPOrSelector}},
		{"both peers", BGPPeerSpec{PeerIP: "192.0.2.1", ASNumber: 1, PeerSelector: sel}, []string{MsgBGPPeerIPOrSelector}},
		{"no AS", BGPPeerSpec{PeerIP: "192.0.2.1"}, []string{MsgBGPPeerNeedsASNumber}},
		{"bad peerIP", BGPPeerSpec{PeerIP: "192.0.2.1:70000", ASNumber: 1}, []string{`spec.peerIP: Invalid value: "192.0.2.1:70000": ` + MsgBGPPeerIP}},
		{"bad source", BGPPeerSpec{PeerIP: "192.0.2.1", ASNumber: 1, SourceAddress: "Node"}, []string{`spec.sourceAddress: Unsupported value: "Node"`}},
		{"password without key", BGPPeerSpec{PeerIP: "192.0.2.1", ASNumber: 1, Password: &SecretKeyRef{Name: "s"}}, []string{`spec.password.key: Required value`}},
		{"everything wrong", BGPPeerSpec{Node: "n", NodeSelector: sel}, []string{MsgBGPPeerNodeAndSelector, MsgBGPPeerIPOrSelector}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: "peer"}, Spec: tc.spec}
			err := p.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted, want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if !strings.HasPrefix(err.Error(), `BGPPeer "peer" is invalid: `) {
				t.Errorf("error %q does not name the peer", err)
			}
		})
	}
}

func TestBGPConfigurationAndIPAMConfigurationValidate(t *testing.T) {
	good := &BGPConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: BGPConfigurationSpec{
		RouteReflectorClusterID: "244.0.0.1", ServiceClusterIPs: []ServiceIPBlock{{CIDR: "10.96.0.0/16"}},
	}}
	if err := good.Validate(); err != nil {
		t.Error(err)
	}
	bad := &BGPConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: BGPConfigurationSpec{
		RouteReflectorClusterID: "fd00::1", ServiceExternalIPs: []ServiceIPBlock{{CIDR: "10.96.0.0"}},
	}}
	err := bad.Validate()
	for _, w := range []string{`spec.routeReflectorClusterID: Invalid value: "fd00::1": ` + MsgRouteReflectorClusterID, `spec.serviceExternalIPs[0].cidr: Invalid value: "10.96.0.0": ` + MsgServiceCIDR} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %v lacks %q", err, w)
		}
	}
	ic := &IPAMConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: IPAMConfigurationSpec{MaxBlocksPerHost: 0}}
	if err := ic.Validate(); err != nil {
		t.Error(err)
	}
	ic.Name = "cluster"
	if err := ic.Validate(); err == nil || !strings.Contains(err.Error(), MsgIPAMConfigurationName) {
		t.Errorf("IPAMConfiguration named cluster: %v", err)
	}
}

// TestMessagesMatchCRDs: every message the Go validation shares with the
// CEL rules is in the generated CRDs (a marker edited without this file, or
// the other way round, fails here).
func TestMessagesMatchCRDs(t *testing.T) {
	files, err := filepath.Glob("../../deploy/crds/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs: %v", err)
	}
	var all strings.Builder
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all.Write(b)
	}
	// YAML folds long strings: compare with whitespace collapsed and the
	// doubled single quotes of YAML undone.
	norm := func(s string) string {
		s = strings.ReplaceAll(s, "''", "'")
		return strings.Join(strings.Fields(s), " ")
	}
	crds := norm(all.String())
	for _, m := range []string{
		MsgCIDRInvalid, MsgCIDRHostBits, MsgBlockSizeRange, MsgBlockSizeTooSmall, MsgIPIPAndVXLAN,
		MsgIPAMConfigurationName, MsgBGPPeerNodeAndSelector, MsgBGPPeerIPOrSelector, MsgBGPPeerNeedsASNumber,
		MsgBGPPeerIP, MsgRouteReflectorClusterID, MsgServiceCIDR,
		MsgFilterCIDRAndOperator, MsgFilterCIDRv4, MsgFilterCIDRv6,
		// The fixed parts of the messageExpressions.
		" has host bits set: write the network address, ",
		" is out of range for an IPv", "20 to 32 (the default is 26)", "116 to 128 (the default is 122)",
		" is smaller than the prefix length of cidr ", ", so one block would not fit in the pool: set blockSize to at least ",
	} {
		if !strings.Contains(crds, norm(m)) {
			t.Errorf("deploy/crds does not carry %q: regenerate the CRDs or fix the message", m)
		}
	}
}

func TestBGPFilterValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec BGPFilterSpec
		want []string
	}{
		{"ok", BGPFilterSpec{
			ImportV4: []BGPFilterRuleV4{{CIDR: "0.0.0.0/0", MatchOperator: MatchEqual, Action: FilterAccept}, {Action: FilterReject}},
			ExportV6: []BGPFilterRuleV6{{CIDR: "fd00::/8", MatchOperator: MatchNotIn, Action: FilterReject}},
		}, nil},
		{"cidr without operator", BGPFilterSpec{ImportV4: []BGPFilterRuleV4{{CIDR: "10.0.0.0/8", Action: FilterAccept}}},
			[]string{`spec.importV4[0]: Invalid value: ` + MsgFilterCIDRAndOperator}},
		{"v6 cidr in a v4 rule", BGPFilterSpec{ExportV4: []BGPFilterRuleV4{{CIDR: "::/0", MatchOperator: MatchIn, Action: FilterAccept}}},
			[]string{`spec.exportV4[0].cidr: Invalid value: "::/0": ` + MsgFilterCIDRv4}},
		{"v4 cidr in a v6 rule", BGPFilterSpec{ImportV6: []BGPFilterRuleV6{{CIDR: "10.0.0.0/8", MatchOperator: MatchIn, Action: FilterAccept}}},
			[]string{MsgFilterCIDRv6}},
		{"bad operator and action", BGPFilterSpec{ImportV4: []BGPFilterRuleV4{{CIDR: "10.0.0.0/8", MatchOperator: "Within", Action: "Allow"}}},
			[]string{`spec.importV4[0].matchOperator: Unsupported value: "Within"`, `spec.importV4[0].action: Unsupported value: "Allow"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &BGPFilter{ObjectMeta: metav1.ObjectMeta{Name: "f"}, Spec: tc.spec}
			err := f.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate accepted it; want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
