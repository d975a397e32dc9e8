package extender

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// strangeStrings need escaping, or not, in every way encoding/json does.
var strangeStrings = []string{"", "node-1", `a"b`, `a\b`, "<&>", "tab\there", "nl\n", "\x00\x1f", "café", "日本", "\u2028", "bad\xffutf8", "emoji 🙂"}

func randomString(r *rand.Rand) string {
	if r.IntN(2) == 0 {
		return fmt.Sprintf("node-%04d", r.IntN(10000))
	}
	return strangeStrings[r.IntN(len(strangeStrings))] + strangeStrings[r.IntN(len(strangeStrings))]
}

func randomMap(r *rand.Rand) extenderv1.FailedNodesMap {
	if r.IntN(5) == 0 {
		return nil
	}
	m := extenderv1.FailedNodesMap{}
	for range r.IntN(6) {
		m[randomString(r)] = randomString(r)
	}
	return m
}

// TestEncodeAsEncodingJSON: the answers written by hand decode to what
// encoding/json's decode to, and prioritize's are the same bytes.
func TestEncodeAsEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		fr := &extenderv1.ExtenderFilterResult{FailedNodes: randomMap(r), FailedAndUnresolvableNodes: randomMap(r), Error: randomString(r)}
		if r.IntN(4) > 0 {
			names := []string{}
			for range r.IntN(5) {
				names = append(names, randomString(r))
			}
			fr.NodeNames = &names
		}
		var hl extenderv1.HostPriorityList
		if r.IntN(5) > 0 {
			hl = extenderv1.HostPriorityList{}
			for range r.IntN(5) {
				hl = append(hl, extenderv1.HostPriority{Host: randomString(r), Score: r.Int64N(21) - 10})
			}
		}
		for _, v := range []any{fr, hl} {
			var mine bytes.Buffer
			if !appendAnswer(&mine, v) {
				t.Fatalf("%d: %#v not written by hand", i, v)
			}
			want, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			if !json.Valid(mine.Bytes()) {
				t.Fatalf("%d: %s is not JSON", i, mine.Bytes())
			}
			if _, ok := v.(extenderv1.HostPriorityList); ok && !bytes.Equal(mine.Bytes(), want) {
				t.Fatalf("%d: wrote %s, encoding/json %s", i, mine.Bytes(), want)
			}
			got, exp := reflect.New(reflect.TypeOf(v)), reflect.New(reflect.TypeOf(v))
			if err := json.Unmarshal(mine.Bytes(), got.Interface()); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(want, exp.Interface()); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.Interface(), exp.Interface()) {
				t.Fatalf("%d: wrote %s, encoding/json %s", i, mine.Bytes(), want)
			}
		}
	}
	// Full Nodes stay encoding/json's.
	if appendAnswer(new(bytes.Buffer), &extenderv1.ExtenderFilterResult{Nodes: &v1.NodeList{Items: []v1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "n"}}}}}) {
		t.Error("a filter result with Nodes was written by hand")
	}
}
