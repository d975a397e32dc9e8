package bgp

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestCollectorOnLoopback: GoBGP's collector, registered once, exports the
// per-peer messages, session state and routes of the speaker set last;
// nothing without one; and a stopped speaker does not fail the scrape.
func TestCollectorOnLoopback(t *testing.T) {
	if testing.Short() {
		t.Skip("starts BGP sessions")
	}
	ctx := context.Background()
	a, b := loopSpeaker(t, 41, Config{}), loopSpeaker(t, 42, Config{})
	setLoopFilters(t, "a", a, b)
	reg := prometheus.NewPedanticRegistry()
	c := NewCollector()
	reg.MustRegister(c)
	if fams := gather(t, reg); len(fams) != 0 {
		t.Errorf("without a speaker the collector exports %d families", len(fams))
	}
	c.Set(b)
	if err := a.SetPeers(ctx, []Peer{loopPeer(41, 42)}); err != nil {
		t.Fatal(err)
	}
	if err := b.SetPeers(ctx, []Peer{loopPeer(42, 41)}); err != nil {
		t.Fatal(err)
	}
	block := Route{Prefix: netip.MustParsePrefix("10.244.41.0/26"), NextHop: netip.MustParseAddr("192.168.0.41")}
	if err := a.SetAdvertisements(ctx, []Route{block}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "b's metrics show the session established and a's route accepted", func() (bool, string) {
		fams := gather(t, reg)
		state := value(fams["bgp_peer_state"], map[string]string{"peer": "127.0.0.41", "session_state": "ESTABLISHED"})
		accepted := value(fams["bgp_routes_accepted"], map[string]string{"peer": "127.0.0.41", "route_family": "ipv4-unicast"})
		updates := value(fams["bgp_received_update_total"], map[string]string{"peer": "127.0.0.41"})
		return state == 1 && accepted == 1 && updates >= 1, formatFams(fams)
	})
	c.Set(nil)
	if fams := gather(t, reg); len(fams) != 0 {
		t.Errorf("after Set(nil) the collector exports %d families", len(fams))
	}
	// A speaker stopped but still set (the daemon between Stop and Start).
	if err := b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	c.Set(b)
	gather(t, reg)
}

func gather(t *testing.T, g prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatalf("gathering: %v", err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

// value is the value of the metric of f whose labels include want, or -1.
func value(f *dto.MetricFamily, want map[string]string) float64 {
	for _, m := range f.GetMetric() {
		n := 0
		for _, l := range m.GetLabel() {
			if want[l.GetName()] == l.GetValue() {
				n++
			}
		}
		if n != len(want) {
			continue
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

func formatFams(fams map[string]*dto.MetricFamily) string {
	s := ""
	for _, n := range []string{"bgp_peer_state", "bgp_routes_accepted", "bgp_received_update_total"} {
		for _, m := range fams[n].GetMetric() {
			s += n + " " + m.String() + "; "
		}
	}
	return s
}
