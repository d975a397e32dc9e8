package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Default addresses of tabbyd's HTTP endpoints. Health and status listen
// on the node's loopback only: tabbyd runs in the host's network, where
// every pod and every machine that reaches the node could otherwise read
// its status and metrics. The DaemonSet's probes ask 127.0.0.1, as does
// `tabbyctl node status`.
const (
	DefaultHealthListen = "127.0.0.1:9099"
	// DefaultMetricsListen is off: set --metrics-listen (e.g. :9091) to let
	// Prometheus scrape /metrics from elsewhere.
	DefaultMetricsListen = ""
)

// readiness is what /readyz answers from: state tabbyd keeps anyway, so
// that a probe costs no call to the API server (each used to cost one, and
// 50 looping clients slowed tabbyd's own API reads by half a second).
type readiness struct {
	// checks run in order; the first error is the answer.
	checks []readinessCheck
}

type readinessCheck struct {
	what  string       // prefixes the error, e.g. "routing"
	check func() error // nil: this part is ready
}

// Ready is nil when every part is ready, else why not.
func (r *readiness) Ready() error {
	for _, c := range r.checks {
		if c.check == nil {
			continue
		}
		if err := c.check(); err != nil {
			return fmt.Errorf("%s: %w", c.what, err)
		}
	}
	return nil
}

// healthMux serves /healthz, /readyz and /metrics; the routing loop adds
// /status.
func healthMux(ready *readiness, reg prometheus.Gatherer) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready.Ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}

// metricsMux serves only /metrics (for --metrics-listen).
func metricsMux(reg prometheus.Gatherer) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}

// httpServer bounds every phase of a request: these endpoints answer from
// memory, and a client that stalls must not hold a connection.
func httpServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 64 << 10}
}

// listenHTTP listens on addr for what (a flag's name, for the error).
func listenHTTP(addr, flag string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w (pick another %s)", addr, err, flag)
	}
	return ln, nil
}

// serveUntil serves srv on ln until ctx ends, then shuts it down.
func serveUntil(ctx context.Context, srv *http.Server, ln net.Listener) error {
	shut := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(shut)
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	err := srv.Serve(ln)
	if !stop() {
		<-shut // the shutdown began: let it finish the requests in flight
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// apiRequests counts tabbyd's requests to the API server by verb and
// resource (or non-resource path), as client-go's rest_client_requests_total
// does for Kubernetes' own components: what a node costs the API server.
type apiRequests struct{ c *prometheus.CounterVec }

func newAPIRequests(reg prometheus.Registerer) *apiRequests {
	m := &apiRequests{c: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tabby_apiserver_requests_total",
		Help: "Requests tabbyd sent to the API server, by verb (get, list, watch, create, update, patch, delete) and resource (or non-resource path such as /readyz).",
	}, []string{"verb", "resource"})}
	reg.MustRegister(m.c)
	return m
}

// wrap is a rest.Config WrapTransport.
func (m *apiRequests) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		verb, resource := classifyAPIRequest(req.Method, req.URL.Path, req.URL.Query().Get("watch"))
		m.c.WithLabelValues(verb, resource).Inc()
		return rt.RoundTrip(req)
	})
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// classifyAPIRequest names a request to the API server by verb and
// resource: /api/v1/namespaces/ns/pods/p is (get, pods), a GET with
// watch=true is a watch (informers list by watching, too), a GET of a
// collection a list, POST create and PUT update; a path outside /api and
// /apis (such as /readyz) is its own resource.
func classifyAPIRequest(method, path, watch string) (verb, resource string) {
	switch method {
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	default:
		verb = strings.ToLower(method)
	}
	parts := strings.Split(strings.Trim(path, "/"), "/")
	var rest []string
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		rest = parts[2:] // api, v1
	case len(parts) >= 3 && parts[0] == "apis":
		rest = parts[3:] // apis, group, version
	default:
		return verb, path
	}
	named := false
	switch {
	case len(rest) == 0:
		return verb, path // discovery
	case rest[0] == "namespaces" && len(rest) >= 3:
		resource, named = rest[2], len(rest) >= 4
	default:
		resource, named = rest[0], len(rest) >= 2
	}
	if verb == "get" {
		switch {
		case watch == "true" || watch == "1":
			verb = "watch"
		case !named:
			verb = "list"
		}
	}
	return verb, resource
}
