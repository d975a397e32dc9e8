package policy

import (
	"reflect"
	"slices"
	"testing"
	"time"
)

func sig(fam, chain string, pods int) Signature {
	return Signature{Chain: chain, Family: fam, Direction: "ingress", Policies: []string{"x/" + chain}, Pods: pods}
}

func chainsOf(sigs []Signature) []string {
	var out []string
	for _, s := range sigs {
		out = append(out, s.Family+" "+s.Chain)
	}
	return out
}

// Retention keeps what had pods in the last Ruleset, and what lost its
// pods within For, at most Max of those (the most recently used), and
// forgets what a Ruleset left out.
func TestRetention(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	rs := func(sigs ...Signature) *Ruleset { return &Ruleset{Signatures: sigs} }
	for _, c := range []struct {
		name    string
		r       Retention
		observe []*Ruleset // one a minute from t0
		now     time.Duration
		want    []string
	}{
		{"nothing observed", Retention{}, nil, 0, nil},
		{"with pods: kept, however old", Retention{},
			[]*Ruleset{rs(sig(FamilyIPv4, "A", 1), sig(FamilyIPv6, "A", 1))}, time.Hour,
			[]string{"inet A", "inet6 A"}},
		{"without pods: kept for 5 minutes after the last Ruleset with pods", Retention{},
			[]*Ruleset{rs(sig(FamilyIPv4, "A", 1), sig(FamilyIPv4, "B", 2)), rs(sig(FamilyIPv4, "A", 0), sig(FamilyIPv4, "B", 1))},
			4*time.Minute + 59*time.Second, []string{"inet A", "inet B"}},
		{"without pods: gone after 5 minutes", Retention{},
			[]*Ruleset{rs(sig(FamilyIPv4, "A", 1), sig(FamilyIPv4, "B", 2)), rs(sig(FamilyIPv4, "A", 0), sig(FamilyIPv4, "B", 1))},
			5 * time.Minute, []string{"inet B"}},
		{"a kept signature observed again without pods does not renew", Retention{For: 2 * time.Minute},
			[]*Ruleset{rs(sig(FamilyIPv4, "A", 1)), rs(sig(FamilyIPv4, "A", 0)), rs(sig(FamilyIPv4, "A", 0))},
			2 * time.Minute, nil},
		{"left out of a Ruleset: forgotten", Retention{},
			[]*Ruleset{rs(sig(FamilyIPv4, "A", 1), sig(FamilyIPv4, "B", 1)), rs(sig(FamilyIPv4, "B", 1))},
			time.Minute, []string{"inet B"}},
		{"first seen without pods (kept by an earlier run): kept from then", Retention{For: time.Minute},
			[]*Ruleset{rs(sig(FamilyIPv4, "A", 0))}, 59 * time.Second, []string{"inet A"}},
		{"at most Max without pods, the most recently used", Retention{Max: 2},
			[]*Ruleset{
				rs(sig(FamilyIPv4, "A", 1), sig(FamilyIPv4, "B", 1), sig(FamilyIPv4, "C", 1), sig(FamilyIPv4, "D", 1)),
				rs(sig(FamilyIPv4, "A", 1), sig(FamilyIPv4, "B", 0), sig(FamilyIPv4, "C", 1), sig(FamilyIPv4, "D", 1)),
				rs(sig(FamilyIPv4, "A", 0), sig(FamilyIPv4, "B", 0), sig(FamilyIPv4, "C", 1), sig(FamilyIPv4, "D", 0)),
				rs(sig(FamilyIPv4, "A", 0), sig(FamilyIPv4, "B", 0), sig(FamilyIPv4, "C", 0), sig(FamilyIPv4, "D", 0)),
			},
			3 * time.Minute, []string{"inet A", "inet C"}}, // C last had pods at 2, A and D at 1
		{"ties broken by family and name", Retention{Max: 1},
			[]*Ruleset{rs(sig(FamilyIPv4, "B", 1), sig(FamilyIPv6, "A", 1)), rs(sig(FamilyIPv4, "B", 0), sig(FamilyIPv6, "A", 0))},
			time.Minute, []string{"inet B"}},
		{"negative For: nothing", Retention{For: -1},
			[]*Ruleset{rs(sig(FamilyIPv4, "A", 1))}, 0, nil},
		{"negative Max: only what has pods", Retention{Max: -1},
			[]*Ruleset{rs(sig(FamilyIPv4, "A", 1), sig(FamilyIPv4, "B", 1)), rs(sig(FamilyIPv4, "A", 0), sig(FamilyIPv4, "B", 1))},
			time.Minute, []string{"inet B"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := c.r
			for i, rs := range c.observe {
				r.Observe(rs, at(time.Duration(i)*time.Minute))
			}
			if got := chainsOf(r.Keep(at(c.now))); !slices.Equal(got, c.want) {
				t.Errorf("kept %v, want %v", got, c.want)
			}
		})
	}
}

// With Input.Keep from a Retention, as tabbyd compiles, a local pod whose
// labels flip to another local pod's and back changes set members only:
// no chain, set or dispatch rule comes or goes, though the combination it
// left has no pod. Without, each flip changes chains. Verdicts are those
// of the pod's labels either way.
func TestKeepFlipChangesOnlySets(t *testing.T) {
	for _, keep := range []bool{true, false} {
		w := newXYZ(1)
		w.policies = nps(
			pol("x", "p", ml("pod", "a"), ingress(peers{selPeer(mlp("pod", "b"))})),
			pol("x", "q", all, types(tEg), egress(peers{nsPeer(mlp("ns", "z"))})),
			pol("x", "r", ml("pod", "c"), ingress(nil, num("TCP", 81))))
		var r Retention
		now := time.Unix(0, 0)
		compile := func() *Ruleset {
			in := w.input("n1")
			if keep {
				in.Keep = r.Keep(now)
			}
			rs := Compile(in)
			checkRuleset(t, rs)
			r.Observe(rs, now)
			now = now.Add(10 * time.Second)
			return rs
		}
		first := compile()
		var prev *Ruleset = first
		for i, l := range []string{"a", "c", "a", "c"} { // x/c is the only pod=c
			w.pod("x/c").labels = map[string]string{"pod": l}
			rs := compile()
			if changed := !reflect.DeepEqual(prev.Chains, rs.Chains); changed == keep {
				t.Errorf("keep %v, flip %d to pod=%s: chains changed %v", keep, i+1, l, changed)
			}
			if keep && !slices.Equal(setNames(prev), setNames(rs)) {
				t.Errorf("flip %d: set names changed: %v -> %v", i+1, setNames(prev), setNames(rs))
			}
			idle := 0
			for _, s := range rs.Signatures {
				if s.Pods == 0 {
					idle++
				}
			}
			if want := map[bool]int{true: 2, false: 0}[keep && l == "a"]; idle != want {
				t.Errorf("keep %v, flip %d: %d signatures without pods, want %d: %+v", keep, i+1, idle, want, rs.Signatures)
			}
			for f, m := range machines(t, rs) {
				a, c := w.pod("y/a"), w.pod("x/c")
				v, _ := m.forward(pkt{src: a.addr(f), dst: c.addr(f), in: a.iface(), out: c.iface(), proto: "tcp", dport: 81, ctstate: "NEW"})
				// pod=a takes ingress from pod=b only; pod=c on 81 from anyone.
				if want := l == "c"; (v == vAccept) != want {
					t.Errorf("keep %v, flip %d %s: y/a -> x/c (pod=%s):81 accepted %v, want %v", keep, i+1, families[f], l, v == vAccept, want)
				}
			}
			prev = rs
		}
		// A kept combination whose policy is deleted goes.
		w.pod("x/c").labels = map[string]string{"pod": "a"}
		compile()
		w.policies = w.policies[:2]
		rs := compile()
		for _, s := range rs.Signatures {
			if slices.Contains(s.Policies, "x/r") {
				t.Errorf("keep %v: %s kept after x/r was deleted", keep, s.Chain)
			}
		}
	}
}

func setNames(rs *Ruleset) []string {
	var n []string
	for _, s := range rs.Sets {
		n = append(n, s.Name)
	}
	return n
}

// Input.Keep entries that are no combination of the input's policies a
// pod could have are left out; the others make a chain and an empty set.
func TestKeepInvalid(t *testing.T) {
	w := newXYZ(1)
	w.policies = nps(
		pol("x", "p", ml("pod", "nobody"), ingress(nil)),
		pol("x", "q", ml("pod", "nobody"), types(tIn, tEg)),
		pol("x", "r", ml("pod", "nobody"), types(tEg)))
	w.cnps = cnps(
		cnp("adm", admin, 10, subjNs(mlp("ns", "nobody")), cin(deny, cpeers{pNs(mlp("ns", "y"))})),
		cnp("base", baseline, 10, subjNs(mlp("ns", "nobody")), cin(deny, cpeers{pNs(mlp("ns", "y"))})))
	for _, c := range []struct {
		name string
		keep Signature
		ok   bool
	}{
		{"one policy", Signature{Family: FamilyIPv4, Direction: "ingress", Policies: []string{"x/p"}}, true},
		{"two, in order", Signature{Family: FamilyIPv6, Direction: "ingress", Policies: []string{"x/p", "x/q"}}, true},
		{"admin then policy", Signature{Family: FamilyIPv4, Direction: "ingress", Policies: []string{"cnp:adm", "x/q"}}, true},
		{"baseline alone", Signature{Family: FamilyIPv4, Direction: "ingress", Policies: []string{"cnp:base"}}, true},
		{"egress", Signature{Family: FamilyIPv4, Direction: "egress", Policies: []string{"x/q", "x/r"}}, true},
		{"out of order", Signature{Family: FamilyIPv4, Direction: "ingress", Policies: []string{"x/q", "x/p"}}, false},
		{"twice", Signature{Family: FamilyIPv4, Direction: "ingress", Policies: []string{"x/p", "x/p"}}, false},
		{"policy before admin", Signature{Family: FamilyIPv4, Direction: "ingress", Policies: []string{"x/q", "cnp:adm"}}, false},
		{"baseline with a policy", Signature{Family: FamilyIPv4, Direction: "ingress", Policies: []string{"cnp:base", "x/p"}}, false},
		{"unknown policy", Signature{Family: FamilyIPv4, Direction: "ingress", Policies: []string{"x/zz"}}, false},
		{"egress only policy in ingress", Signature{Family: FamilyIPv4, Direction: "ingress", Policies: []string{"x/r"}}, false},
		{"ingress only policy in egress", Signature{Family: FamilyIPv4, Direction: "egress", Policies: []string{"x/p"}}, false},
		{"cnp without rules in the direction", Signature{Family: FamilyIPv4, Direction: "egress", Policies: []string{"cnp:adm"}}, false},
		{"no policies", Signature{Family: FamilyIPv4, Direction: "ingress"}, false},
		{"bad family", Signature{Family: "inet7", Direction: "ingress", Policies: []string{"x/p"}}, false},
		{"bad direction", Signature{Family: FamilyIPv4, Direction: "both", Policies: []string{"x/p"}}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := w.input("n1")
			base := Compile(in)
			in.Keep = []Signature{c.keep}
			rs := Compile(in)
			checkRuleset(t, rs)
			if !c.ok {
				if !reflect.DeepEqual(rs, base) {
					t.Errorf("the Ruleset changed: %s", rulesetDiff(rs, base))
				}
				return
			}
			if len(rs.Signatures) != len(base.Signatures)+1 {
				t.Fatalf("signatures %+v, want one more than %+v", rs.Signatures, base.Signatures)
			}
			i := slices.IndexFunc(rs.Signatures, func(s Signature) bool { return slices.Equal(s.Policies, c.keep.Policies) })
			if i < 0 {
				t.Fatalf("signatures %+v: none of %v", rs.Signatures, c.keep.Policies)
			}
			got := rs.Signatures[i]
			if got.Family != c.keep.Family || got.Direction != c.keep.Direction || got.Pods != 0 {
				t.Errorf("signature %+v, want %+v with no pods", got, c.keep)
			}
			// Kept again with its chain name, as tabbyd passes it back:
			// the same Ruleset.
			in.Keep = []Signature{got}
			if again := Compile(in); !reflect.DeepEqual(again, rs) {
				t.Errorf("kept again: %s", rulesetDiff(again, rs))
			}
		})
	}
}
