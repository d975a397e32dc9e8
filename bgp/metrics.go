package bgp

import (
	"sync"

	gobgpmetrics "github.com/osrg/gobgp/v3/pkg/metrics"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Collector exports GoBGP's own metrics (package
// github.com/osrg/gobgp/v3/pkg/metrics) of the speaker set last: per peer,
// the messages sent and received by type (bgp_received_update_total ...),
// the session and admin state (bgp_peer_state), and per peer and family
// the routes received, accepted and advertised (bgp_routes_*). The daemon
// restarts its speaker when its BGP identity changes, so the collector
// outlives speakers; with none it exports nothing.
type Collector struct {
	mu    sync.Mutex
	inner prometheus.Collector
}

// NewCollector is a Collector with no speaker yet.
func NewCollector() *Collector { return &Collector{} }

// Set makes s the speaker whose metrics are exported (nil: none).
func (c *Collector) Set(s *Speaker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inner = nil
	if s != nil {
		c.inner = gobgpmetrics.NewBgpCollector(s.srv)
	}
}

// Describe sends GoBGP's descriptions, which do not need a speaker.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	gobgpmetrics.NewBgpCollector(nil).Describe(ch)
}

// Collect sends the speaker's metrics. GoBGP's collector sends an invalid
// metric when its server has stopped (between a speaker's Stop and the
// next Set), which would fail the whole scrape: those are dropped.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	inner := c.inner
	c.mu.Unlock()
	if inner == nil {
		return
	}
	all := make(chan prometheus.Metric)
	go func() {
		inner.Collect(all)
		close(all)
	}()
	for m := range all {
		if m.Write(&dto.Metric{}) == nil {
			ch <- m
		}
	}
}
