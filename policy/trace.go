package policy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// TracePacket is the first packet of a new connection as one node's
// FORWARD hook sees it.
type TracePacket struct {
	Src, Dst netip.Addr
	// Proto is tcp, udp, sctp or icmp; Port is the destination port (0
	// for icmp).
	Proto string
	Port  int
	// In and Out are the interfaces it comes in on and leaves by: a local
	// pod's host veth (Endpoint.HostIface), or any other name (UplinkIface)
	// for the node's own interfaces.
	In, Out string
}

// UplinkIface stands for the interface a trace's packet crosses to or
// from another node or the world: the rules treat every interface that is
// not a pod's veth or tabby's own device alike.
const UplinkIface = "eth0"

// TraceStep is one rule a traced packet matched, in the order the kernel
// runs them.
type TraceStep struct {
	Chain string `json:"chain"`
	// Rule is the rule's position in Chain, from 1.
	Rule int      `json:"rule"`
	Args []string `json:"args"`
	// Depth counts the jumps from FORWARD (0) to Chain.
	Depth int `json:"depth"`
}

// Trace verdicts: what tabby's rules do with the packet.
const (
	TraceAccept = "ACCEPT"
	TraceDrop   = "DROP"
	// TraceUntouched is traffic that is no local pod's: tabby's rules
	// return it to the rest of FORWARD.
	TraceUntouched = "RETURN"
)

// Trace runs p through the rules of rs of p's family, as the kernel would
// with the Ruleset loaded, and returns the verdict and every rule the
// packet matched. It fails when the Ruleset is one the kernel would refuse.
func Trace(rs *Ruleset, p TracePacket) (verdict string, steps []TraceStep, err error) {
	if !p.Src.IsValid() || !p.Dst.IsValid() || p.Src.Is4() != p.Dst.Is4() {
		return "", nil, fmt.Errorf("a traced packet needs a source and a destination of one family, not %s and %s", p.Src, p.Dst)
	}
	family := FamilyIPv4
	if p.Src.Is6() {
		family = FamilyIPv6
	}
	m, err := newMachine(rs, family)
	if err != nil {
		return "", nil, fmt.Errorf("the compiled rules do not load: %w", err)
	}
	m.trace = &steps
	v, _ := m.forward(pkt{src: p.Src.Unmap(), dst: p.Dst.Unmap(), proto: p.Proto, dport: p.Port, in: p.In, out: p.Out, ctstate: "NEW"})
	return v.String(), steps, nil
}

// Decision is what the policies of one direction, egress from the source
// pod or ingress to the destination pod, decided about a traced packet.
type Decision struct {
	// Direction is "egress" or "ingress".
	Direction string `json:"direction"`
	// Verdict is "allow" or "deny".
	Verdict string `json:"verdict"`
	// Policies are the policies that select the pod in this direction,
	// in the order the rules ask them: NetworkPolicies as
	// "namespace/name", ClusterNetworkPolicies as "cnp-admin:name" and
	// "cnp-baseline:name"; none: the pod is not isolated in this
	// direction.
	Policies []string `json:"policies,omitempty"`
	// Tier is the tier that decided: "Admin", "NetworkPolicy" or
	// "Baseline"; "" when none did (allowed by default).
	Tier string `json:"tier,omitempty"`
	// AllowedBy is the policy whose rule allowed the packet (DeniedBy:
	// the ClusterNetworkPolicy whose rule denied it; a NetworkPolicy tier
	// denies by no rule allowing), and Rule that rule as programmed.
	AllowedBy string   `json:"allowedBy,omitempty"`
	DeniedBy  string   `json:"deniedBy,omitempty"`
	Rule      []string `json:"rule,omitempty"`
	// PassedBy is the Admin policy whose Pass rule sent the packet on to
	// the next tier.
	PassedBy string `json:"passedBy,omitempty"`
	// Reason says in words why.
	Reason string `json:"reason"`
}

// Explain reads the steps of a Trace of rs: what egress (the packet came in
// from a local pod's veth) and ingress (it goes out to one) decided. A
// direction the node does not police for this packet is left out.
func Explain(rs *Ruleset, steps []TraceStep) []Decision {
	var out []Decision
	var cur *Decision
	policy := ""
	for _, s := range steps {
		target, _ := ruleTarget(s.Args)
		switch {
		case s.Chain == ChainPod && target == ChainFromPod:
			out = append(out, Decision{Direction: "egress"})
			cur, policy = &out[len(out)-1], ""
		case s.Chain == ChainPod && target == ChainToPod:
			out = append(out, Decision{Direction: "ingress"})
			cur, policy = &out[len(out)-1], ""
		case cur == nil:
		case isDispatchChain(s.Chain):
			dispatch(cur, s.Args, target)
			cur.Policies = policiesOf(rs, target)
		case target == "MARK" && policy != "" && cur.Verdict == "":
			markExplained(cur, policy, s.Args)
		case ruleComment(s.Args) != "" && strings.HasPrefix(target, PolicyChainPrefix):
			policy = ruleComment(s.Args)
		case target == "DROP" && cur.Verdict == "" && isCNPChain(s.Chain):
			cur.Verdict, cur.Tier, cur.DeniedBy, cur.Rule = "deny", tierOf(policy), policy, s.Args
			cur.Reason = "denied by " + policy
		case target == "DROP" && cur.Verdict == "":
			cur.Verdict, cur.Tier = "deny", "NetworkPolicy"
			cur.Reason = "selected by " + strings.Join(npOnly(cur.Policies), ", ") + ": no rule of these allows it"
		}
	}
	for i := range out {
		switch d := &out[i]; {
		case d.Verdict != "":
		case len(d.Policies) > 0:
			// Only ClusterNetworkPolicies select the pod, and none
			// decided (or one passed on to a tier with nothing).
			d.Verdict, d.Reason = "allow", "no ClusterNetworkPolicy rule decided and no NetworkPolicy selects the pod: all traffic is allowed"
		default:
			// The dispatch chain had no rule for the pod: no set of
			// policies selects it (and unknown pods are not dropped).
			d.Verdict, d.Reason = "allow", unselected(d.Direction)
		}
		if d := &out[i]; d.PassedBy != "" {
			d.Reason += " (after " + d.PassedBy + " passed it on)"
		}
	}
	return out
}

// markExplained reads a MARK rule of policy's chain that a packet matched:
// MarkAllowed set is an allow (a NetworkPolicy rule, a
// ClusterNetworkPolicy's Accept), MarkPass a Pass; clearing decides
// nothing.
func markExplained(d *Decision, policy string, args []string) {
	v, _, _ := strings.Cut(flagValue(args, "--set-xmark"), "/")
	val, err := strconv.ParseUint(v, 0, 32)
	switch {
	case err != nil:
	case val&MarkAllowed != 0:
		d.AllowedBy, d.Rule, d.Verdict, d.Tier = policy, args, "allow", tierOf(policy)
		d.Reason = "allowed by " + policy
	case val&MarkPass != 0:
		d.PassedBy = policy
	}
}

// tierOf is the tier of a policy as the jumps' comments name it.
func tierOf(policy string) string {
	switch {
	case strings.HasPrefix(policy, CommentAdminPrefix):
		return "Admin"
	case strings.HasPrefix(policy, CommentBaselinePrefix):
		return "Baseline"
	}
	return "NetworkPolicy"
}

// isCNPChain says whether a chain is a ClusterNetworkPolicy's.
func isCNPChain(chain string) bool {
	return strings.HasPrefix(chain, PolicyChainPrefix+kindCNPEgress) || strings.HasPrefix(chain, PolicyChainPrefix+kindCNPIngress)
}

// npOnly are the NetworkPolicies of a list of policies.
func npOnly(policies []string) []string {
	var out []string
	for _, p := range policies {
		if tierOf(p) == "NetworkPolicy" {
			out = append(out, p)
		}
	}
	return out
}

// flagValue is the argument after flag in a rule, "" without one.
func flagValue(args []string, flag string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			return args[i+1]
		}
	}
	return ""
}

func unselected(direction string) string {
	return "no " + direction + " policy selects the pod: all traffic is allowed"
}

// policiesOf lists the policies a pod's chain asks, in order: the
// comments of its jumps to policy chains.
func policiesOf(rs *Ruleset, chain string) []string {
	var out []string
	for _, c := range rs.Chains {
		if c.Name != chain {
			continue
		}
		for _, r := range c.Rules {
			if t, _ := ruleTarget(r); strings.HasPrefix(t, PolicyChainPrefix) && ruleComment(r) != "" {
				out = append(out, ruleComment(r))
			}
		}
		return out
	}
	return nil
}

// isDispatchChain says whether chain is ChainFromPod, ChainToPod or one of
// their bucket chains (DispatchBuckets).
func isDispatchChain(chain string) bool {
	for _, c := range []string{ChainFromPod, ChainToPod} {
		if rest, ok := strings.CutPrefix(chain, c); ok && (rest == "" || rest[0] == '-') {
			return true
		}
	}
	return false
}

// dispatch reads the rule of a dispatch chain (isDispatchChain) that
// matched; one sending to a bucket chain decides nothing yet.
func dispatch(d *Decision, args []string, target string) {
	switch {
	case strings.HasPrefix(target, PolicyChainPrefix):
		// The chain of the pod's policies: their rules decide.
	case target == "RETURN" && setOf(args) != "":
		d.Verdict, d.Reason = "allow", unselected(d.Direction)
	case target == "RETURN":
		d.Verdict, d.Reason = "allow", "not a pod's traffic (tabby's own device)"
	case target == "DROP":
		d.Verdict = "deny"
		d.Reason = "tabbyd does not know a pod with this veth and address yet (a pod wired while tabbyd was down, or a spoofed address): dropped until its policies are programmed"
	}
}

// ruleTarget is a rule's -j or -g target.
func ruleTarget(args []string) (string, bool) {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-j" || args[i] == "-g" {
			return args[i+1], args[i] == "-g"
		}
	}
	return "", false
}

// ruleComment is a rule's -m comment, "" without one.
func ruleComment(args []string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--comment" {
			return args[i+1]
		}
	}
	return ""
}

// setOf is the first set a rule matches, "" without one.
func setOf(args []string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--match-set" {
			return args[i+1]
		}
	}
	return ""
}

// TraceEnd is one end of a traced connection: an address, and when it is
// a pod on a node tabby programs, that node's compiled rules and the pod's
// host veth there.
type TraceEnd struct {
	Addr  netip.Addr
	Node  string // "" for an address that is no local pod of any node
	Rules *Ruleset
	Iface string
}

// TraceHop is what one node's rules did with the connection's first packet.
type TraceHop struct {
	Node    string      `json:"node"`
	In      string      `json:"in"`
	Out     string      `json:"out"`
	Verdict string      `json:"verdict"`
	Steps   []TraceStep `json:"steps"`
	// Reached is false for a hop the packet never gets to because an
	// earlier hop dropped it (egress denied): it is traced anyway, from
	// the node's uplink, so that ingress has its answer too.
	Reached bool `json:"reached"`
}

// ConnectionTrace is a traced connection: what egress from the source pod
// and ingress to the destination pod decided (nil where the end is not a
// pod tabby polices), each node's part, and whether it gets through.
type ConnectionTrace struct {
	Allowed bool       `json:"allowed"`
	Egress  *Decision  `json:"egress,omitempty"`
	Ingress *Decision  `json:"ingress,omitempty"`
	Hops    []TraceHop `json:"hops"`
}

// TraceConnection traces a new connection from src to dst (proto tcp,
// udp, sctp or icmp; port 0 for icmp) through the rules of the source
// pod's node and then the destination pod's, as the packet crosses them.
func TraceConnection(src, dst TraceEnd, proto string, port int) (*ConnectionTrace, error) {
	ct := &ConnectionTrace{Allowed: true}
	hop := func(end TraceEnd, in, out string, reached bool) error {
		v, steps, err := Trace(end.Rules, TracePacket{Src: src.Addr, Dst: dst.Addr, Proto: proto, Port: port, In: in, Out: out})
		if err != nil {
			return fmt.Errorf("node %s: %w", end.Node, err)
		}
		ct.Hops = append(ct.Hops, TraceHop{Node: end.Node, In: in, Out: out, Verdict: v, Steps: steps, Reached: reached})
		for _, d := range Explain(end.Rules, steps) {
			switch {
			case d.Direction == "egress" && ct.Egress == nil:
				ct.Egress = &d
			case d.Direction == "ingress" && ct.Ingress == nil:
				ct.Ingress = &d
			}
		}
		if reached && v == TraceDrop {
			ct.Allowed = false
		}
		return nil
	}
	out := UplinkIface
	if dst.Node != "" && dst.Node == src.Node {
		out = dst.Iface
	}
	if src.Node != "" {
		if err := hop(src, src.Iface, out, true); err != nil {
			return nil, err
		}
	}
	if dst.Node != "" && ct.Ingress == nil {
		// Another node's pod, or this node's behind an egress drop.
		if err := hop(dst, UplinkIface, dst.Iface, ct.Allowed); err != nil {
			return nil, err
		}
	}
	return ct, nil
}
