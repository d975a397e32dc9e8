package apply

import (
	"slices"
	"strings"

	"github.com/tabbynet/tabby/internal/netfilter"
	"github.com/tabbynet/tabby/policy"
)

// filterTable is what iptables-save -t filter says about the chains the
// applier cares about: every policy chain's rules and the built-in chains'
// rules, as printed (after "-A CHAIN ").
type filterTable struct {
	chains   map[string][]string
	builtins map[string][]string
}

// ofFilter keeps, of the filter table, the policy chains and the rules of
// the built-in chains the jumps go into.
func ofFilter(t netfilter.Table) filterTable {
	ft := filterTable{chains: map[string][]string{}, builtins: map[string][]string{}}
	for name, rules := range t {
		switch {
		case strings.HasPrefix(name, policy.PolicyChainPrefix):
			ft.chains[name] = rules
		case slices.Contains(builtins, name) && len(rules) > 0:
			ft.builtins[name] = rules
		}
	}
	return ft
}

// ownedChain says a chain is a policy chain: the rules of built-in chains
// that jump to one are tabby's jumps.
var ownedChain = netfilter.Prefixed(policy.PolicyChainPrefix)

// ours reports whether a built-in chain's rule (as printed) is a jump of
// tabby's policy: its target is a policy chain.
func ours(printed string) bool {
	return ownedChain(netfilter.Target(netfilter.SplitArgs(printed)))
}
