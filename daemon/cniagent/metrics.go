package cniagent

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	requests   *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	podLookups *prometheus.CounterVec
	records    *prometheus.CounterVec
	otherNode  prometheus.Counter
	commands   *prometheus.HistogramVec
	// assignBatch: how many assignments were answered together.
	assignBatch prometheus.Histogram
	// releaseBatch: how many releases were answered together.
	releaseBatch prometheus.Histogram
	// spares: what became of addresses held ahead, by event.
	spares *prometheus.CounterVec
}

func newMetrics() metrics {
	return metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_cni_agent_requests_total",
			Help: "CNI plugin requests served by tabbyd's CNI agent, by endpoint and result (ok, error).",
		}, []string{"endpoint", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tabby_cni_agent_request_duration_seconds",
			Help:    "Time tabbyd's CNI agent took to answer a request, by endpoint.",
			Buckets: []float64{.0005, .001, .002, .003, .005, .0075, .01, .02, .05, .1, .25, 1, 5},
		}, []string{"endpoint"}),
		podLookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_cni_agent_pod_lookups_total",
			Help: "Pods read for their IPAM annotations, by source: cache (the informer) or api (not in the cache yet).",
		}, []string{"source"}),
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_cni_agent_handle_records_total",
			Help: "IPAM handles written after answering an assignment, by result (ok, error).",
		}, []string{"result"}),
		otherNode: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tabby_cni_agent_other_node_requests_total",
			Help: "Requests refused because they name another node than this tabbyd's (a CNI config whose nodename or agentSocket is another node's).",
		}),
		commands: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "tabby_cni_command_duration_seconds",
			Help: "CNI ADD and DEL of the tabby plugin on this node, end to end as the plugin measured them, by command (ADD, DEL) and result (ok, error). Only commands that reached this tabbyd's agent are counted.",
			// From a warm agent's few milliseconds to a policy wait's 10s bound.
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"command", "result"}),
		assignBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tabby_cni_agent_assign_batch_size",
			Help:    "Assignments the CNI agent answered together: those that queued while another was written (several pods starting at once), served from one block in one write where they can.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
		}),
		releaseBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tabby_cni_agent_release_batch_size",
			Help:    "Releases the CNI agent answered together: those that queued while another was written (several pods deleted at once), freed from one block in one write where they can.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
		}),
		spares: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_cni_agent_spare_addresses_total",
			Help: "Addresses the CNI agent holds ahead (spares), by event: assigned (allocated ahead), handed (an ADD answered from one), missed (an ADD that found none that fits), transferred (moved to the pod's handle in its block), returned (the pod was deleted before the transfer: held ahead again), released (given back: no longer fitting the pools, or spares turned off), error (a transfer that failed for good: tabbyctl ipam check).",
		}, []string{"event"}),
	}
}

// Metrics are the agent's metrics, made before the agent so that a
// program registers all of its metrics in one place (daemon.NewMetrics).
type Metrics struct{ m metrics }

// NewMetrics registers the agent's metrics with r.
func NewMetrics(r prometheus.Registerer) (*Metrics, error) {
	m := newMetrics()
	if err := m.register(r); err != nil {
		return nil, fmt.Errorf("cniagent: registering metrics: %w", err)
	}
	return &Metrics{m}, nil
}

func (m metrics) register(r prometheus.Registerer) error {
	return errors.Join(r.Register(m.requests), r.Register(m.duration), r.Register(m.podLookups), r.Register(m.records), r.Register(m.otherNode), r.Register(m.commands), r.Register(m.assignBatch), r.Register(m.releaseBatch), r.Register(m.spares))
}
