package lab

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"
)

func freeUDPPort(t *testing.T) int {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	return pc.LocalAddr().(*net.UDPAddr).Port
}

func freeTCPPort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func TestNetexecAndProbe(t *testing.T) {
	tcp, udp := freeTCPPort(t), freeUDPPort(t)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- RunNetexec(ctx, NetexecConfig{TCP: []int{tcp}, UDP: []int{udp}, Name: "web-0"}, func() { close(ready) })
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatal(err)
	}
	for _, tc := range []struct{ network, addr string }{
		{"tcp", net.JoinHostPort("127.0.0.1", itoa(tcp))},
		{"udp", net.JoinHostPort("127.0.0.1", itoa(udp))},
	} {
		for range 3 {
			got, err := Probe(context.Background(), tc.network, tc.addr, time.Second)
			if err != nil || got != "web-0" {
				t.Errorf("probe %s %s: %q %v", tc.network, tc.addr, got, err)
			}
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("netexec: %v", err)
	}
	// Nothing listens any more: both probes fail, the UDP one without
	// waiting out its timeout when the port is refused.
	start := time.Now()
	if got, err := Probe(context.Background(), "tcp", net.JoinHostPort("127.0.0.1", itoa(tcp)), time.Second); err == nil {
		t.Errorf("a TCP probe of a closed port answered %q", got)
	}
	if got, err := Probe(context.Background(), "udp", net.JoinHostPort("127.0.0.1", itoa(udp)), 2*time.Second); err == nil {
		t.Errorf("a UDP probe of a closed port answered %q", got)
	}
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Errorf("the failing probes took %v", d)
	}
}

func TestProbeTCPServerThatSaysNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	// A connection is success enough over TCP.
	if got, err := Probe(context.Background(), "tcp", ln.Addr().String(), 300*time.Millisecond); err != nil || got != "" {
		t.Errorf("probe: %q %v", got, err)
	}
}

func TestNetexecNeedsPorts(t *testing.T) {
	if err := RunNetexec(context.Background(), NetexecConfig{Name: "x"}, nil); err == nil {
		t.Error("netexec without ports started")
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
