package routing

import (
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	v1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/internal/testnet"
)

// The rules of others (kube-proxy, Docker, the admin) that every sync
// must leave in place and in order.
var foreignRules = [][]string{
	{"iptables", "-t", "nat", "-N", "KUBE-POSTROUTING"},
	{"iptables", "-t", "nat", "-A", "KUBE-POSTROUTING", "-m", "mark", "--mark", "0x4000/0x4000", "-j", "MASQUERADE"},
	{"iptables", "-t", "nat", "-A", "POSTROUTING", "-m", "comment", "--comment", "kubernetes postrouting rules", "-j", "KUBE-POSTROUTING"},
	{"iptables", "-t", "nat", "-A", "POSTROUTING", "-s", "172.17.0.0/16", "!", "-o", "docker0", "-j", "MASQUERADE"},
	{"iptables", "-t", "nat", "-A", "POSTROUTING", "-d", "192.0.2.1/32", "-j", "ACCEPT"},
	{"iptables", "-t", "filter", "-A", "FORWARD", "-s", "10.99.0.0/16", "-j", "ACCEPT"},
	{"ip6tables", "-t", "nat", "-A", "POSTROUTING", "-s", "fd00:99::/64", "-j", "MASQUERADE"},
	{"ipset", "create", "admin-set", "hash:ip"},
}

// others is everything in the node's iptables and ipsets that is not tabby's.
func others(t *testing.T, n *node) string {
	t.Helper()
	var b strings.Builder
	for _, c := range [][]string{
		{"iptables", "-t", "nat", "-S"}, {"iptables", "-t", "filter", "-S"},
		{"ip6tables", "-t", "nat", "-S"}, {"ip6tables", "-t", "filter", "-S"},
		{"ipset", "list", "-n"},
	} {
		for _, l := range strings.Split(n.ns.Exec(c[0], c[1:]...), "\n") {
			if !strings.Contains(l, NATChain) && !strings.HasPrefix(l, "tabby-") {
				b.WriteString(l + "\n")
			}
		}
	}
	return b.String()
}

// masqueraded is how many packets the MASQUERADE rule of NATChain matched.
func masqueraded(t *testing.T, n *node, cmd string) int {
	t.Helper()
	out := n.ns.Exec(cmd, "-t", "nat", "-L", NATChain, "-n", "-v", "-x")
	m := regexp.MustCompile(`(?m)^\s*(\d+)\s+\d+\s+MASQUERADE`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no MASQUERADE rule in %s:\n%s", NATChain, out)
	}
	v, _ := strconv.Atoi(m[1])
	return v
}

func natPools(nat bool, extra ...v1.IPPool) []v1.IPPool {
	return append([]v1.IPPool{
		ippool("v4", "10.244.0.0/16", "", "", nat),
		ippool("v6", "fd00:10:244::/56", "", "", nat),
	}, extra...)
}

// NAT outgoing: pods of natOutgoing pools reach a host outside every pool
// (which has no route back to them) masqueraded, pod-to-pod traffic is not
// masqueraded, other users' rules, chains and sets survive every sync in
// their order, tampering is repaired, and turning natOutgoing off (or
// Cleanup) removes tabby's chain, jumps and sets.
func TestApplyNATOutgoing(t *testing.T) {
	l := newLab(t, 1)
	n1, n2 := l.addNode(1, 1), l.addNode(2, 1)
	p1, p1b, p2 := n1.addPod(t, 10), n1.addPod(t, 11), n2.addPod(t, 10)
	ext, _, _ := l.attach("outside", 1, 100) // 192.168.1.100, fd00:1::100
	_ = ext
	for _, c := range foreignRules {
		n1.ns.Exec(c[0], c[1:]...)
	}
	foreign := others(t, n1)
	mustContain(t, "the rules before tabby", foreign, "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING", "admin-set")

	// Without natOutgoing there is nothing of tabby's, and the outside
	// host cannot answer the pod.
	l.applyAll(natPools(false)...)
	if got := others(t, n1); got != foreign {
		t.Errorf("Apply without NAT changed others' rules:\n%s\nwant\n%s", got, foreign)
	}
	mustNotContain(t, "node1's nat table", n1.ns.Exec("iptables", "-t", "nat", "-S"), NATChain)
	if err := testnet.Ping(p1.ns, addr("192.168.1.100").AsSlice()); err == nil {
		t.Fatal("the outside host answered a pod without NAT: the test cannot tell masquerading apart")
	}

	// natOutgoing on: sets, chain, jump first in POSTROUTING.
	st := n1.apply(t, Desired(l.inputs(n1, natPools(true)...)))
	if st.NATRules != (Counts{Added: 4}) || st.SetMembers != (Counts{Added: 8}) {
		t.Errorf("turning NAT on: rules %+v (want 4 added: chain and jump of each family), set members %+v (want 4 sets and 4 members added)", st.NATRules, st.SetMembers)
	}
	nat4 := n1.ns.Exec("iptables", "-t", "nat", "-S")
	mustContain(t, "node1's nat table", nat4,
		"-A POSTROUTING -m comment --comment \"tabby:nat-outgoing\" -j TABBY-NAT-OUTGOING\n-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\"",
		"-A TABBY-NAT-OUTGOING -m set --match-set tabby-nat-pools src -m set ! --match-set tabby-masq-pools dst -j MASQUERADE")
	mustContain(t, "node1's ip6tables nat table", n1.ns.Exec("ip6tables", "-t", "nat", "-S"),
		"-A TABBY-NAT-OUTGOING -m set --match-set tabby-nat-pools-v6 src -m set ! --match-set tabby-masq-pools-v6 dst -j MASQUERADE")
	mustContain(t, "node1's ipsets", n1.ns.Exec("ipset", "save"),
		"add tabby-masq-pools 10.244.0.0/16", "add tabby-nat-pools 10.244.0.0/16",
		"add tabby-masq-pools-v6 fd00:10:244::/56", "add tabby-nat-pools-v6 fd00:10:244::/56")
	if got := others(t, n1); got != foreign {
		t.Errorf("turning NAT on changed others' rules:\n%s\nwant\n%s", got, foreign)
	}

	ping(t, p1, addr("192.168.1.100"))
	ping(t, p1, addr("fd00:1::100"))
	m4, m6 := masqueraded(t, n1, "iptables"), masqueraded(t, n1, "ip6tables")
	if m4 < 1 || m6 < 1 {
		t.Errorf("masqueraded %d IPv4 and %d IPv6 packets; want at least one each", m4, m6)
	}
	// Pod to pod, across nodes and on the node: not masqueraded.
	for _, dst := range []*pod{p2, p1b} {
		ping(t, p1, dst.v4)
		ping(t, p1, dst.v6)
	}
	if a, b := masqueraded(t, n1, "iptables"), masqueraded(t, n1, "ip6tables"); a != m4 || b != m6 {
		t.Errorf("pod-to-pod traffic was masqueraded (%d IPv4, %d IPv6 packets)", a-m4, b-m6)
	}

	// Again: nothing changes.
	s1 := Desired(l.inputs(n1, natPools(true)...))
	before := snapshot(t, n1.ns)
	if st := n1.apply(t, s1); st.Changed() != 0 {
		t.Errorf("second Apply changed %d things: %+v", st.Changed(), st)
	}
	sameSnapshot(t, "the second Apply", before, snapshot(t, n1.ns))

	// Tampering: the jump deleted, a rule added to tabby's chain, a member
	// too many and one missing. One Apply repairs it.
	for _, c := range [][]string{
		{"iptables", "-t", "nat", "-D", "POSTROUTING", "-m", "comment", "--comment", "tabby:nat-outgoing", "-j", NATChain},
		{"iptables", "-t", "nat", "-A", NATChain, "-j", "RETURN"},
		{"ipset", "add", SetAllPools, "10.200.0.0/16"},
		{"ipset", "del", SetNATPools, "10.244.0.0/16"},
	} {
		n1.ns.Exec(c[0], c[1:]...)
	}
	st = n1.apply(t, s1)
	if st.NATRules != (Counts{Added: 1, Updated: 1, Unchanged: 2}) || st.SetMembers != (Counts{Added: 1, Removed: 1, Unchanged: 3}) {
		t.Errorf("repairing tampering: rules %+v, set members %+v", st.NATRules, st.SetMembers)
	}
	sameSnapshot(t, "tampering and its repair", before, snapshot(t, n1.ns))

	// A new pool without natOutgoing joins the masq-pools set only.
	st = n1.apply(t, Desired(l.inputs(n1, natPools(true, ippool("svc", "10.96.0.0/12", "", "", false))...)))
	if st.SetMembers != (Counts{Added: 1, Unchanged: 4}) || st.NATRules.Changed() != 0 {
		t.Errorf("adding a pool: set members %+v, rules %+v", st.SetMembers, st.NATRules)
	}
	mustContain(t, "node1's ipsets", n1.ns.Exec("ipset", "save"), "add tabby-masq-pools 10.96.0.0/12")
	mustNotContain(t, "node1's ipsets", n1.ns.Exec("ipset", "save"), "add tabby-nat-pools 10.96.0.0/12")

	// natOutgoing off: tabby's chain, jumps and sets go; the rest stays.
	st = n1.apply(t, Desired(l.inputs(n1, natPools(false)...)))
	if st.NATRules != (Counts{Removed: 4}) || st.SetMembers != (Counts{Removed: 4}) {
		t.Errorf("turning NAT off: rules %+v, sets %+v; want 4 and 4 removed", st.NATRules, st.SetMembers)
	}
	if got := others(t, n1); got != foreign {
		t.Errorf("turning NAT off changed others' rules:\n%s\nwant\n%s", got, foreign)
	}
	mustNotContain(t, "node1's nat tables", n1.ns.Exec("iptables-save")+n1.ns.Exec("ip6tables-save")+n1.ns.Exec("ipset", "list", "-n"), NATChain, "tabby")
}

// Cleanup removes everything tabby made on a node (routes, tabby.vxlan,
// NAT chains, jumps and sets) and nothing else; a second Cleanup is a no-op.
func TestCleanup(t *testing.T) {
	l := newLab(t, 1)
	n1, n2 := l.addNode(1, 1), l.addNode(2, 1)
	n1.addPod(t, 10)
	_ = n2
	for _, c := range foreignRules {
		n1.ns.Exec(c[0], c[1:]...)
	}
	foreign, routes := others(t, n1), notOurs(t, n1)
	pools := []v1.IPPool{ippool("v4", "10.244.0.0/16", "", v1.EncapAlways, true), ippool("v6", "fd00:10:244::/56", "", v1.EncapCrossSubnet, true)}
	l.applyAll(pools...)
	mustContain(t, "node1 with tabby", n1.ns.Exec("ip", "link")+n1.ns.Exec("iptables", "-t", "nat", "-S")+ourRoutes(t, n1.ns),
		VXLANDevice, NATChain, "proto 81")

	for range 2 {
		n1.ns.Must(n1.applier.Cleanup)
		all := n1.ns.Exec("ip", "-d", "link") + n1.ns.Exec("iptables-save") + n1.ns.Exec("ip6tables-save") + n1.ns.Exec("ipset", "list", "-n") + ourRoutes(t, n1.ns)
		mustNotContain(t, "node1 after Cleanup", all, VXLANDevice, "tabby-", NATChain, "proto 81")
		if got := others(t, n1); got != foreign {
			t.Errorf("Cleanup changed others' rules:\n%s\nwant\n%s", got, foreign)
		}
		if got := notOurs(t, n1); got != routes {
			t.Errorf("Cleanup changed others' routes:\n%s\nwant\n%s", got, routes)
		}
	}
}

// On a host whose rules are in iptables-legacy (kube-proxy's here), NAT
// outgoing goes into legacy too, never into nft, and Cleanup takes it out
// of legacy: the backend is detected from what the node already has.
func TestApplyNATOnLegacyHost(t *testing.T) {
	l := newLab(t, 1)
	n1 := l.addNode(1, 1)
	for _, c := range [][]string{
		{"iptables-legacy", "-t", "nat", "-N", "KUBE-POSTROUTING"},
		{"iptables-legacy", "-t", "nat", "-A", "KUBE-POSTROUTING", "-m", "mark", "--mark", "0x4000/0x4000", "-j", "MASQUERADE"},
		{"iptables-legacy", "-t", "nat", "-A", "POSTROUTING", "-m", "comment", "--comment", "kubernetes postrouting rules", "-j", "KUBE-POSTROUTING"},
		{"ip6tables-legacy", "-t", "nat", "-A", "POSTROUTING", "-s", "fd00:99::/64", "-j", "MASQUERADE"},
	} {
		if _, err := exec.LookPath(c[0]); err != nil {
			t.Skipf("SKIPPING: %s is not installed", c[0])
		}
		n1.ns.Exec(c[0], c[1:]...)
	}
	n1.apply(t, Desired(l.inputs(n1, natPools(true)...)))
	legacy4, legacy6 := n1.ns.Exec("iptables-legacy-save", "-t", "nat"), n1.ns.Exec("ip6tables-legacy-save", "-t", "nat")
	mustContain(t, "node1's legacy nat table", legacy4,
		"-A POSTROUTING -m comment --comment \"tabby:nat-outgoing\" -j TABBY-NAT-OUTGOING\n-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\"",
		"-A TABBY-NAT-OUTGOING -m set --match-set tabby-nat-pools src")
	mustContain(t, "node1's legacy ip6tables nat table", legacy6, "-A TABBY-NAT-OUTGOING -m set --match-set tabby-nat-pools-v6 src")
	mustNotContain(t, "node1's nft tables", n1.ns.Exec("iptables-nft-save")+n1.ns.Exec("ip6tables-nft-save"), NATChain)

	n1.ns.Must(n1.applier.Cleanup)
	mustNotContain(t, "node1's legacy tables after Cleanup", n1.ns.Exec("iptables-legacy-save")+n1.ns.Exec("ip6tables-legacy-save"), NATChain)
	mustContain(t, "node1's legacy nat table after Cleanup", n1.ns.Exec("iptables-legacy-save", "-t", "nat"), "-j KUBE-POSTROUTING")
}

// An upgraded tabbyd adopts NAT outgoing as the tabbyd before the shared
// netfilter engine left it: sets made over netlink (revision 0, where the
// ipset program makes the newest revision), the chain written by its own
// iptables-restore, the jump inserted by go-iptables. Nothing is rewritten
// or recreated: the nat tables and the sets read back byte for byte.
func TestApplyNATAdoptsOlderTabbyd(t *testing.T) {
	l := newLab(t, 1)
	n1 := l.addNode(1, 1)
	n1.ns.Must(func() error {
		for _, s := range []struct {
			name   string
			family uint8
			cidr   string
		}{
			{SetAllPools, unix.AF_INET, "10.244.0.0/16"}, {SetNATPools, unix.AF_INET, "10.244.0.0/16"},
			{SetAllPools + SetSuffixV6, unix.AF_INET6, "fd00:10:244::/56"}, {SetNATPools + SetSuffixV6, unix.AF_INET6, "fd00:10:244::/56"},
		} {
			if err := netlink.IpsetCreate(s.name, "hash:net", netlink.IpsetCreateOptions{Family: s.family}); err != nil {
				return fmt.Errorf("creating %s over netlink: %w", s.name, err)
			}
			p := netip.MustParsePrefix(s.cidr)
			if err := netlink.IpsetAdd(s.name, &netlink.IPSetEntry{IP: p.Addr().AsSlice(), CIDR: uint8(p.Bits())}); err != nil {
				return fmt.Errorf("adding %s to %s: %w", p, s.name, err)
			}
		}
		return nil
	})
	for _, c := range []struct{ cmd, v6 string }{{"iptables", ""}, {"ip6tables", SetSuffixV6}} {
		restore := exec.Command(c.cmd+"-restore", "--noflush")
		restore.Stdin = strings.NewReader("*nat\n:" + NATChain + " - [0:0]\n-F " + NATChain + "\n-A " + NATChain +
			" -m set --match-set " + SetNATPools + c.v6 + " src -m set ! --match-set " + SetAllPools + c.v6 + " dst -j MASQUERADE\nCOMMIT\n")
		n1.ns.Must(func() error {
			if out, err := restore.CombinedOutput(); err != nil {
				return fmt.Errorf("%s-restore: %v: %s", c.cmd, err, out)
			}
			return nil
		})
		n1.ns.Exec(c.cmd, "-t", "nat", "-I", "POSTROUTING", "1", "-m", "comment", "--comment", "tabby:nat-outgoing", "-j", NATChain)
	}
	kernel := func() string {
		return n1.ns.Exec("iptables", "-t", "nat", "-S") + n1.ns.Exec("ip6tables", "-t", "nat", "-S") + n1.ns.Exec("ipset", "list")
	}
	before := kernel()
	mustContain(t, "the sets an older tabbyd made", before, "Revision: 0")

	st := n1.apply(t, Desired(l.inputs(n1, natPools(true)...)))
	if st.NATRules != (Counts{Unchanged: 4}) || st.SetMembers != (Counts{Unchanged: 4}) {
		t.Errorf("adopting an older tabbyd's NAT: rules %+v (want 4 unchanged), set members %+v (want 4 unchanged)", st.NATRules, st.SetMembers)
	}
	sameSnapshot(t, "adopting an older tabbyd's NAT", before, kernel())
}
