package policy

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
)

// hostilePeers are the ipBlocks of issue 11: 0.0.0.0/0 and ::/0 with n
// excepts each, plus one that hides the pods y/a and y/b.
func hostilePeers(n int) peers {
	b4, b6 := hostileBlocks(n)
	ex := func(b ipBlock, extra string) []string {
		out := []string{extra}
		for _, e := range b.except {
			out = append(out, e.String())
		}
		return out
	}
	return peers{ipPeer("0.0.0.0/0", ex(b4, "10.0.1.10/31")...), ipPeer("::/0", ex(b6, "fd00::1:10/127")...)}
}

// emptied is the policy with its rules removed: what a policy over the
// limits must enforce (it isolates its pods, allows them nothing).
func emptied(p *networkingv1.NetworkPolicy) *networkingv1.NetworkPolicy {
	q := p.DeepCopy()
	if len(q.Spec.PolicyTypes) == 0 {
		q.Spec.PolicyTypes = []networkingv1.PolicyType{tIn}
		if len(q.Spec.Egress) > 0 {
			q.Spec.PolicyTypes = append(q.Spec.PolicyTypes, tEg)
		}
	}
	q.Spec.Ingress, q.Spec.Egress = nil, nil
	return q
}

// compareAs checks every connection of w (one protocol and port) against
// the reference semantics of the policies ref.
func compareAs(t *testing.T, w *world, ref []*networkingv1.NetworkPolicy, proto string, port int) *cluster {
	t.Helper()
	c := w.compile(t)
	rw := *w
	rw.policies = ref
	for fam := 0; fam < 2 && !(fam == 1 && w.noV6); fam++ {
		if d := w.diff(rw.expected(t, proto, port, fam), c.observe(t, proto, port, fam)); d != "" {
			t.Fatalf("%s/%d %s: %s", proto, port, families[fam], d)
		}
	}
	return c
}

func netSets(rs *Ruleset) map[string]int {
	out := map[string]int{}
	for _, s := range rs.Sets {
		if s.Type == SetHashNet {
			out[s.Name] = len(s.Members)
		}
	}
	return out
}

func TestLimits(t *testing.T) {
	hostile := pol("x", "big", ml("pod", "a"), types(tEg), egress(hostilePeers(11000)))
	// Many sets: a rule per address, each its own hash:net set.
	manySets := pol("x", "big", ml("pod", "a"), types(tEg))
	for i := 0; i < 12; i++ {
		egress(peers{ipPeer(fmt.Sprintf("192.168.7.%d/32", i))})(&manySets.Spec)
	}
	// Many rules: 100 ports apart take 7 multiport rules.
	manyRules := pol("x", "big", ml("pod", "a"), types(tEg, tIn), ingress(nil, num("TCP", 80)))
	var ports []port
	for i := int32(0); i < 100; i++ {
		ports = append(ports, num("TCP", 1001+2*i))
	}
	egress(peers{ipPeer("192.168.7.0/24")}, append(ports, num("TCP", 80))...)(&manyRules.Spec)

	// Normal policies next to it, one selecting the same pod: at most 4
	// sets and 2 rules (per family) each.
	normal := []*networkingv1.NetworkPolicy{
		pol("y", "from-x", all, ingress(peers{nsPeer(mlp("ns", "x"))})),
		pol("x", "a-to-z", ml("pod", "a"), types(tEg), egress(peers{nsPeer(mlp("ns", "z"))})),
		pol("z", "web", all, ingress(peers{selPeer(&all), ipPeer("10.0.0.0/8", "10.0.2.0/24")}, num("TCP", 80))),
	}

	for _, tc := range []struct {
		name   string
		big    *networkingv1.NetworkPolicy
		limits Limits
		// over is the flag of the limit the big policy is over, "" when
		// it is enforced as written.
		over string
	}{
		{"11,000 excepts: compact and enforced", hostile, Limits{}, ""},
		{"exactly at the member limit", hostile, Limits{SetMembers: 11003}, ""},
		{"one member over", hostile, Limits{SetMembers: 11002}, FlagMaxSetMembers},
		{"12 sets, at the limit", manySets, Limits{Sets: 12}, ""},
		{"12 sets over 11", manySets, Limits{Sets: 11}, FlagMaxPolicySets},
		{"8 rules, at the limit", manyRules, Limits{Rules: 8}, ""},
		{"8 rules over 7", manyRules, Limits{Rules: 7}, FlagMaxRules},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newXYZ(2)
			w.policies, w.limits = append([]*networkingv1.NetworkPolicy{tc.big}, normal...), tc.limits
			ref := w.policies
			if tc.over != "" {
				ref = append([]*networkingv1.NetworkPolicy{emptied(tc.big)}, normal...)
			}
			var c *cluster
			for _, port := range []int{80, 1001} {
				c = compareAs(t, w, ref, "tcp", port)
			}
			rs := c.rs[w.pod("x/a").node]
			var problems []Problem
			for _, p := range rs.Problems {
				if p.Name == "big" {
					problems = append(problems, p)
				} else {
					t.Errorf("a problem with a normal policy: %+v", p)
				}
			}
			if tc.big == hostile {
				big := 0
				for name, n := range netSets(rs) {
					if n > 1000 {
						big++
						if n != 11003 {
							t.Errorf("the hostile ipBlocks take %d members in %s, want 11003 (two /1s, 11,001 nomatch)", n, name)
						}
					}
				}
				if want := map[bool]int{true: 2, false: 0}[tc.over == ""]; big != want {
					t.Errorf("%d sets of the hostile policy in the Ruleset, want %d", big, want)
				}
			}
			if tc.over == "" {
				if len(problems) > 0 {
					t.Fatalf("problems %+v; want none", problems)
				}
				return
			}
			if len(problems) != 1 || problems[0].Limit != tc.over || problems[0].Kind != KindNetworkPolicy ||
				!strings.Contains(problems[0].Message, "--"+tc.over) || !strings.Contains(problems[0].Message, "allows them nothing") {
				t.Fatalf("problems %+v; want one naming --%s and saying the policy allows nothing", problems, tc.over)
			}
		})
	}
}

// A policy over the limits never makes a pod more open than the policy
// would, whatever else selects it: random worlds with a small member limit
// are enforced as the same worlds with the over-limit policies emptied.
func TestLimitsFailClosedRandom(t *testing.T) {
	n := 200
	if testing.Short() {
		n = 30
	}
	overSeen := 0
	for seed := 0; seed < n; seed++ {
		g := &gen{c: &chooser{r: rand.New(rand.NewSource(int64(seed)))}, valid: true}
		w := g.world()
		w.limits = Limits{SetMembers: 2, Rules: 6}
		w.cnps = nil // the reference below empties NetworkPolicies
		// One node: what is over the limits depends on the node (which
		// directions of a policy select a pod there, the local pods'
		// named ports), and the reference is one set of policies.
		w.nodes = []string{"n1"}
		for _, p := range w.pods {
			p.node = "n1"
		}
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			over := map[string]bool{}
			for _, p := range Compile(w.input("n1")).Problems {
				if p.Limit == "" {
					t.Fatalf("problem with a valid policy: %+v", p)
				}
				over[p.Namespace+"/"+p.Name] = true
			}
			var ref []*networkingv1.NetworkPolicy
			for _, p := range w.policies {
				if over[p.Namespace+"/"+p.Name] {
					p = emptied(p)
					overSeen++
				}
				ref = append(ref, p)
			}
			for _, proto := range []string{"tcp", "udp"} {
				compareAs(t, w, ref, proto, 80)
			}
		})
	}
	if overSeen < n/4 {
		t.Errorf("only %d policies over the limits in %d worlds: the test does not test much", overSeen, n)
	}
}
