package apply_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/internal/iptbackend"
	"github.com/tabbynet/tabby/policy"
	"github.com/tabbynet/tabby/policy/apply"
)

// foreign are the rules of the node's other users, installed before tabby
// runs: kubelet and kube-proxy (iptables mode), Docker (with FORWARD's
// policy DROP and an ipset of the admin's in DOCKER-USER), and tabby's own
// routing (TABBY-NAT-OUTGOING in nat, its tabby-nat-pools set, and a
// TABBY- filter chain that is not a policy chain). Every sync must leave
// all of it byte for byte as it was, in its order.
var foreign = [][]string{
	{"ipset", "create", "admin-allow", "hash:net"},
	{"ipset", "add", "admin-allow", "203.0.113.0/24"},
	{"ipset", "create", "tabby-nat-pools", "hash:net"},
	{"ipset", "add", "tabby-nat-pools", "10.244.0.0/16"},

	// kubelet
	{"ipt", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT"},
	{"ipt", "-t", "mangle", "-N", "KUBE-KUBELET-CANARY"},
	{"ipt", "-N", "KUBE-FIREWALL"},
	{"ipt", "-A", "KUBE-FIREWALL", "!", "-s", "127.0.0.0/8", "-d", "127.0.0.0/8", "-m", "comment", "--comment", "block incoming localnet connections", "-m", "conntrack", "!", "--ctstate", "RELATED,ESTABLISHED,DNAT", "-j", "DROP"},
	{"ipt", "-A", "INPUT", "-j", "KUBE-FIREWALL"},
	{"ipt", "-A", "OUTPUT", "-j", "KUBE-FIREWALL"},
	// kube-proxy
	{"ipt", "-N", "KUBE-PROXY-FIREWALL"},
	{"ipt", "-N", "KUBE-NODEPORTS"},
	{"ipt", "-N", "KUBE-EXTERNAL-SERVICES"},
	{"ipt", "-N", "KUBE-SERVICES"},
	{"ipt", "-N", "KUBE-FORWARD"},
	{"ipt", "-I", "INPUT", "1", "-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "kubernetes load balancer firewall", "-j", "KUBE-PROXY-FIREWALL"},
	{"ipt", "-I", "INPUT", "2", "-m", "comment", "--comment", "kubernetes health check service ports", "-j", "KUBE-NODEPORTS"},
	{"ipt", "-I", "INPUT", "3", "-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "kubernetes externally-visible service portals", "-j", "KUBE-EXTERNAL-SERVICES"},
	{"ipt", "-I", "FORWARD", "1", "-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "kubernetes load balancer firewall", "-j", "KUBE-PROXY-FIREWALL"},
	{"ipt", "-I", "FORWARD", "2", "-m", "comment", "--comment", "kubernetes forwarding rules", "-j", "KUBE-FORWARD"},
	{"ipt", "-I", "FORWARD", "3", "-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"},
	{"ipt", "-I", "OUTPUT", "1", "-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"},
	{"ipt", "-A", "KUBE-FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"},
	{"ipt", "-A", "KUBE-FORWARD", "-m", "comment", "--comment", "kubernetes forwarding rules", "-m", "mark", "--mark", "0x4000/0x4000", "-j", "ACCEPT"},
	{"ipt", "-A", "KUBE-FORWARD", "-m", "comment", "--comment", "kubernetes forwarding conntrack rule", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"},
	{"ipt", "-A", "KUBE-SERVICES", "-d", "10.96.0.10/32", "-p", "udp", "-m", "comment", "--comment", "kube-system/kube-dns:dns has no endpoints", "-m", "udp", "--dport", "53", "-j", "REJECT", "--reject-with", "icmp-port-unreachable"},
	{"ipt", "-t", "nat", "-N", "KUBE-SERVICES"},
	{"ipt", "-t", "nat", "-N", "KUBE-POSTROUTING"},
	{"ipt", "-t", "nat", "-N", "KUBE-MARK-MASQ"},
	{"ipt", "-t", "nat", "-N", "KUBE-SVC-NPX46M4PTMTKRN6Y"},
	{"ipt", "-t", "nat", "-N", "KUBE-SEP-QKSB7HUW4Z3NWAKL"},
	{"ipt", "-t", "nat", "-A", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"},
	{"ipt", "-t", "nat", "-A", "OUTPUT", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"},
	{"ipt", "-t", "nat", "-A", "POSTROUTING", "-m", "comment", "--comment", "kubernetes postrouting rules", "-j", "KUBE-POSTROUTING"},
	{"ipt", "-t", "nat", "-A", "KUBE-MARK-MASQ", "-j", "MARK", "--set-xmark", "0x4000/0x4000"},
	{"ipt", "-t", "nat", "-A", "KUBE-POSTROUTING", "-m", "mark", "!", "--mark", "0x4000/0x4000", "-j", "RETURN"},
	{"ipt", "-t", "nat", "-A", "KUBE-POSTROUTING", "-j", "MARK", "--set-xmark", "0x4000/0x0"},
	{"ipt", "-t", "nat", "-A", "KUBE-POSTROUTING", "-m", "comment", "--comment", "kubernetes service traffic requiring SNAT", "-j", "MASQUERADE"},
	{"ipt", "-t", "nat", "-A", "KUBE-SERVICES", "-d", "10.96.0.1/32", "-p", "tcp", "-m", "comment", "--comment", "default/kubernetes:https cluster IP", "-m", "tcp", "--dport", "443", "-j", "KUBE-SVC-NPX46M4PTMTKRN6Y"},
	{"ipt", "-t", "nat", "-A", "KUBE-SVC-NPX46M4PTMTKRN6Y", "-m", "comment", "--comment", "default/kubernetes:https -> 192.168.1.2:6443", "-j", "KUBE-SEP-QKSB7HUW4Z3NWAKL"},
	{"ipt", "-t", "nat", "-A", "KUBE-SEP-QKSB7HUW4Z3NWAKL", "-p", "tcp", "-m", "tcp", "-j", "DNAT", "--to-destination", "192.168.1.2:6443"},
	// Docker
	{"ipt", "-P", "FORWARD", "DROP"},
	{"ipt", "-N", "DOCKER"},
	{"ipt", "-N", "DOCKER-USER"},
	{"ipt", "-N", "DOCKER-ISOLATION-STAGE-1"},
	{"ipt", "-N", "DOCKER-ISOLATION-STAGE-2"},
	{"ipt", "-I", "FORWARD", "1", "-j", "DOCKER-USER"},
	{"ipt", "-A", "FORWARD", "-j", "DOCKER-ISOLATION-STAGE-1"},
	{"ipt", "-A", "FORWARD", "-o", "docker0", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"},
	{"ipt", "-A", "FORWARD", "-o", "docker0", "-j", "DOCKER"},
	{"ipt", "-A", "FORWARD", "-i", "docker0", "!", "-o", "docker0", "-j", "ACCEPT"},
	{"ipt", "-A", "DOCKER-ISOLATION-STAGE-1", "-i", "docker0", "!", "-o", "docker0", "-j", "DOCKER-ISOLATION-STAGE-2"},
	{"ipt", "-A", "DOCKER-ISOLATION-STAGE-1", "-j", "RETURN"},
	{"ipt", "-A", "DOCKER-ISOLATION-STAGE-2", "-o", "docker0", "-j", "DROP"},
	{"ipt", "-A", "DOCKER-ISOLATION-STAGE-2", "-j", "RETURN"},
	{"ipt", "-A", "DOCKER-USER", "-m", "set", "--match-set", "admin-allow", "src", "-j", "ACCEPT"},
	{"ipt", "-A", "DOCKER-USER", "-j", "RETURN"},
	{"ipt", "-t", "nat", "-N", "DOCKER"},
	{"ipt", "-t", "nat", "-A", "PREROUTING", "-m", "addrtype", "--dst-type", "LOCAL", "-j", "DOCKER"},
	{"ipt", "-t", "nat", "-A", "POSTROUTING", "-s", "172.17.0.0/16", "!", "-o", "docker0", "-j", "MASQUERADE"},
	// tabby's routing: not the policy's to touch
	{"ipt", "-t", "nat", "-N", "TABBY-NAT-OUTGOING"},
	{"ipt", "-t", "nat", "-A", "TABBY-NAT-OUTGOING", "-m", "set", "--match-set", "tabby-nat-pools", "src", "-j", "MASQUERADE"},
	{"ipt", "-t", "nat", "-I", "POSTROUTING", "1", "-m", "comment", "--comment", "tabby:nat-outgoing", "-j", "TABBY-NAT-OUTGOING"},
	{"ipt", "-N", "TABBY-ROUTING"},
	{"ipt", "-A", "TABBY-ROUTING", "-j", "RETURN"},
	{"ipt", "-A", "FORWARD", "-j", "TABBY-ROUTING"},
	// IPv6
	{"ip6t", "-P", "FORWARD", "DROP"},
	{"ip6t", "-N", "KUBE-FORWARD"},
	{"ip6t", "-A", "KUBE-FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP"},
	{"ip6t", "-A", "FORWARD", "-m", "comment", "--comment", "kubernetes forwarding rules", "-j", "KUBE-FORWARD"},
	{"ip6t", "-N", "DOCKER-USER"},
	{"ip6t", "-A", "DOCKER-USER", "-j", "RETURN"},
	{"ip6t", "-I", "FORWARD", "1", "-j", "DOCKER-USER"},
	{"ip6t", "-t", "nat", "-A", "POSTROUTING", "-s", "fd00:99::/64", "-j", "MASQUERADE"},
}

// leftovers are what an earlier tabbyd left behind and the first Apply
// must take away: a policy chain and its jump, a set only it named, and a
// set of a wanted name with the wrong type.
var leftovers = [][]string{
	{"ipset", "create", "tabby-np-zzz-old", "hash:ip"},
	{"ipset", "create", "tabby-np-p4-aaa", "hash:net"},
	{"ipset", "add", "tabby-np-p4-aaa", "10.9.0.0/16"},
	{"ipt", "-N", "TABBY-NP-OLD"},
	{"ipt", "-A", "TABBY-NP-OLD", "-m", "set", "--match-set", "tabby-np-zzz-old", "src", "-j", "DROP"},
	{"ipt", "-A", "TABBY-NP-OLD", "-m", "set", "--match-set", "tabby-np-p4-aaa", "src", "-j", "DROP"},
	{"ipt", "-A", "INPUT", "-j", "TABBY-NP-OLD"},
	{"ip6t", "-N", "TABBY-NP-OLD"},
	{"ip6t", "-I", "FORWARD", "2", "-j", "TABBY-NP-OLD"},
}

func r(s string) []string { return strings.Fields(s) }

// both returns chain name with rules in both families; fam4 and fam6 hold
// rules that differ (they name a family's sets).
func both(name string, rules ...string) []policy.Chain {
	var rs [][]string
	for _, s := range rules {
		rs = append(rs, r(s))
	}
	return []policy.Chain{{Name: name, Family: policy.FamilyIPv4, Rules: rs}, {Name: name, Family: policy.FamilyIPv6, Rules: rs}}
}

func chain(name, fam string, rules ...string) policy.Chain {
	c := policy.Chain{Name: name, Family: fam}
	for _, s := range rules {
		c.Rules = append(c.Rules, r(s))
	}
	return c
}

const mark = "-j MARK --set-xmark 0x10000/0x10000"

// ruleset1 is a small Ruleset in the compiler's layout: one pod (veth
// tab1234, dispatched by the hash:net,iface sets i4-aaaa and i6-aaaa)
// isolated for ingress by one policy allowing TCP 80 from pods of a set,
// from an ipBlock with an except, and a named port.
func ruleset1() *policy.Ruleset {
	rs := &policy.Ruleset{
		Sets: []policy.Set{
			{Name: "tabby-np-p4-aaa", Type: policy.SetHashIP, Family: policy.FamilyIPv4, Members: []string{"10.244.1.10", "10.244.2.11"}},
			{Name: "tabby-np-p6-aaa", Type: policy.SetHashIP, Family: policy.FamilyIPv6, Members: []string{"fd00:10:244::10"}},
			{Name: "tabby-np-n4-bbb", Type: policy.SetHashNet, Family: policy.FamilyIPv4, Members: []string{"10.1.2.3", "192.168.0.0/16", "192.168.5.0/24 nomatch"}},
			{Name: "tabby-np-q4-ccc", Type: policy.SetHashIPPort, Family: policy.FamilyIPv4, Members: []string{"10.244.1.10,tcp:8080"}},
			{Name: "tabby-np-i4-aaaa", Type: policy.SetHashNetIface, Family: policy.FamilyIPv4, Members: []string{"10.244.1.10,tab1234"}},
			{Name: "tabby-np-i6-aaaa", Type: policy.SetHashNetIface, Family: policy.FamilyIPv6, Members: []string{"fd00:10:244::10,tab1234"}},
		},
		Jumps: []policy.Jump{
			{Chain: "FORWARD", Rule: r("-m comment --comment tabby:network-policy -j TABBY-NP-FORWARD")},
			{Chain: "OUTPUT", Rule: r("-o tab+ -j TABBY-NP-POD")},
		},
	}
	rs.Chains = append(rs.Chains, both("TABBY-NP-FORWARD", "-i tab+ -j TABBY-NP-POD", "-o tab+ -j TABBY-NP-POD")...)
	rs.Chains = append(rs.Chains, both("TABBY-NP-POD",
		"-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
		"-m conntrack --ctstate INVALID -j DROP",
		"-i tab+ -j TABBY-NP-FROM-POD",
		"-o tab+ -j TABBY-NP-TO-POD",
		"-j MARK --set-xmark 0x0/0x10000",
		"-j ACCEPT")...)
	rs.Chains = append(rs.Chains, both("TABBY-NP-FROM-POD")...)
	rs.Chains = append(rs.Chains,
		chain("TABBY-NP-TO-POD", policy.FamilyIPv4, "-m set --match-set tabby-np-i4-aaaa dst,dst -g TABBY-NP-I-AAAA"),
		chain("TABBY-NP-TO-POD", policy.FamilyIPv6, "-m set --match-set tabby-np-i6-aaaa dst,dst -g TABBY-NP-I-AAAA"))
	rs.Chains = append(rs.Chains, both("TABBY-NP-I-AAAA",
		"-j MARK --set-xmark 0x0/0x10000",
		"-m comment --comment x/allow -j TABBY-NP-PI-AAAA",
		"-m mark --mark 0x10000/0x10000 -j RETURN",
		"-j DROP")...)
	rs.Chains = append(rs.Chains,
		chain("TABBY-NP-PI-AAAA", policy.FamilyIPv4,
			"-p tcp -m tcp --dport 80 -m set --match-set tabby-np-p4-aaa src "+mark,
			"-m set --match-set tabby-np-n4-bbb src "+mark,
			"-p tcp -m set --match-set tabby-np-q4-ccc dst,dst -m set --match-set tabby-np-p4-aaa src "+mark),
		chain("TABBY-NP-PI-AAAA", policy.FamilyIPv6,
			"-p tcp -m tcp --dport 80 -m set --match-set tabby-np-p6-aaa src "+mark))
	return rs
}

// ruleset2 changes only members: a pod moves from one set to another (out
// of p4-aaa, into n4-bbb), the except stops being one, a named port gains
// a pod, and so does the policy (a second local pod, veth tab5678).
func ruleset2() *policy.Ruleset {
	rs := ruleset1()
	rs.Sets[0].Members = []string{"10.244.1.10"}
	rs.Sets[2].Members = []string{"10.1.2.3", "10.244.2.11", "192.168.0.0/16", "192.168.5.0/24"}
	rs.Sets[3].Members = []string{"10.244.1.10,tcp:8080", "10.244.1.12,tcp:8080"}
	rs.Sets[4].Members = []string{"10.244.1.10,tab1234", "10.244.1.12,tab5678"}
	return rs
}

// ruleset3 changes chains: the policy allows port 81 instead of 80 and
// gains a second policy (a new chain, a changed one), egress dispatch and
// the named-port set go away (a stale chain and a stale set), and so does
// the OUTPUT jump.
func ruleset3() *policy.Ruleset {
	rs := ruleset2()
	rs.Sets = slices.Delete(rs.Sets, 3, 4)
	rs.Jumps = rs.Jumps[:1]
	var chains []policy.Chain
	for _, c := range rs.Chains {
		switch c.Name {
		case "TABBY-NP-FROM-POD":
			continue
		case "TABBY-NP-POD":
			c.Rules = [][]string{r("-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"), r("-o tab+ -j TABBY-NP-TO-POD"), r("-j ACCEPT")}
		case "TABBY-NP-I-AAAA":
			c.Rules = [][]string{r("-j MARK --set-xmark 0x0/0x10000"),
				r("-m comment --comment x/allow -j TABBY-NP-PI-AAAA"), r("-m mark --mark 0x10000/0x10000 -j RETURN"),
				r("-m comment --comment x/second -j TABBY-NP-PI-BBBB"), r("-m mark --mark 0x10000/0x10000 -j RETURN"),
				r("-j DROP")}
		case "TABBY-NP-PI-AAAA":
			if c.Family == policy.FamilyIPv4 {
				c = chain(c.Name, c.Family, "-p tcp -m tcp --dport 81 -m set --match-set tabby-np-p4-aaa src "+mark, "-m set --match-set tabby-np-n4-bbb src "+mark)
			} else {
				c = chain(c.Name, c.Family, "-p tcp -m tcp --dport 81 -m set --match-set tabby-np-p6-aaa src "+mark)
			}
		}
		chains = append(chains, c)
	}
	rs.Chains = append(chains, both("TABBY-NP-PI-BBBB", "-p udp -m udp --dport 53 "+mark)...)
	return rs
}

// TestApplySequence installs the node's other users' rules first, then
// applies a sequence of Rulesets (add, members only, chains, tampering,
// removal) and checks after every sync that everybody else's rules, chains,
// policies and sets are byte for byte what they were, and tabby's are
// exactly what the Ruleset says. Once per installed backend.
func TestApplySequence(t *testing.T) {
	needRoot(t)
	forEachBackend(t, testSequence)
}

func testSequence(t *testing.T, b iptbackend.Backend) {
	n := newNode(t, b, apply.Options{})
	for _, c := range foreign {
		n.sh(c...)
	}
	before := n.state()
	for _, want := range []string{
		`v4 -A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD`,
		"v4 :FORWARD DROP",
		"v4 -A TABBY-NAT-OUTGOING -m set --match-set tabby-nat-pools src -j MASQUERADE",
		"v4 -A FORWARD -j TABBY-ROUTING",
		"create admin-allow hash:net",
		"v6 -A FORWARD -j DOCKER-USER",
	} {
		if !strings.Contains(before.others, want) {
			t.Fatalf("the node's rules before tabby lack %q:\n%s", want, before.others)
		}
	}
	if before.ours != "\n" {
		t.Fatalf("tabby's policy state before tabby ran:\n%s", before.ours)
	}
	for _, c := range leftovers {
		n.sh(c...)
	}

	check := func(step string, rs *policy.Ruleset) {
		t.Helper()
		got := n.state()
		if diff := cmp.Diff(before.others, got.others); diff != "" {
			t.Errorf("%s changed others' rules or sets (-before +after):\n%s", step, diff)
		}
		if diff := cmp.Diff(expected(rs), got.ours); diff != "" {
			t.Errorf("%s: tabby's rules and sets are not the Ruleset's (-want +got):\n%s", step, diff)
		}
	}

	// 1. Add: everything created, the leftovers gone, the jumps first in
	// FORWARD and OUTPUT, above kube-proxy's and Docker's.
	st := n.apply(ruleset1())
	t.Logf("TMP restores %d", st.Restores)
	check("the first Apply", ruleset1())
	// The hash:net tabby-np-p4-aaa, named by a leftover rule, is replaced
	// in two passes through a stand-in set: 5 sets created, 3 deleted (the
	// stand-in too), the chain naming it written twice.
	if !st.KernelRead || st.SetsCreated != 7 || st.ChainsWritten != 13 || st.ChainsDeleted != 2 || st.SetsDeleted != 3 ||
		st.JumpsInserted != 4 || st.JumpsDeleted != 2 || st.MembersAdded != 11 || st.Restores != 5 {
		t.Errorf("the first Apply: %+v; want the kernel read, 7 sets created (6 and a stand-in for the hash:net), 13 chains written (12, one twice), "+
			"11 members added, 2 leftover chains, 3 sets (2 leftovers, the stand-in) and 2 jumps deleted, 4 jumps inserted, "+
			"in 5 restores (the jumps written with the chains; 10 when each built-in chain took a restore of its own)", st)
	}

	// 2. Members only: one ipset restore, no iptables-restore. Counters put
	// on a policy rule survive, which a rewrite of its chain would reset.
	n.sh("ipt", "-R", "TABBY-NP-I-AAAA", "4", "-c", "7", "700", "-j", "DROP")
	// (ip6tables-nft ignores -c with -R, so the counters are IPv4 only.)
	n.sh("ipt", "-R", "TABBY-NP-FORWARD", "1", "-c", "9", "900", "-i", "tab+", "-j", "TABBY-NP-POD")
	st = n.apply(ruleset2())
	check("a members-only Apply", ruleset2())
	if st.Restores != 0 || st.ChainsWritten != 0 || st.KernelRead || st.SetsUpdated != 4 || st.MembersAdded != 4 || st.MembersRemoved != 1 || st.Changed() != 4 {
		t.Errorf("a members-only Apply: %+v; want no iptables-restore, no kernel read, 4 sets updated with 4 members added (one a nomatch flip) and 1 removed", st)
	}
	mustCount(t, n, "ipt-save", "[7:700] -A TABBY-NP-I-AAAA -j DROP")
	mustCount(t, n, "ipt-save", "[9:900] -A TABBY-NP-FORWARD -i tab+ -j TABBY-NP-POD")

	// The same again: nothing at all.
	if st := n.apply(ruleset2()); st.Changed() != 0 || st.Restores != 0 || st.MembersAdded+st.MembersRemoved != 0 {
		t.Errorf("Apply of an unchanged Ruleset changed something: %+v", st)
	}
	// Reading the kernel again finds everything as the applier left it:
	// nothing is rewritten (what iptables prints for tabby's rules is
	// remembered, not guessed).
	n.a.Invalidate()
	if st := n.apply(ruleset2()); !st.KernelRead || st.Changed() != 0 || st.Restores != 0 {
		t.Errorf("Apply after re-reading the kernel changed something: %+v", st)
	}

	// 3. Chains: only the changed and new chains are written, the stale
	// chain, set and jump go; counters of untouched chains survive.
	st = n.apply(ruleset3())
	check("an Apply changing chains", ruleset3())
	if st.ChainsWritten != 8 || st.ChainsDeleted != 2 || st.SetsDeleted != 1 || st.JumpsDeleted != 2 || st.JumpsInserted != 0 || st.Restores != 6 {
		t.Errorf("an Apply changing chains: %+v; want 8 chains written (POD, I-AAAA, PI-AAAA, PI-BBBB in both families), 2 deleted (FROM-POD), "+
			"1 set deleted, the 2 OUTPUT jumps deleted, 6 restores (chains, OUTPUT jump, stale chains; per family)", st)
	}
	mustCount(t, n, "ipt-save", "[9:900] -A TABBY-NP-FORWARD -i tab+ -j TABBY-NP-POD")
	// What was read back after writing (with iptables -S) is what a kernel
	// read finds (iptables-save): nothing to rewrite.
	n.a.Invalidate()
	if st := n.apply(ruleset3()); !st.KernelRead || st.Changed() != 0 || st.Restores != 0 {
		t.Errorf("Apply after re-reading the kernel changed something: %+v", st)
	}

	// 4. Tampering with the jumps: deleted in IPv4, pushed down by a rule
	// inserted above it in IPv6 (as Docker does at its start). CheckJumps
	// puts them back on top, leaving others' rules in their order.
	n.sh("ipt", "-D", "FORWARD", "-m", "comment", "--comment", "tabby:network-policy", "-j", "TABBY-NP-FORWARD")
	n.sh("ip6t", "-I", "FORWARD", "1", "-s", "fd00:77::/64", "-j", "ACCEPT")
	before.others = strings.Replace(before.others, "v6 -A FORWARD -j DOCKER-USER", "v6 -A FORWARD -s fd00:77::/64 -j ACCEPT\nv6 -A FORWARD -j DOCKER-USER", 1)
	// A check cut short (the controller cancels it for a sync) reads and
	// repairs nothing, and says so; it does not fall back to a full apply.
	cut, cancel := context.WithCancel(context.Background())
	cancel()
	n.do(func() error {
		got, err := n.a.CheckJumps(cut)
		if got != 0 || !errors.Is(err, context.Canceled) {
			t.Errorf("CheckJumps with a cancelled context = %d, %v; want 0, context.Canceled", got, err)
		}
		return nil
	})
	if got := n.checkJumps(); got != 3 {
		t.Errorf("CheckJumps repaired %d jumps; want 3 (one inserted in IPv4, one moved in IPv6)", got)
	}
	check("CheckJumps", ruleset3())
	if got := n.checkJumps(); got != 0 {
		t.Errorf("a second CheckJumps repaired %d jumps; want 0", got)
	}

	// 4b. An audit reads the kernel and repairs what it finds; cut short
	// during the read, it changes nothing and says so.
	n.sh("ipt", "-F", "TABBY-NP-PI-AAAA")
	n.do(func() error {
		st, err := n.a.Audit(cut)
		if !errors.Is(err, context.Canceled) || st.Changed() != 0 {
			t.Errorf("Audit with a cancelled context = %+v, %v; want no change, context.Canceled", st, err)
		}
		return nil
	})
	n.do(func() error {
		st, err := n.a.Audit(context.Background())
		if err != nil || !st.KernelRead || st.ChainsWritten != 1 || st.Changed() != 1 {
			t.Errorf("Audit = %+v, %v; want the kernel read and the flushed chain written", st, err)
		}
		return nil
	})
	check("an audit", ruleset3())

	// 5. Tampering with chains, sets and a jump, found on the next kernel
	// read (Invalidate stands in for the resync period). The jump pushed
	// down is put back on top in the same restore as the IPv4 chain.
	n.sh("ipt", "-I", "FORWARD", "1", "-s", "10.77.0.0/16", "-j", "ACCEPT")
	lb := "v4 -A FORWARD -j DOCKER-USER" // the first of others' FORWARD rules
	if !strings.Contains(before.others, lb) {
		t.Fatalf("the node's rules lack %q:\n%s", lb, before.others)
	}
	before.others = strings.Replace(before.others, lb, "v4 -A FORWARD -s 10.77.0.0/16 -j ACCEPT\n"+lb, 1)
	n.sh("ipt", "-F", "TABBY-NP-PI-AAAA")
	n.sh("ip6t", "-A", "TABBY-NP-PI-BBBB", "-j", "ACCEPT")
	n.sh("ipset", "del", "tabby-np-p4-aaa", "10.244.1.10")
	n.sh("ipset", "add", "tabby-np-n4-bbb", "10.66.0.0/16")
	n.sh("ipset", "del", "tabby-np-i4-aaaa", "10.244.1.12,tab5678")
	n.sh("ipset", "create", "tabby-np-stray", "hash:ip")
	n.a.Invalidate()
	st = n.apply(ruleset3())
	check("repairing tampering", ruleset3())
	if !st.KernelRead || st.ChainsWritten != 2 || st.MembersAdded != 2 || st.MembersRemoved != 1 || st.SetsDeleted != 1 ||
		st.JumpsDeleted != 1 || st.JumpsInserted != 1 || st.Restores != 2 {
		t.Errorf("repairing tampering: %+v; want the 2 tampered chains rewritten, 2 members added and 1 removed, the stray set deleted, "+
			"the IPv4 FORWARD jump rewritten, in 2 restores (one per family: the jump goes with the IPv4 chain)", st)
	}
	if got := n.checkJumps(); got != 0 {
		t.Errorf("CheckJumps after jumps written with the chains repaired %d jumps; want 0", got)
	}

	// 6. Everything of tabby's wiped behind the applier's back (as a
	// careless `iptables -F/-X` would): CheckJumps cannot put the jump back
	// without its chain, so it applies the last Ruleset from scratch.
	other := newApplierIn(t, n)
	n.do(func() error { _, err := other.Cleanup(context.Background()); return err })
	if got := n.state().ours; got != "\n" {
		t.Fatalf("a second Applier's Cleanup left:\n%s", got)
	}
	n.checkJumps()
	check("CheckJumps after a wipe", ruleset3())
	// Wiped again, then an Apply that changes one chain: writing it fails
	// (the chains it jumps to are gone), the applier reads the kernel and
	// writes everything.
	n.do(func() error { _, err := other.Cleanup(context.Background()); return err })
	rs4 := ruleset3()
	for i, c := range rs4.Chains {
		if c.Name == "TABBY-NP-I-AAAA" && c.Family == policy.FamilyIPv4 {
			rs4.Chains[i].Rules = rs4.Chains[i].Rules[1:] // jumps to PI-AAAA and PI-BBBB, which are gone
		}
	}
	st = n.apply(rs4)
	check("an Apply after a wipe", rs4)
	if !st.Retried || !st.KernelRead {
		t.Errorf("an Apply after a wipe: %+v; want a failed first attempt, then the kernel read", st)
	}

	// 7. Remove all: nothing of tabby's policy is left, everything else is.
	empty := &policy.Ruleset{}
	st = n.apply(empty)
	check("removing everything", empty)
	if st.ChainsDeleted != 12 || st.SetsDeleted != 5 || st.JumpsDeleted != 2 {
		t.Errorf("removing everything: %+v; want 12 chains, 5 sets and 2 jumps deleted", st)
	}

	// 8. Cleanup after an Apply, twice: the second finds nothing.
	n.apply(ruleset1())
	check("re-adding", ruleset1())
	for i := range 2 {
		var cst apply.Stats
		n.do(func() error {
			var err error
			cst, err = n.a.Cleanup(context.Background())
			return err
		})
		check("Cleanup", empty)
		if i == 1 && cst.Changed() != 0 {
			t.Errorf("a second Cleanup changed things: %+v", cst)
		}
	}
}

func (n *node) checkJumps() int {
	n.t.Helper()
	var got int
	n.do(func() error {
		var err error
		got, err = n.a.CheckJumps(context.Background())
		return err
	})
	return got
}

func newApplierIn(t *testing.T, n *node) *apply.Applier {
	t.Helper()
	var a *apply.Applier
	n.do(func() error {
		var err error
		a, err = apply.New(apply.Options{Backend: &n.b, Logger: testLogger(t)})
		return err
	})
	return a
}

// mustCount fails unless the counters-included save of a family holds line.
func mustCount(t *testing.T, n *node, save, line string) {
	t.Helper()
	if out := n.sh(save, "-c", "-t", "filter"); !strings.Contains(out, line) {
		t.Errorf("%s -c lacks %q (was the chain rewritten?):\n%s", save, line, out)
	}
}

// An invalid Ruleset changes nothing and says what is wrong.
func TestApplyRejectsInvalidRuleset(t *testing.T) {
	needRoot(t)
	b := backends(t)[0]
	n := newNode(t, b, apply.Options{})
	n.apply(ruleset1())
	before := n.state()
	bad := ruleset3()
	bad.Chains[0].Rules = append(bad.Chains[0].Rules, r("-j TABBY-NP-MISSING"))
	bad.Sets = append(bad.Sets, policy.Set{Name: "tabby-np-x", Type: policy.SetHashIP, Family: policy.FamilyIPv4, Members: []string{"fd00::1"}})
	_, err := n.tryApply(bad)
	if err == nil {
		t.Fatal("Apply of an invalid Ruleset succeeded")
	}
	for _, want := range []string{"nothing was applied", "TABBY-NP-MISSING", "tabby-np-x", "not an inet address"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error %q does not mention %q", err, want)
		}
	}
	if diff := cmp.Diff(before, n.state(), cmp.AllowUnexported(state{})); diff != "" {
		t.Errorf("a rejected Ruleset changed the kernel:\n%s", diff)
	}
}

// With IPv6 disabled, ip6tables and the inet6 sets are left alone.
func TestApplyIPv4Only(t *testing.T) {
	needRoot(t)
	b := backends(t)[0]
	n := newNode(t, b, apply.Options{DisableIPv6: true})
	n.apply(ruleset1())
	got := n.state().ours
	if strings.Contains(got, "v6 ") || strings.Contains(got, "tabby-np-p6-aaa") {
		t.Errorf("IPv6 disabled, but tabby programmed IPv6:\n%s", got)
	}
	if !strings.Contains(got, "v4 chain TABBY-NP-PI-AAAA") || !strings.Contains(got, "set tabby-np-p4-aaa hash:ip inet") {
		t.Errorf("IPv4 not programmed:\n%s", got)
	}
	n.do(func() error { _, err := n.a.Cleanup(context.Background()); return err })
}

var _ = ns.NetNS(nil)
