package controlplane

import (
	"context"
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
	var ln net.Listener
	err = InNetNS(nsPath, func() error {
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
	dial := func(ctx context.Context) (net.Conn, error) {
		d := net.Dialer{Timeout: 5 * time.Second}
		return d.DialContext(ctx, "tcp", target)
	}
	return ln.Addr().String(), Forward(ln, dial), nil
}

// InNetNS runs f on a thread inside the network namespace at nsPath;
// sockets f creates belong to that namespace for their whole life, whatever
// thread uses them later.
func InNetNS(nsPath string, f func() error) error {
	netns, err := ns.GetNS(nsPath)
	if err != nil {
		return fmt.Errorf("opening network namespace %s: %w", nsPath, err)
	}
	defer netns.Close()
	return netns.Do(func(ns.NetNS) error { return f() })
}

// DialInNetNS dials address with a socket created inside the network
// namespace at nsPath (for example an API server listening on an address
// only that namespace reaches).
func DialInNetNS(ctx context.Context, nsPath, network, address string) (conn net.Conn, err error) {
	err = InNetNS(nsPath, func() error {
		var d net.Dialer
		conn, err = d.DialContext(ctx, network, address)
		return err
	})
	return conn, err
}

// Forward relays every connection accepted on ln to a connection dial
// makes (ForwardIntoNetNS listens inside a namespace and dials out; the lab
// listens on the host's loopback and dials into a namespace with
// DialInNetNS). A connection dial fails for is closed, as a refused one
// would be. stop closes ln and every relayed connection, and waits for the
// relays to end; it may be called more than once.
func Forward(ln net.Listener, dial func(ctx context.Context) (net.Conn, error)) (stop func()) {
	f := &forwarder{ln: ln, dial: dial, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.serve()
	return f.stop
}

type forwarder struct {
	ln     net.Listener
	dial   func(ctx context.Context) (net.Conn, error)
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	out, err := f.dial(ctx)
	cancel()
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
