package apply

import (
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/internal/netfilter"
	"github.com/tabbynet/tabby/policy"
)

func TestNormalizeMember(t *testing.T) {
	for _, c := range []struct {
		typ     policy.SetType
		fam     int
		in      string
		want    []string
		nomatch bool
		err     string
	}{
		{policy.SetHashIP, v4, "10.0.0.1", []string{"10.0.0.1"}, false, ""},
		{policy.SetHashIP, v4, "10.0.0.1/32", []string{"10.0.0.1"}, false, ""},
		{policy.SetHashIP, v4, "::ffff:10.0.0.1", []string{"10.0.0.1"}, false, ""},
		{policy.SetHashIP, v6, "FD00:0::1", []string{"fd00::1"}, false, ""},
		{policy.SetHashIP, v4, "10.0.0.0/24", nil, false, "not an IP address"},
		{policy.SetHashIP, v4, "fd00::1", nil, false, "not an inet address"},
		{policy.SetHashIP, v6, "10.0.0.1", nil, false, "not an inet6 address"},
		{policy.SetHashIP, v6, "fe80::1%eth0", nil, false, "zone"},
		{policy.SetHashIP, v4, "10.0.0.1 nomatch", nil, false, "want one address"},
		{policy.SetHashNet, v4, "10.0.0.7/24", []string{"10.0.0.0/24"}, false, ""},
		{policy.SetHashNet, v4, "10.0.0.7/32", []string{"10.0.0.7"}, false, ""},
		{policy.SetHashNet, v4, "10.0.0.7", []string{"10.0.0.7"}, false, ""},
		{policy.SetHashNet, v4, "10.1.0.0/16 nomatch", []string{"10.1.0.0/16"}, true, ""},
		{policy.SetHashNet, v4, "0.0.0.0/0", []string{"0.0.0.0/1", "128.0.0.0/1"}, false, ""},
		{policy.SetHashNet, v6, "::/0", []string{"::/1", "8000::/1"}, false, ""},
		{policy.SetHashNet, v6, "FD00::1:2/64", []string{"fd00::/64"}, false, ""},
		{policy.SetHashNet, v6, "fd00::1/128", []string{"fd00::1"}, false, ""},
		{policy.SetHashNet, v4, "0.0.0.0/0 nomatch", nil, false, "/0 cannot be nomatch"},
		{policy.SetHashNet, v4, "10.0.0.0/33", nil, false, "prefix length"},
		{policy.SetHashNet, v4, "10.0.0.0/x", nil, false, "prefix length"},
		{policy.SetHashNet, v4, "10.0.0.0/8 match", nil, false, "want one"},
		{policy.SetHashIPPort, v4, "10.0.0.1,TCP:80", []string{"10.0.0.1,tcp:80"}, false, ""},
		{policy.SetHashIPPort, v6, "fd00::1,sctp:09000", []string{"fd00::1,sctp:9000"}, false, ""},
		{policy.SetHashIPPort, v4, "10.0.0.1,icmp:8", nil, false, "not tcp, udp or sctp"},
		{policy.SetHashIPPort, v4, "10.0.0.1,tcp:80-90", nil, false, "ranges are not accepted"},
		{policy.SetHashIPPort, v4, "10.0.0.1:80", nil, false, "want address,proto:port"},
		// hash:net,iface as `ipset save` prints it (checked against the
		// kernel by TestIfaceSetDispatch).
		{policy.SetHashNetIface, v4, "10.244.1.5,tab0123456789a", []string{"10.244.1.5,tab0123456789a"}, false, ""},
		{policy.SetHashNetIface, v4, "10.244.1.5/32,tabA", []string{"10.244.1.5,tabA"}, false, ""},
		{policy.SetHashNetIface, v4, "10.244.1.5/24,tabA", []string{"10.244.1.0/24,tabA"}, false, ""},
		{policy.SetHashNetIface, v4, "0.0.0.0/0,tabA", []string{"0.0.0.0/0,tabA"}, false, ""},
		{policy.SetHashNetIface, v4, "10.1.0.0/16,eth0 nomatch", []string{"10.1.0.0/16,eth0"}, true, ""},
		{policy.SetHashNetIface, v4, "10.1.0.0/16,physdev:eth0", []string{"10.1.0.0/16,physdev:eth0"}, false, ""},
		{policy.SetHashNetIface, v6, "FD00::0:5,tabB", []string{"fd00::5,tabB"}, false, ""},
		{policy.SetHashNetIface, v6, "fd00::5/128,tabB", []string{"fd00::5,tabB"}, false, ""},
		{policy.SetHashNetIface, v6, "::/0,tabB", []string{"::/0,tabB"}, false, ""},
		{policy.SetHashNetIface, v4, "10.244.1.5", nil, false, "want address[/prefix],interface"},
		{policy.SetHashNetIface, v4, "10.244.1.5,", nil, false, "not a name of 1-15 bytes"},
		{policy.SetHashNetIface, v4, "10.244.1.5,a-name-over-15-bytes", nil, false, "not a name of 1-15 bytes"},
		{policy.SetHashNetIface, v4, "10.244.1.5,tab/x", nil, false, `contains '/'`},
		{policy.SetHashNetIface, v4, "10.244.1.5,tab,x", nil, false, `contains ','`},
		{policy.SetHashNetIface, v4, "fd00::5,tabA", nil, false, "not an inet address"},
		{policy.SetHashNetIface, v6, "fd00::5/129,tabA", nil, false, "prefix length"},
		{policy.SetHashNetIface, v4, "10.244.1.5,tabA match", nil, false, "want one"},
	} {
		got, nm, err := normalizeMember(c.typ, c.fam, c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("normalizeMember(%s, %q) error = %v, want one containing %q", c.typ, c.in, err, c.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, c.want) || nm != c.nomatch {
			t.Errorf("normalizeMember(%s, %q) = %q, %v, %v; want %q, %v", c.typ, c.in, got, nm, err, c.want, c.nomatch)
		}
	}
}

func rules(ss ...string) [][]string {
	var out [][]string
	for _, s := range ss {
		out = append(out, strings.Fields(s))
	}
	return out
}

func TestValidate(t *testing.T) {
	good := func() *policy.Ruleset {
		return &policy.Ruleset{
			Sets: []policy.Set{
				{Name: "tabby-np-p4-a", Type: policy.SetHashIP, Family: policy.FamilyIPv4, Members: []string{"10.0.0.2", "10.0.0.1", "10.0.0.1/32"}},
				{Name: "tabby-np-p6-a", Type: policy.SetHashIP, Family: policy.FamilyIPv6, Members: []string{"fd00::1"}},
				{Name: "tabby-np-e4-a", Type: policy.SetHashNetIface, Family: policy.FamilyIPv4, Members: []string{"10.0.0.1,tab1", "10.0.0.2/32,tab2"}},
				{Name: "tabby-np-q4-a", Type: policy.SetHashIPPort, Family: policy.FamilyIPv4, Members: []string{"10.0.0.1,tcp:80"}},
			},
			Chains: []policy.Chain{
				{Name: "TABBY-NP-FORWARD", Family: policy.FamilyIPv4, Rules: rules("-m set --match-set tabby-np-p4-a src -j TABBY-NP-X", "-m set --match-set admin src -j ACCEPT",
					"-m set --match-set tabby-np-e4-a src,src -g TABBY-NP-X", "-p tcp -m set --match-set tabby-np-q4-a dst,dst -j ACCEPT")},
				{Name: "TABBY-NP-X", Family: policy.FamilyIPv4},
				{Name: "TABBY-NP-FORWARD", Family: policy.FamilyIPv6, Rules: rules("-m set --match-set tabby-np-p6-a src -g TABBY-NP-X")},
				{Name: "TABBY-NP-X", Family: policy.FamilyIPv6},
			},
			Jumps: []policy.Jump{{Chain: "FORWARD", Rule: rules("-j TABBY-NP-FORWARD")[0]}},
		}
	}
	d, err := validate(good(), [2]bool{}, nil)
	if err != nil {
		t.Fatalf("validate(good) = %v", err)
	}
	if diff := cmp.Diff(map[string]bool{"10.0.0.1": false, "10.0.0.2": false}, d.sets["tabby-np-p4-a"].members); diff != "" {
		t.Errorf("members (deduplicated, normalized): %s", diff)
	}
	if diff := cmp.Diff(map[string]bool{"10.0.0.1,tab1": false, "10.0.0.2,tab2": false}, d.sets["tabby-np-e4-a"].members); diff != "" {
		t.Errorf("hash:net,iface members (normalized): %s", diff)
	}
	if got := d.fams[v6].jumps["FORWARD"]; len(got) != 1 || len(d.fams[v4].jumps["FORWARD"]) != 1 {
		t.Errorf("the jump is not in both families: %v / %v", d.fams[v4].jumps, got)
	}
	if !slices.Equal(d.fams[v4].order, []string{"TABBY-NP-FORWARD", "TABBY-NP-X"}) {
		t.Errorf("chain order = %v", d.fams[v4].order)
	}
	// IPv6 off: no inet6 sets or IPv6 chains, and a jump checked in IPv4 only.
	d, err = validate(good(), [2]bool{v6: true}, nil)
	if err != nil || d.sets["tabby-np-p6-a"] != nil || len(d.fams[v6].chains) != 0 || len(d.fams[v6].jumps) != 0 {
		t.Errorf("validate without IPv6 = %v, %+v", err, d)
	}

	for _, c := range []struct {
		name   string
		break_ func(*policy.Ruleset)
		want   string
	}{
		{"nil", nil, "no Ruleset"},
		{"set prefix", func(r *policy.Ruleset) { r.Sets[0].Name = "p4-a" }, "does not start with tabby-np-"},
		{"set too long", func(r *policy.Ruleset) { r.Sets[0].Name = "tabby-np-" + strings.Repeat("x", 23) }, "more than the kernel's 31"},
		{"set twice", func(r *policy.Ruleset) { r.Sets = append(r.Sets, r.Sets[0]) }, "listed twice"},
		{"set type", func(r *policy.Ruleset) { r.Sets[0].Type = "list:set" }, "type \"list:set\""},
		{"set family", func(r *policy.Ruleset) { r.Sets[0].Family = "ipv4" }, "family \"ipv4\""},
		{"member family", func(r *policy.Ruleset) { r.Sets[0].Members = []string{"fd00::9"} }, "member \"fd00::9\": not an inet address"},
		{"chain prefix", func(r *policy.Ruleset) { r.Chains[1].Name = "TABBY-X" }, "does not start with TABBY-NP-"},
		{"chain too long", func(r *policy.Ruleset) { r.Chains[1].Name = "TABBY-NP-" + strings.Repeat("X", 20) }, "more than the kernel's 28"},
		{"chain name space", func(r *policy.Ruleset) { r.Chains[1].Name = "TABBY-NP-A B" }, "contains"},
		{"chain family", func(r *policy.Ruleset) { r.Chains[1].Family = "" }, "family \"\""},
		{"chain twice", func(r *policy.Ruleset) { r.Chains = append(r.Chains, r.Chains[1]) }, "listed twice"},
		{"missing chain", func(r *policy.Ruleset) { r.Chains[0].Rules = rules("-j TABBY-NP-GONE") }, "TABBY-NP-GONE, which is not a inet chain"},
		{"routing chain", func(r *policy.Ruleset) { r.Chains[0].Rules = rules("-j TABBY-NAT-OUTGOING") }, "not a policy chain"},
		{"missing set", func(r *policy.Ruleset) { r.Chains[0].Rules = rules("-m set --match-set tabby-np-gone src -j ACCEPT") }, "does not list"},
		{"set of the other family", func(r *policy.Ruleset) { r.Chains[0].Rules = rules("-m set --match-set tabby-np-p6-a src -j ACCEPT") }, "of family inet6 in a inet rule"},
		{"too few set flags", func(r *policy.Ruleset) {
			r.Chains[0].Rules = rules("-m set --match-set tabby-np-e4-a src -g TABBY-NP-X")
		},
			"hash:net,iface set tabby-np-e4-a with 1 flag(s) \"src\": it has 2 dimensions and would never match"},
		{"too few set flags for hash:ip,port", func(r *policy.Ruleset) { r.Chains[0].Rules = rules("-m set --match-set tabby-np-q4-a dst -j ACCEPT") },
			"it has 2 dimensions"},
		{"bad set flag", func(r *policy.Ruleset) {
			r.Chains[0].Rules = rules("-m set --match-set tabby-np-e4-a src,in -j ACCEPT")
		},
			"want src or dst for each of its dimensions"},
		{"no set flags", func(r *policy.Ruleset) { r.Chains[0].Rules = [][]string{{"-m", "set", "--match-set", "tabby-np-p4-a"}} },
			"with 0 flag(s)"},
		{"bad iface member", func(r *policy.Ruleset) { r.Sets[2].Members = []string{"10.0.0.1"} }, "member \"10.0.0.1\": want address[/prefix],interface"},
		{"empty rule", func(r *policy.Ruleset) { r.Chains[0].Rules = [][]string{{}} }, "empty rule"},
		{"empty argument", func(r *policy.Ruleset) { r.Chains[0].Rules = [][]string{{"-j", ""}} }, "argument 2 is empty"},
		{"newline", func(r *policy.Ruleset) {
			r.Chains[0].Rules = [][]string{{"-m", "comment", "--comment", "a\nb", "-j", "ACCEPT"}}
		}, "line break"},
		{"family flag", func(r *policy.Ruleset) { r.Chains[0].Rules = rules("-4 -j ACCEPT") }, "Chain.Family"},
		{"jump chain", func(r *policy.Ruleset) { r.Jumps[0].Chain = "PREROUTING" }, "not one of INPUT, FORWARD, OUTPUT"},
		{"jump target", func(r *policy.Ruleset) { r.Jumps[0].Rule = rules("-j ACCEPT")[0] }, "not a chain starting with TABBY-NP-"},
		{"jump to a missing chain", func(r *policy.Ruleset) { r.Jumps[0].Rule = rules("-j TABBY-NP-GONE")[0] }, "TABBY-NP-GONE"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var rs *policy.Ruleset
			if c.break_ != nil {
				rs = good()
				c.break_(rs)
			}
			_, err := validate(rs, [2]bool{}, nil)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("validate = %v, want an error containing %q", err, c.want)
			}
		})
	}
}

func TestOurs(t *testing.T) {
	for line, want := range map[string]bool{
		`-m comment --comment "tabby:network-policy" -j TABBY-NP-FORWARD`: true,
		`-i tab+ -g TABBY-NP-E-ABC`:                                       true,
		`-m comment --comment "-j TABBY-NP-FORWARD" -j ACCEPT`:            false,
		`-j TABBY-ROUTING`: false,
		`-j DOCKER-USER`:   false,
	} {
		if got := ours(line); got != want {
			t.Errorf("ours(%s) = %v, want %v", line, got, want)
		}
	}
}

func TestParseFilter(t *testing.T) {
	save := `# Generated by iptables-save
*nat
:POSTROUTING ACCEPT [0:0]
:TABBY-NP-NOT-FILTER - [0:0]
-A POSTROUTING -j TABBY-NAT-OUTGOING
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [3:180]
:OUTPUT ACCEPT [0:0]
:TABBY-NP-EMPTY - [0:0]
:TABBY-NP-FORWARD - [0:0]
:TABBY-ROUTING - [0:0]
-A FORWARD -m comment --comment "tabby:network-policy" -j TABBY-NP-FORWARD
-A FORWARD -j DOCKER-USER
-A TABBY-NP-FORWARD -i tab+ -j TABBY-NP-POD
-A TABBY-ROUTING -j RETURN
COMMIT
`
	ft := ofFilter(netfilter.ParseSave(save, "filter"))
	want := filterTable{
		chains:   map[string][]string{"TABBY-NP-EMPTY": {}, "TABBY-NP-FORWARD": {"-i tab+ -j TABBY-NP-POD"}},
		builtins: map[string][]string{"FORWARD": {`-m comment --comment "tabby:network-policy" -j TABBY-NP-FORWARD`, "-j DOCKER-USER"}},
	}
	if diff := cmp.Diff(want, ft, cmp.AllowUnexported(filterTable{})); diff != "" {
		t.Errorf("ofFilter (-want +got):\n%s", diff)
	}
}

func TestHashSize(t *testing.T) {
	for n, want := range map[int]int{0: 64, 256: 64, 257: 64, 1000: 256, 5000: 2048, 1 << 20: 65536} {
		if got := hashSize(n); got != want {
			t.Errorf("hashSize(%d) = %d, want %d", n, got, want)
		}
	}
}

// TestPlanSetsRemovalOrder: additions go in set name order, removals in
// reverse, so a pod moving from one dispatch bucket's signature to
// another's is in a signature's set whenever it is in that signature's
// bucket's set (the bucket sets, 'f' and 't', sort after 'e' and 'i'; see
// policy.DispatchBuckets).
func TestPlanSetsRemovalOrder(t *testing.T) {
	const sig1, sig2 = policy.SetPrefix + "i4-aaaa", policy.SetPrefix + "i4-bbbb"
	const bucket1, bucket2 = policy.SetPrefix + "t4-aaaa", policy.SetPrefix + "t4-bbbb"
	const m = "10.0.0.5,tab0123456789a"
	set := func(name string, members ...string) policy.Set {
		return policy.Set{Name: name, Type: policy.SetHashNetIface, Family: policy.FamilyIPv4, Members: members}
	}
	// The pod moves from sig1 (bucket1) to sig2 (bucket2).
	rs := &policy.Ruleset{Sets: []policy.Set{set(sig1), set(sig2, m), set(bucket1), set(bucket2, m)}}
	d, err := validate(rs, [2]bool{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kernel := func(members ...string) *netfilter.Set {
		s := &netfilter.Set{Type: string(policy.SetHashNetIface), Family: "inet", Members: map[string]bool{}}
		for _, x := range members {
			s.Members[x] = false
		}
		return s
	}
	a := &Applier{log: slog.New(slog.DiscardHandler), sets: map[string]*netfilter.Set{
		sig1: kernel(m), sig2: kernel(), bucket1: kernel(m), bucket2: kernel(),
	}}
	p := a.planSets(d)
	order := func(b *netfilter.SetBatch) []string {
		var out []string
		for line := range strings.Lines(b.String()) {
			out = append(out, strings.TrimSpace(line))
		}
		return out
	}
	if got, want := order(&p.adds), []string{"add " + sig2 + " " + m, "add " + bucket2 + " " + m}; !slices.Equal(got, want) {
		t.Errorf("additions %q; want %q", got, want)
	}
	if got, want := order(&p.dels), []string{"del " + bucket1 + " " + m, "del " + sig1 + " " + m}; !slices.Equal(got, want) {
		t.Errorf("removals %q; want %q", got, want)
	}
}
