package lab

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// Probe connects to addr over network ("tcp" or "udp") and returns what the
// server answered: for TCP whatever it writes before closing (agnhost
// serve-hostname --tcp writes the pod's hostname), for UDP the answer to
// one datagram (serve-hostname --udp answers with the hostname). Run inside
// a pod's network namespace, it is a probe from that pod.
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
		buf := make([]byte, 1500)
		n, err := c.Read(buf)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return "", fmt.Errorf("no answer from %s over UDP within %v", addr, timeout)
		}
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(string(buf[:n])), nil
	}
	data, err := io.ReadAll(io.LimitReader(c, 4096))
	if ne, ok := err.(net.Error); ok && ne.Timeout() && len(data) > 0 {
		err = nil
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(data)), nil
}
