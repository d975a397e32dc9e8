package nflog_test

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/tabbynet/tabby/daemon/nflog"
	"github.com/tabbynet/tabby/internal/netnstest"
)

// TestReadLoggedPacket logs a UDP packet on the loopback of a fresh network
// namespace with -j NFLOG and reads it back from the group.
func TestReadLoggedPacket(t *testing.T) {
	n := netnstest.New(t, "nflog")
	n.Exec("iptables", "-A", "OUTPUT", "-p", "udp", "--dport", "4789", "-j", "NFLOG", "--nflog-group", "7", "--nflog-prefix", "tabby:test")
	var c *nflog.Conn
	n.Must(func() (err error) {
		c, err = nflog.Open(nflog.Config{Group: 7, Flush: 10 * time.Millisecond})
		return err
	})
	got := make(chan nflog.Packet, 10)
	done := make(chan error, 1)
	go func() { done <- c.Read(func(p nflog.Packet) { got <- p }, nil) }()
	t.Cleanup(func() {
		_ = c.Close()
		if err := <-done; err != nil {
			t.Errorf("Read after Close: %v", err)
		}
	})
	// A second reader of the same group is refused with a clear error.
	n.Must(func() error {
		if c2, err := nflog.Open(nflog.Config{Group: 7}); err == nil {
			_ = c2.Close()
			t.Errorf("a second socket bound group 7")
		} else {
			t.Logf("second reader: %v", err)
		}
		return nil
	})
	start := time.Now()
	n.Must(func() error {
		conn, err := net.DialUDP("udp", &net.UDPAddr{IP: net.ParseIP("127.0.0.1"), Port: 5555}, &net.UDPAddr{IP: net.ParseIP("127.0.0.2"), Port: 4789})
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = conn.Write([]byte("hello"))
		return err
	})
	select {
	case p := <-got:
		want := nflog.Packet{Prefix: "tabby:test", Src: netip.MustParseAddr("127.0.0.1"), Dst: netip.MustParseAddr("127.0.0.2"),
			Proto: nflog.ProtoUDP, SrcPort: 5555, DstPort: 4789}
		if p.Prefix != want.Prefix || p.Src != want.Src || p.Dst != want.Dst || p.Proto != want.Proto || p.SrcPort != want.SrcPort || p.DstPort != want.DstPort {
			t.Errorf("read %+v, want %+v", p, want)
		}
		if p.OutDev == 0 {
			t.Errorf("no output interface in %+v", p)
		}
		t.Logf("read %+v after %v", p, time.Since(start))
	case <-time.After(2 * time.Second):
		t.Fatal("no packet read within 2s")
	}
}
