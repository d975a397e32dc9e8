package extender

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/tabbynet/tabby/scheduler-extender/cache"
	"github.com/tabbynet/tabby/scheduler-extender/plugins"
)

// binder is the extender as tabby-scheduler-extender runs it (the default
// plugins over the cache, the cache as its placements) over nodes n1..n3,
// with a Bind that records the Bindings, or fails with fail.
type binder struct {
	mux   *http.ServeMux
	cache *cache.Cache
	mu    sync.Mutex
	bound []*v1.Binding
	fail  error
}

func newBinder(t *testing.T) *binder {
	t.Helper()
	b := &binder{cache: cache.New()}
	for _, n := range []string{"n1", "n2", "n3"} {
		b.cache.SetNode(node(n, map[string]string{v1.LabelHostname: n}))
	}
	b.mux = NewMux(Config{
		Scheduler:  plugins.Default(b.cache.Snapshot, nil),
		Nodes:      b.cache,
		Placements: b.cache,
		Bind: func(_ context.Context, bd *v1.Binding) error {
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.fail != nil {
				return b.fail
			}
			b.bound = append(b.bound, bd)
			return nil
		},
	}, prometheus.NewRegistry())
	return b
}

func antiPod(name string) *v1.Pod {
	app := map[string]string{"app": "anti"}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name), Labels: app},
		Spec: v1.PodSpec{Affinity: &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{
			{TopologyKey: v1.LabelHostname, LabelSelector: &metav1.LabelSelector{MatchLabels: app}}}}}},
	}
}

// filter asks as kube-scheduler does (node names) and returns the nodes
// that passed.
func (b *binder) filter(t *testing.T, p *v1.Pod) []string {
	t.Helper()
	names := []string{"n1", "n2", "n3"}
	w := do(b.mux, http.MethodPost, "/filter", "application/json", mustJSON(t, extenderv1.ExtenderArgs{Pod: p, NodeNames: &names}))
	if w.Code != http.StatusOK {
		t.Fatalf("filter %s: %d %s", p.Name, w.Code, w.Body)
	}
	var res extenderv1.ExtenderFilterResult
	if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	return *res.NodeNames
}

func (b *binder) bind(t *testing.T, p *v1.Pod, node string) extenderv1.ExtenderBindingResult {
	t.Helper()
	w := do(b.mux, http.MethodPost, "/bind", "application/json", mustJSON(t, extenderv1.ExtenderBindingArgs{
		PodName: p.Name, PodNamespace: p.Namespace, PodUID: p.UID, Node: node}))
	if w.Code != http.StatusOK {
		t.Fatalf("bind %s: %d %s", p.Name, w.Code, w.Body)
	}
	var res extenderv1.ExtenderBindingResult
	if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	return res
}

// TestBindBeforeNextFilter is kube-scheduler's order when it binds in the
// background: a's filter, then b's filter, with a's bind request arriving
// while b's is being answered. b's answer must not offer a's node.
func TestBindBeforeNextFilter(t *testing.T) {
	b := newBinder(t)
	a, next := antiPod("a"), antiPod("b")
	if got := b.filter(t, a); len(got) != 3 {
		t.Fatalf("a passes %v, want all three nodes", got)
	}
	passed := make(chan []string, 1)
	go func() { passed <- b.filter(t, next) }()
	if res := b.bind(t, a, "n2"); res.Error != "" {
		t.Fatalf("binding a: %s", res.Error)
	}
	if got := <-passed; strings.Join(got, ",") != "n1,n3" {
		t.Errorf("b, anti-affine to a, passes %v; want n1,n3 (a is being bound to n2)", got)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.bound) != 1 || b.bound[0].Name != "a" || b.bound[0].UID != a.UID || b.bound[0].Target.Name != "n2" || b.bound[0].Target.Kind != "Node" {
		t.Errorf("Bindings made: %+v", b.bound)
	}
}

// TestBindFails: a Binding the API server refuses is reported in Error
// (kube-scheduler then forgets the pod and retries it) and the pod no
// longer counts on the node.
func TestBindFails(t *testing.T) {
	b := newBinder(t)
	a := antiPod("a")
	b.filter(t, a)
	b.fail = errors.New(`Operation cannot be fulfilled on pods/binding "a": pod a is already assigned to node "n1"`)
	res := b.bind(t, a, "n2")
	if !strings.Contains(res.Error, "binding pod default/a (UID uid-a) to node n2") || !strings.Contains(res.Error, "already assigned") {
		t.Errorf("Error %q", res.Error)
	}
	if got := b.filter(t, antiPod("b")); len(got) != 3 {
		t.Errorf("after a's binding failed, b passes %v; want all three nodes", got)
	}
}

func TestBindBadRequests(t *testing.T) {
	b := newBinder(t)
	for _, tc := range []struct {
		name, ct, body string
		code           int
		want           string
	}{
		{"no pod UID", "application/json", `{"PodName":"a","PodNamespace":"default","Node":"n1"}`, 400, "ExtenderBindingArgs has no PodUID"},
		{"no node", "application/json", `{"PodName":"a","PodNamespace":"default","PodUID":"u"}`, 400, "ExtenderBindingArgs has no Node"},
		{"not JSON", "application/json", `{`, 400, "decoding ExtenderBindingArgs"},
		{"wrong type", "text/plain", `{}`, 415, "want application/json"},
		{"too large", "application/json", `{"PodName":"` + strings.Repeat("a", maxBindBytes) + `"}`, 413, "at most"},
	} {
		w := do(b.mux, http.MethodPost, "/bind", tc.ct, []byte(tc.body))
		if w.Code != tc.code || !strings.Contains(w.Body.String(), tc.want) {
			t.Errorf("%s: %d %q; want %d with %q", tc.name, w.Code, w.Body, tc.code, tc.want)
		}
	}
	// Without a Bind there is no bind verb.
	mux, _ := newTestMux(t, 0)
	if w := do(mux, http.MethodPost, "/bind", "application/json", []byte(`{}`)); w.Code != http.StatusNotFound {
		t.Errorf("POST /bind without a binder: %d", w.Code)
	}
}
