// Package extender is tabby's kube-scheduler HTTP extender.
//
// This first version serves /healthz and /metrics; /filter and /prioritize
// answer 501 until the placement rules land, so a scheduler configured with
// ignorable: true keeps scheduling without it.
package extender

import (
	"context"
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
	Log        *slog.Logger
}

// Run serves until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	notYet := func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "tabby-scheduler-extender: filter and prioritize are not implemented in this version", http.StatusNotImplemented)
	}
	mux.HandleFunc("POST /filter", notYet)
	mux.HandleFunc("POST /prioritize", notYet)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w (pick another --listen)", cfg.Listen, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	cfg.Log.Info("tabby-scheduler-extender listening", "addr", ln.Addr().String())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
