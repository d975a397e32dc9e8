package lab

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/tabbynet/tabby/internal/controlplane"
)

// startForward opens the host's loopback port (port 0: a free one), hands
// the listening socket to a detached `tabbyctl lab forward` (RunForward)
// and writes the admin kubeconfig naming it, the one `lab kubeconfig`
// prints.
func startForward(s *State, c *controlplane.Cluster, port int) error {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("listening on 127.0.0.1:%d for the API server forward: %w (pick another port)", port, err)
	}
	defer ln.Close()
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		return err
	}
	defer f.Close()
	p, _, err := startDetached(procSpec{
		name:       "forward",
		path:       s.Binaries.Tabbyctl,
		args:       []string{"lab", "forward", "--dir", s.Dir},
		log:        filepath.Join(s.Dir, "forward.log"),
		extraFiles: []*os.File{f},
	})
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	if err := s.update(func(s *State) {
		s.Forward = Forward{Address: addr, Proc: p}
		s.Kubeconfig = filepath.Join(s.Dir, "admin.kubeconfig")
	}); err != nil {
		return err
	}
	return c.WriteKubeconfig(s.Kubeconfig, "https://"+addr)
}

// RunForward relays every connection accepted on ln (the listening socket
// lab up hands to `tabbyctl lab forward` as fd 3) to the API server, dialled
// from a thread inside the control-plane namespace, until ctx ends.
func RunForward(ctx context.Context, s *State, ln net.Listener) error {
	nsName, target := s.ControlPlane.NetNS, s.apiTarget()
	stop := controlplane.Forward(ln, func(ctx context.Context) (net.Conn, error) {
		return dialInNetNS(ctx, nsName, "tcp", target)
	})
	<-ctx.Done()
	stop()
	return nil
}
