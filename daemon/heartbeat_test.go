package daemon

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

func TestRetryDelay(t *testing.T) {
	for _, c := range []struct {
		failures int
		jitter   float64
		want     time.Duration
	}{
		{1, 0, time.Second},
		{2, 0, 2 * time.Second},
		{3, 0, 4 * time.Second},
		{4, 0, 8 * time.Second},
		{5, 0, 10 * time.Second},
		{100, 0, 10 * time.Second},
		{1, 1, 1200 * time.Millisecond},
		{1, -1, 800 * time.Millisecond},
		{9, 1, 12 * time.Second},
	} {
		if got := retryDelay(c.failures, c.jitter); got != c.want {
			t.Errorf("retryDelay(%d, %v) = %v, want %v", c.failures, c.jitter, got, c.want)
		}
	}
}

// TestHeartbeatBackoff: renewals against an API server that refuses
// connections (a real client, a real closed port) back off: over a
// simulated minute of one-second ticks it tries about 9 times, not 60
// (the heartbeat used to retry every second), and says why on apiError.
// Not ready, it asks nothing.
func TestHeartbeatBackoff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now: connections are refused
	var notReady error
	hb, err := newHeartbeat(&rest.Config{Host: "http://" + addr}, "tabby-system", "n1", func() error { return notReady }, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := time.Now()
	var tries []time.Duration
	for s := range 60 {
		at := start.Add(time.Duration(s) * time.Second)
		if hb.tick(ctx, at) {
			tries = append(tries, at.Sub(start))
		}
	}
	t.Logf("renewals in a simulated minute against a refusing API server: %d, at %v", len(tries), tries)
	if len(tries) < 7 || len(tries) > 11 {
		t.Errorf("%d renewals in a minute at %v, want about 9 (1, 2, 4, 8 s apart, then every 10 s with 20%% jitter)", len(tries), tries)
	}
	for i := 2; i < len(tries); i++ {
		if gap := tries[i] - tries[i-1]; gap > 13*time.Second {
			t.Errorf("renewals %v: a gap of %v is over the cap (10 s + 20%%, and the 1 s tick)", tries, gap)
		}
	}
	err = hb.apiError()
	if err == nil || !strings.Contains(err.Error(), "connection refused") || !strings.Contains(err.Error(), "tabby-system/tabbyd-n1") {
		t.Errorf("apiError: %v", err)
	}
	notReady = context.Canceled
	if hb.tick(ctx, start.Add(10*time.Minute)) {
		t.Error("not ready, the heartbeat still asked the API server")
	}
}
