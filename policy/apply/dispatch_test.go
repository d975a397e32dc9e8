package apply_test

// Real traffic through the dispatch sets: a node namespace with pods
// (namespaces of their own) behind veths named as tabby's, TCP between
// them, and the node's FORWARD programmed by the Applier.

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/internal/iptbackend"
	"github.com/tabbynet/tabby/internal/netnstest"
	"github.com/tabbynet/tabby/policy"
	"github.com/tabbynet/tabby/policy/apply"
)

// ipIn runs `ip -n <n> ARGS` (space-separated, printf-style).
func ipIn(t testing.TB, n ns.NetNS, format string, args ...any) {
	t.Helper()
	argv := append([]string{"-n", filepath.Base(n.Path())}, strings.Fields(fmt.Sprintf(format, args...))...)
	if out, err := exec.Command("ip", argv...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(argv, " "), err, out)
	}
}

// tpod is a pod: a namespace whose eth0 is the peer of the node's veth.
type tpod struct {
	name   string
	ns     ns.NetNS
	veth   string
	v4, v6 netip.Addr
}

func (p *tpod) addr(fam int) netip.Addr {
	if fam == 0 {
		return p.v4
	}
	return p.v6
}

// forwarding turns the node into a router. Its lo goes up too: a
// namespace without any IPv4 address has no local routing table, and the
// kernel then takes every neighbour for a broadcast address (NOARP,
// ff:ff:ff:ff:ff:ff), which TCP at the pod drops.
func (n *node) forwarding() {
	n.t.Helper()
	ipIn(n.t, n.ns, "link set lo up")
	n.do(func() error {
		for _, k := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
			if err := os.WriteFile("/proc/sys/"+k, []byte("1"), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
}

// addPod wires pod i as tabby's plugin does: 10.77.0.i/32 and fd00:77::i
// on its eth0, routes to them over the veth on the node, the node's side
// answering ARP for everything (proxy ARP) and holding fe80::1, the pods'
// IPv6 gateway.
func (n *node) addPod(name, veth string, i int) *tpod {
	t := n.t
	t.Helper()
	p := &tpod{name: name, ns: netnstest.New(t, name), veth: veth,
		v4: netip.AddrFrom4([4]byte{10, 77, 0, byte(i)}), v6: netip.MustParseAddr(fmt.Sprintf("fd00:77::%d", i))}
	ipIn(t, n.ns, "link add %s type veth peer name eth0 netns %s", veth, filepath.Base(p.ns.Path()))
	ipIn(t, n.ns, "link set %s up", veth)
	ipIn(t, n.ns, "addr add fe80::1/64 dev %s nodad", veth)
	ipIn(t, n.ns, "route add %s/32 dev %s", p.v4, veth)
	ipIn(t, n.ns, "-6 route add %s/128 dev %s", p.v6, veth)
	n.do(func() error { return os.WriteFile("/proc/sys/net/ipv4/conf/"+veth+"/proxy_arp", []byte("1"), 0o644) })
	ipIn(t, p.ns, "link set lo up")
	ipIn(t, p.ns, "link set eth0 up")
	ipIn(t, p.ns, "addr add %s/32 dev eth0", p.v4)
	ipIn(t, p.ns, "addr add %s/128 dev eth0 nodad", p.v6)
	ipIn(t, p.ns, "route add default dev eth0")
	ipIn(t, p.ns, "-6 route add default via fe80::1 dev eth0")
	return p
}

// serve answers TCP on port 80 of both addresses of every pod until the
// test ends.
func serve(t testing.TB, pods ...*tpod) {
	t.Helper()
	for _, p := range pods {
		for fam := range 2 {
			var ln net.Listener
			err := p.ns.Do(func(ns.NetNS) (err error) {
				ln, err = net.Listen("tcp", net.JoinHostPort(p.addr(fam).String(), "80"))
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					_, _ = c.Write([]byte("hello"))
					c.Close()
				}
			}()
		}
	}
}

// connect opens a TCP connection from one pod to another's port 80 in a
// family and reads the greeting: nil when it arrives, else why not (a
// refusal, or nothing within timeout).
func connect(from, to *tpod, fam int, timeout time.Duration) error {
	return from.ns.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", net.JoinHostPort(to.addr(fam).String(), "80"), timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		b := make([]byte, 5)
		if _, err := c.Read(b); err != nil || string(b) != "hello" {
			return fmt.Errorf("read %q: %v", b, err)
		}
		return nil
	})
}

// TestIfaceSetMatch pins the kernel semantics the dispatch chains rely on:
// a hash:net,iface set matched with "src,src" holds a packet when its
// source address and its input interface are a member together, with
// "dst,dst" its destination address and output interface; an address
// with another interface, or the interface with another address, is no
// match. The sets change by members only between the probes (no chain is
// rewritten), and what `ipset save` prints is what the applier
// normalized: a kernel read finds nothing to change. Rules REJECT with a
// TCP reset so a match answers at once. Both families, every backend.
func TestIfaceSetMatch(t *testing.T) {
	needRoot(t)
	forEachBackend(t, testIfaceSetMatch)
}

func testIfaceSetMatch(t *testing.T, b iptbackend.Backend) {
	n := newNode(t, b, apply.Options{})
	n.forwarding()
	a, bb := n.addPod("a", "tabA", 1), n.addPod("b", "tabB", 2)
	serve(t, a, bb)

	reject := "-p tcp -j REJECT --reject-with tcp-reset"
	ruleset := func(from, to [2][]string) *policy.Ruleset {
		rs := &policy.Ruleset{Jumps: []policy.Jump{{Chain: "FORWARD", Rule: r("-j TABBY-NP-FORWARD")}}}
		for f, fam := range []string{policy.FamilyIPv4, policy.FamilyIPv6} {
			e, i := fmt.Sprintf("tabby-np-e%d-test", []int{4, 6}[f]), fmt.Sprintf("tabby-np-i%d-test", []int{4, 6}[f])
			rs.Sets = append(rs.Sets,
				policy.Set{Name: e, Type: policy.SetHashNetIface, Family: fam, Members: from[f]},
				policy.Set{Name: i, Type: policy.SetHashNetIface, Family: fam, Members: to[f]})
			rs.Chains = append(rs.Chains, chain("TABBY-NP-FORWARD", fam,
				"-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
				"-m set --match-set "+e+" src,src "+reject,
				"-m set --match-set "+i+" dst,dst "+reject))
		}
		return rs
	}
	// member is "<address of p>,<veth>" in both families.
	member := func(p *tpod, veth string) [2][]string {
		return [2][]string{{p.v4.String() + "," + veth}, {p.v6.String() + "," + veth}}
	}
	none := [2][]string{}
	for i, c := range []struct {
		name     string
		from, to [2][]string
		aToB     bool // a's connection to b is answered
	}{
		{"empty sets", none, none, true},
		{"a's address on a's veth, src,src", member(a, "tabA"), none, false},
		{"a's address on b's veth, src,src", member(a, "tabB"), none, true},
		{"b's address on a's veth, src,src", member(bb, "tabA"), none, true},
		{"a /0 on a's veth, src,src", [2][]string{{"0.0.0.0/0,tabA"}, {"::/0,tabA"}}, none, false},
		{"b's address on b's veth, dst,dst", none, member(bb, "tabB"), false},
		{"b's address on a's veth, dst,dst", none, member(bb, "tabA"), true},
		{"a's address on b's veth, dst,dst", none, member(a, "tabB"), true},
	} {
		st := n.apply(ruleset(c.from, c.to))
		if i > 0 && (st.Restores != 0 || st.ChainsWritten != 0) {
			t.Errorf("%s: %+v, want members changed only", c.name, st)
		}
		n.a.Invalidate()
		if st := n.apply(ruleset(c.from, c.to)); st.Changed() != 0 {
			t.Errorf("%s: a kernel read found changes to make: %+v (members not as ipset save prints them?)", c.name, st)
		}
		for fam := range 2 {
			err := connect(a, bb, fam, 5*time.Second)
			switch {
			case c.aToB && err != nil:
				t.Errorf("%s: %s a -> b: %v, want it answered", c.name, policy.FamilyIPv4+[]string{"", "6"}[fam], err)
			case !c.aToB && (err == nil || !strings.Contains(err.Error(), "connection refused")):
				t.Errorf("%s: %s a -> b: %v, want it refused by the set's rule", c.name, policy.FamilyIPv4+[]string{"", "6"}[fam], err)
			}
			// b's connections to a never match: a's replies are
			// ESTABLISHED, and b's packets are neither from a's veth nor
			// to b's.
			if err := connect(bb, a, fam, 5*time.Second); err != nil {
				t.Errorf("%s: b -> a: %v", c.name, err)
			}
		}
	}
}

// TestCompiledDispatch runs the compiler's own Ruleset (DenyUnlisted, as
// tabbyd runs it) against real traffic: pod b is isolated for ingress,
// pod c's veth is up before the Ruleset lists it. A pod the Ruleset comes
// to list, selected by no policy or by the policies of a pod already
// there, costs an ipset restore and no iptables-restore, and its traffic
// is then what its policies say.
func TestCompiledDispatch(t *testing.T) {
	needRoot(t)
	forEachBackend(t, testCompiledDispatch)
}

func testCompiledDispatch(t *testing.T, b iptbackend.Backend) {
	n := newNode(t, b, apply.Options{})
	n.forwarding()
	pods := map[string]*tpod{}
	for i, name := range []string{"a", "b", "c", "d"} {
		pods[name] = n.addPod(name, "tab"+name, i+1)
	}
	a, bb, c, d := pods["a"], pods["b"], pods["c"], pods["d"]
	serve(t, a, bb, c, d)
	in := &policy.Input{Node: "n1", DenyUnlisted: true, Policies: []*networkingv1.NetworkPolicy{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "b-deny-ingress"},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "b"}}},
	}}}
	list := func(p *tpod, app string) {
		in.Endpoints = append(in.Endpoints, policy.Endpoint{
			Pod:       &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: p.name, Labels: map[string]string{"app": app}}},
			IPs:       []netip.Addr{p.v4, p.v6},
			HostIface: p.veth,
		})
	}
	list(a, "a")
	list(bb, "b")
	sync := func() apply.Stats {
		t.Helper()
		rs := policy.Compile(in)
		if len(rs.Problems) > 0 {
			t.Fatalf("problems: %+v", rs.Problems)
		}
		return n.apply(rs)
	}
	// Blocked connections are dropped: a probe waits this long for nothing.
	const blocked = time.Second
	check := func(step string, want map[[2]*tpod]bool) {
		t.Helper()
		for pair, ok := range want {
			for fam := range 2 {
				timeout := 5 * time.Second
				if !ok {
					timeout = blocked
				}
				err := connect(pair[0], pair[1], fam, timeout)
				if ok != (err == nil) {
					t.Errorf("%s: %s -> %s (%s): %v, want answered %v", step, pair[0].name, pair[1].name, []string{"IPv4", "IPv6"}[fam], err, ok)
				}
			}
		}
	}

	sync()
	check("a and b listed", map[[2]*tpod]bool{{a, bb}: false, {bb, a}: true, {a, c}: false, {c, a}: false})

	// c listed, no policy selects it: members only.
	list(c, "c")
	if st := sync(); st.Restores != 0 || st.ChainsWritten != 0 || st.MembersAdded != 4 {
		t.Errorf("listing c: %+v; want 4 members added (its IPv4 and IPv6 in the sets of pods no egress and no ingress policy selects), no iptables-restore", st)
	}
	check("c listed", map[[2]*tpod]bool{{a, c}: true, {c, a}: true, {c, bb}: false})

	// d listed with b's labels: into b's dispatch set, members only.
	list(d, "b")
	if st := sync(); st.Restores != 0 || st.ChainsWritten != 0 || st.MembersAdded != 4 {
		t.Errorf("listing d: %+v; want 4 members added (b's ingress set and the unselected egress set, both families), no iptables-restore", st)
	}
	check("d listed", map[[2]*tpod]bool{{a, d}: false, {d, a}: true})

	// c relabelled to b's labels: members move, no chain changes.
	in.Endpoints[2].Pod.Labels = map[string]string{"app": "b"}
	if st := sync(); st.Restores != 0 || st.ChainsWritten != 0 || st.MembersAdded != 2 || st.MembersRemoved != 2 {
		t.Errorf("relabelling c: %+v; want its 2 addresses moved from the unselected ingress set to b's, no iptables-restore", st)
	}
	check("c relabelled", map[[2]*tpod]bool{{a, c}: false, {c, a}: true})
}

// TestMembersLeaveAfterChains: when a pod moves into a set only new rules
// name (its policies change to a combination no other local pod has), the
// applier adds it to the new set, writes the chains, and only then takes
// it out of the old set, so its traffic meets the old rules or the new,
// never neither (which, with DenyUnlisted, would let it through as a pod
// no policy selects). A move between sets whose rules stay as they are is
// one ipset restore, additions first. The ipset and iptables-restore the
// applier runs are the real ones behind wrappers that log their input.
func TestMembersLeaveAfterChains(t *testing.T) {
	needRoot(t)
	forEachBackend(t, testMembersLeaveAfterChains)
}

func testMembersLeaveAfterChains(t *testing.T, b iptbackend.Backend) {
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	wrap := func(real string) string {
		p := filepath.Join(dir, filepath.Base(real))
		script := fmt.Sprintf("#!/bin/sh\necho \"== %s $*\" >> %s\ntee -a %s | %s \"$@\"\n", filepath.Base(real), log, log, real)
		if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ipsetPath, err := exec.LookPath("ipset")
	if err != nil {
		t.Fatal(err)
	}
	logged := b
	logged.IPTablesRestore, logged.IP6TablesRestore = wrap(b.IPTablesRestore), wrap(b.IP6TablesRestore)
	// The ipset program for every change, so that the log shows the order.
	n := newNode(t, logged, apply.Options{IPSet: wrap(ipsetPath), IPSetNoNetlink: true})

	const m4, m6 = "10.244.0.5,tab5", "fd00::5,tab5"
	ruleset := moveRuleset
	pod := [2][]string{{m4}, {m6}}
	n.apply(ruleset(pod, [2][]string{}, false))
	readLog := func() string {
		t.Helper()
		b, err := os.ReadFile(log)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(log, 0); err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	readLog()

	// Into the new set, with the new rule: add, chains, remove.
	want := ruleset([2][]string{}, pod, true)
	st := n.apply(want)
	got := readLog()
	// The restore reads its rules while the sets are filled (StartHeld):
	// what counts is that its COMMIT comes after the addition.
	add, del := strings.Index(got, "add tabby-np-e4-new "+m4), strings.Index(got, "del tabby-np-e4-old "+m4)
	commit := -1
	if write := strings.Index(got, "-A TABBY-NP-FORWARD"); write >= 0 {
		if i := strings.Index(got[write:], "COMMIT"); i >= 0 {
			commit = write + i
		}
	}
	if add < 0 || commit < 0 || del < 0 || !(add < commit && commit < del) {
		t.Errorf("the move into a new set ran in this order (want the addition, the chains' commit, the removal; %+v):\n%s", st, got)
	}
	if diff := cmpState(n, want); diff != "" {
		t.Errorf("after the move: %s", diff)
	}

	// Back, the rules as they are: one ipset restore, additions first.
	want = ruleset(pod, [2][]string{}, true)
	st = n.apply(want)
	got = readLog()
	add, del = strings.Index(got, "add tabby-np-e4-old "+m4), strings.Index(got, "del tabby-np-e4-new "+m4)
	if st.Restores != 0 || strings.Count(got, "== ipset") != 1 || add < 0 || del < add {
		t.Errorf("a move between sets whose rules stay: %+v; want one ipset restore adding then removing:\n%s", st, got)
	}
	if diff := cmpState(n, want); diff != "" {
		t.Errorf("after the move back: %s", diff)
	}
}

// moveRuleset has a pod's members in the -old sets and the -new sets of
// both families (old, new), and a rule naming each -old set; with newRule,
// also a rule naming each -new set, after it.
func moveRuleset(old, new [2][]string, newRule bool) *policy.Ruleset {
	rs := &policy.Ruleset{Jumps: []policy.Jump{{Chain: "FORWARD", Rule: r("-j TABBY-NP-FORWARD")}}}
	for f, fam := range []string{policy.FamilyIPv4, policy.FamilyIPv6} {
		d := []string{"4", "6"}[f]
		rs.Sets = append(rs.Sets,
			policy.Set{Name: "tabby-np-e" + d + "-new", Type: policy.SetHashNetIface, Family: fam, Members: new[f]},
			policy.Set{Name: "tabby-np-e" + d + "-old", Type: policy.SetHashNetIface, Family: fam, Members: old[f]})
		c := chain("TABBY-NP-FORWARD", fam, "-m set --match-set tabby-np-e"+d+"-old src,src -j DROP")
		if newRule {
			c.Rules = append(c.Rules, r("-m set --match-set tabby-np-e"+d+"-new src,src -j DROP"))
		}
		rs.Chains = append(rs.Chains, c)
	}
	return rs
}

// A sync whose sets cannot be filled commits none of its chains: the
// restores read their rules while the sets are filled, and get no COMMIT
// when that fails. Then it goes through once the sets can be filled. And
// the error of a first sync whose restore fails names the jumps that
// restore was rewriting, besides the rule iptables refused.
func TestFillFailsNothingCommitted(t *testing.T) {
	needRoot(t)
	forEachBackend(t, testFillFails)
}

func testFillFails(t *testing.T, b iptbackend.Backend) {
	dir := t.TempDir()
	refuse := filepath.Join(dir, "refuse")
	real, err := exec.LookPath("ipset")
	if err != nil {
		t.Fatal(err)
	}
	// The ipset program, refusing any input that adds to tabby-np-e4-new
	// while the file refuse exists.
	wrapper := filepath.Join(dir, "ipset")
	script := fmt.Sprintf("#!/bin/sh\nin=$(cat)\nif [ -e %s ] && printf '%%s\\n' \"$in\" | grep -q 'add tabby-np-e4-new'; then echo 'refused by the test' >&2; exit 1; fi\nprintf '%%s\\n' \"$in\" | %s \"$@\"\n", refuse, real)
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	n := newNode(t, b, apply.Options{IPSet: wrapper, IPSetNoNetlink: true})
	pod := [2][]string{{"10.244.0.5,tab5"}, {"fd00::5,tab5"}}
	before := moveRuleset(pod, [2][]string{}, false)
	n.apply(before)

	if err := os.WriteFile(refuse, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	want := moveRuleset([2][]string{}, pod, true)
	st, err := n.tryApply(want)
	if err == nil || !strings.Contains(err.Error(), "refused by the test") {
		t.Fatalf("Apply with the additions refused: %+v, %v; want the ipset error", st, err)
	}
	t.Logf("refused, as it should be: %v", err)
	if diff := cmpState(n, before); diff != "" {
		t.Errorf("after a sync whose sets could not be filled: %s", diff)
	}
	// A node's first sync writes the jump from FORWARD in the chains'
	// restore: when that restore fails, its error says so.
	fresh := newNode(t, b, apply.Options{})
	bad := moveRuleset(pod, [2][]string{}, false)
	bad.Chains[0].Rules = append(bad.Chains[0].Rules, r("-m conntrack --ctstate BOGUS -j DROP"))
	if _, err := fresh.tryApply(bad); err == nil || !strings.Contains(err.Error(), "rewriting the jumps of FORWARD") || !strings.Contains(err.Error(), "BOGUS") {
		t.Errorf("a first sync with a rule iptables refuses: %v; want an error naming the rule and the jumps it was rewriting", err)
	} else {
		t.Logf("refused, as it should be: %v", err)
	}

	if err := os.Remove(refuse); err != nil {
		t.Fatal(err)
	}
	n.apply(want)
	if diff := cmpState(n, want); diff != "" {
		t.Errorf("once the sets can be filled: %s", diff)
	}
}

// cmpState is what differs between tabby's state in the node's kernel and
// rs, "" if nothing.
func cmpState(n *node, rs *policy.Ruleset) string {
	if got, want := n.state().ours, expected(rs); got != want {
		return fmt.Sprintf("the kernel has\n%s\nwant\n%s", got, want)
	}
	return ""
}
