package apply_test

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tabbynet/tabby/internal/iptbackend"
	"github.com/tabbynet/tabby/policy"
	"github.com/tabbynet/tabby/policy/apply"
)

// TestApplyLearnsPrinting: a chain whose rules the kernel has printed
// before (in another chain) is written without being read back, and a
// kernel read finds it printed as the applier predicted; a chain changed
// behind the applier's back, with as many rules as it had, is rewritten on
// the next kernel read and read back (what it predicted is forgotten),
// after which a kernel read finds nothing to change. The rules are ones
// iptables prints otherwise than written (it quotes comments), so a
// prediction of the text as written would be found wrong.
func TestApplyLearnsPrinting(t *testing.T) {
	needRoot(t)
	forEachBackend(t, func(t *testing.T, b iptbackend.Backend) {
		n := newNode(t, b, apply.Options{})
		rules := []string{"-p tcp -m tcp --dport 80 -m comment --comment x/web -j ACCEPT", "-p udp -m udp --dport 53 -m comment --comment x/dns -j ACCEPT", "-j DROP"}
		one := &policy.Ruleset{Chains: both("TABBY-NP-A", rules...)}
		two := &policy.Ruleset{Chains: append(both("TABBY-NP-A", rules...), both("TABBY-NP-B", rules[1], rules[0], rules[2])...)}
		check := func(step string, rs *policy.Ruleset) {
			t.Helper()
			if diff := cmp.Diff(expected(rs), n.state().ours); diff != "" {
				t.Errorf("%s: tabby's rules are not the Ruleset's (-want +got):\n%s", step, diff)
			}
		}

		if st := n.apply(one); st.ChainsWritten != 2 || st.ChainsReadBack != 2 {
			t.Errorf("the first Apply: %+v; want 2 chains written and read back (one per family)", st)
		}
		if st := n.apply(two); st.ChainsWritten != 2 || st.ChainsReadBack != 0 || st.KernelRead {
			t.Errorf("adding a chain of known rules: %+v; want 2 chains written, none read back, no kernel read", st)
		}
		check("adding a chain of known rules", two)
		n.a.Invalidate()
		if st := n.apply(two); !st.KernelRead || st.Changed() != 0 {
			t.Errorf("a kernel read after a predicted printing: %+v; want the kernel read and nothing changed", st)
		}

		n.sh("ipt", "-R", "TABBY-NP-B", "1", "-p", "udp", "--dport", "54", "-j", "ACCEPT")
		n.a.Invalidate()
		if st := n.apply(two); !st.KernelRead || st.ChainsWritten != 1 || st.ChainsReadBack != 1 {
			t.Errorf("repairing a chain changed behind the applier's back: %+v; want the IPv4 chain rewritten and read back", st)
		}
		check("repairing a changed chain", two)
		n.a.Invalidate()
		if st := n.apply(two); !st.KernelRead || st.Changed() != 0 {
			t.Errorf("a kernel read after the repair: %+v; want nothing changed", st)
		}
	})
}

// TestApplyPredictsShapes: the applier learns how the kernel prints a
// shape of rule from one chain and predicts the printing of every other
// rule of that shape, whatever its set names, comments (bare words and
// quoted ones), ports, port ranges and lists, and target chains: with the
// nft backend, of twelve new chains of one shape it reads back one (the
// legacy backend reads the table whole), and a kernel read then finds
// every chain printed as predicted. A chain changed behind the applier's
// back is rewritten and read back, and so is a new chain of its shapes:
// they are distrusted, so a wrong template costs one rewrite, not one
// per kernel read.
func TestApplyPredictsShapes(t *testing.T) {
	needRoot(t)
	forEachBackend(t, func(t *testing.T, b iptbackend.Backend) {
		n := newNode(t, b, apply.Options{})
		ruleset := func(chains int) *policy.Ruleset {
			rs := &policy.Ruleset{Chains: []policy.Chain{chain("TABBY-NP-Z", policy.FamilyIPv4, "-j RETURN")}}
			for i := range chains {
				p, q := fmt.Sprintf("tabby-np-p4-s%03d", i), fmt.Sprintf("tabby-np-n4-s%03d", i)
				rs.Sets = append(rs.Sets,
					policy.Set{Name: p, Type: policy.SetHashIP, Family: policy.FamilyIPv4, Members: []string{fmt.Sprintf("10.244.0.%d", i+1)}},
					policy.Set{Name: q, Type: policy.SetHashNet, Family: policy.FamilyIPv4, Members: []string{fmt.Sprintf("10.%d.0.0/16", i)}})
				rs.Chains = append(rs.Chains, chain(fmt.Sprintf("TABBY-NP-PI-A%03d", i), policy.FamilyIPv4,
					fmt.Sprintf("-p tcp -m tcp --dport %d -m set --match-set %s src %s", 80+i*101, p, mark),
					fmt.Sprintf("-p tcp -m tcp --dport %d:%d -m set --match-set %s dst %s", 1000+i, 2000+i*37, q, mark),
					fmt.Sprintf("-p udp -m multiport --dports %d,%d:%d -m set --match-set %s src %s", 53+i, 5353+i, 6000+i*3, p, mark),
					fmt.Sprintf("-m comment --comment ns-%d/web.v%d -g TABBY-NP-Z", i, i),
					fmt.Sprintf("-m comment --comment pol-%d_x -j TABBY-NP-Z", i),
					fmt.Sprintf("-m comment --comment cnp-admin:adm%d -j TABBY-NP-Z", i),
					"-m mark --mark 0x10000/0x10000 -j RETURN",
					"-j DROP"))
			}
			return rs
		}
		check := func(step string, rs *policy.Ruleset) {
			t.Helper()
			if diff := cmp.Diff(expected(rs), n.state().ours); diff != "" {
				t.Errorf("%s: tabby's rules are not the Ruleset's (-want +got):\n%s", step, diff)
			}
			n.a.Invalidate()
			if st := n.apply(rs); !st.KernelRead || st.Changed() != 0 {
				t.Errorf("%s: a kernel read: %+v; want nothing changed (every chain printed as predicted)", step, st)
			}
		}

		twelve := ruleset(12)
		wantRead := 1
		if b.Mode == iptbackend.Legacy {
			wantRead = 12
		}
		if st := n.apply(twelve); st.ChainsWritten != 13 || st.ChainsReadBack != wantRead+1 {
			t.Errorf("the first Apply: %+v; want 13 chains written, %d read back (TABBY-NP-Z and what teaches the shapes)", st, wantRead+1)
		}
		check("twelve chains of one shape", twelve)

		thirteen := ruleset(13)
		if st := n.apply(thirteen); st.ChainsWritten != 1 || st.ChainsReadBack != 0 {
			t.Errorf("a thirteenth chain of known shapes: %+v; want it written, not read back", st)
		}
		check("a thirteenth chain", thirteen)

		n.sh("ipt", "-R", "TABBY-NP-PI-A012", "1", "-p", "tcp", "--dport", "9", "-j", "ACCEPT")
		n.a.Invalidate()
		if st := n.apply(thirteen); !st.KernelRead || st.ChainsWritten != 1 || st.ChainsReadBack != 1 {
			t.Errorf("repairing a chain changed behind the applier's back: %+v; want it rewritten and read back", st)
		}
		check("the repair", thirteen)
		if st := n.apply(ruleset(14)); st.ChainsWritten != 1 || st.ChainsReadBack != 1 {
			t.Errorf("a chain of the repaired chain's shapes: %+v; want it written and read back (its shapes are distrusted)", st)
		}
		check("after the repair", ruleset(14))
	})
}
