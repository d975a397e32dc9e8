package bgp

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
)

// TestGobgpLoggerLevels: what GoBGP logs on every filter change goes to
// debug; its other info lines (a session up or down) stay info, and a
// peer's problems are remembered whatever the level.
func TestGobgpLoggerLevels(t *testing.T) {
	var buf bytes.Buffer
	g := newGobgpLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})))
	for _, msg := range []string{"call set policy", "Neighbor soft reset in", "Neighbor soft reset out", "Neighbor soft reset"} {
		g.Info(msg, gobgplog.Fields{"Topic": "Peer", "Key": "10.0.0.2"})
	}
	if buf.Len() != 0 {
		t.Errorf("routine messages logged at info:\n%s", &buf)
	}
	g.Info("Peer Down", gobgplog.Fields{"Topic": "Peer", "Key": "10.0.0.2", "Reason": "hold timer expired"})
	if !strings.Contains(buf.String(), "Peer Down") {
		t.Errorf("a session going down is not logged at info: %q", &buf)
	}
	if got := g.detail("10.0.0.2"); !strings.Contains(got, "hold timer expired") {
		t.Errorf("detail %q", got)
	}
	buf.Reset()
	g = newGobgpLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	g.Info("call set policy", gobgplog.Fields{"Topic": "Peer", "Key": "10.0.0.2"})
	if !strings.Contains(buf.String(), "level=DEBUG") {
		t.Errorf("a routine message is not logged at debug: %q", &buf)
	}
}
