package bgp

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	gobgplog "github.com/osrg/gobgp/v3/pkg/log"
)

// gobgpLogger passes GoBGP's logs to slog and remembers, per peer, the last
// thing that went wrong (GoBGP's API does not say why a session is down).
type gobgpLogger struct {
	log *slog.Logger

	// onLimit is called when a session is closed for sending more
	// prefixes than its limit, with the neighbor address and family.
	onLimit func(addr, family string)

	mu      sync.Mutex
	details map[string]string // by neighbor address
	trips   map[string]int    // prefix-limit closures, by neighbor address
	// limited are the peers whose session was last closed for the prefix
	// limit (until it is up again), by neighbor address.
	limited map[string]bool
}

func newGobgpLogger(l *slog.Logger) *gobgpLogger {
	return &gobgpLogger{log: l.With("component", "gobgp"), details: map[string]string{}, trips: map[string]int{}, limited: map[string]bool{}}
}

// detail is the last problem logged for a peer, "" for none.
func (g *gobgpLogger) detail(addr string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.details[addr]
}

func (g *gobgpLogger) emit(level slog.Level, msg string, fields gobgplog.Fields) {
	if key, ok := fields["Key"].(string); ok {
		// GoBGP logs "prefix limit reached" once with Pct at the warning
		// threshold, and without it each time it closes the session.
		if _, warning := fields["Pct"]; msg == "prefix limit reached" && !warning {
			g.mu.Lock()
			g.trips[key]++
			g.limited[key] = true
			g.mu.Unlock()
			if g.onLimit != nil {
				g.onLimit(key, fmt.Sprint(fields["Family"]))
			}
		}
		switch {
		case msg == "Peer Down":
			g.remember(key, fmt.Sprintf("session went down: %v", fields["Reason"]))
		case msg == "Peer Up":
			g.remember(key, "")
			g.mu.Lock()
			delete(g.limited, key)
			g.mu.Unlock()
		case level >= slog.LevelWarn:
			g.remember(key, msg+describeFields(fields))
		}
	}
	if !g.log.Enabled(context.Background(), level) {
		return
	}
	attrs := make([]any, 0, 2*len(fields))
	for _, k := range sortedKeys(fields) {
		attrs = append(attrs, strings.ToLower(k), fields[k])
	}
	g.log.Log(context.Background(), level, msg, attrs...)
}

// limitTrips counts the prefix-limit closures of a peer.
func (g *gobgpLogger) limitTrips(addr string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.trips[addr]
}

// overLimit says the peer's session was last closed for sending more
// prefixes than its limit and has not come up since.
func (g *gobgpLogger) overLimit(addr string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.limited[addr]
}

func (g *gobgpLogger) remember(addr, detail string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.details[addr] = detail
}

// describeFields renders the fields worth showing in a peer's detail.
func describeFields(fields gobgplog.Fields) string {
	var parts []string
	for _, k := range sortedKeys(fields) {
		if k != "Key" && k != "Topic" && k != "State" {
			parts = append(parts, fmt.Sprintf("%s=%v", strings.ToLower(k), fields[k]))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

func (g *gobgpLogger) Panic(msg string, fields gobgplog.Fields) {
	g.emit(slog.LevelError, msg, fields)
	panic("gobgp: " + msg)
}

func (g *gobgpLogger) Fatal(msg string, fields gobgplog.Fields) {
	g.emit(slog.LevelError, msg, fields)
	panic("gobgp: " + msg)
}

func (g *gobgpLogger) Error(msg string, fields gobgplog.Fields) {
	g.emit(slog.LevelError, msg, fields)
}

func (g *gobgpLogger) Warn(msg string, fields gobgplog.Fields) {
	g.emit(slog.LevelWarn, msg, fields)
}

// routine are GoBGP's info messages for what the speaker asks of it on
// every change of its route filters: with a claim anywhere in the cluster
// each node logged one per session (29 lines on a 30-node mesh, every
// node), and writing them was a cost of its own. They are debug lines.
var routine = map[string]bool{
	"call set policy":         true,
	"Neighbor soft reset in":  true,
	"Neighbor soft reset out": true,
	"Neighbor soft reset":     true,
}

func (g *gobgpLogger) Info(msg string, fields gobgplog.Fields) {
	level := slog.LevelInfo
	if routine[msg] {
		level = slog.LevelDebug
	}
	g.emit(level, msg, fields)
}

func (g *gobgpLogger) Debug(msg string, fields gobgplog.Fields) {
	g.emit(slog.LevelDebug, msg, fields)
}

// SetLevel is ignored: the slog handler decides what is shown.
func (g *gobgpLogger) SetLevel(gobgplog.LogLevel) {}

// GetLevel tells GoBGP whether to build debug messages at all.
func (g *gobgpLogger) GetLevel() gobgplog.LogLevel {
	if g.log.Enabled(context.Background(), slog.LevelDebug) {
		return gobgplog.DebugLevel
	}
	return gobgplog.InfoLevel
}

var _ gobgplog.Logger = (*gobgpLogger)(nil)
