package policy

import (
	"slices"
	"strconv"
	"strings"
)

// DeniedLog turns on the log of denied packets: every per-pod chain
// (TABBY-NP-E-/I-) gets, just before its final DROP, a rule that sends the
// packet to the NFLOG group Group with the prefix of its Denial, rate
// limited in the kernel so that a flood of denied packets costs the node
// no more than the limits allow:
//
//	-m hashlimit --hashlimit-upto <PerSource>/sec --hashlimit-burst <Burst>
//	   --hashlimit-mode srcip --hashlimit-name tabby-s-<h> --hashlimit-htable-max 65536
//	-m hashlimit --hashlimit-upto <PerNode>/sec --hashlimit-burst <Burst>
//	   --hashlimit-name tabby-n-<h>
//	-j NFLOG --nflog-group <Group> --nflog-prefix tabby:I-<H> --nflog-size 128
//
// The hashlimit tables are shared by name across every chain: each source
// address gets its own bucket (one noisy pod cannot use up another's), and
// the node's total is bounded. Packets over the limits are dropped
// unlogged. Only the first 128 bytes of a packet (its headers) are copied
// to the reader.
type DeniedLog struct {
	// Group is the NFLOG group (0-65535) the rules send to and tabbyd
	// reads; DefaultDeniedLogGroup when 0 (kube-router's, too).
	Group uint16
	// PerSource and PerNode bound the packets logged per second from one
	// source address and from all of them; Burst is how many may come at
	// once. Zero takes the defaults.
	PerSource, PerNode, Burst int
}

// Defaults of DeniedLog.
const (
	DefaultDeniedLogGroup     = 100
	DefaultDeniedLogPerSource = 10
	DefaultDeniedLogPerNode   = 1000
	DefaultDeniedLogBurst     = 20
	// DeniedLogPrefix starts the NFLOG prefix of every denied-packet rule;
	// the rest is the per-pod chain's kind and hash ("I-<H>" or "E-<H>"),
	// 22 bytes in all, within NFLOG's 64.
	DeniedLogPrefix = "tabby:"
	// deniedLogSnap is how much of each packet is copied: IPv6 with
	// extension headers and the transport header fit.
	deniedLogSnap = 128
)

// Denial is what a per-pod chain's log prefix stands for: the packets it
// logs are those the Policies (all selecting the pod, in Direction) do not
// allow. A packet is denied by all of them at once: NetworkPolicies only
// allow, and a pod they select is isolated from everything none of them
// allows.
type Denial struct {
	// Prefix is the NFLOG prefix, "tabby:I-<H>" or "tabby:E-<H>".
	Prefix string `json:"prefix"`
	// Chain is the per-pod chain (TABBY-NP-I-<H>).
	Chain string `json:"chain"`
	// Direction is "ingress" or "egress", from the local pod's side.
	Direction string `json:"direction"`
	// Policies are the policies selecting the pod ("namespace/name"),
	// sorted; none for the drop of unlisted interfaces
	// (UnlistedLogPrefix).
	Policies []string `json:"policies"`
}

// UnlistedLogPrefix is the NFLOG prefix of what Input.DenyUnlisted drops:
// packets from (egress) or to (ingress) a pod interface tabbyd has not
// programmed yet, "tabby:unlisted-E" or "tabby:unlisted-I".
func UnlistedLogPrefix(egress bool) string {
	if egress {
		return DeniedLogPrefix + "unlisted-E"
	}
	return DeniedLogPrefix + "unlisted-I"
}

// UnlistedDenials are the Denials of what Input.DenyUnlisted drops, one
// per direction, the same in every Ruleset.
func UnlistedDenials() []Denial {
	return []Denial{
		{Prefix: UnlistedLogPrefix(true), Chain: ChainFromPod, Direction: dirEgress.String()},
		{Prefix: UnlistedLogPrefix(false), Chain: ChainToPod, Direction: dirIngress.String()},
	}
}

// Reason says why the packet was dropped, for people.
func (d Denial) Reason() string {
	if len(d.Policies) == 0 {
		return "the pod's interface is not programmed by tabbyd yet (--policy-deny-unlisted drops its " + d.Direction + " until it is)"
	}
	if len(d.Policies) == 1 && tierOf(d.Policies[0]) != "NetworkPolicy" {
		return "denied by " + d.Policies[0] + " (a Deny rule of this ClusterNetworkPolicy, or one it fails closed on)"
	}
	if len(d.Policies) == 1 {
		return "default deny of policy " + d.Policies[0] + " (no rule of it allows this " + d.Direction + ")"
	}
	return "isolated for " + d.Direction + " by policies " + strings.Join(d.Policies, ", ") + " (no rule of them allows it)"
}

func (l DeniedLog) withDefaults() DeniedLog {
	if l.Group == 0 {
		l.Group = DefaultDeniedLogGroup
	}
	if l.PerSource <= 0 {
		l.PerSource = DefaultDeniedLogPerSource
	}
	if l.PerNode <= 0 {
		l.PerNode = DefaultDeniedLogPerNode
	}
	if l.Burst <= 0 {
		l.Burst = DefaultDeniedLogBurst
	}
	return l
}

// denials are the Ruleset's Denials, one per signature, when the log is on.
func (c *compiler) denials(sigs []*signature) []Denial {
	if c.in.DeniedLog == nil {
		return nil
	}
	out := make([]Denial, 0, len(sigs))
	for _, s := range sigs {
		if len(s.pols) == 0 {
			continue // only ClusterNetworkPolicies: no default deny
		}
		pols := make([]string, len(s.pols))
		for i, p := range s.pols {
			pols[i] = p.key
		}
		out = append(out, Denial{Prefix: s.logPrefix(), Chain: s.name, Direction: s.dir.String(), Policies: pols})
	}
	// A ClusterNetworkPolicy's chain is in the Ruleset when a per-pod
	// chain jumps to it (a Baseline policy's is not, when NetworkPolicies
	// select all its pods).
	chains := map[string]bool{}
	for _, ch := range c.rs.Chains {
		chains[ch.Name] = true
	}
	for _, p := range c.cnps {
		for _, dir := range allDirections {
			if p.used[dir] && p.drops(dir) && chains[p.chain(dir)] {
				out = append(out, Denial{Prefix: p.logPrefix(dir), Chain: p.chain(dir), Direction: dir.String(), Policies: []string{p.comment()}})
			}
		}
	}
	if c.in.DenyUnlisted {
		out = append(out, UnlistedDenials()...)
	}
	slices.SortFunc(out, func(a, b Denial) int { return strings.Compare(a.Prefix, b.Prefix) })
	return out
}

// logPrefix is the signature's NFLOG prefix: DeniedLogPrefix and the
// chain's name without PolicyChainPrefix.
func (s *signature) logPrefix() string {
	return DeniedLogPrefix + strings.TrimPrefix(s.name, PolicyChainPrefix)
}

// logRule is the rule logging what a chain drops with the NFLOG prefix,
// nil when the log is off.
func (c *compiler) logRule(prefix string) []string {
	if c.in.DeniedLog == nil {
		return nil
	}
	l := c.in.DeniedLog.withDefaults()
	src, all := strconv.Itoa(l.PerSource)+"/sec", strconv.Itoa(l.PerNode)+"/sec"
	burst := strconv.Itoa(l.Burst)
	return []string{
		"-m", "hashlimit", "--hashlimit-upto", src, "--hashlimit-burst", burst,
		"--hashlimit-mode", "srcip", "--hashlimit-name", limitName("s", src, burst), "--hashlimit-htable-max", "65536",
		"-m", "hashlimit", "--hashlimit-upto", all, "--hashlimit-burst", burst,
		"--hashlimit-name", limitName("n", all, burst),
		"-j", "NFLOG", "--nflog-group", strconv.Itoa(int(l.Group)), "--nflog-prefix", prefix,
		"--nflog-size", strconv.Itoa(deniedLogSnap),
	}
}

// limitName names a hashlimit table: the kernel shares a table among the
// rules naming it and keeps the rate it was made with while any rule
// names it, so the name carries the rate (new limits get a new table).
// "tabby-s-" or "tabby-n-" and 6 characters: within the kernel's 15.
func limitName(kind string, params ...string) string {
	return "tabby-" + kind + "-" + strings.ToLower(hash(params...)[:6])
}

// String is "ingress" or "egress".
func (d direction) String() string {
	if d == dirEgress {
		return "egress"
	}
	return "ingress"
}
