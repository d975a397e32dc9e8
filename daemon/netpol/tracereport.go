package netpol

import (
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/tabbynet/tabby/policy"
)

// TraceReport is what `tabbyctl policy trace` prints.
type TraceReport struct {
	Src      TraceEnd `json:"source"`
	Dst      TraceEnd `json:"destination"`
	Family   int      `json:"family"`
	Protocol string   `json:"protocol"`
	Port     int      `json:"port,omitempty"`
	*policy.ConnectionTrace
	SrcPolicies []PolicyMatch `json:"sourcePolicies,omitempty"`
	DstPolicies []PolicyMatch `json:"destinationPolicies,omitempty"`
}

// String names the end for the report: the pod, its addresses and node.
func (t TraceEnd) String() string {
	switch {
	case t.Pod != "" && t.Pod != t.Ref:
		return fmt.Sprintf("%s (pod %s on %s)", t.Ref, t.Pod, t.Node)
	case t.Pod != "":
		return fmt.Sprintf("%s (%s on %s)", t.Pod, joinAddrs(t.Addrs), t.Node)
	}
	return t.Ref
}

func joinAddrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

// Write prints the report as text; wide adds every rule matched.
func (r *TraceReport) Write(w io.Writer, wide bool) error {
	what := "ping (ICMP echo)"
	if r.Port != 0 {
		what = fmt.Sprintf("%s/%d", r.Protocol, r.Port)
	}
	verdict := "ALLOWED"
	if !r.Allowed {
		verdict = "DENIED"
	}
	fmt.Fprintf(w, "%s -> %s, %s over IPv%d: %s\n", r.Src, r.Dst, what, r.Family, verdict)
	writeDecision(w, "egress from "+r.Src.Ref, r.Src, r.Egress)
	writeDecision(w, "ingress to "+r.Dst.Ref, r.Dst, r.Ingress)
	for _, x := range []struct {
		ref string
		ms  []PolicyMatch
	}{{r.Src.Ref, r.SrcPolicies}, {r.Dst.Ref, r.DstPolicies}} {
		if x.ms == nil {
			continue
		}
		fmt.Fprintf(w, "NetworkPolicies of %s's namespace:\n", x.ref)
		for _, m := range x.ms {
			sel := "does not select it"
			if m.Selects {
				sel = "selects it for " + strings.Join(m.Types, ", ")
			}
			fmt.Fprintf(w, "  %s %s: %s\n", m.Policy, sel, m.Why)
		}
	}
	if wide {
		for _, h := range r.Hops {
			note := ""
			if !h.Reached {
				note = " (not reached: traced from the uplink for ingress's answer)"
			}
			fmt.Fprintf(w, "rules on %s, in %s out %s: %s%s\n", h.Node, h.In, h.Out, h.Verdict, note)
			for _, s := range h.Steps {
				fmt.Fprintf(w, "  %s%s #%d: %s\n", strings.Repeat("  ", s.Depth), s.Chain, s.Rule, strings.Join(s.Args, " "))
			}
		}
	}
	return nil
}

func writeDecision(w io.Writer, title string, end TraceEnd, d *policy.Decision) {
	switch {
	case d != nil:
		fmt.Fprintf(w, "  %s: %s: %s\n", title, d.Verdict, d.Reason)
		if len(d.Rule) > 0 {
			fmt.Fprintf(w, "    rule: %s\n", strings.Join(d.Rule, " "))
		}
	case end.HostNetwork:
		fmt.Fprintf(w, "  %s: allow: the pod is in its node's network, which NetworkPolicy does not police\n", title)
	case end.Pod == "":
		fmt.Fprintf(w, "  %s: allow: not a pod (policies apply to pods only)\n", title)
	default:
		fmt.Fprintf(w, "  %s: allow: not policed by tabby (no node, or no veth on it)\n", title)
	}
}
