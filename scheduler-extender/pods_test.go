package extender

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// TestDecodeArgsKeepsPods: the same pod's JSON again (filter, then
// prioritize) gives the Pod decoded the first time; a changed pod, or
// the same pod once more pods than are kept came between, is decoded anew;
// every Pod is what encoding/json makes of the JSON.
func TestDecodeArgsKeepsPods(t *testing.T) {
	body := func(p *v1.Pod) []byte {
		t.Helper()
		names := []string{"n1"}
		data, err := json.Marshal(extenderv1.ExtenderArgs{Pod: p, NodeNames: &names})
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	decode := func(data []byte) *v1.Pod {
		t.Helper()
		args, err := DecodeArgs(data)
		if err != nil {
			t.Fatal(err)
		}
		var want extenderv1.ExtenderArgs
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want.Pod, args.Pod); diff != "" {
			t.Fatalf("Pod differs from encoding/json's (-want +got):\n%s", diff)
		}
		return args.Pod
	}
	pod := func(name, label string) *v1.Pod {
		p := &v1.Pod{}
		p.Name, p.Namespace, p.UID = name, "default", types.UID("uid-"+name)
		p.Labels = map[string]string{"app": label}
		return p
	}
	a := body(pod("a", "x"))
	first := decode(a)
	if again := decode(a); again != first {
		t.Errorf("the same pod's JSON was decoded again")
	}
	if changed := decode(body(pod("a", "y"))); changed == first || changed.Labels["app"] != "y" {
		t.Errorf("a changed pod got the kept Pod %v", changed.Labels)
	}
	for i := range recentPodsKept {
		decode(body(pod(fmt.Sprint("other-", i), "x")))
	}
	if later := decode(a); later == first {
		t.Errorf("a pod was kept after %d others", recentPodsKept)
	}
	// A body that does not decode keeps nothing.
	bad := []byte(`{"Pod":{"metadata":{"name":"b"},"spec":{"priority":"high"}},"NodeNames":[]}`)
	for range 2 {
		if _, err := DecodeArgs(bad); err == nil {
			t.Fatalf("a pod with a string priority decoded")
		}
	}
}
