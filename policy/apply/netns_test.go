package apply_test

// Real-kernel test helpers: every test node is a fresh network namespace
// (iptables of both backends, and ipsets, are per namespace), removed with
// everything in it when the test ends. Nothing runs in the host namespace.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/tabbynet/tabby/internal/iptbackend"
	"github.com/tabbynet/tabby/internal/netnstest"
	"github.com/tabbynet/tabby/internal/tier"
	"github.com/tabbynet/tabby/policy"
	"github.com/tabbynet/tabby/policy/apply"
)

func needRoot(t testing.TB) {
	t.Helper()
	tier.Root(t, "a real-kernel test: it creates network namespaces", "ipset")
}

// backends are the iptables backends installed here; each real-kernel test
// runs once per backend.
func backends(t testing.TB) []iptbackend.Backend {
	t.Helper()
	var bs []iptbackend.Backend
	for _, m := range []iptbackend.Mode{iptbackend.Legacy, iptbackend.NFT} {
		b, err := iptbackend.Paths(m)
		if err != nil {
			t.Logf("the %s backend is not installed, not tested: %v", m, err)
			continue
		}
		bs = append(bs, b)
	}
	if len(bs) == 0 {
		t.Skip("SKIPPING: no iptables installed")
	}
	return bs
}

// forEachBackend runs f as a subtest for each installed backend.
func forEachBackend(t *testing.T, f func(t *testing.T, b iptbackend.Backend)) {
	t.Helper()
	for _, b := range backends(t) {
		t.Run(string(b.Mode), func(t *testing.T) { f(t, b) })
	}
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// node is a namespace with an Applier for one backend.
type node struct {
	t  testing.TB
	ns ns.NetNS
	b  iptbackend.Backend
	a  *apply.Applier
}

func newNode(t testing.TB, b iptbackend.Backend, opts apply.Options) *node {
	t.Helper()
	n := &node{t: t, ns: netnstest.New(t, "apply-node"), b: b}
	opts.Backend = &b
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	n.do(func() error {
		var err error
		n.a, err = apply.New(opts)
		return err
	})
	return n
}

// do runs f in the node's namespace, failing the test on error.
func (n *node) do(f func() error) {
	n.t.Helper()
	if err := n.ns.Do(func(ns.NetNS) error { return f() }); err != nil {
		n.t.Fatal(err)
	}
}

func (n *node) apply(rs *policy.Ruleset) apply.Stats {
	n.t.Helper()
	st, err := n.tryApply(rs)
	if err != nil {
		n.t.Fatalf("Apply: %v", err)
	}
	return st
}

func (n *node) tryApply(rs *policy.Ruleset) (apply.Stats, error) {
	var st apply.Stats
	var err error
	_ = n.ns.Do(func(ns.NetNS) error {
		st, err = n.a.Apply(context.Background(), rs)
		return nil
	})
	return st, err
}

// sh runs a command in the node; "ipt", "ip6t", "ipt-save" and "ip6t-save"
// stand for the node's backend's binaries.
func (n *node) sh(argv ...string) string {
	n.t.Helper()
	out, err := n.trySh(argv...)
	if err != nil {
		n.t.Fatal(err)
	}
	return out
}

func (n *node) trySh(argv ...string) (string, error) {
	switch argv[0] {
	case "ipt":
		argv = append([]string{n.b.IPTables}, argv[1:]...)
	case "ip6t":
		argv = append([]string{n.b.IP6Tables}, argv[1:]...)
	case "ipt-save":
		argv = append([]string{n.b.IPTablesSave}, argv[1:]...)
	case "ip6t-save":
		argv = append([]string{n.b.IP6TablesSave}, argv[1:]...)
	}
	var out []byte
	var err error
	_ = n.ns.Do(func(ns.NetNS) error {
		out, err = exec.Command(argv[0], argv[1:]...).CombinedOutput()
		return nil
	})
	if err != nil {
		return string(out), fmt.Errorf("%s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return string(out), nil
}

var countersRe = regexp.MustCompile(`\[\d+:\d+\]`)

// split separates a family's iptables-save (all tables) into what is not
// tabby's policy (every line, in order, counters blanked) and what is: the
// policy jumps in the built-in chains with their positions, and the policy
// chains with their rules, sorted by chain (the backends print chains in
// different orders).
func split(save, tag string) (others []string, ours []string) {
	table := ""
	pos := map[string]int{}
	chains := map[string][]string{}
	for _, l := range strings.Split(save, "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(l, "*") {
			table = l[1:]
			clear(pos)
		}
		if table == "filter" {
			switch {
			case strings.HasPrefix(l, ":"+policy.PolicyChainPrefix):
				name, _, _ := strings.Cut(l[1:], " ")
				chains[name] = append(chains[name], tag+" chain "+name)
				continue
			case strings.HasPrefix(l, "-A "+policy.PolicyChainPrefix):
				name, _, _ := strings.Cut(l[3:], " ")
				chains[name] = append(chains[name], tag+"   "+l)
				continue
			case strings.HasPrefix(l, "-A "):
				chain, _, _ := strings.Cut(l[3:], " ")
				pos[chain]++
				if strings.Contains(l, " -j "+policy.PolicyChainPrefix) || strings.Contains(l, " -g "+policy.PolicyChainPrefix) {
					ours = append(ours, fmt.Sprintf("%s %s#%d %s", tag, chain, pos[chain], l))
					continue
				}
			}
		}
		others = append(others, tag+" "+countersRe.ReplaceAllString(l, "[-]"))
	}
	for _, name := range slices.Sorted(maps.Keys(chains)) {
		ours = append(ours, chains[name]...)
	}
	return others, ours
}

// state is a node's iptables (both families, every table) and ipsets,
// split into everybody else's and tabby's policy's.
type state struct {
	others, ours string
}

func (n *node) state() state {
	n.t.Helper()
	o4, t4 := split(n.sh("ipt-save"), "v4")
	o6, t6 := split(n.sh("ip6t-save"), "v6")
	others, ours := append(o4, o6...), append(t4, t6...)
	// ipsets: others' verbatim; ours as type, family and sorted members.
	members := map[string][]string{}
	for _, l := range strings.Split(n.sh("ipset", "save"), "\n") {
		f := strings.Fields(l)
		if len(f) < 3 {
			continue
		}
		if !strings.HasPrefix(f[1], policy.SetPrefix) {
			others = append(others, l)
			continue
		}
		if f[0] == "create" {
			family := ""
			if i := slices.Index(f, "family"); i > 0 {
				family = f[i+1]
			}
			members[f[1]] = append([]string{"set " + f[1] + " " + f[2] + " " + family}, members[f[1]]...)
		} else {
			members[f[1]] = append(members[f[1]], "  "+strings.Join(f[2:], " "))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(members)) {
		m := members[name]
		slices.Sort(m[1:])
		ours = append(ours, m...)
	}
	return state{others: strings.Join(others, "\n") + "\n", ours: strings.Join(ours, "\n") + "\n"}
}

// expected renders what state().ours must be for rs: its jumps at
// positions 1… of their built-in chains, its chains with their rules (as
// iptables-save prints them: comments quoted), and its sets.
func expected(rs *policy.Ruleset) string {
	var lines []string
	for fi, fam := range []string{policy.FamilyIPv4, policy.FamilyIPv6} {
		tag := [2]string{"v4", "v6"}[fi]
		for _, b := range []string{"INPUT", "FORWARD", "OUTPUT"} {
			i := 0
			for _, j := range rs.Jumps {
				if j.Chain == b {
					i++
					lines = append(lines, fmt.Sprintf("%s %s#%d -A %s %s", tag, b, i, b, printed(j.Rule)))
				}
			}
		}
		chains := rs.ChainsFor(fam)
		slices.SortFunc(chains, func(a, b policy.Chain) int { return strings.Compare(a.Name, b.Name) })
		for _, c := range chains {
			lines = append(lines, tag+" chain "+c.Name)
			for _, r := range c.Rules {
				lines = append(lines, tag+"   -A "+c.Name+" "+printed(r))
			}
		}
	}
	sets := slices.Clone(rs.Sets)
	slices.SortFunc(sets, func(a, b policy.Set) int { return strings.Compare(a.Name, b.Name) })
	for _, s := range sets {
		lines = append(lines, "set "+s.Name+" "+string(s.Type)+" "+s.Family)
		m := slices.Clone(s.Members)
		slices.Sort(m)
		for _, x := range m {
			lines = append(lines, "  "+x)
		}
	}
	return strings.Join(lines, "\n") + "\n"
}

// printed is a rule as iptables-save prints it, for the rules the tests
// use (written in their canonical form): a comment is quoted unless it
// is all letters, digits, '-' and '_'.
func printed(rule []string) string {
	out := slices.Clone(rule)
	for i := range out {
		if i > 0 && out[i-1] == "--comment" && strings.Trim(out[i], "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") != "" {
			out[i] = `"` + out[i] + `"`
		}
	}
	return strings.Join(out, " ")
}
