package netfilter_test

// Real-kernel tests of the engine: every test runs in a fresh network
// namespace (iptables of both backends, and ipsets, are per namespace),
// removed with everything in it when the test ends.

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/coreos/go-iptables/iptables"

	"github.com/tabbynet/tabby/internal/iptbackend"
	"github.com/tabbynet/tabby/internal/netfilter"
	"github.com/tabbynet/tabby/internal/netnstest"
	"github.com/tabbynet/tabby/internal/tier"
)

func newNS(t *testing.T) ns.NetNS {
	t.Helper()
	tier.Root(t, "a real-kernel test: it creates network namespaces", "ipset")
	return netnstest.New(t, "netfilter")
}

// in runs f in n, failing the test on error.
func in(t *testing.T, n ns.NetNS, f func() error) {
	t.Helper()
	if err := n.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
}

// sh runs a program in n and returns what it printed.
func sh(t *testing.T, n ns.NetNS, name string, args ...string) string {
	t.Helper()
	var out []byte
	in(t, n, func() error {
		var err error
		if out, err = exec.Command(name, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return nil
	})
	return string(out)
}

// forEachBackend runs f once per installed iptables backend, each in a
// namespace of its own.
func forEachBackend(t *testing.T, f func(t *testing.T, n ns.NetNS, b iptbackend.Backend)) {
	ran := false
	for _, m := range []iptbackend.Mode{iptbackend.Legacy, iptbackend.NFT} {
		b, err := iptbackend.Paths(m)
		if err != nil {
			t.Logf("the %s backend is not installed, not tested: %v", m, err)
			continue
		}
		ran = true
		t.Run(string(m), func(t *testing.T) { f(t, newNS(t), b) })
	}
	if !ran {
		t.Fatal("no iptables backend is installed (install iptables)")
	}
}

// Tx transactions against the kernel: a chain written and listed back as
// iptables prints it, a jump inserted at the top above others' rules and
// found as ours by JumpsTo, a failing transaction that changes nothing and
// names its line, and a removal that leaves everybody else's rules as they
// were.
func TestIPTables(t *testing.T) {
	forEachBackend(t, func(t *testing.T, n ns.NetNS, b iptbackend.Backend) {
		ctx := context.Background()
		save := b.Save(iptables.ProtocolIPv4)
		sh(t, n, b.IPTables, "-t", "nat", "-A", "POSTROUTING", "-s", "172.17.0.0/16", "!", "-o", "docker0", "-j", "MASQUERADE")
		foreign := sh(t, n, save, "-t", "nat")
		var ipt *netfilter.IPTables
		in(t, n, func() (err error) { ipt, err = netfilter.NewIPTables(b, iptables.ProtocolIPv4, 0); return err })

		in(t, n, func() error {
			if rules, ok, err := ipt.List("nat", "TABBY-TEST"); err != nil || ok || rules != nil {
				return fmt.Errorf("List of a missing chain = %q, %v, %v; want nothing, false, no error", rules, ok, err)
			}
			return nil
		})
		rule := []string{"-m", "comment", "--comment", "tabby test rule", "-j", "MASQUERADE"}
		jump := []string{"-m", "comment", "--comment", "tabby:test", "-j", "TABBY-TEST"}
		tx := netfilter.NewTx("nat")
		tx.Declare("TABBY-TEST")
		tx.Append("TABBY-TEST", rule)
		tx.Insert("POSTROUTING", 1, jump)
		in(t, n, func() error { return ipt.Apply(ctx, tx) })

		var post []string
		in(t, n, func() error {
			rules, ok, err := ipt.List("nat", "TABBY-TEST")
			if err != nil || !ok || len(rules) != 1 || !slices.Equal(netfilter.SplitArgs(rules[0]), rule) {
				return fmt.Errorf("List(TABBY-TEST) = %q, %v, %v; want the one rule %q", rules, ok, err, rule)
			}
			table, err := ipt.Save(ctx, "nat")
			if err != nil {
				return err
			}
			post = table["POSTROUTING"]
			if len(post) != 2 || !slices.Equal(netfilter.SplitArgs(post[0]), jump) {
				return fmt.Errorf("POSTROUTING is %q; want the jump first, then docker's rule", post)
			}
			if got := netfilter.JumpsTo(post, netfilter.Prefixed("TABBY-")); !slices.Equal(got, post[:1]) {
				return fmt.Errorf("JumpsTo = %q, want %q", got, post[:1])
			}
			return nil
		})

		// A transaction with a bad line changes nothing, and says which.
		bad := netfilter.NewTx("nat")
		bad.Declare("TABBY-TEST")
		bad.Append("TABBY-TEST", []string{"-j", "TABBY-MISSING"})
		written := sh(t, n, save, "-t", "nat")
		in(t, n, func() error {
			err := ipt.Apply(ctx, bad)
			if err == nil || !strings.Contains(err.Error(), "(the line: -A TABBY-TEST -j TABBY-MISSING)") {
				return fmt.Errorf("a jump to a missing chain: %v; want an error quoting the line", err)
			}
			t.Logf("refused, as it should be: %v", err)
			return nil
		})
		if got := sh(t, n, save, "-t", "nat"); stripCounters(got) != stripCounters(written) {
			t.Errorf("a failed transaction changed the table:\n%s\nwant\n%s", got, written)
		}

		// Removal: the jump by its text, the chain flushed and deleted.
		rm := netfilter.NewTx("nat")
		rm.Delete("POSTROUTING", post[0])
		rm.Declare("TABBY-TEST")
		rm.DeleteChain("TABBY-TEST")
		in(t, n, func() error { return ipt.Apply(ctx, rm) })
		if got := sh(t, n, save, "-t", "nat"); stripCounters(got) != stripCounters(foreign) {
			t.Errorf("after the removal the nat table is\n%s\nwant what it was before\n%s", got, foreign)
		}
	})
}

// StartHeld against the kernel: the restore reads a rule naming an empty
// set and commits only when told, after the set is filled; told not to,
// or with its context ended, it changes nothing; a bad line is quoted as
// Apply quotes it.
func TestIPTablesHeld(t *testing.T) {
	forEachBackend(t, func(t *testing.T, n ns.NetNS, b iptbackend.Backend) {
		save := b.Save(iptables.ProtocolIPv4)
		var ipt *netfilter.IPTables
		in(t, n, func() (err error) { ipt, err = netfilter.NewIPTables(b, iptables.ProtocolIPv4, 0); return err })
		sh(t, n, "ipset", "create", "tabby-held", "hash:ip")
		rule := []string{"-m", "set", "--match-set", "tabby-held", "src", "-j", "DROP"}
		tx := func(rules ...[]string) *netfilter.Tx {
			tx := netfilter.NewTx("filter")
			tx.Declare("TABBY-HELD")
			for _, r := range rules {
				tx.Append("TABBY-HELD", r)
			}
			return tx
		}
		before := sh(t, n, save, "-t", "filter")

		// Told not to commit, and with its context ended: nothing.
		for _, how := range []string{"commit(false)", "context ended"} {
			ctx, cancel := context.WithCancel(context.Background())
			var commit func(bool)
			var wait func() error
			in(t, n, func() error { commit, wait = ipt.StartHeld(ctx, tx(rule)); return nil })
			if how == "commit(false)" {
				commit(false)
			} else {
				cancel()
			}
			if err := wait(); err == nil {
				t.Errorf("%s: the held restore succeeded; want an error", how)
			} else {
				t.Logf("%s: %v", how, err)
			}
			cancel()
			if got := sh(t, n, save, "-t", "filter"); stripCounters(got) != stripCounters(before) {
				t.Errorf("%s changed the table:\n%s\nwant\n%s", how, got, before)
			}
		}

		// Held while the set is filled, then committed.
		var commit func(bool)
		var wait func() error
		in(t, n, func() error { commit, wait = ipt.StartHeld(context.Background(), tx(rule)); return nil })
		time.Sleep(100 * time.Millisecond)
		// iptables -S would wait for the xtables lock, which a legacy
		// restore holds from its start: iptables-save does not.
		if strings.Contains(sh(t, n, save, "-t", "filter"), "TABBY-HELD") {
			t.Error("the chain of a held restore is in the kernel before its commit")
		}
		sh(t, n, "ipset", "add", "tabby-held", "10.0.0.1")
		commit(true)
		if err := wait(); err != nil {
			t.Fatal(err)
		}
		in(t, n, func() error {
			rules, ok, err := ipt.List("filter", "TABBY-HELD")
			if err != nil || !ok || len(rules) != 1 || !slices.Equal(netfilter.SplitArgs(rules[0]), rule) {
				return fmt.Errorf("after the commit List(TABBY-HELD) = %q, %v, %v; want %q", rules, ok, err, rule)
			}
			return nil
		})

		// A bad line: the error quotes it, and the table stays.
		written := sh(t, n, save, "-t", "filter")
		in(t, n, func() error {
			commit, wait = ipt.StartHeld(context.Background(), tx([]string{"-j", "TABBY-MISSING"}))
			return nil
		})
		commit(true)
		if err := wait(); err == nil || !strings.Contains(err.Error(), "(the line: -A TABBY-HELD -j TABBY-MISSING)") {
			t.Errorf("a held restore's jump to a missing chain: %v; want an error quoting the line", err)
		}
		if got := sh(t, n, save, "-t", "filter"); stripCounters(got) != stripCounters(written) {
			t.Errorf("a failed held restore changed the table:\n%s\nwant\n%s", got, written)
		}
	})
}

// stripCounters drops iptables-save's comment lines (with dates) and
// packet counters, which differ between two saves of the same rules.
func stripCounters(save string) string {
	var out []string
	for _, l := range strings.Split(save, "\n") {
		if strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(l, ":") {
			l, _, _ = strings.Cut(l, " [")
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// IPSets against the kernel: a large set created and filled by one
// restore and read back whole; everyone else's sets left out of Save and
// Get; nomatch and deletions; a refused member named in the error; and a
// set still used by a rule surviving Destroy, which removes the others.
func TestIPSets(t *testing.T) {
	n := newNS(t)
	ctx := context.Background()
	sh(t, n, "ipset", "create", "admin-set", "hash:ip")
	var s *netfilter.IPSets
	in(t, n, func() (err error) { s, err = netfilter.NewIPSets(""); return err })

	const big = 100000
	var b netfilter.SetBatch
	b.Create("tabby-test-big", "hash:ip", "inet", "hashsize", "16384", "maxelem", "1048576")
	for i := range big {
		b.Add("tabby-test-big", fmt.Sprintf("10.%d.%d.%d", i>>16, i>>8&255, i&255), false)
	}
	b.Create("tabby-test-net", "hash:net", "inet6")
	b.Add("tabby-test-net", "fd00::/64", false)
	b.Add("tabby-test-net", "fd00::/80", true)
	b.Add("tabby-test-net", "fd01::/64", false)
	b.Del("tabby-test-net", "fd01::/64")
	in(t, n, func() error { return s.Apply(ctx, &b, false) })

	in(t, n, func() error {
		sets, err := s.Save(ctx, "tabby-test-")
		if err != nil {
			return err
		}
		if len(sets) != 2 || sets["admin-set"] != nil {
			return fmt.Errorf("Save(tabby-test-) returned %d sets, want the 2 of tabby-test-", len(sets))
		}
		got := sets["tabby-test-big"]
		if _, last := got.Members["10.1.134.159"]; got.Type != "hash:ip" || got.Family != "inet" || len(got.Members) != big || !last {
			return fmt.Errorf("the big set read back as %s %s with %d members (the last added: %v), want hash:ip inet with %d", got.Type, got.Family, len(got.Members), last, big)
		}
		want := map[string]bool{"fd00::/64": false, "fd00::/80": true}
		if got := sets["tabby-test-net"]; got.Family != "inet6" || !maps.Equal(got.Members, want) {
			return fmt.Errorf("tabby-test-net read back as %s with %v, want inet6 with %v", got.Family, got.Members, want)
		}
		one, err := s.Get(ctx, "tabby-test-net", "tabby-test-missing")
		if err != nil || len(one) != 1 || !maps.Equal(one["tabby-test-net"].Members, want) {
			return fmt.Errorf("Get = %v, %v; want tabby-test-net alone", one, err)
		}
		return nil
	})

	var refused netfilter.SetBatch
	refused.Add("tabby-test-net", "fd00::/64", false)
	refused.Add("tabby-test-net", "10.0.0.0/8", false)
	in(t, n, func() error {
		err := s.Apply(ctx, &refused, true)
		if err == nil || !strings.Contains(err.Error(), "(the line: add tabby-test-net 10.0.0.0/8)") {
			return fmt.Errorf("adding an IPv4 member to an IPv6 set: %v; want an error quoting the line", err)
		}
		t.Logf("refused, as it should be: %v", err)
		return nil
	})

	sh(t, n, "ip6tables", "-A", "INPUT", "-m", "set", "--match-set", "tabby-test-net", "src", "-j", "ACCEPT")
	in(t, n, func() error {
		done, err := s.Destroy(ctx, []string{"tabby-test-big", "tabby-test-net"})
		if err == nil || !strings.Contains(err.Error(), "tabby-test-net") || !slices.Equal(done, []string{"tabby-test-big"}) {
			return fmt.Errorf("Destroy with tabby-test-net in use = %q, %v; want tabby-test-big destroyed and an error naming tabby-test-net", done, err)
		}
		return nil
	})
	if got := sh(t, n, "ipset", "list", "-n"); got != "admin-set\ntabby-test-net\n" {
		t.Errorf("after Destroy the sets are %q, want admin-set and tabby-test-net", got)
	}
}
