// Package daemon is tabbyd, the node agent. It registers the node, watches the
// datastore and converges the node's routes, BGP sessions and policy rules
// with level-triggered loops, and serves health and metrics.
//
// This first version connects to the datastore and serves /healthz, /readyz
// (the datastore answers) and /metrics; the routing and policy loops build on it.
package daemon

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

	"github.com/tabbynet/tabby/datastore"
)

// Config is what tabbyd is started with.
type Config struct {
	NodeName     string
	Kubeconfig   string
	NodeIP       net.IP
	HealthListen string // address of /healthz, /readyz and /metrics
	Log          *slog.Logger
}

// Run runs the daemon until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	if cfg.NodeName == "" {
		return errors.New("tabbyd needs a node name: pass --nodename")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	rc, err := datastore.LoadConfig(cfg.Kubeconfig)
	if err != nil {
		return err
	}
	ds, err := datastore.New(rc)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		c, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := ds.Ping(c); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	ln, err := net.Listen("tcp", cfg.HealthListen)
	if err != nil {
		return fmt.Errorf("listening for health and metrics on %s: %w (pick another --health-listen)", cfg.HealthListen, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	cfg.Log.Info("tabbyd started", "node", cfg.NodeName, "apiserver", ds.Host(), "health", ln.Addr().String())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
