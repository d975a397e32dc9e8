package extender

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// checkNamesArgs fails t unless decodeNamesArgs, when it takes data, gives
// what encoding/json gives (and encoding/json takes data too).
func checkNamesArgs(t *testing.T, data []byte) (took bool) {
	t.Helper()
	fast, ok := decodeNamesArgs(data)
	if !ok {
		return false
	}
	var full wireArgs
	if err := json.Unmarshal(data, &full); err != nil {
		t.Fatalf("decodeNamesArgs took %q, which encoding/json refuses: %v", data, err)
	}
	if full.Pod == nil || fast.Pod == nil || full.NodeNames == nil || fast.NodeNames == nil || full.Nodes != nil {
		t.Fatalf("decodeNamesArgs took %q: pod %v, names %v; encoding/json: pod %v, names %v, nodes %v",
			data, fast.Pod != nil, fast.NodeNames != nil, full.Pod != nil, full.NodeNames != nil, full.Nodes != nil)
	}
	if diff := cmp.Diff(full.Pod.pod, fast.Pod.pod); diff != "" {
		t.Fatalf("%q: Pod differs from encoding/json's (-want +got):\n%s", data, diff)
	}
	if diff := cmp.Diff(*full.NodeNames, *fast.NodeNames); diff != "" {
		t.Fatalf("%q: NodeNames differ from encoding/json's (-want +got):\n%s", data, diff)
	}
	return true
}

// TestDecodeNamesArgs: kube-scheduler's nodeCacheCapable requests take the
// fast path; every prefix of them, and variants with another shape,
// either take it with encoding/json's result or are left to encoding/json.
func TestDecodeNamesArgs(t *testing.T) {
	took := 0
	for _, seed := range fuzzSeeds(t) {
		if checkNamesArgs(t, seed) {
			took++
		}
		for i := range seed {
			if checkNamesArgs(t, seed[:i]) {
				t.Errorf("took a prefix: %q", seed[:i])
			}
		}
	}
	if took != 2 {
		t.Errorf("%d of the seeds took the fast path, want the 2 with node names", took)
	}
	quoted := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "q", Namespace: "default",
		Annotations: map[string]string{"a": `"}{]["\`, "b": "ü\u2028\t"}}}
	pod, err := json.Marshal(quoted)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		body string
		fast bool
	}{
		{`{"Pod":` + string(pod) + `,"Nodes":null,"NodeNames":["n1","n2"]}`, true},
		{`{"Pod":` + string(pod) + `,"Nodes":null,"NodeNames":[]}` + " \n", true},
		{`{"Pod":{},"Nodes":null,"NodeNames":["n1"]}`, true},
		{`{"Pod":{"spec":{"priority":"high"}},"Nodes":null,"NodeNames":["n1"]}`, false},
		{`{"Pod":{"metadata":{"name":"a"}},"Nodes":null,"NodeNames":["n1"]}}`, false},
		{`{"Pod":{"metadata":{"name":"a"}},"Nodes":null,"NodeNames":["n\u0031"]}`, false},
		{`{"Pod":{"metadata":{"name":"a"}},"Nodes":null,"NodeNames":null}`, false},
		{`{"Pod":{"metadata":{"name":"a"}},"Nodes":null,"NodeNames":["n1"],"Pod":{}}`, false},
		{`{"Pod":{"metadata":{"name":"a"}},"Nodes":null,"NodeNames":["n1"]} {}`, false},
		{`{"Pod":{"metadata":{"name":"a"}}},"Nodes":null,"NodeNames":["n1"]}`, false},
		{`{"Pod":{"metadata":{"name":"a\"}},"Nodes":null,"NodeNames":["n1"]}`, false},
		{` {"Pod":{},"Nodes":null,"NodeNames":["n1"]}`, false},
		{`{"pod":{},"Nodes":null,"NodeNames":["n1"]}`, false},
	} {
		if got := checkNamesArgs(t, []byte(tc.body)); got != tc.fast {
			t.Errorf("%s: fast path %v, want %v", tc.body, got, tc.fast)
		}
		// Either way, DecodeArgs answers as encoding/json does.
		args, err := DecodeArgs([]byte(tc.body))
		var full wireArgs
		ferr := json.Unmarshal([]byte(tc.body), &full)
		decodeErr := err != nil && strings.HasPrefix(err.Error(), "decoding ExtenderArgs")
		if decodeErr != (ferr != nil) {
			t.Errorf("%s: DecodeArgs error %v, encoding/json %v", tc.body, err, ferr)
		}
		if err == nil && full.Pod != nil && !cmp.Equal(full.Pod.pod, args.Pod) {
			t.Errorf("%s: Pod differs from encoding/json's", tc.body)
		}
	}
}

// FuzzDecodeNamesArgs: whatever the fast path takes, encoding/json takes
// too and decodes to the same.
func FuzzDecodeNamesArgs(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkNamesArgs(t, data) })
}
