package apply_test

import (
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
