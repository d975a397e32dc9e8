package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/tabbynet/tabby/internal/controlplane"
)

// apiServerName is the control-plane process StopAPIServer stops.
const apiServerName = "kube-apiserver"

// apiServerArgv is where StopAPIServer keeps kube-apiserver's command line
// for StartAPIServer (in the control plane's folder).
func (s *State) apiServerArgv() string {
	return filepath.Join(s.ControlPlane.Dir, apiServerName+".argv.json")
}

// apiServerProc is the recorded kube-apiserver process (its index in
// ControlPlane.Procs, -1 when none is recorded).
func (s *State) apiServerProc() (Proc, int) {
	for i, p := range s.ControlPlane.Procs {
		if p.Name == apiServerName {
			return p, i
		}
	}
	return Proc{}, -1
}

// StopAPIServer stops the lab's kube-apiserver (SIGTERM, SIGKILL after
// grace), as when the datastore goes down: etcd, the scheduler, the
// controller manager, the nodes' tabbyd and kubelets keep running and find
// the API server unreachable. Its command line is kept for StartAPIServer.
// Stopping a stopped API server does nothing.
func StopAPIServer(s *State, grace time.Duration) error {
	p, _ := s.apiServerProc()
	if !p.Alive() {
		if _, err := os.Stat(s.apiServerArgv()); err == nil {
			return nil
		}
		return errors.New("the lab's kube-apiserver is not running, and no command line was kept to start it again")
	}
	data, err := os.ReadFile("/proc/" + strconv.Itoa(p.Pid) + "/cmdline")
	if err != nil {
		return fmt.Errorf("reading the command line of kube-apiserver (pid %d): %w", p.Pid, err)
	}
	argv := strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
	// Started through nsenter --net=..., which execs the program: the
	// command line is kube-apiserver's own.
	if len(argv) == 0 || filepath.Base(argv[0]) != apiServerName {
		return fmt.Errorf("pid %d is not kube-apiserver (%q)", p.Pid, argv)
	}
	out, err := json.Marshal(argv)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(s.apiServerArgv(), out, 0o644); err != nil {
		return err
	}
	if left := stopProcs([]Proc{p}, grace, false); len(left) > 0 {
		return fmt.Errorf("kube-apiserver (pid %d) does not stop", p.Pid)
	}
	return nil
}

// StartAPIServer starts the kube-apiserver StopAPIServer stopped, with the
// same command line (port, certificates, etcd), in the control plane's
// namespace, and waits until it answers /readyz. It does nothing when the
// API server runs.
func StartAPIServer(ctx context.Context, s *State) error {
	p, i := s.apiServerProc()
	if i < 0 {
		return errors.New("the lab records no kube-apiserver")
	}
	if !p.Alive() {
		data, err := os.ReadFile(s.apiServerArgv())
		if err != nil {
			return fmt.Errorf("kube-apiserver's command line (kept by StopAPIServer): %w", err)
		}
		var argv []string
		if err := json.Unmarshal(data, &argv); err != nil || len(argv) == 0 {
			return fmt.Errorf("%s: %v", s.apiServerArgv(), err)
		}
		np, _, err := startDetached(procSpec{
			name:  apiServerName,
			netns: NetNSPath(s.ControlPlane.NetNS),
			path:  argv[0],
			args:  argv[1:],
			log:   p.Log,
		})
		if err != nil {
			return err
		}
		if err := s.update(func(s *State) { s.ControlPlane.Procs[i] = np }); err != nil {
			return err
		}
		p = np
	}
	cfg, err := s.RESTConfig()
	if err != nil {
		return err
	}
	cfg.Timeout = 2 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	return poll(ctx, 100*time.Millisecond, func() error {
		if !p.Alive() {
			return errStop(fmt.Errorf("kube-apiserver exited; the end of its log (%s):\n%s", p.Log, controlplane.TailFile(p.Log, 20)))
		}
		_, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	})
}
