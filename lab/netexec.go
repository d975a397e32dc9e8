package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// NetexecConfig configures RunNetexec.
type NetexecConfig struct {
	// TCP and UDP are the ports to serve on every address.
	TCP, UDP []int
	// Name is the answer (the pod's name: HOSTNAME in a lab container).
	Name string
}

// RunNetexec is `tabbyctl lab netexec`, the workloads' server: every TCP
// connection gets Name and a newline and is closed; every UDP datagram is
// answered with Name and a newline. It serves until ctx ends. ready, when
// not nil, is called once every port listens.
func RunNetexec(ctx context.Context, cfg NetexecConfig, ready func()) error {
	if len(cfg.TCP)+len(cfg.UDP) == 0 {
		return errors.New("nothing to serve: pass --tcp PORT and/or --udp PORT")
	}
	reply := []byte(cfg.Name + "\n")
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			c.Close()
		}
	}()
	var wg sync.WaitGroup
	for _, port := range cfg.TCP {
		ln, err := net.Listen("tcp", ":"+strconv.Itoa(port))
		if err != nil {
			return fmt.Errorf("listening on TCP port %d: %w", port, err)
		}
		closers = append(closers, ln)
		wg.Go(func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					if errors.Is(err, net.ErrClosed) {
						return
					}
					continue
				}
				_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
				_, _ = c.Write(reply)
				c.Close()
			}
		})
	}
	for _, port := range cfg.UDP {
		pc, err := net.ListenPacket("udp", ":"+strconv.Itoa(port))
		if err != nil {
			return fmt.Errorf("listening on UDP port %d: %w", port, err)
		}
		closers = append(closers, pc)
		wg.Go(func() {
			buf := make([]byte, 64<<10)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					if errors.Is(err, net.ErrClosed) {
						return
					}
					continue
				}
				_, _ = pc.WriteTo(reply, from)
			}
		})
	}
	if ready != nil {
		ready()
	}
	<-ctx.Done()
	for _, c := range closers {
		c.Close()
	}
	closers = nil
	wg.Wait()
	return nil
}

// Probe is `tabbyctl lab probe`, the workloads' client: over TCP it
// connects to addr (host:port) and returns the first line the server
// sends (empty when it sends none within the timeout: a connection is
// success enough); over UDP it sends a datagram and waits for the answer
// (no answer is failure). network is "tcp" or "udp".
func Probe(ctx context.Context, network, addr string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	deadline, _ := ctx.Deadline()
	_ = c.SetDeadline(deadline)
	if network == "udp" {
		if _, err := c.Write([]byte("probe\n")); err != nil {
			return "", err
		}
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	line = strings.TrimSpace(line)
	var ne net.Error
	switch {
	case err == nil, errors.Is(err, io.EOF) && network == "tcp":
		return line, nil
	case network == "tcp" && errors.As(err, &ne) && ne.Timeout():
		return line, nil
	case network == "udp" && errors.As(err, &ne) && ne.Timeout():
		return "", fmt.Errorf("no answer from %s over UDP within %v", addr, timeout)
	}
	return "", err
}
