package policy

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

// peerSets gives, per policy chain (ingress) of a family, the pod sets
// (tabby-np-p…) its rules match, sorted and without repeats.
func peerSets(t *testing.T, rs *Ruleset, family string, keys ...string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, k := range keys {
		name := (&cpolicy{key: k}).chain(0)
		found := false
		for _, c := range rs.Chains {
			if c.Family != family || c.Name != name {
				continue
			}
			found = true
			for _, r := range c.Rules {
				for i := 0; i+1 < len(r); i++ {
					if r[i] == "--match-set" && strings.HasPrefix(r[i+1], SetPrefix+"p") {
						out[k] = append(out[k], r[i+1])
					}
				}
			}
		}
		if !found {
			t.Fatalf("%s: no ingress chain %s for %s", family, name, k)
		}
		slices.Sort(out[k])
		out[k] = slices.Compact(out[k])
	}
	return out
}

func setByName(rs *Ruleset, name string) *Set {
	for i := range rs.Sets {
		if rs.Sets[i].Name == name {
			return &rs.Sets[i]
		}
	}
	return nil
}

// prodWorld is x (dev), y and z (prod); x/a, x/c and z/a are tier=api,
// y/b tier=web.
func prodWorld(nodes int) *world {
	w := newXYZ(nodes)
	w.nsLabels["x"]["env"] = "dev"
	w.nsLabels["y"]["env"] = "prod"
	w.nsLabels["z"]["env"] = "prod"
	for k, tier := range map[string]string{"x/a": "api", "x/c": "api", "z/a": "api", "y/b": "web"} {
		w.pod(k).labels["tier"] = tier
	}
	return w
}

// Policies of different namespaces with the same namespaceSelector peer
// share one pod set per family; a rule mixing it with a podSelector peer
// has a set of its own namespace's pods besides the shared one, never a
// copy of the shared part.
func TestNamespaceSelectorPeersShareOneSet(t *testing.T) {
	w := prodWorld(1)
	w.policies = nps(
		pol("x", "from-prod", ml("pod", "a"), ingress(peers{nsPeer(mlp("env", "prod"))})),
		pol("y", "from-prod", ml("pod", "a"), ingress(peers{nsPeer(mlp("env", "prod"))})),
		pol("x", "mixed", ml("pod", "b"), ingress(peers{nsPeer(mlp("env", "prod")), selPeer(mlp("tier", "api"))})),
		pol("y", "mixed", ml("pod", "b"), ingress(peers{selPeer(mlp("tier", "api")), nsPeer(mlp("env", "prod"))})))
	rs := Compile(w.input("n1"))
	checkRuleset(t, rs)
	keys := []string{"x/from-prod", "y/from-prod", "x/mixed", "y/mixed"}
	for f, family := range families {
		got := peerSets(t, rs, family, keys...)
		wide := got["x/from-prod"]
		if len(wide) != 1 || !slices.Equal(got["y/from-prod"], wide) {
			t.Fatalf("%s: the namespaceSelector-only policies name %v and %v: want one shared set", family, wide, got["y/from-prod"])
		}
		var wantWide []string
		for _, k := range []string{"y/a", "y/b", "y/c", "z/a", "z/b", "z/c"} {
			wantWide = append(wantWide, w.pod(k).addr(f).String())
		}
		slices.Sort(wantWide)
		if s := setByName(rs, wide[0]); s == nil || !slices.Equal(s.Members, wantWide) {
			t.Errorf("%s: shared set %s = %v, want %v", family, wide[0], s, wantWide)
		}
		locals := map[string]string{}
		for _, ns := range []string{"x", "y"} {
			m := got[ns+"/mixed"]
			if len(m) != 2 || !slices.Contains(m, wide[0]) {
				t.Fatalf("%s: %s/mixed names %v: want the shared set %s and one of its own", family, ns, m, wide[0])
			}
			local := m[0]
			if local == wide[0] {
				local = m[1]
			}
			locals[ns] = local
			var want []string
			for _, p := range w.pods {
				if p.ns == ns && p.labels["tier"] == "api" {
					want = append(want, p.addr(f).String())
				}
			}
			slices.Sort(want)
			if s := setByName(rs, local); s == nil || !slices.Equal(s.Members, want) {
				t.Errorf("%s: %s/mixed's own set %s = %v, want %v", family, ns, local, s, want)
			}
		}
		if locals["x"] == locals["y"] {
			t.Errorf("%s: x and y share their podSelector set %s", family, locals["x"])
		}
		// Every pod set: the shared one and the two namespaces' own.
		var ps []string
		for _, s := range rs.Sets {
			if s.Family == family && strings.HasPrefix(s.Name, SetPrefix+"p") {
				ps = append(ps, s.Name)
			}
		}
		if len(ps) != 3 {
			t.Errorf("%s: pod sets %v, want 3", family, ps)
		}
	}
}

// A rule mixing podSelector, namespaceSelector (with and without a pod
// selector) and ipBlock peers allows exactly the union of what each allows,
// over two nodes, in both directions.
func TestMixedPeerRuleIsTheUnion(t *testing.T) {
	w := prodWorld(2)
	mixed := peers{
		nsPeer(mlp("env", "prod")),
		selPeer(mlp("tier", "api")),
		bothPeer(mlp("ns", "x"), mlp("pod", "b")), // a namespaceSelector peer naming the policy's own namespace
		ipPeer("192.168.0.0/16"),
	}
	w.policies = nps(
		pol("x", "in", ml("pod", "a"), ingress(mixed, num("TCP", 80))),
		pol("x", "eg", ml("pod", "c"), types(tEg), egress(mixed)),
		pol("y", "in", all, ingress(peers{bothPeer(mlp("env", "dev"), mlp("tier", "api")), selPeer(mlp("pod", "c"))}, named("UDP", "serve-81-udp"))))
	compare(t, w)
	rs := w.compile(t).rs[w.pod("x/a").node]
	for _, family := range families {
		if n := len(peerSets(t, rs, family, "x/in")["x/in"]); n != 2 {
			t.Errorf("%s: x/in names %d pod sets, want 2", family, n)
		}
	}
}

// A pod changing labels in a prod namespace changes the members of the
// shared namespaceSelector set only: every chain, every set name and every
// other set stay as they were. A pod of x changing labels changes x's own
// podSelector set only.
func TestProdPodChurnChangesOnlySharedSet(t *testing.T) {
	w := prodWorld(1)
	w.policies = nps(
		pol("x", "p", ml("pod", "a"), ingress(peers{bothPeer(mlp("env", "prod"), mlp("tier", "web")), selPeer(mlp("tier", "api"))})),
		pol("y", "p", ml("pod", "a"), ingress(peers{selPeer(mlp("tier", "api")), bothPeer(mlp("env", "prod"), mlp("tier", "web"))})))
	compile := func() *Ruleset {
		rs := Compile(w.input("n1"))
		checkRuleset(t, rs)
		return rs
	}
	shared := func(rs *Ruleset, family string) (wide, local string) {
		got := peerSets(t, rs, family, "x/p", "y/p")
		common := []string{}
		for _, s := range got["x/p"] {
			if slices.Contains(got["y/p"], s) {
				common = append(common, s)
			}
		}
		if len(common) != 1 || len(got["x/p"]) != 2 {
			t.Fatalf("%s: x/p names %v, y/p %v: want one shared set and one each", family, got["x/p"], got["y/p"])
		}
		wide = common[0]
		local = got["x/p"][0]
		if local == wide {
			local = got["x/p"][1]
		}
		return wide, local
	}
	for _, c := range []struct {
		name   string
		change func()
		which  func(wide, local string) string
	}{
		{"z/c becomes tier=web", func() { w.pod("z/c").labels["tier"] = "web" }, func(wide, _ string) string { return wide }},
		{"y/b leaves tier=web", func() { delete(w.pod("y/b").labels, "tier") }, func(wide, _ string) string { return wide }},
		{"x/b becomes tier=api", func() { w.pod("x/b").labels["tier"] = "api" }, func(_, local string) string { return local }},
	} {
		before := compile()
		c.change()
		after := compile()
		if !reflect.DeepEqual(before.Chains, after.Chains) {
			t.Errorf("%s: chains changed", c.name)
		}
		if len(before.Sets) != len(after.Sets) {
			t.Fatalf("%s: %d sets -> %d", c.name, len(before.Sets), len(after.Sets))
		}
		want := map[string]bool{}
		for _, family := range families {
			wide, local := shared(after, family)
			want[c.which(wide, local)] = true
		}
		for i, b := range before.Sets {
			a := after.Sets[i]
			if a.Name != b.Name {
				t.Fatalf("%s: set %s became %s", c.name, b.Name, a.Name)
			}
			if changed := !slices.Equal(a.Members, b.Members); changed != want[a.Name] {
				t.Errorf("%s: set %s changed %v, want %v (%v -> %v)", c.name, a.Name, changed, want[a.Name], b.Members, a.Members)
			}
		}
	}
	compare(t, w)
}
