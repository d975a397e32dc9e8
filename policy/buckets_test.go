package policy

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
)

// withBuckets runs f with every dispatch chain of more than one rule
// spread over bucket chains.
func withBuckets(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	defer func(v int) { dispatchFlatMax = v }(dispatchFlatMax)
	dispatchFlatMax = 1
	f(t)
}

// TestBucketedAgainstReference runs the truth tables and the random worlds
// checked against the reference with the dispatch in buckets: the packets'
// fates must not change.
func TestBucketedAgainstReference(t *testing.T) {
	for _, c := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"UpstreamTruthTables", TestUpstreamTruthTables},
		{"TieredTruthTables", TestTieredTruthTables},
		{"RandomWorldsAgainstReference", TestRandomWorldsAgainstReference},
		{"RandomTieredWorldsAgainstReference", TestRandomTieredWorldsAgainstReference},
		{"TraceRandomWorlds", TestTraceRandomWorlds},
		{"DeniedLogRandomWorlds", TestDeniedLogRandomWorlds},
		{"IncrementalEqualsCompile", TestIncrementalEqualsCompile},
	} {
		t.Run(c.name, func(t *testing.T) { withBuckets(t, c.f) })
	}
}

// TestDispatchBuckets: a node with more signatures than DispatchFlatMax
// dispatches through buckets, each signature's rule in the bucket its hash
// names, each bucket's set the union of its signatures' sets. (TestNPWorld,
// in test/bench, checks that pods changing labels still change set members
// only, on a node of 100 pods whose dispatch is in buckets.)
func TestDispatchBuckets(t *testing.T) {
	w := newXYZ(1)
	// A policy per pod selecting it alone, for ingress: nine
	// signatures, one per pod; and dispatchFlatMax below them.
	for _, p := range w.pods {
		w.policies = append(w.policies, pol(p.ns, "only-"+p.name, ml("pod", p.name), types(networkingv1.PolicyTypeIngress)))
	}
	defer func(v int) { dispatchFlatMax = v }(dispatchFlatMax)
	dispatchFlatMax = 4
	rs := Compile(w.input("n1"))
	checkRuleset(t, rs)
	chains := map[string]Chain{}
	for _, c := range rs.Chains {
		if c.Family == FamilyIPv4 {
			chains[c.Name] = c
		}
	}
	sets := map[string]Set{}
	for _, s := range rs.Sets {
		sets[s.Name] = s
	}
	top := chains[ChainToPod]
	sigsIn := 0
	for _, r := range top.Rules {
		target, _ := ruleTarget(r)
		b, ok := strings.CutPrefix(target, ChainToPod+"-")
		if !ok {
			t.Fatalf("%s rule %q does not send to a bucket", ChainToPod, r)
		}
		bc, ok := chains[target]
		if !ok {
			t.Fatalf("bucket chain %s missing", target)
		}
		var union []string
		for _, sr := range bc.Rules {
			st, _ := ruleTarget(sr)
			h := strings.TrimPrefix(st, PolicyChainPrefix+kindPodIngress)
			if got := fmt.Sprintf("%x", bucketOf(h)); got != b {
				t.Errorf("signature %s is in bucket %s, its hash says %s", st, b, got)
			}
			union = append(union, sets[setOf(sr)].Members...)
			sigsIn++
		}
		slices.Sort(union)
		if got := sets[setOf(r)].Members; !slices.Equal(got, union) {
			t.Errorf("bucket %s's set %s holds %v, its signatures' sets %v", b, setOf(r), got, union)
		}
	}
	if sigsIn != len(w.pods) {
		t.Errorf("%d signature rules in buckets, want %d", sigsIn, len(w.pods))
	}
}
