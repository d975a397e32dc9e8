package gc

import "github.com/prometheus/client_golang/prometheus"

// metrics are the collector's Prometheus metrics.
type metrics struct {
	candidates prometheus.Gauge
	releases   *prometheus.CounterVec
	blocks     *prometheus.CounterVec
	repairs    *prometheus.CounterVec
	passTime   prometheus.Histogram
	passes     *prometheus.CounterVec
	leader     prometheus.Gauge
	pools      *poolGauges
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		candidates: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tabby_ipam_gc_candidates",
			Help: "Allocations that looked leaked in the last pass (their pod gone, finished or holding other addresses; tunnel addresses of deleted nodes), waiting for the grace period or released in that pass.",
		}),
		releases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_ipam_gc_releases_total",
			Help: "Addresses the IPAM garbage collector released, by reason (pod-gone, pod-finished, pod-has-other-addresses, node-gone).",
		}, []string{"reason"}),
		blocks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_ipam_gc_blocks_reclaimed_total",
			Help: "Blocks the IPAM garbage collector freed, by reason: node-deleted (a deleted node's empty block, deleted), unaffined (a deleted node's block still holding borrowed addresses, its affinity removed), empty (a live node's spare empty block, or an unaffined empty block, deleted).",
		}, []string{"reason"}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_ipam_gc_repairs_total",
			Help: "IPAM records the garbage collector repaired, by kind: orphan-affinity (removed), missing-affinity (created), orphan-handle (removed).",
		}, []string{"kind"}),
		passTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tabby_ipam_gc_pass_duration_seconds",
			Help:    "How long one pass of the IPAM garbage collector took.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_ipam_gc_passes_total",
			Help: "Passes of the IPAM garbage collector, by result (ok, error).",
		}, []string{"result"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tabby_ipam_gc_leader",
			Help: "1 while this tabbyd holds the IPAM garbage collector's Lease and runs its passes, else 0.",
		}),
		pools: newPoolGauges(),
	}
	for _, r := range []Reason{ReasonPodGone, ReasonPodFinished, ReasonPodOtherAddresses, ReasonNodeGone} {
		m.releases.WithLabelValues(string(r))
	}
	for _, r := range []string{reclaimNodeDeleted, reclaimUnaffined, reclaimEmpty} {
		m.blocks.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.candidates, m.releases, m.blocks, m.repairs, m.passTime, m.passes, m.leader, m.pools)
	}
	return m
}

// Metrics are the collector's metrics, made before it so that a program
// registers all of its metrics in one place (daemon.NewMetrics).
type Metrics struct{ m *metrics }

// NewMetrics registers the collector's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics { return &Metrics{newMetrics(reg)} }

const (
	reclaimNodeDeleted = "node-deleted"
	reclaimUnaffined   = "unaffined"
	reclaimEmpty       = "empty"
)
