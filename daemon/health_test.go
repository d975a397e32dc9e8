package daemon

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tabbynet/tabby/internal/profiling"
)

func TestClassifyAPIRequest(t *testing.T) {
	for _, c := range []struct {
		method, path, watch string
		verb, resource      string
	}{
		{"GET", "/api/v1/nodes", "", "list", "nodes"},
		{"GET", "/api/v1/nodes/n1", "", "get", "nodes"},
		{"GET", "/api/v1/nodes", "true", "watch", "nodes"},
		{"PATCH", "/api/v1/nodes/n1/status", "", "patch", "nodes"},
		{"GET", "/api/v1/namespaces", "", "list", "namespaces"},
		{"GET", "/api/v1/namespaces/kube-system", "", "get", "namespaces"},
		{"GET", "/api/v1/namespaces/default/pods", "", "list", "pods"},
		{"GET", "/api/v1/namespaces/default/pods/p", "", "get", "pods"},
		{"GET", "/apis/coordination.k8s.io/v1/namespaces/tabby-system/leases/tabbyd-n1", "", "get", "leases"},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/tabby-system/leases/tabbyd-n1", "", "update", "leases"},
		{"POST", "/apis/coordination.k8s.io/v1/namespaces/tabby-system/leases", "", "create", "leases"},
		{"DELETE", "/apis/tabby.io/v1/ipamhandles/h", "", "delete", "ipamhandles"},
		{"GET", "/apis/tabby.io/v1/ipamblocks", "1", "watch", "ipamblocks"},
		{"GET", "/readyz", "", "get", "/readyz"},
		{"GET", "/apis", "", "get", "/apis"},
		{"GET", "/api/v1", "", "get", "/api/v1"},
	} {
		verb, resource := classifyAPIRequest(c.method, c.path, c.watch)
		if verb != c.verb || resource != c.resource {
			t.Errorf("%s %s watch=%q: %s %s, want %s %s", c.method, c.path, c.watch, verb, resource, c.verb, c.resource)
		}
	}
}

// TestReadyz: /readyz answers the first failing check, prefixed with its
// part; a part without a check (NetworkPolicy off) is skipped.
func TestReadyz(t *testing.T) {
	var routing, heartbeat error
	ready := &readiness{checks: []readinessCheck{
		{"routing", func() error { return routing }},
		{"networkpolicy", nil},
		{"heartbeat", func() error { return heartbeat }},
	}}
	srv := httptest.NewServer(healthMux(ready, prometheus.NewRegistry()))
	defer srv.Close()
	get := func() (int, string) {
		resp, err := http.Get(srv.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	if code, body := get(); code != 200 || body != "ok" {
		t.Errorf("all ready: %d %q", code, body)
	}
	heartbeat = errors.New("lease refused")
	if code, body := get(); code != 503 || body != "heartbeat: lease refused" {
		t.Errorf("heartbeat failing: %d %q", code, body)
	}
	routing = errors.New("caches not synced")
	if code, body := get(); code != 503 || body != "routing: caches not synced" {
		t.Errorf("routing and heartbeat failing: %d %q", code, body)
	}
}

// --profiling serves Go's profiles next to /healthz; without it there are
// none.
func TestProfiling(t *testing.T) {
	for _, on := range []bool{false, true} {
		mux := healthMux(&readiness{}, prometheus.NewRegistry())
		if on {
			profiling.Register(mux)
		}
		srv := httptest.NewServer(mux)
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap?debug=1", "/debug/pprof/goroutine?debug=1"} {
			resp, err := http.Get(srv.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if want := map[bool]int{false: 404, true: 200}[on]; resp.StatusCode != want {
				t.Errorf("profiling %v: GET %s: %d, want %d", on, path, resp.StatusCode, want)
			}
			if on && path == "/debug/pprof/heap?debug=1" && !strings.Contains(string(b), "HeapInuse") {
				t.Errorf("the heap profile lacks the memory statistics:\n%.300s", b)
			}
		}
		srv.Close()
	}
}
