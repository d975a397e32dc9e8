package extender

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

func nodeList(nodes ...*v1.Node) *v1.NodeList {
	l := &v1.NodeList{}
	for _, n := range nodes {
		l.Items = append(l.Items, *n)
	}
	return l
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newTestMux(t testing.TB, maxBytes int64) (*http.ServeMux, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	return NewMux(Config{MaxRequestBytes: maxBytes, Scheduler: testScheduler()}, reg), reg
}

func do(mux http.Handler, method, path, contentType string, body []byte) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, bytes.NewReader(body))
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, r)
	return w
}

func zonePod() *v1.Pod {
	p := requiredPod(exprs(req("zone", v1.NodeSelectorOpIn, "a", "b")))
	p.Name, p.Namespace = "web", "default"
	p.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution = []v1.PreferredSchedulingTerm{
		pref(1, exprs(req("zone", v1.NodeSelectorOpIn, "a"))),
		pref(4, exprs(req("zone", v1.NodeSelectorOpIn, "b"))),
	}
	return p
}

func TestFilterFullNodes(t *testing.T) {
	mux, _ := newTestMux(t, 0)
	args := extenderv1.ExtenderArgs{Pod: zonePod(), Nodes: nodeList(testNodes()...)}
	w := do(mux, "POST", "/filter", "application/json", mustJSON(t, args))
	if w.Code != http.StatusOK {
		t.Fatalf("code %d: %s", w.Code, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	var got extenderv1.ExtenderFilterResult
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.NodeNames != nil {
		t.Errorf("NodeNames = %v for a full-Nodes request", *got.NodeNames)
	}
	var names []string
	for _, n := range got.Nodes.Items {
		names = append(names, n.Name)
	}
	if d := cmp.Diff([]string{"n1", "n2"}, names); d != "" {
		t.Errorf("passing nodes (-want +got):\n%s", d)
	}
	if got.Nodes.Items[0].Labels["zone"] != "a" {
		t.Errorf("passing node lost its labels: %+v", got.Nodes.Items[0])
	}
	want := extenderv1.FailedNodesMap{"n3": reasonNodeAffinity, "n4": reasonNodeAffinity, "n5": reasonNodeAffinity}
	if d := cmp.Diff(want, got.FailedAndUnresolvableNodes); d != "" {
		t.Errorf("FailedAndUnresolvableNodes (-want +got):\n%s", d)
	}
	if len(got.FailedNodes) != 0 || got.Error != "" {
		t.Errorf("FailedNodes %v, Error %q", got.FailedNodes, got.Error)
	}
}

func TestFilterNodeNamesWithoutCache(t *testing.T) {
	mux, _ := newTestMux(t, 0)
	names := []string{"n1", "n2"}
	w := do(mux, "POST", "/filter", "application/json; charset=utf-8", mustJSON(t, extenderv1.ExtenderArgs{Pod: zonePod(), NodeNames: &names}))
	if w.Code != http.StatusOK {
		t.Fatalf("code %d: %s", w.Code, w.Body)
	}
	var got extenderv1.ExtenderFilterResult
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.NodeNames == nil || len(*got.NodeNames) != 0 || got.Nodes != nil {
		t.Errorf("want an empty NodeNames and no Nodes, got %s", w.Body)
	}
	want := extenderv1.FailedNodesMap{"n1": ReasonNoNodeCache, "n2": ReasonNoNodeCache}
	if d := cmp.Diff(want, got.FailedNodes); d != "" {
		t.Errorf("FailedNodes (-want +got):\n%s", d)
	}
}

type mapCache map[string]*v1.Node

func (m mapCache) Node(name string) (*v1.Node, bool) { n, ok := m[name]; return n, ok }

func TestFilterNodeNamesWithCache(t *testing.T) {
	cache := mapCache{}
	for _, n := range testNodes() {
		cache[n.Name] = n
	}
	h := &Handler{Scheduler: testScheduler(), Nodes: cache}
	mux := http.NewServeMux()
	h.Register(mux)
	names := []string{"n1", "n3", "gone"}
	w := do(mux, "POST", "/filter", "application/json", mustJSON(t, extenderv1.ExtenderArgs{Pod: zonePod(), NodeNames: &names}))
	var got extenderv1.ExtenderFilterResult
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"n1"}, *got.NodeNames); d != "" {
		t.Errorf("NodeNames (-want +got):\n%s", d)
	}
	if got.FailedAndUnresolvableNodes["n3"] != reasonNodeAffinity || !strings.Contains(got.FailedNodes["gone"], "not in") {
		t.Errorf("failures: %s", w.Body)
	}
}

func TestPrioritizeHandler(t *testing.T) {
	mux, _ := newTestMux(t, 0)
	nodes := testNodes()[:3]
	w := do(mux, "POST", "/prioritize", "application/json", mustJSON(t, extenderv1.ExtenderArgs{Pod: zonePod(), Nodes: nodeList(nodes...)}))
	if w.Code != http.StatusOK {
		t.Fatalf("code %d: %s", w.Code, w.Body)
	}
	var got extenderv1.HostPriorityList
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	// Node affinity scores n1 25 and n2 100 (of 100): n2 is the top, 10;
	// n1 trails it by 7.5 tenths, rounded up: 10-8.
	want := extenderv1.HostPriorityList{{Host: "n1", Score: 2}, {Host: "n2", Score: 10}, {Host: "n3", Score: 0}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}

	names := []string{"n1"}
	w = do(mux, "POST", "/prioritize", "application/json", mustJSON(t, extenderv1.ExtenderArgs{Pod: zonePod(), NodeNames: &names}))
	if w.Code != http.StatusUnprocessableEntity || !strings.Contains(w.Body.String(), "without a node cache") {
		t.Errorf("NodeNames without a cache: code %d %q", w.Code, w.Body)
	}
}

type wildScheduler struct{ Scheduler }

func (wildScheduler) Prioritize(_ context.Context, _ *v1.Pod, nodes []*v1.Node) (extenderv1.HostPriorityList, error) {
	return extenderv1.HostPriorityList{{Host: nodes[0].Name, Score: -3}, {Host: nodes[1].Name, Score: 99}}, nil
}

func TestPrioritizeClampsScores(t *testing.T) {
	mux := http.NewServeMux()
	(&Handler{Scheduler: wildScheduler{testScheduler()}}).Register(mux)
	w := do(mux, "POST", "/prioritize", "application/json", mustJSON(t, extenderv1.ExtenderArgs{Pod: &v1.Pod{}, Nodes: nodeList(testNodes()[:2]...)}))
	if got := strings.TrimSpace(w.Body.String()); got != `[{"Host":"n1","Score":0},{"Host":"n2","Score":10}]` {
		t.Errorf("got %s", got)
	}
}

func TestBadRequests(t *testing.T) {
	good := mustJSON(t, extenderv1.ExtenderArgs{Pod: &v1.Pod{}, Nodes: nodeList(node("n1", nil))})
	tests := []struct {
		name, method, ct string
		body             []byte
		code             int
		msg              string
	}{
		{"malformed JSON", "POST", "application/json", []byte(`{"Pod":`), 400, "decoding ExtenderArgs"},
		{"wrong JSON type", "POST", "application/json", []byte(`{"Pod":"yes"}`), 400, "decoding ExtenderArgs"},
		{"trailing data", "POST", "application/json", append(append([]byte{}, good...), '}'), 400, "after top-level value"},
		{"two objects", "POST", "application/json", append(append([]byte{}, good...), good...), 400, "after top-level value"},
		{"null", "POST", "application/json", []byte(`null`), 400, "no Pod"},
		{"no pod", "POST", "application/json", []byte(`{"Nodes":{"items":[]}}`), 400, "no Pod"},
		{"no nodes", "POST", "application/json", []byte(`{"Pod":{}}`), 400, "neither Nodes nor NodeNames"},
		{"empty body", "POST", "application/json", nil, 400, "decoding"},
		{"no content type", "POST", "", good, 415, "want application/json"},
		{"wrong content type", "POST", "text/plain", good, 415, "want application/json"},
		{"too large", "POST", "application/json", append([]byte(`{"Pod":{},"NodeNames":["`), bytes.Repeat([]byte("x"), 2048)...), 413, "larger than 1024"},
		{"too large after a valid object", "POST", "application/json", append(mustJSON(t, extenderv1.ExtenderArgs{Pod: &v1.Pod{}, NodeNames: &[]string{}}), bytes.Repeat([]byte(" "), 2048)...), 413, "larger than 1024"},
		{"GET", "GET", "application/json", good, 405, ""},
	}
	mux, _ := newTestMux(t, 1024)
	for _, tt := range tests {
		for _, path := range []string{"/filter", "/prioritize"} {
			t.Run(tt.name+path, func(t *testing.T) {
				w := do(mux, tt.method, path, tt.ct, tt.body)
				if w.Code != tt.code || !strings.Contains(w.Body.String(), tt.msg) {
					t.Errorf("code %d body %q; want %d containing %q", w.Code, w.Body, tt.code, tt.msg)
				}
			})
		}
	}
}

func TestBadRequestsUnderDefaultLimit(t *testing.T) {
	good := mustJSON(t, extenderv1.ExtenderArgs{Pod: zonePod(), Nodes: nodeList(testNodes()...)})
	mux, _ := newTestMux(t, 0)
	for _, body := range [][]byte{append(append([]byte{}, good...), '}'), append(append([]byte{}, good...), good...)} {
		if w := do(mux, "POST", "/filter", "application/json", body); w.Code != 400 {
			t.Errorf("code %d %q", w.Code, w.Body)
		}
	}
}

func TestMetrics(t *testing.T) {
	mux, _ := newTestMux(t, 0)
	good := mustJSON(t, extenderv1.ExtenderArgs{Pod: zonePod(), Nodes: nodeList(testNodes()...)})
	do(mux, "POST", "/filter", "application/json", good)
	do(mux, "POST", "/filter", "application/json", good)
	do(mux, "POST", "/filter", "application/json", []byte("{"))
	do(mux, "POST", "/prioritize", "application/json", good)
	w := do(mux, "GET", "/metrics", "", nil)
	body, _ := io.ReadAll(w.Body)
	for _, line := range []string{
		`tabby_scheduler_extender_requests_total{code="200",verb="filter"} 2`,
		`tabby_scheduler_extender_requests_total{code="400",verb="filter"} 1`,
		`tabby_scheduler_extender_requests_total{code="200",verb="prioritize"} 1`,
		`tabby_scheduler_extender_request_duration_seconds_count{verb="filter"} 3`,
		`tabby_scheduler_extender_request_duration_seconds_count{verb="prioritize"} 1`,
	} {
		if !strings.Contains(string(body), line+"\n") {
			t.Errorf("/metrics lacks %s", line)
		}
	}
}

// FuzzHandlers: no body, however malformed, panics either verb, and every
// answer is 200 with JSON or a 4xx.
func FuzzHandlers(f *testing.F) {
	names := []string{"n1", "n2"}
	for _, a := range []extenderv1.ExtenderArgs{
		{Pod: zonePod(), Nodes: nodeList(testNodes()...)},
		{Pod: zonePod(), NodeNames: &names},
		{Pod: requiredPod(fields(req("metadata.name", v1.NodeSelectorOpIn, "n1")), v1.NodeSelectorTerm{}), Nodes: nodeList(testNodes()...)},
		{Pod: preferredPod(pref(-5, exprs(req("gpu", v1.NodeSelectorOpGt, "x")))), Nodes: nodeList(testNodes()...)},
		{Pod: &v1.Pod{}, Nodes: &v1.NodeList{}},
	} {
		f.Add(mustJSON(f, a))
	}
	for _, s := range []string{``, `null`, `{}`, `[]`, `{"Pod":null,"Nodes":null}`, `{"Pod":{},"Nodes":{"items":[null]}}`,
		`{"Pod":{"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[null,{}]}}}}},"NodeNames":[]}`,
		`{"Pod":{"spec":{"affinity":{"nodeAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[{"weight":1,"preference":{"matchFields":[{"key":"metadata.name","operator":"In"}]}}]}}}},"Nodes":{"items":[{}]}}`,
		`{"Pod":{"spec":{"nodeSelector":{"":"","a/b/c":"!"}}},"Nodes":{"items":[{"metadata":{"labels":{"":""}}}]}}`,
		"\xff", `{"Pod":{}} x`} {
		f.Add([]byte(s))
	}
	mux, _ := newTestMux(f, 1<<16)
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, path := range []string{"/filter", "/prioritize"} {
			w := do(mux, "POST", path, "application/json", body)
			switch {
			case w.Code == http.StatusOK:
				var v any
				if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
					t.Errorf("%s: 200 with a body that is not JSON: %v", path, err)
				}
			case w.Code >= 400 && w.Code < 500:
				if w.Body.Len() == 0 {
					t.Errorf("%s: %d without a message", path, w.Code)
				}
			default:
				t.Errorf("%s: code %d: %s", path, w.Code, w.Body)
			}
		}
	})
}
