package testnet

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// Ping sends ICMP echo requests from inside the namespace `from` to dst,
// up to 5, one a second, until one is answered.
func Ping(from ns.NetNS, dst net.IP) error {
	var c *icmp.PacketConn
	v4 := dst.To4() != nil
	network, laddr, proto := "ip6:ipv6-icmp", "::", 58
	var typ, replyTyp icmp.Type = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
	if v4 {
		network, laddr, proto = "ip4:icmp", "0.0.0.0", 1
		typ, replyTyp = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	}
	// The socket belongs to the namespace it is opened in.
	err := from.Do(func(ns.NetNS) (err error) {
		c, err = icmp.ListenPacket(network, laddr)
		return err
	})
	if err != nil {
		return fmt.Errorf("opening an ICMP socket: %w", err)
	}
	defer c.Close()
	const tries, wait = 5, time.Second
	id := rand.IntN(1 << 16) // a raw socket sees every echo reply: tell ours apart
	var lastErr error
	for seq := 1; seq <= tries; seq++ {
		b, err := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: id, Seq: seq, Data: []byte("tabby-probe")}}).Marshal(nil)
		if err != nil {
			return err
		}
		if _, err := c.WriteTo(b, &net.IPAddr{IP: dst}); err != nil {
			lastErr = err
			time.Sleep(wait)
			continue
		}
		_ = c.SetReadDeadline(time.Now().Add(wait))
		buf := make([]byte, 1500)
		for {
			nr, peer, err := c.ReadFrom(buf)
			if err != nil {
				lastErr = err
				break
			}
			m, err := icmp.ParseMessage(proto, buf[:nr])
			if err != nil || m.Type != replyTyp {
				continue
			}
			if e, ok := m.Body.(*icmp.Echo); ok && e.ID == id && e.Seq == seq && peer.(*net.IPAddr).IP.Equal(dst) {
				return nil
			}
		}
	}
	return fmt.Errorf("no echo reply from %s after %d tries: %v", dst, tries, lastErr)
}

// ServeTCP listens on addr (host:port) inside the namespace `in` and
// answers every connection with reply, then closes it. stop closes the
// listener.
func ServeTCP(in ns.NetNS, addr string, reply []byte) (stop func(), err error) {
	var ln net.Listener
	err = in.Do(func(ns.NetNS) (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write(reply)
			c.Close()
		}
	}()
	return func() { ln.Close() }, nil
}

// ReadTCP connects from inside the namespace `from` to addr (host:port)
// and reads until the peer closes, all within timeout.
func ReadTCP(from ns.NetNS, addr string, timeout time.Duration) ([]byte, error) {
	var out []byte
	err := from.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		out, err = io.ReadAll(c)
		return err
	})
	return out, err
}
