package policy

import (
	"fmt"
	"math/rand"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func deniedInput(log *DeniedLog) *Input {
	pod := func(name, ip, iface string, kv ...string) Endpoint {
		l := ml(kv...).MatchLabels
		return Endpoint{Pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name, Labels: l}},
			IPs: []netip.Addr{netip.MustParseAddr(ip)}, HostIface: iface}
	}
	return &Input{
		Node: "n1",
		Endpoints: []Endpoint{
			pod("db", "10.0.0.1", "tab00000000001", "app", "db"),
			pod("web", "10.0.0.2", "tab00000000002", "app", "web"),
			pod("other", "10.0.0.3", "tab00000000003"),
		},
		Policies: nps(
			pol("shop", "db-from-web", ml("app", "db"), ingress(peers{selPeer(mlp("app", "web"))}, num("TCP", 5432))),
			pol("shop", "default-deny", ml(), types(tIn)),
			pol("shop", "web-egress", ml("app", "web"), types(tEg), egress(peers{selPeer(mlp("app", "db"))})),
		),
		DeniedLog: log,
	}
}

// TestDeniedLogRules: with DeniedLog, each per-pod chain logs just before
// its DROP with the prefix of its Denial, which names the policies of the
// chain; nothing else changes.
func TestDeniedLogRules(t *testing.T) {
	off := Compile(deniedInput(nil))
	on := Compile(deniedInput(&DeniedLog{Group: 7, PerSource: 3}))
	if len(off.Denials) != 0 {
		t.Errorf("Denials without the log: %v", off.Denials)
	}
	byChain := map[string]Denial{}
	for _, d := range on.Denials {
		byChain[d.Chain] = d
		if len(d.Prefix) > 63 || !strings.HasPrefix(d.Prefix, DeniedLogPrefix) {
			t.Errorf("prefix %q: must start with %q and fit NFLOG's 63 bytes", d.Prefix, DeniedLogPrefix)
		}
	}
	want := map[string][]string{ // direction -> policies of each chain
		"ingress": {"shop/db-from-web,shop/default-deny", "shop/default-deny"},
		"egress":  {"shop/web-egress"},
	}
	got := map[string][]string{}
	for _, d := range on.Denials {
		got[d.Direction] = append(got[d.Direction], strings.Join(d.Policies, ","))
	}
	for _, v := range got {
		slices.Sort(v)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Denials (-want +got):\n%s", diff)
	}
	if len(on.Chains) != len(off.Chains) {
		t.Fatalf("%d chains with the log, %d without", len(on.Chains), len(off.Chains))
	}
	logged := 0
	for i, c := range on.Chains {
		rules := c.Rules
		if d, ok := byChain[c.Name]; ok {
			n := len(rules)
			logRule := strings.Join(rules[n-2], " ")
			if !strings.Contains(logRule, "-j NFLOG --nflog-group 7 --nflog-prefix "+d.Prefix+" ") ||
				!strings.Contains(logRule, "--hashlimit-upto 3/sec") || !strings.Contains(logRule, "--hashlimit-mode srcip") {
				t.Errorf("%s %s: rule before the DROP is %q, want the NFLOG of %s", c.Family, c.Name, logRule, d.Prefix)
			}
			rules = slices.Delete(slices.Clone(rules), n-2, n-1)
			logged++
		}
		if diff := cmp.Diff(off.Chains[i].Rules, rules); diff != "" {
			t.Errorf("%s %s differs beyond its log rule (-off +on):\n%s", c.Family, c.Name, diff)
		}
	}
	// The pods are IPv4 only: their chains are in IPv4 alone.
	if logged != len(on.Denials) {
		t.Errorf("%d chains log, want one per Denial in the pods' family (%d)", logged, len(on.Denials))
	}
	if r := on.Denials[0].Reason(); !strings.Contains(r, "shop/") {
		t.Errorf("Reason %q names no policy", r)
	}
}

// TestDeniedLogUnlisted: with DenyUnlisted, the dispatch chains log what
// they drop (packets of interfaces tabbyd has not programmed) with the
// unlisted prefixes, whose Denials name no policy and say why; without
// the log, or without DenyUnlisted, nothing of it.
func TestDeniedLogUnlisted(t *testing.T) {
	in := deniedInput(&DeniedLog{})
	in.DenyUnlisted = true
	rs := Compile(in)
	want := map[string]string{ChainFromPod: UnlistedLogPrefix(true), ChainToPod: UnlistedLogPrefix(false)}
	for _, c := range rs.Chains {
		prefix, ok := want[c.Name]
		if !ok {
			continue
		}
		n := len(c.Rules)
		if n < 2 || !slices.Equal(c.Rules[n-1], []string{"-j", "DROP"}) ||
			!strings.Contains(strings.Join(c.Rules[n-2], " "), "-j NFLOG --nflog-group 100 --nflog-prefix "+prefix+" ") {
			t.Errorf("%s %s ends %q, want the NFLOG of %s then DROP", c.Family, c.Name, c.Rules[max(0, n-2):], prefix)
		}
	}
	var unlisted []Denial
	for _, d := range rs.Denials {
		if len(d.Policies) == 0 {
			unlisted = append(unlisted, d)
		}
	}
	if diff := cmp.Diff(UnlistedDenials(), unlisted); diff != "" {
		t.Errorf("unlisted Denials (-want +got):\n%s", diff)
	}
	if r := unlisted[0].Reason(); !strings.Contains(r, "not programmed by tabbyd") || !strings.Contains(r, "egress") {
		t.Errorf("Reason %q", r)
	}
	in.DenyUnlisted = false
	for _, d := range Compile(in).Denials {
		if len(d.Policies) == 0 {
			t.Errorf("Denial %+v without DenyUnlisted", d)
		}
	}
	in.DenyUnlisted, in.DeniedLog = true, nil
	for _, c := range Compile(in).Chains {
		for _, r := range c.Rules {
			if slices.Contains(r, "NFLOG") {
				t.Errorf("%s logs without DeniedLog: %q", c.Name, r)
			}
		}
	}
}

// TestDeniedLogLimitNames: the hashlimit tables' names change with the
// limits (the kernel keeps a table's first rate while any rule names it),
// and fit the kernel's 15 bytes.
func TestDeniedLogLimitNames(t *testing.T) {
	names := func(l DeniedLog) (src, all string) {
		rs := Compile(deniedInput(&l))
		for _, c := range rs.Chains {
			if n := len(c.Rules); n >= 2 && slices.Contains(c.Rules[n-2], "NFLOG") {
				r := c.Rules[n-2]
				var got []string
				for i, a := range r {
					if a == "--hashlimit-name" {
						got = append(got, r[i+1])
					}
				}
				return got[0], got[1]
			}
		}
		t.Fatal("no log rule")
		return "", ""
	}
	s1, a1 := names(DeniedLog{})
	s2, a2 := names(DeniedLog{PerSource: 11})
	s3, a3 := names(DeniedLog{PerNode: 5000})
	for _, n := range []string{s1, a1, s2, a2, s3, a3} {
		if len(n) > 15 {
			t.Errorf("hashlimit name %q is over 15 bytes", n)
		}
	}
	if s1 == s2 || a1 != a2 || s1 != s3 || a1 == a3 || s1 == a1 {
		t.Errorf("names by limits: default %s %s, per source 11 %s %s, per node 5000 %s %s", s1, a1, s2, a2, s3, a3)
	}
}

// TestDeniedLogRandomWorlds: with the log on, random worlds give every
// connection the verdict of the reference semantics (the log rule decides
// nothing), and every per-pod chain logs before its DROP.
func TestDeniedLogRandomWorlds(t *testing.T) {
	n := 100
	if testing.Short() {
		n = 20
	}
	denials := 0
	for seed := 0; seed < n; seed++ {
		g := &gen{c: &chooser{r: rand.New(rand.NewSource(int64(seed)))}, valid: true}
		w := g.world()
		w.deniedLog = &DeniedLog{}
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			compare(t, w)
			for _, node := range w.nodes {
				rs := Compile(w.input(node))
				if err := denialsLogged(rs); err != nil {
					t.Fatalf("node %s: %v", node, err)
				}
				denials += len(rs.Denials)
			}
		})
	}
	if denials < n {
		t.Errorf("%d worlds made only %d per-pod chains: the log was hardly tested", n, denials)
	}
	t.Logf("%d worlds, %d per-pod chains logging", n, denials)
}

// denialsLogged checks that each Denial's chain logs with its prefix just
// before its final DROP, in both families.
func denialsLogged(rs *Ruleset) error {
	logged, exist := map[string]int{}, map[string]int{}
	for _, c := range rs.Chains {
		exist[c.Name]++
		logs := false
		for i, r := range c.Rules {
			j := slices.Index(r, "NFLOG")
			if j < 0 {
				continue
			}
			// The log rule's match (before its hashlimits) and then
			// the same match dropping.
			match := r[:slices.Index(r, "hashlimit")-1]
			if i+1 == len(c.Rules) || !slices.Equal(c.Rules[i+1], append(slices.Clone(match), "-j", "DROP")) {
				return fmt.Errorf("%s: the log rule %q is not followed by the DROP of its match", c.Name, r)
			}
			logs = true
		}
		if logs {
			logged[c.Name]++
		}
	}
	for _, d := range rs.Denials {
		if strings.HasPrefix(d.Prefix, DeniedLogPrefix+"C") && logged[d.Chain] >= 1 {
			continue // a ClusterNetworkPolicy's peers may all be of one family
		}
		// A per-pod chain is in the families its pods have addresses in.
		if logged[d.Chain] == 0 || logged[d.Chain] != exist[d.Chain] {
			return fmt.Errorf("chain %s of %s logs in %d families, want the %d it is in", d.Chain, d.Prefix, logged[d.Chain], exist[d.Chain])
		}
	}
	if len(logged) != len(rs.Denials) {
		return fmt.Errorf("%d chains log, %d Denials", len(logged), len(rs.Denials))
	}
	return nil
}
