//go:debug multipathtcp=0

// The directive above does for this test binary what tabbyd's main package
// must do (see mptcp.go): without it no session with a password comes up.

package bgp

import (
	"context"
	"errors"
	"testing"
)

func TestPasswordNeedsPlainTCPListeners(t *testing.T) {
	if listenersUseMPTCP() {
		t.Fatal("the //go:debug multipathtcp=0 directive of this test binary did not take effect")
	}
	s := loopSpeaker(t, 3, Config{})
	defer func(f func() bool) { listenersUseMPTCP = f }(listenersUseMPTCP)
	listenersUseMPTCP = func() bool { return true }
	p := loopPeer(3, 4)
	p.Password = "x"
	if err := s.SetPeers(context.Background(), []Peer{p}); !errors.Is(err, ErrMPTCPListeners) {
		t.Fatalf("SetPeers with a password over MPTCP listeners = %v, want ErrMPTCPListeners", err)
	}
	p.Password = ""
	if err := s.SetPeers(context.Background(), []Peer{p}); err != nil {
		t.Fatalf("SetPeers without a password: %v", err)
	}
}
