package bgp

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"testing"
	"time"
)

// Two speakers in this process, on loopback addresses with ports of their
// own: the speaker's API without namespaces or root. Real multi-node
// sessions are in the namespace tests (lab_test.go).

// loopSpeaker starts a speaker on 127.0.0.<i>, port 20000+i.
func loopSpeaker(t *testing.T, i int, cfg Config) *Speaker {
	t.Helper()
	addr := netip.AddrFrom4([4]byte{127, 0, 0, byte(i)})
	cfg.RouterID, cfg.ListenAddresses, cfg.ListenPort = addr, []netip.Addr{addr}, uint16(20000+i)
	if cfg.AS == 0 {
		cfg.AS = 64512
	}
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("speaker", i)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
	return s
}

// loopPeer is the session from speaker i to speaker j.
func loopPeer(i, j int) Peer {
	local, remote := netip.AddrFrom4([4]byte{127, 0, 0, byte(i)}), netip.AddrFrom4([4]byte{127, 0, 0, byte(j)})
	return Peer{Address: remote, Port: uint16(20000 + j), AS: 64512, LocalAddress: local, Passive: remote.Less(local),
		RestartTime: 2 * time.Minute, Kind: KindMesh}
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; last state: %s", what, timeout, state)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func learnedString(t *testing.T, s *Speaker) string {
	t.Helper()
	routes, err := s.Learned(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := ""
	for _, r := range routes {
		out += fmt.Sprintf("%s via %s from %s stale=%v; ", r.Prefix, r.NextHop, r.Peer, r.Stale)
	}
	return out
}

func TestSpeakerOnLoopback(t *testing.T) {
	if testing.Short() {
		t.Skip("starts BGP sessions")
	}
	ctx := context.Background()
	a, b := loopSpeaker(t, 1, Config{}), loopSpeaker(t, 2, Config{})
	if err := a.SetPeers(ctx, []Peer{loopPeer(1, 2)}); err != nil {
		t.Fatal(err)
	}
	if err := b.SetPeers(ctx, []Peer{loopPeer(2, 1)}); err != nil {
		t.Fatal(err)
	}
	blockA := Route{Prefix: netip.MustParsePrefix("10.244.1.0/26"), NextHop: netip.MustParseAddr("192.168.0.1")}
	svc := Route{Prefix: netip.MustParsePrefix("10.96.0.0/12"), NextHop: netip.MustParseAddr("192.168.0.1")}
	if err := a.SetAdvertisements(ctx, []Route{blockA, svc}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "b learns a's routes with a's next hop", func() (bool, string) {
		got := learnedString(t, b)
		return got == "10.96.0.0/12 via 192.168.0.1 from 127.0.0.1 stale=false; 10.244.1.0/26 via 192.168.0.1 from 127.0.0.1 stale=false; ", got
	})
	if got := learnedString(t, a); got != "" {
		t.Errorf("a learned its own routes back: %s", got)
	}
	states, err := b.PeerStates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(states) != 1 || !states[0].Established() || !states[0].Synced || states[0].Received != 2 || len(states[0].Prefixes) != 2 || states[0].Reason() != "node-mesh" {
		t.Errorf("b's peer states: %+v", states)
	}
	// b originates nothing, so it carries nothing to a (graceful restart's
	// End-of-RIB is not a route: Transition would otherwise hold a session
	// between two nodes without blocks until its timeout); a carries two.
	if len(states) == 1 && states[0].Advertised != 0 {
		t.Errorf("b, which originates nothing, counts %d routes advertised to a", states[0].Advertised)
	}
	if st, err := a.PeerStates(ctx); err != nil || len(st) != 1 || st[0].Advertised != 2 {
		t.Errorf("a's peer states (want 2 advertised): %+v %v", st, err)
	}

	// Withdraw one route, move the other to a new next hop.
	moved := blockA
	moved.NextHop = netip.MustParseAddr("192.168.0.9")
	if err := a.SetAdvertisements(ctx, []Route{moved}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "b sees the withdrawal and the new next hop", func() (bool, string) {
		got := learnedString(t, b)
		return got == "10.244.1.0/26 via 192.168.0.9 from 127.0.0.1 stale=false; ", got
	})
	select {
	case <-b.Changes():
	default:
		t.Error("b's Changes was not signalled")
	}

	// No peers: the session goes (nothing relays, so at once) and so do its
	// routes, on both sides (removing a peer is a Hard Reset, no graceful
	// restart).
	if err := b.SetAdvertisements(ctx, []Route{{Prefix: netip.MustParsePrefix("10.244.2.0/26"), NextHop: netip.MustParseAddr("192.168.0.2")}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "a learns b's route", func() (bool, string) {
		got := learnedString(t, a)
		return got == "10.244.2.0/26 via 192.168.0.2 from 127.0.0.2 stale=false; ", got
	})
	if err := b.SetPeers(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if got := learnedString(t, b); got != "" {
		t.Errorf("b still has routes after dropping its only peer: %s", got)
	}
	eventually(t, 10*time.Second, "a's session goes down and b's route with it", func() (bool, string) {
		st, _ := a.PeerStates(ctx)
		got := learnedString(t, a)
		return len(st) == 1 && !st[0].Established() && st[0].Detail != "" && got == "", fmt.Sprintf("%+v %s", st, got)
	})
}
