package extender

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	"k8s.io/utils/ptr"
)

// fuzzSeeds are requests as kube-scheduler sends them: node names with
// nodeCacheCapable, full Nodes without, for pods using each rule.
func fuzzSeeds(t testing.TB) [][]byte {
	spread := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "spread", Namespace: "default", Labels: map[string]string{"app": "web"}},
		Spec: v1.PodSpec{
			Containers: []v1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10.1"}},
			TopologySpreadConstraints: []v1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: v1.LabelTopologyZone,
				WhenUnsatisfiable: v1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
				MinDomains: ptr.To(int32(2)), MatchLabelKeys: []string{"pod-template-hash"}}},
			Tolerations: []v1.Toleration{{Key: "dedicated", Operator: v1.TolerationOpEqual, Value: "gpu", Effect: v1.TaintEffectNoSchedule}},
			Affinity: &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{
				{TopologyKey: v1.LabelHostname, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}}},
		}}
	tainted := node("n6", map[string]string{"zone": "c"})
	tainted.Spec.Taints = []v1.Taint{{Key: "dedicated", Value: "gpu", Effect: v1.TaintEffectNoSchedule}}
	names := []string{"n1", "n2", "n3", "n4", "n5"}
	return [][]byte{
		mustJSON(t, extenderv1.ExtenderArgs{Pod: zonePod(), NodeNames: &names}),
		mustJSON(t, extenderv1.ExtenderArgs{Pod: zonePod(), Nodes: nodeList(testNodes()...)}),
		mustJSON(t, extenderv1.ExtenderArgs{Pod: spread, NodeNames: &names}),
		mustJSON(t, extenderv1.ExtenderArgs{Pod: spread, Nodes: nodeList(append(testNodes(), tainted)...)}),
		mustJSON(t, extenderv1.ExtenderArgs{Pod: requiredPod(fields(req("metadata.name", v1.NodeSelectorOpIn, "n1"))), Nodes: nodeList(testNodes()...)}),
		mustJSON(t, extenderv1.ExtenderArgs{Pod: requiredPod(exprs(req("gpu", v1.NodeSelectorOpGt, "4"))), Nodes: nodeList(testNodes()...)}),
	}
}

// FuzzDecodeArgs feeds the decoder, then the whole filter and prioritize
// path over the node plugins, arbitrary bytes grown from real requests: it
// never panics; it accepts only requests with a Pod and nodes, which encode
// and decode again to the same; it refuses the rest with a 4xx; and what
// it accepts is answered, never with a 5xx.
func FuzzDecodeArgs(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	f.Add([]byte(`{"Pod":null,"NodeNames":null}`))
	f.Add([]byte(`{"Pod":{},"Nodes":{"items":[{"metadata":{"name":""}}]}}`))
	mux, _ := newTestMux(f, 1<<20)
	f.Fuzz(func(t *testing.T, data []byte) {
		args, err := DecodeArgs(data)
		if err != nil {
			var re *requestError
			if !errors.As(err, &re) || re.code != http.StatusBadRequest {
				t.Fatalf("refused with %v, not a 400", err)
			}
			return
		}
		if args.Pod == nil || (args.Nodes == nil && args.NodeNames == nil) {
			t.Fatalf("accepted %q without a Pod or nodes", data)
		}
		again, err := DecodeArgs(mustJSON(t, args))
		if err != nil {
			t.Fatalf("accepted %q but not its own encoding: %v", data, err)
		}
		if a, b := mustJSON(t, args), mustJSON(t, again); string(a) != string(b) {
			t.Fatalf("round trip changed the request:\n%s\n%s", a, b)
		}
		for _, path := range []string{"/filter", "/prioritize"} {
			w := do(mux, "POST", path, "application/json", data)
			if w.Code >= 500 {
				t.Fatalf("%s of %q: %d %s", path, data, w.Code, w.Body)
			}
			if w.Code == http.StatusOK && !json.Valid(w.Body.Bytes()) {
				t.Fatalf("%s of %q: answer is not JSON: %s", path, data, w.Body)
			}
		}
	})
}
