package bench

import (
	"maps"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tabbynet/tabby/daemon/netpol"
	"github.com/tabbynet/tabby/internal/netnstest"
	"github.com/tabbynet/tabby/policy"
)

// BenchmarkNetpolFlipPhases: where a label flip's time goes on tabbyd's
// path without the API server: building the compiler's input from the
// cluster's objects (a netpol.InputBuilder, as the controller does from its
// informers), compiling (policy.Incremental with a policy.Retention, as
// tabbyd) and applying (policy/apply, with
// its own phases, and how many chains it read back) in a node namespace,
// 1,000 policies / 5,000 pods. Each
// iteration flips the pod's labels, as BenchmarkNetpolLabelFlip does, by
// replacing the Pod object (informers hand out new objects).
func BenchmarkNetpolFlipPhases(b *testing.B) {
	needPolicyTools(b)
	w := newNPWorld(5000, 1000, 100)
	netns := netnstest.New(b, "np-phases")
	a := newApplier(b, netns, nil)
	inc := policy.NewIncremental()
	var builder netpol.InputBuilder
	// As the controller compiles: keeping the combinations of policies
	// local pods had (policy.Retention).
	var ret policy.Retention
	compileKeep := func(in *policy.Input) *policy.Ruleset {
		in.Keep = ret.Keep(time.Now())
		rs := inc.Compile(in)
		ret.Observe(rs, time.Now())
		return rs
	}
	if _, err := applyIn(netns, a, compileKeep(w.inputWith(&builder))); err != nil {
		b.Fatal(err)
	}
	var remote, local, other int = -1, -1, -1
	for i, p := range w.Pods {
		if p.Namespace != npNamespace(3) {
			continue
		}
		switch {
		case p.Spec.NodeName != npNode && p.Labels["app"] == "app4" && remote < 0:
			remote = i
		case p.Spec.NodeName == npNode && local < 0:
			local = i
		case p.Spec.NodeName == npNode && other < 0:
			other = i
		}
	}
	remoteTo := maps.Clone(w.Pods[remote].Labels)
	remoteTo["app"], remoteTo["tier"] = "app6", "db"
	for _, c := range []struct {
		name string
		pod  int
		to   map[string]string
	}{{"remote-pod", remote, remoteTo}, {"local-pod", local, w.Pods[other].Labels}} {
		b.Run(c.name, func(b *testing.B) {
			labels := [2]map[string]string{maps.Clone(w.Pods[c.pod].Labels), maps.Clone(c.to)}
			var input, compile, apply, sets, chains, jumps, stale time.Duration
			n, state, readBack, written := 0, 0, 0, 0
			for b.Loop() {
				state = 1 - state
				p := w.Pods[c.pod].DeepCopy()
				p.Labels = labels[state]
				w.Pods[c.pod] = p
				t0 := time.Now()
				in := w.inputWith(&builder)
				t1 := time.Now()
				rs := compileKeep(in)
				t2 := time.Now()
				st, err := applyIn(netns, a, rs)
				if err != nil {
					b.Fatal(err)
				}
				input += t1.Sub(t0)
				compile += t2.Sub(t1)
				apply += st.Total
				sets += st.SetsTime
				chains += st.ChainsTime
				jumps += st.JumpsTime
				stale += st.StaleTime
				readBack += st.ChainsReadBack
				written += st.ChainsWritten + st.ChainsDeleted
				n++
			}
			b.ReportMetric(msOf(input, n), "input-ms")
			b.ReportMetric(msOf(compile, n), "compile-ms")
			b.ReportMetric(msOf(apply, n), "apply-ms")
			b.ReportMetric(msOf(apply-sets-chains-jumps-stale, n), "validate-ms")
			b.ReportMetric(msOf(sets, n), "ipset-ms")
			b.ReportMetric(msOf(chains, n), "chains-ms")
			b.ReportMetric(msOf(jumps, n), "jumps-ms")
			b.ReportMetric(msOf(stale, n), "stale-ms")
			b.ReportMetric(float64(readBack)/float64(n), "readback-chains/op")
			b.ReportMetric(float64(written)/float64(n), "chain-changes/op")
			if state == 1 {
				p := w.Pods[c.pod].DeepCopy()
				p.Labels = labels[0]
				w.Pods[c.pod] = p
				if _, err := applyIn(netns, a, compileKeep(w.inputWith(&builder))); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkNetpolBuildInput: the "input" phase of
// BenchmarkNetpolFlipPhases alone, for 1,000 policies / 5,000 pods:
// netpol.BuildInput (a first sync), and an InputBuilder as tabbyd's loop
// uses, one pod's labels flipping (a new Pod object) between builds.
// (Pure: no root, no kernel.)
func BenchmarkNetpolBuildInput(b *testing.B) {
	b.Run("first", func(b *testing.B) {
		w := newNPWorld(5000, 1000, 100)
		b.ReportAllocs()
		for b.Loop() {
			w.input()
		}
	})
	b.Run("flip", func(b *testing.B) {
		w := newNPWorld(5000, 1000, 100)
		var builder netpol.InputBuilder
		w.inputWith(&builder)
		labels := [2]map[string]string{maps.Clone(w.Pods[7].Labels), {"app": "flipped"}}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			p := w.Pods[7].DeepCopy()
			p.Labels = labels[i%2]
			w.Pods[7] = p
			w.inputWith(&builder)
		}
	})
}

// BenchmarkNetpolDecodeClusterPolicies: what tabbyd's loop spends on 100
// ClusterNetworkPolicies (npCNP), which its informer holds as
// unstructured objects, at each sync: all of them decoded
// (netpol.DecodeClusterPolicies, a first sync) and, with the loop's
// InputBuilder, a sync where one of them changed. (Pure: no root, no
// kernel.)
func BenchmarkNetpolDecodeClusterPolicies(b *testing.B) {
	objs := make([]*unstructured.Unstructured, 100)
	for i := range objs {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(npCNP(i))
		if err != nil {
			b.Fatal(err)
		}
		objs[i] = &unstructured.Unstructured{Object: m}
	}
	b.Run("first", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			netpol.DecodeClusterPolicies(objs)
		}
	})
	b.Run("one-changed", func(b *testing.B) {
		var builder netpol.InputBuilder
		builder.ClusterPolicies(objs)
		b.ReportAllocs()
		for b.Loop() {
			objs[7] = objs[7].DeepCopy()
			if _, bad := builder.ClusterPolicies(objs); len(bad) > 0 {
				b.Fatal(bad)
			}
		}
	})
}
