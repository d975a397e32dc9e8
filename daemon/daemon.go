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
// the previous run left until BGP has converged (restart.go). One tabbyd
// in the cluster, elected with a Lease, runs the IPAM garbage collector
// (package ipam/gc). The policy loop (package netpol, started in
// policy.go) enforces NetworkPolicy; the CNI agent's policy-wait lets the
// plugin wait until a new pod's policies are in the kernel.
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
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/daemon/cniagent"
	"github.com/tabbynet/tabby/daemon/netpol"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/iptbackend"
	"github.com/tabbynet/tabby/ipam/gc"
	"github.com/tabbynet/tabby/policy"
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
	// IPAMGC takes part in the election (a Lease named gc.DefaultLeaseName
	// in Namespace) of the cluster's one IPAM garbage collector, and runs
	// it while elected (package ipam/gc); IPAMGCGrace and IPAMGCInterval
	// tune it (defaults gc.DefaultGrace and gc.DefaultInterval).
	IPAMGC                      bool
	IPAMGCGrace, IPAMGCInterval time.Duration
	// NetworkPolicy turns NetworkPolicy enforcement on (package netpol);
	// off, tabbyd removes the rules an earlier run left, and the CNI
	// agent's policy-wait answers at once.
	NetworkPolicy bool
	// PolicyResync is how often NetworkPolicy syncs without an event
	// (default netpol.DefaultResync).
	PolicyResync time.Duration
	// PolicyDenyUnlisted drops the traffic of pod veths whose pod the
	// policy loop does not know yet (netpol.Config.DenyUnlisted).
	PolicyDenyUnlisted bool
	// PolicyLimits bound what one NetworkPolicy may expand to
	// (netpol.Config.Limits); zero fields take policy's defaults.
	PolicyLimits policy.Limits
	// IPTablesBackend is "legacy" or "nft"; "" detects the one the node
	// uses. Routing (NAT outgoing) and NetworkPolicy both use it.
	IPTablesBackend iptbackend.Mode
	// DefaultIPv4Pool, when set, is created as the IPPool DefaultPoolName
	// if the cluster has no IPPool (DefaultPoolSpec makes it).
	DefaultIPv4Pool *tabbyv1.IPPoolSpec
	Log             *slog.Logger
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
	var routes *router              // set before the server starts
	var policies *netpol.Controller // nil: NetworkPolicy off
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
		if policies != nil {
			if err := policies.Ready(); err != nil {
				http.Error(w, "networkpolicy: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
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
	// One iptables backend for routing (NAT outgoing) and NetworkPolicy.
	var backend *iptbackend.Backend
	if b, err := iptbackend.Detect(ctx, iptbackend.Options{Mode: cfg.IPTablesBackend}); err != nil {
		if cfg.NetworkPolicy || cfg.IPTablesBackend != "" {
			_ = ln.Close()
			return fmt.Errorf("finding the iptables backend: %w (install iptables, or pass --iptables-backend; NetworkPolicy needs it)", err)
		}
		cfg.Log.Warn("no iptables backend: NAT outgoing cannot be programmed", "error", err)
	} else {
		backend = &b
		cfg.Log.Info("iptables backend", "mode", b.Mode, "reason", b.Reason)
	}
	if cfg.DefaultIPv4Pool != nil {
		go ensureDefaultPool(ctx, ds, *cfg.DefaultIPv4Pool, cfg.Log)
	}
	routes, routingDone := startRouting(ctx, cfg, ds, backend, reg, mux)
	policies, policyDone, err := startPolicy(ctx, cfg, rc, ds, backend, reg)
	if err != nil {
		stop()
		<-routingDone
		_ = ln.Close()
		return err
	}
	// The heartbeat says what /readyz says (the API server's answer is
	// the renewal itself): routes, and policies when enforced, programmed.
	go runHeartbeat(ctx, rc, cfg.Namespace, cfg.NodeName, func() error {
		if err := routes.Ready(); err != nil {
			return err
		}
		if policies != nil {
			return policies.Ready()
		}
		return nil
	}, cfg.Log)
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
		acfg := cniagent.Config{Socket: cfg.CNISocket, NodeName: cfg.NodeName, DS: ads, Log: cfg.Log, Registerer: reg}
		if policies != nil {
			acfg.Policy = policies
		}
		agent, err := cniagent.New(acfg)
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
	gcDone := make(chan struct{})
	if cfg.IPAMGC {
		if err := startIPAMGC(ctx, cfg, rc, ds, reg, gcDone); err != nil {
			_ = ln.Close()
			stop()
			<-agentDone
			<-routingDone
			<-policyDone
			return err
		}
	} else {
		close(gcDone)
	}
	cfg.Log.Info("tabbyd started", "node", cfg.NodeName, "apiserver", ds.Host(), "health", ln.Addr().String(), "cniSocket", cfg.CNISocket)
	err = srv.Serve(ln)
	stop()
	<-agentDone
	<-routingDone
	<-policyDone
	<-gcDone
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// startIPAMGC runs the IPAM garbage collector's election (and the
// collector while elected) until ctx ends, then closes done.
func startIPAMGC(ctx context.Context, cfg Config, rc *rest.Config, ds *datastore.Client, reg prometheus.Registerer, done chan struct{}) error {
	log := cfg.Log.With("component", "ipam-gc")
	collector, err := gc.New(gc.Config{DS: ds, Grace: cfg.IPAMGCGrace, Interval: cfg.IPAMGCInterval, Log: log, Registerer: reg})
	if err != nil {
		return err
	}
	leases, err := coordinationv1client.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("building the coordination.k8s.io client for the IPAM garbage collector's Lease: %w", err)
	}
	ns := cfg.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	go func() {
		defer close(done)
		if err := collector.RunElected(ctx, gc.Election{Leases: leases, Namespace: ns, Identity: cfg.NodeName}); err != nil {
			log.Error("the IPAM garbage collector's election stopped", "error", err)
		}
	}()
	return nil
}
