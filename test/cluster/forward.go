package cluster

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
)

// ForwardIntoNetNS listens on 127.0.0.1 (a free port) inside the network
// namespace at nsPath (a file such as /var/run/netns/NAME or
// /proc/PID/ns/net) and relays every connection to target (host:port), which
// is dialled from the namespace this program's threads run in (the host's).
// It brings lo up in the namespace. A CNI plugin or daemon running in a
// namespace that stands for a node reaches the API server this way.
//
// listenAddr is "127.0.0.1:PORT" as seen inside the namespace. stop closes
// the listener and every relayed connection, and waits for the relays to end.
func ForwardIntoNetNS(nsPath, target string) (listenAddr string, stop func(), err error) {
	netns, err := ns.GetNS(nsPath)
	if err != nil {
		return "", nil, fmt.Errorf("opening network namespace %s: %w", nsPath, err)
	}
	defer netns.Close()
	var ln net.Listener
	err = netns.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return fmt.Errorf("finding lo: %w", err)
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return fmt.Errorf("bringing lo up: %w", err)
		}
		// The socket belongs to the namespace it was created in, whatever
		// thread later accepts on it.
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	})
	if err != nil {
		return "", nil, fmt.Errorf("listening in network namespace %s: %w", nsPath, err)
	}
	f := &forwarder{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.serve()
	return ln.Addr().String(), f.stop, nil
}

type forwarder struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	once   sync.Once
}

func (f *forwarder) serve() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if !f.track(c) {
			c.Close()
			return
		}
		f.wg.Add(1)
		go f.relay(c)
	}
}

func (f *forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *forwarder) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
	c.Close()
}

func (f *forwarder) relay(in net.Conn) {
	defer f.wg.Done()
	defer f.untrack(in)
	out, err := net.DialTimeout("tcp", f.target, 5*time.Second)
	if err != nil {
		return // the client sees the connection closed, as with a refused one
	}
	if !f.track(out) {
		out.Close()
		return
	}
	defer f.untrack(out)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
}

func (f *forwarder) stop() {
	f.once.Do(func() {
		f.mu.Lock()
		f.closed = true
		for c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		f.ln.Close()
		f.wg.Wait()
	})
}
