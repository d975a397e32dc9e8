// Package daemon is tabbyd, the node agent. It registers the node, watches the
// datastore and converges the node's routes, BGP sessions and policy rules
// with level-triggered loops, and serves health and metrics.
//
// It serves /healthz, /readyz (the datastore answers and routing is
// ready), /status (the node's BGP sessions and routes, package nodestatus)
// and /metrics; serves the CNI plugins' IPAM on a unix socket (package
// cniagent); and runs the routing loop (reconcile.go): it publishes the
// node's routing identity in its Node's annotations (node.go), watches
// Nodes, IPPools, IPAMBlocks, BGPConfigurations, BGPPeers and the Secrets
// of its namespace (watch.go), and on every change and periodically
// computes the BGP sessions (bgp.DesiredPeers), the advertisements and the
// routes (routing.Desired) and converges GoBGP (bgp.Speaker) and the
// kernel (routing.Applier) to them. After a restart it keeps the routes
// the previous run left until BGP has converged (restart.go). The policy
// loop is next.
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
	"k8s.io/client-go/rest"

	"github.com/tabbynet/tabby/daemon/cniagent"
	"github.com/tabbynet/tabby/datastore"
)

// Config is what tabbyd is started with.
type Config struct {
	NodeName     string
	Kubeconfig   string
	NodeIP       net.IP
	HealthListen string // address of /healthz, /readyz and /metrics
	// CNISocket is where the CNI agent serves the plugins (the CNI config's
	// agentSocket); "" turns the agent off.
	CNISocket string
	// Namespace is where tabbyd runs: BGP passwords are read from its
	// Secrets (default DefaultNamespace).
	Namespace string
	// Resync is how often routing reconciles without an event (default
	// DefaultResync); StartupHold bounds how long a restarted tabbyd keeps
	// the routes its previous run left while BGP converges (default
	// DefaultStartupHold).
	Resync, StartupHold time.Duration
	Log                 *slog.Logger
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
	var routes *router // set before the server starts
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		c, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := ds.Ping(c); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		if err := routes.Ready(); err != nil {
			http.Error(w, "routing: "+err.Error(), http.StatusServiceUnavailable)
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
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	routes, routingDone := startRouting(ctx, cfg, ds, reg, mux)
	agentDone := make(chan struct{})
	if cfg.CNISocket != "" {
		// The agent paces itself (one assignment or release at a time on
		// the node): a client-side rate limit would only queue a burst of
		// pods behind it. The API server's priority and fairness still
		// applies.
		arc := rest.CopyConfig(rc)
		arc.QPS = -1
		ads, err := datastore.New(arc)
		if err != nil {
			_ = ln.Close()
			return err
		}
		agent, err := cniagent.New(cniagent.Config{Socket: cfg.CNISocket, NodeName: cfg.NodeName, DS: ads, Log: cfg.Log, Registerer: reg})
		if err != nil {
			_ = ln.Close()
			return err
		}
		go func() {
			defer close(agentDone)
			// Without the agent the plugins reach the API server
			// themselves: tabbyd keeps running.
			if err := agent.Run(ctx); err != nil {
				cfg.Log.Error("the CNI agent stopped; CNI plugins on this node reach the API server directly", "socket", cfg.CNISocket, "error", err)
			}
		}()
	} else {
		close(agentDone)
	}
	cfg.Log.Info("tabbyd started", "node", cfg.NodeName, "apiserver", ds.Host(), "health", ln.Addr().String(), "cniSocket", cfg.CNISocket)
	err = srv.Serve(ln)
	stop()
	<-agentDone
	<-routingDone
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
