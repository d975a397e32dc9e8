package policy

import (
	"fmt"
	"math/rand"
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"

	cnpv1 "github.com/tabbynet/tabby/api/cnp/v1beta1"
)

// TestTraceRandomWorlds traces every connection of random worlds hop by
// hop, as `tabbyctl policy trace` does, and checks the explanation against
// the reference semantics: the verdict, and for each direction the
// policies that select the pod and the one said to allow the packet.
func TestTraceRandomWorlds(t *testing.T) {
	n := 150
	if testing.Short() {
		n = 30
	}
	for seed := 0; seed < n; seed++ {
		g := &gen{c: &chooser{r: rand.New(rand.NewSource(int64(1000 + seed)))}, valid: true}
		w := g.world()
		t.Run(fmt.Sprint(seed), func(t *testing.T) { traceWorld(t, w) })
	}
}

func traceWorld(t *testing.T, w *world) {
	c := w.compile(t)
	for _, from := range w.endpoints(true) {
		for _, to := range w.endpoints(true) {
			if from == to || (from.ext && to.ext) {
				continue
			}
			for _, pp := range []struct {
				proto string
				port  int
			}{{"tcp", 80}, {"udp", 81}, {"sctp", 80}, {"icmp", 0}} {
				traceOne(t, w, c, from, to, pp.proto, pp.port)
			}
		}
	}
}

// traceOne checks one connection's trace against the reference.
func traceOne(t *testing.T, w *world, c *cluster, from, to *tpod, proto string, port int) {
	t.Helper()
	end := func(p *tpod) TraceEnd {
		if p.ext {
			return TraceEnd{Addr: p.v4}
		}
		return TraceEnd{Addr: p.v4, Node: p.node, Rules: c.rs[p.node], Iface: p.iface()}
	}
	ct, err := TraceConnection(end(from), end(to), proto, port)
	if err != nil {
		t.Fatal(err)
	}
	what := fmt.Sprintf("%s -> %s %s/%d", from.key(), to.key(), proto, port)
	if want := w.oracle(t, from, to, proto, port, 0); ct.Allowed != want {
		t.Fatalf("%s: trace says allowed=%v, the reference %v\npolicies: %s", what, ct.Allowed, want, describe(w))
	}
	for _, dir := range []struct {
		d    *Decision
		pod  *tpod
		typ  networkingv1.PolicyType
		name string
	}{{ct.Egress, from, networkingv1.PolicyTypeEgress, "egress"}, {ct.Ingress, to, networkingv1.PolicyTypeIngress, "ingress"}} {
		if (dir.d == nil) != dir.pod.ext {
			t.Fatalf("%s: %s decision %+v for an end that is a pod: %v", what, dir.name, dir.d, !dir.pod.ext)
		}
		if dir.d == nil {
			continue
		}
		d := dir.d
		if d.Verdict != "allow" && d.Verdict != "deny" {
			t.Fatalf("%s: %s decision without a verdict: %+v\nhops: %+v", what, dir.name, d, ct.Hops)
		}
		var selecting []string
		for _, np := range w.policies {
			if hasType(np, dir.typ) && w.selects(t, np, dir.pod) {
				selecting = append(selecting, np.Namespace+"/"+np.Name)
			}
		}
		npSelecting := slices.Clone(selecting)
		for _, p := range w.cnps {
			rules := len(p.Spec.Ingress)
			if dir.typ == networkingv1.PolicyTypeEgress {
				rules = len(p.Spec.Egress)
			}
			asked := p.Spec.Tier == cnpv1.AdminTier || len(npSelecting) == 0 // Baseline only without NetworkPolicies
			if rules > 0 && asked && w.cnpSelects(t, p, dir.pod) {
				selecting = append(selecting, cnpComment(p))
			}
		}
		got := slices.Clone(d.Policies)
		slices.Sort(got)
		slices.Sort(selecting)
		if !slices.Equal(got, selecting) {
			t.Fatalf("%s %s: trace lists policies %v, the reference %v", what, dir.name, got, selecting)
		}
		tier, by := w.refDecider(t, dir.typ == networkingv1.PolicyTypeEgress, from, to, proto, port, len(npSelecting) > 0)
		if d.Tier != tier {
			t.Fatalf("%s %s: decided by tier %q (%+v), the reference %q\npolicies: %s", what, dir.name, d.Tier, d, tier, describe(w))
		}
		switch {
		case tier == "NetworkPolicy" && d.Verdict == "allow" && !w.policyAllows(t, d.AllowedBy, dir.typ, from, to, proto, port):
			t.Fatalf("%s %s: allowed by %q, whose rules do not allow it", what, dir.name, d.AllowedBy)
		case tier == "NetworkPolicy" && d.Verdict == "deny":
			for _, p := range npSelecting {
				if w.policyAllows(t, p, dir.typ, from, to, proto, port) {
					t.Fatalf("%s %s: denied, but %s allows it", what, dir.name, p)
				}
			}
		case tier != "NetworkPolicy" && d.AllowedBy+d.DeniedBy != by:
			t.Fatalf("%s %s: decided by %q%q, the reference %q", what, dir.name, d.AllowedBy, d.DeniedBy, by)
		}
	}
	if dirsAllow := (ct.Egress == nil || ct.Egress.Verdict == "allow") && (ct.Ingress == nil || ct.Ingress.Verdict == "allow"); dirsAllow != ct.Allowed {
		t.Fatalf("%s: allowed=%v but egress %+v, ingress %+v", what, ct.Allowed, ct.Egress, ct.Ingress)
	}
}

// policyAllows is whether a rule of the policy named key ("ns/name") in
// direction typ allows the connection, by the reference semantics.
func (w *world) policyAllows(t *testing.T, key string, typ networkingv1.PolicyType, from, to *tpod, proto string, port int) bool {
	for _, np := range w.policies {
		if np.Namespace+"/"+np.Name != key {
			continue
		}
		if typ == networkingv1.PolicyTypeEgress {
			for _, r := range np.Spec.Egress {
				if w.ruleAllows(t, np, r.To, r.Ports, to, to, proto, port, 0) {
					return true
				}
			}
			return false
		}
		for _, r := range np.Spec.Ingress {
			if w.ruleAllows(t, np, r.From, r.Ports, from, to, proto, port, 0) {
				return true
			}
		}
	}
	return false
}

// cnpComment is how the rules (and so a trace) name a ClusterNetworkPolicy.
func cnpComment(p *cnpv1.ClusterNetworkPolicy) string {
	if p.Spec.Tier == cnpv1.AdminTier {
		return CommentAdminPrefix + p.Name
	}
	return CommentBaselinePrefix + p.Name
}

// refDecider is, by the reference semantics, the tier that decides one
// direction of a connection ("" when none does) and, for a
// ClusterNetworkPolicy's decision, the policy (as cnpComment names it).
func (w *world) refDecider(t *testing.T, egress bool, from, to *tpod, proto string, port int, npIsolated bool) (tier, by string) {
	subject, peer := to, from
	if egress {
		subject, peer = from, to
	}
	named := func(name string) string {
		for _, p := range w.cnps {
			if p.Name == name {
				return cnpComment(p)
			}
		}
		return ""
	}
	if a, name := w.tierAction(t, true, egress, subject, peer, to, proto, port, 0); a == cnpv1.ActionAccept || a == cnpv1.ActionDeny {
		return "Admin", named(name)
	}
	if npIsolated {
		return "NetworkPolicy", ""
	}
	if a, name := w.tierAction(t, false, egress, subject, peer, to, proto, port, 0); a == cnpv1.ActionAccept || a == cnpv1.ActionDeny {
		return "Baseline", named(name)
	}
	return "", ""
}
