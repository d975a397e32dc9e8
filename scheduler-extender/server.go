// Package extender is tabby's kube-scheduler HTTP extender.
//
// It serves POST /filter and POST /prioritize with the types of
// k8s.io/kube-scheduler/extender/v1, GET /healthz and GET /metrics, over
// HTTPS when given a certificate (kube-scheduler's enableHTTPS). The
// placement rules sit behind the Scheduler interface: a framework.Framework
// of plugins (package plugins) over an informer cache.
package extender

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Config is what the extender is started with.
type Config struct {
	Listen     string
	Kubeconfig string
	// TLSCertFile and TLSKeyFile, both or neither, make the extender serve
	// HTTPS.
	TLSCertFile string
	TLSKeyFile  string
	// MaxRequestBytes bounds a request body; 0 means DefaultMaxRequestBytes.
	MaxRequestBytes int64
	// Scheduler decides (required).
	Scheduler Scheduler
	// Nodes resolves node names for nodeCacheCapable requests (nil: they
	// are refused).
	Nodes NodeCache
	Log   *slog.Logger
}

// NewMux returns the extender's routes, with its metrics in reg.
func NewMux(cfg Config, reg *prometheus.Registry) *http.ServeMux {
	sched := cfg.Scheduler
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	h := &Handler{Scheduler: sched, Nodes: cfg.Nodes, MaxRequestBytes: cfg.MaxRequestBytes, Metrics: NewMetrics(reg)}
	h.Register(mux)
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
	var tlsConfig *tls.Config
	if cfg.TLSCertFile != "" || cfg.TLSKeyFile != "" {
		// Load now so a bad certificate stops the start, not the first request.
		cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			ln.Close()
			return fmt.Errorf("loading the TLS certificate (--tls-cert-file %s, --tls-key-file %s): %w", cfg.TLSCertFile, cfg.TLSKeyFile, err)
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv := &http.Server{
		Handler:           NewMux(cfg, reg),
		ReadHeaderTimeout: 5 * time.Second,
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
	cfg.Log.Info("tabby-scheduler-extender listening", "addr", ln.Addr().String(), "scheme", scheme)
	var err error
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
