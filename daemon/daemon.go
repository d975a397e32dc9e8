// Package daemon is tabbyd, the node agent. It registers the node, watches the
// datastore and converges the node's routes, BGP sessions and policy rules
// with level-triggered loops, and serves health and metrics.
//
// It serves, on the node's loopback by default, /healthz, /readyz (routing
// and policy are ready and the API server answered the last heartbeat,
// all from state: no probe costs an API call; health.go), /status (the
// node's BGP sessions and routes, package nodestatus), /policy/denied
// (what NetworkPolicy dropped, with --denied-log; package deniedlog) and
// /metrics (also on --metrics-listen when set); serves the CNI plugins' IPAM on a unix socket (package
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
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/rest"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/daemon/cniagent"
	"github.com/tabbynet/tabby/daemon/cnitoken"
	"github.com/tabbynet/tabby/daemon/netpol"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/iptbackend"
	"github.com/tabbynet/tabby/internal/profiling"
	"github.com/tabbynet/tabby/ipam/gc"
	"github.com/tabbynet/tabby/policy"
)

// Config is what tabbyd is started with.
type Config struct {
	NodeName   string
	Kubeconfig string
	// NodeIPs are --node-ip (ParseNodeIPs): at most one address per
	// family; the families not given are detected.
	NodeIPs []netip.Addr
	// HealthListen serves /healthz, /readyz, /status and /metrics
	// (default DefaultHealthListen, the loopback only); MetricsListen, when
	// set, serves /metrics alone there too, for Prometheus.
	HealthListen, MetricsListen string
	// Profiling serves Go's profiles (/debug/pprof/) on HealthListen too,
	// as kube-apiserver's --profiling does: for finding where tabbyd's CPU
	// and memory go on a live node.
	Profiling bool
	// CNISocket is where the CNI agent serves the plugins (the CNI config's
	// agentSocket); "" turns the agent off.
	CNISocket string
	// CNISpares is how many addresses the CNI agent holds ahead, so that
	// an ADD is answered without an API write (cniagent.Config.Spares).
	CNISpares int
	// Namespace is where tabbyd runs: BGP passwords are read from its
	// Secrets (default DefaultNamespace), and the CNI plugin's service
	// account lives there.
	Namespace string
	// CNIKubeconfig is the CNI plugin's kubeconfig (as tabbyd sees the
	// host's file): tabbyd mints the plugin's short-lived token and writes
	// it there before it expires (package cnitoken). "" turns that off.
	CNIKubeconfig string
	// CNIServiceAccount (in Namespace) and CNITokenLifetime: whose token
	// and how long it lives (defaults cnitoken.DefaultServiceAccount and
	// cnitoken.DefaultLifetime).
	CNIServiceAccount string
	CNITokenLifetime  time.Duration
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
	// DeniedLog, when set, logs what NetworkPolicy drops (NFLOG from the
	// per-pod chains, rate-limited in the kernel; policy.DeniedLog) and
	// serves the last DeniedLogBuffer records (netpol.DefaultDeniedBuffer
	// when 0) on /policy/denied; DeniedLogFile, when set, gets each as a
	// JSON line (rotated at 100 MiB, 3 kept).
	DeniedLog       *policy.DeniedLog
	DeniedLogFile   string
	DeniedLogBuffer int
	// IPTablesBackend is "legacy" or "nft"; "" detects the one the node
	// uses. Routing (NAT outgoing) and NetworkPolicy both use it.
	IPTablesBackend iptbackend.Mode
	// DefaultIPv4Pool, when set, is created as the IPPool DefaultPoolName
	// if the cluster has no IPv4 IPPool (DefaultPoolSpec makes it);
	// DefaultIPv6Pool as DefaultIPv6PoolName if it has no IPv6 one
	// (DefaultIPv6PoolSpec).
	DefaultIPv4Pool, DefaultIPv6Pool *tabbyv1.IPPoolSpec
	Log                              *slog.Logger
}

// Run runs the daemon until ctx ends. It returns once every goroutine it
// started has stopped, with the errors of all of them.
func Run(ctx context.Context, cfg Config) (err error) {
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
	reg := prometheus.NewRegistry()
	met, err := NewMetrics(reg)
	if err != nil {
		return err
	}
	// Every client of tabbyd is made from rc: count what they ask of the
	// API server.
	rc.WrapTransport = met.api.wrap
	ds, err := datastore.New(rc)
	if err != nil {
		return err
	}
	ready := &readiness{}
	mux := healthMux(ready, reg)
	if cfg.Profiling {
		profiling.Register(mux)
	}
	ln, mln, err := listenAll(cfg)
	if err != nil {
		return err
	}
	// From here on every goroutine runs in gs: whichever way Run returns,
	// it stops them all and waits for them first.
	ctx, stop := context.WithCancel(ctx)
	gs := newGoroutines(ctx)
	defer func() {
		stop()
		err = errors.Join(err, gs.Wait())
		_ = ln.Close()
		if mln != nil {
			_ = mln.Close()
		}
	}()
	backend, err := detectBackend(ctx, cfg)
	if err != nil {
		return err
	}
	// Routing, NetworkPolicy and the CNI agent share one watch and one
	// cache of the nodes, pools, blocks and namespaces (the agent reads
	// its own node from routing's cache of every node).
	infs := datastore.NewInformers(ds)
	routes := startRouting(gs, cfg, ds, infs, backend, met, mux)
	// The default pools. The NetworkUnavailable condition waits for them
	// (router.poolsPending); it waits for the heartbeat too, which starts
	// below, so no pass can clear it before they are counted here.
	for _, d := range []struct {
		name string
		spec *tabbyv1.IPPoolSpec
	}{{DefaultPoolName, cfg.DefaultIPv4Pool}, {DefaultIPv6PoolName, cfg.DefaultIPv6Pool}} {
		if d.spec != nil {
			routes.poolsPending.Add(1)
			gs.Go("default pool "+d.name, func(ctx context.Context) error {
				if ensureDefaultPool(ctx, ds, d.name, *d.spec, cfg.Log) {
					routes.poolsPending.Add(-1)
					routes.markDirty()
				}
				return nil
			})
		}
	}
	policies, err := startPolicy(gs, cfg, rc, ds, infs, backend, met, mux)
	if err != nil {
		return err
	}
	if cfg.CNIKubeconfig != "" {
		if err := startCNIToken(gs, cfg, ds); err != nil {
			return err
		}
	}
	if err := startHeartbeat(gs, cfg, rc, ready, routes, policies); err != nil {
		return err
	}
	if cfg.CNISocket != "" {
		if err := startAgent(gs, cfg, rc, infs, met, policies); err != nil {
			return err
		}
	}
	if cfg.IPAMGC {
		if err := startIPAMGC(gs, cfg, rc, ds, met); err != nil {
			return err
		}
	}
	cfg.Log.Info("tabbyd started", "node", cfg.NodeName, "apiserver", ds.Host(), "health", ln.Addr().String(), "metrics", cfg.MetricsListen, "cniSocket", cfg.CNISocket)
	if mln != nil {
		gs.Go("metrics server", func(ctx context.Context) error {
			err := serveUntil(ctx, httpServer(metricsMux(reg)), mln)
			if err != nil {
				cfg.Log.Error("serving /metrics on --metrics-listen stopped", "address", cfg.MetricsListen, "error", err)
			}
			return err
		})
	}
	// The health server is tabbyd's life: when it stops, all stops.
	return serveUntil(ctx, httpServer(mux), ln)
}

// listenAll opens the health server's listener and, when asked for, the
// metrics server's (nil otherwise).
func listenAll(cfg Config) (ln, mln net.Listener, err error) {
	healthAddr := cfg.HealthListen
	if healthAddr == "" {
		healthAddr = DefaultHealthListen
	}
	if ln, err = listenHTTP(healthAddr, "--health-listen"); err != nil {
		return nil, nil, fmt.Errorf("serving health and status: %w", err)
	}
	if cfg.MetricsListen != "" {
		if mln, err = listenHTTP(cfg.MetricsListen, "--metrics-listen"); err != nil {
			_ = ln.Close()
			return nil, nil, fmt.Errorf("serving metrics: %w", err)
		}
	}
	return ln, mln, nil
}

// detectBackend finds the one iptables backend of routing (NAT outgoing)
// and NetworkPolicy; nil, without an error, when none is found and
// NetworkPolicy is off.
func detectBackend(ctx context.Context, cfg Config) (*iptbackend.Backend, error) {
	b, err := iptbackend.Detect(ctx, iptbackend.Options{Mode: cfg.IPTablesBackend})
	if err != nil {
		if cfg.NetworkPolicy || cfg.IPTablesBackend != "" {
			return nil, fmt.Errorf("finding the iptables backend: %w (install iptables, or pass --iptables-backend; NetworkPolicy needs it)", err)
		}
		cfg.Log.Warn("no iptables backend: NAT outgoing cannot be programmed", "error", err)
		return nil, nil
	}
	cfg.Log.Info("iptables backend", "mode", b.Mode, "reason", b.Reason)
	return &b, nil
}

// startHeartbeat renews the node's heartbeat Lease until ctx ends, and
// sets what /readyz checks.
func startHeartbeat(gs *goroutines, cfg Config, rc *rest.Config, ready *readiness, routes *router, policies *netpol.Controller) error {
	var policyReady func() error
	if policies != nil {
		policyReady = policies.Ready
	}
	// The heartbeat says what /readyz says: routes, and policies when
	// enforced, programmed (its renewal is the API server's answer).
	hb, err := newHeartbeat(rc, cfg.Namespace, cfg.NodeName, func() error {
		if err := routes.Ready(); err != nil {
			return err
		}
		if policyReady != nil {
			return policyReady()
		}
		return nil
	}, cfg.Log)
	if err != nil {
		return err
	}
	hb.onRenewed = func() {
		if !routes.beating.Swap(true) {
			routes.markDirty() // the NetworkUnavailable condition waits for it
		}
	}
	gs.Go("heartbeat", hb.run)
	// /readyz answers from state: the routing loop's (its caches synced,
	// its last reconcile), the policy loop's, and whether the API server
	// answered the last heartbeat. No probe costs an API call.
	ready.checks = []readinessCheck{
		{"routing", routes.Ready},
		{"networkpolicy", policyReady},
		{"heartbeat", hb.apiError},
	}
	return nil
}

// startAgent serves the CNI plugins' IPAM on cfg.CNISocket until ctx ends.
func startAgent(gs *goroutines, cfg Config, rc *rest.Config, infs *datastore.Informers, met *Metrics, policies *netpol.Controller) error {
	// The agent paces itself (one assignment or release at a time on
	// the node): a client-side rate limit would only queue a burst of
	// pods behind it. The API server's priority and fairness still
	// applies.
	arc := rest.CopyConfig(rc)
	arc.QPS = -1
	ads, err := datastore.New(arc)
	if err != nil {
		return err
	}
	acfg := cniagent.Config{Socket: cfg.CNISocket, NodeName: cfg.NodeName, DS: ads, Informers: infs, Log: cfg.Log, Metrics: met.agent, Spares: cfg.CNISpares}
	if policies != nil {
		acfg.Policy = policies
	}
	agent, err := cniagent.New(acfg)
	if err != nil {
		return err
	}
	gs.Go("CNI agent", func(ctx context.Context) error {
		// Without the agent the plugins reach the API server
		// themselves: tabbyd keeps running.
		err := agent.Run(ctx)
		if err != nil {
			cfg.Log.Error("the CNI agent stopped; CNI plugins on this node reach the API server directly", "socket", cfg.CNISocket, "error", err)
		}
		return err
	})
	return nil
}

// goroutines are the goroutines of one Run. Unlike a bare errgroup.Group,
// whose Wait reports the first error, Wait reports every one (named); and
// one goroutine's error stops no other: tabbyd keeps routing when its CNI
// agent fails.
type goroutines struct {
	ctx context.Context
	g   errgroup.Group

	mu      sync.Mutex
	errs    []error
	running map[string]int // by name, for the tests
}

func newGoroutines(ctx context.Context) *goroutines {
	gs := &goroutines{ctx: ctx, running: map[string]int{}}
	if runStarted != nil {
		runStarted(gs)
	}
	return gs
}

// runStarted, when set (by tests), is told of each Run's goroutines.
var runStarted func(*goroutines)

// Go runs f(ctx) in the group, as name.
func (gs *goroutines) Go(name string, f func(context.Context) error) {
	gs.mu.Lock()
	gs.running[name]++
	gs.mu.Unlock()
	gs.g.Go(func() error {
		err := f(gs.ctx)
		gs.mu.Lock()
		defer gs.mu.Unlock()
		if gs.running[name]--; gs.running[name] == 0 {
			delete(gs.running, name)
		}
		if err != nil {
			gs.errs = append(gs.errs, fmt.Errorf("%s: %w", name, err))
		}
		return nil
	})
}

// Wait waits for every goroutine and returns all their errors.
func (gs *goroutines) Wait() error {
	_ = gs.g.Wait()
	gs.mu.Lock()
	defer gs.mu.Unlock()
	return errors.Join(gs.errs...)
}

// Running names the goroutines that have not returned.
func (gs *goroutines) Running() []string {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	return slices.Sorted(maps.Keys(gs.running))
}

// startIPAMGC runs the IPAM garbage collector's election (and the
// collector while elected) until ctx ends.
func startIPAMGC(gs *goroutines, cfg Config, rc *rest.Config, ds *datastore.Client, met *Metrics) error {
	log := cfg.Log.With("component", "ipam-gc")
	collector, err := gc.New(gc.Config{DS: ds, Grace: cfg.IPAMGCGrace, Interval: cfg.IPAMGCInterval, Log: log, Metrics: met.gc})
	if err != nil {
		return err
	}
	ns := cfg.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	leases, err := newLeaseClient(rc, ns)
	if err != nil {
		return fmt.Errorf("building the Lease client of the IPAM garbage collector's election: %w", err)
	}
	gs.Go("IPAM GC", func(ctx context.Context) error {
		err := collector.RunElected(ctx, gc.Election{Leases: leases, Namespace: ns, Identity: cfg.NodeName})
		if err != nil {
			log.Error("the IPAM garbage collector's election stopped", "error", err)
		}
		return err
	})
	return nil
}

// startCNIToken keeps the CNI plugin's kubeconfig carrying a valid token
// until ctx ends.
func startCNIToken(gs *goroutines, cfg Config, ds *datastore.Client) error {
	ns, sa := cfg.Namespace, cfg.CNIServiceAccount
	if ns == "" {
		ns = DefaultNamespace
	}
	if sa == "" {
		sa = cnitoken.DefaultServiceAccount
	}
	r := &cnitoken.Refresher{
		Minter: cnitoken.Minter{Client: ds.CoreREST(), Namespace: ns, ServiceAccount: sa, Lifetime: cfg.CNITokenLifetime},
		Path:   cfg.CNIKubeconfig,
		Log:    cfg.Log.With("component", "cni-token"),
	}
	if r.Lifetime != 0 && r.Lifetime < cnitoken.MinLifetime {
		return fmt.Errorf("--cni-token-lifetime %v is below the API server's minimum of %v", r.Lifetime, cnitoken.MinLifetime)
	}
	gs.Go("CNI token", func(ctx context.Context) error { r.Run(ctx); return nil })
	return nil
}
