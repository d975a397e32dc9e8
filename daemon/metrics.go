package daemon

import (
	"errors"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/daemon/cniagent"
	"github.com/tabbynet/tabby/daemon/netpol"
	"github.com/tabbynet/tabby/daemon/routing"
	"github.com/tabbynet/tabby/ipam/gc"
)

// Metrics are every metric tabbyd exports, registered at once by
// NewMetrics, which Run calls with the registry /metrics serves: a test
// that needs the names tabbyd exports (the Grafana dashboard's) calls it
// too. Every loop's metrics are there, also those of loops a flag turns
// off, which then stay at zero.
type Metrics struct {
	routing *routingMetrics
	api     *apiRequests
	policy  *netpol.Metrics
	agent   *cniagent.Metrics
	gc      *gc.Metrics
}

// NewMetrics registers all of tabbyd's metrics with reg: the Go runtime's
// and the process's, the routing loop's (GoBGP's own per-peer collector
// among them), the API requests', the policy loop's, the CNI agent's and
// the IPAM garbage collector's.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if err := errors.Join(reg.Register(collectors.NewGoCollector()), reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))); err != nil {
		return nil, err
	}
	m := &Metrics{routing: newRoutingMetrics(reg), api: newAPIRequests(reg), gc: gc.NewMetrics(reg)}
	var err error
	if m.policy, err = netpol.NewMetrics(reg); err != nil {
		return nil, err
	}
	if m.agent, err = cniagent.NewMetrics(reg); err != nil {
		return nil, err
	}
	return m, nil
}

// routingMetrics are the routing loop's Prometheus metrics.
type routingMetrics struct {
	sessions        *prometheus.GaugeVec
	routes          *prometheus.GaugeVec
	reconciles      *prometheus.CounterVec
	reconcileTime   prometheus.Histogram
	applyErrors     prometheus.Counter
	kernelChanges   *prometheus.CounterVec
	lastReconcileOK prometheus.Gauge
	rejected        *prometheus.GaugeVec
	limitTrips      *prometheus.CounterVec
	// gobgp is GoBGP's own per-peer collector of the running speaker.
	gobgp *bgp.Collector
}

var sessionStates = []bgp.SessionState{bgp.StateIdle, bgp.StateConnect, bgp.StateActive, bgp.StateOpenSent, bgp.StateOpenConfirm, bgp.StateEstablished}

func newRoutingMetrics(reg prometheus.Registerer) *routingMetrics {
	m := &routingMetrics{
		sessions: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tabby_bgp_sessions",
			Help: "BGP sessions of this node by state and type (node-mesh, route-reflector, route-reflector-client, bgppeer).",
		}, []string{"state", "type"}),
		routes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tabby_routes",
			Help: "Routes by kind: programmed (in the kernel, with tabby's protocol), blackhole (own blocks), learned and stale (BGP), advertised (BGP), kept (left by the previous run until BGP converges).",
		}, []string{"kind"}),
		reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_routing_reconciles_total",
			Help: "Reconciles of BGP sessions, advertisements and routes, by result (ok, error).",
		}, []string{"result"}),
		reconcileTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tabby_routing_reconcile_duration_seconds",
			Help:    "How long one reconcile of BGP sessions, advertisements and routes took.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		applyErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tabby_routing_apply_errors_total",
			Help: "Reconciles whose programming of the kernel (routes, tunnels, NAT) failed in part.",
		}),
		kernelChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_routing_kernel_changes_total",
			Help: "Kernel objects tabbyd changed, by object (route, link, address, fdb, neighbor, setmember, natrule, sysctl).",
		}, []string{"object"}),
		lastReconcileOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tabby_routing_last_apply_success",
			Help: "1 when the last programming of the kernel succeeded, else 0.",
		}),
	}
	m.rejected = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tabby_bgp_rejected_routes",
		Help: "Routes a BGP peer currently sends that the route filters reject, by peer address and session type (counted at most once a second).",
	}, []string{"peer", "type"})
	m.limitTrips = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tabby_bgp_prefix_limit_exceeded_total",
		Help: "Times a BGP session was closed because its peer sent more prefixes than its limit (BGPPeer maxPrefixes, BGPConfiguration nodeMeshMaxPrefixes), by peer address and address family.",
	}, []string{"peer", "family"})
	m.gobgp = bgp.NewCollector()
	reg.MustRegister(m.rejected, m.limitTrips, m.gobgp)
	reg.MustRegister(m.sessions, m.routes, m.reconciles, m.reconcileTime, m.applyErrors, m.kernelChanges, m.lastReconcileOK)
	return m
}

// observeSessions sets the sessions gauge from the speaker's sessions.
func (m *routingMetrics) observeSessions(states []bgp.PeerState) {
	m.sessions.Reset()
	for _, s := range sessionStates {
		for _, k := range []bgp.Kind{bgp.KindMesh, bgp.KindReflector, bgp.KindReflectorClient, bgp.KindBGPPeer} {
			m.sessions.WithLabelValues(string(s), string(k)).Set(0)
		}
	}
	for _, st := range states {
		m.sessions.WithLabelValues(string(st.State), string(st.Kind)).Inc()
	}
}

// observeApply counts what an apply (the routing pass's, or the NAT
// worker's) changed, and its failure. The last-apply gauge is the routing
// pass's to set, from both (programKernel).
func (m *routingMetrics) observeApply(st routing.Stats, err error) {
	if err != nil {
		m.applyErrors.Inc()
	}
	for obj, c := range map[string]routing.Counts{
		"route": st.Routes, "link": st.Links, "address": st.Addresses, "fdb": st.FDB, "neighbor": st.Neighbors,
		"setmember": st.SetMembers, "natrule": st.NATRules, "sysctl": st.Sysctls,
	} {
		if n := c.Changed(); n > 0 {
			m.kernelChanges.WithLabelValues(obj).Add(float64(n))
		}
	}
}

// observeRejected sets the rejected-routes gauge from the sessions.
func (m *routingMetrics) observeRejected(states []bgp.PeerState) {
	m.rejected.Reset()
	for _, st := range states {
		m.rejected.WithLabelValues(st.Address.String(), string(st.Kind)).Set(float64(st.Rejected))
	}
}

// prefixLimitReached counts a session closed for too many prefixes.
func (m *routingMetrics) prefixLimitReached(peer netip.Addr, family string) {
	m.limitTrips.WithLabelValues(peer.String(), family).Inc()
}
