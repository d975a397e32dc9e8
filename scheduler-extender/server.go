// Package extender is tabby's kube-scheduler HTTP extender.
//
// It serves POST /filter, POST /prioritize and POST /bind with the types of
// k8s.io/kube-scheduler/extender/v1, GET /healthz and GET /metrics, over
// HTTPS when given a certificate (kube-scheduler's enableHTTPS). The
// placement rules sit behind the Scheduler interface: a framework.Framework
// of plugins (package plugins) over an informer cache.
package extender

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tabbynet/tabby/internal/profiling"
)

// Config is what the extender is started with.
type Config struct {
	Listen     string
	Kubeconfig string
	// TLSCertFile and TLSKeyFile, both or neither, make the extender serve
	// HTTPS.
	TLSCertFile string
	TLSKeyFile  string
	// ClientCAFile, with HTTPS, makes every request but GET /healthz need
	// a client certificate signed by one of its CAs (kube-scheduler's
	// tlsConfig certFile and keyFile).
	ClientCAFile string
	// MaxRequestBytes bounds a request body; 0 means DefaultMaxRequestBytes.
	MaxRequestBytes int64
	// MaxRequestsInflight bounds the requests decoded and answered at
	// once; 0 means DefaultMaxRequestsInflight.
	MaxRequestsInflight int
	// Scheduler decides (required).
	Scheduler Scheduler
	// Nodes resolves node names for nodeCacheCapable requests (nil: they
	// are refused).
	Nodes NodeCache
	// Placements makes requests wait for kube-scheduler's placements in
	// flight and bind count a pod on its node at once (nil: neither).
	Placements Placements
	// Bind, when set, serves POST /bind (kube-scheduler's bindVerb).
	Bind BindFunc
	// Profiling also serves Go's profiles at /debug/pprof/ (behind the
	// client certificate check, like every route but /healthz).
	Profiling bool
	Log       *slog.Logger
}

// Registry takes the extender's metrics and serves them.
type Registry interface {
	prometheus.Registerer
	prometheus.Gatherer
}

// NewRegistry is the registry Run serves, before NewMux adds the
// extender's own metrics: the Go runtime's and the process's. A test that
// needs every name the extender exports calls both.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// NewMux returns the extender's routes, with its metrics in reg (with
// Placements set, also those of binding).
func NewMux(cfg Config, reg Registry) *http.ServeMux {
	sched := cfg.Scheduler
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	h := &Handler{Scheduler: sched, Nodes: cfg.Nodes, MaxRequestBytes: cfg.MaxRequestBytes,
		Inflight: NewInflight(cfg.MaxRequestsInflight), Metrics: NewMetrics(reg),
		Placements: cfg.Placements, Bind: cfg.Bind, Log: cfg.Log}
	if cfg.Placements != nil {
		h.placementMetrics = newPlacementMetrics(reg)
	}
	h.Register(mux)
	if cfg.Profiling {
		profiling.Register(mux)
	}
	return mux
}

// Run serves until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Scheduler == nil {
		return errors.New("extender: no Scheduler configured")
	}
	if (cfg.TLSCertFile == "") != (cfg.TLSKeyFile == "") {
		return errors.New("give both --tls-cert-file and --tls-key-file, or neither")
	}
	if cfg.ClientCAFile != "" && cfg.TLSCertFile == "" {
		return errors.New("--client-ca-file needs --tls-cert-file and --tls-key-file: client certificates are checked only over HTTPS")
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w (pick another --listen)", cfg.Listen, err)
	}
	return serve(ctx, ln, cfg)
}

// serve serves on ln until ctx ends; it closes ln.
func serve(ctx context.Context, ln net.Listener, cfg Config) error {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	tlsConfig, err := loadTLS(cfg)
	if err != nil {
		ln.Close()
		return err
	}
	var handler http.Handler = NewMux(cfg, NewRegistry())
	if cfg.ClientCAFile != "" {
		handler = requireClientCert(handler)
	}
	srv := &http.Server{
		Handler: handler,
		// A client that stalls anywhere in a request is cut off: while
		// sending headers, its body, or reading the answer, or idling
		// between requests. kube-scheduler's requests are small (see
		// DefaultMaxRequestBytes) and it gives up after its httpTimeout.
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		TLSConfig:         tlsConfig,
		ErrorLog:          slog.NewLogLogger(cfg.Log.Handler(), slog.LevelWarn),
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
		case <-done:
			return
		}
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
	}
	cfg.Log.Info("tabby-scheduler-extender listening", "addr", ln.Addr().String(), "scheme", scheme,
		"clientCertificates", cfg.ClientCAFile != "")
	if tlsConfig != nil {
		err = srv.ServeTLS(ln, "", "")
	} else {
		err = srv.Serve(ln)
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// The server's timeouts.
const (
	// ReadHeaderTimeout: a request's headers arrive within it.
	ReadHeaderTimeout = 5 * time.Second
	// ReadTimeout: the whole request, body too, arrives within it.
	ReadTimeout = 10 * time.Second
	// WriteTimeout: the answer is written within it of the headers'
	// end: reading the body, waiting for a slot, deciding and writing.
	WriteTimeout = 20 * time.Second
	// IdleTimeout: a kept-alive connection waits this long for the next
	// request.
	IdleTimeout = 60 * time.Second
)

// loadTLS reads the certificate, and the client CAs when given, now so a
// bad file stops the start, not the first request. Nil without a
// certificate.
func loadTLS(cfg Config) (*tls.Config, error) {
	if cfg.TLSCertFile == "" && cfg.TLSKeyFile == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
	if err != nil {
		return nil, fmt.Errorf("loading the TLS certificate (--tls-cert-file %s, --tls-key-file %s): %w", cfg.TLSCertFile, cfg.TLSKeyFile, err)
	}
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if cfg.ClientCAFile == "" {
		return c, nil
	}
	pem, err := os.ReadFile(cfg.ClientCAFile)
	if err != nil {
		return nil, fmt.Errorf("reading --client-ca-file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--client-ca-file %s holds no PEM certificate", cfg.ClientCAFile)
	}
	c.ClientCAs = pool
	// A certificate that is presented must verify, or the handshake
	// fails. One may be left out only for GET /healthz (see
	// requireClientCert): the kubelet's probes cannot present one.
	c.ClientAuth = tls.VerifyClientCertIfGiven
	return c, nil
}

// requireClientCert refuses every request without a verified client
// certificate, before its body is read, except GET /healthz (as
// kube-scheduler itself lets probes reach /healthz unauthenticated).
func requireClientCert(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Path == "/healthz" {
			next.ServeHTTP(w, r)
			return
		}
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			w.Header().Set("Connection", "close")
			http.Error(w, "a client certificate signed by a CA of the extender's --client-ca-file is required (kube-scheduler: the extender's tlsConfig certFile and keyFile)", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
