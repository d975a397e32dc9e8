package testnet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tabbynet/tabby/internal/controlplane"
)

// TabbydHealthAddr is where a node's tabbyd serves /healthz and /metrics,
// on the node's own loopback.
const TabbydHealthAddr = "127.0.0.1:9099"

// Binary is the tabby program name (tabbyd, tabby, ...) under test:
// $TABBY_BIN_DIR/name when set, else built into buildDir from the
// repository above the working directory.
func Binary(buildDir, name string) (string, error) {
	if d := os.Getenv(EnvBinDir); d != "" {
		p := filepath.Join(d, name)
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$%s=%s lacks %s (run make build): %w", EnvBinDir, d, name, err)
		}
		return p, nil
	}
	root, err := controlplane.FindRepoRoot()
	if err != nil {
		return "", fmt.Errorf("finding the repository to build %s (or set $%s): %w", name, EnvBinDir, err)
	}
	cmd := exec.Command("go", "build", "-o", buildDir+"/", "./cmd/"+name)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %v\n%s", name, err, out)
	}
	return filepath.Join(buildDir, name), nil
}

// Tabbyd is a tabbyd process running inside a node's namespace, serving the
// node's CNI agent on Node.AgentSocket.
type Tabbyd struct {
	Node *Node
	Cmd  *exec.Cmd
	// Log is the file holding its stderr.
	Log  string
	done chan struct{}
	err  error
}

// StartTabbyd runs bin (tabbyd) inside the node's namespace with the node's
// kubeconfig and agent socket, and waits until the socket accepts
// connections (its caches have synced), until ctx's deadline or for
// DefaultTabbydStartWait. Stop or Kill it; the caller must,
// also when the test fails (t.Cleanup).
func (n *Node) StartTabbyd(ctx context.Context, bin string, extraArgs ...string) (*Tabbyd, error) {
	if n.Kubeconfig == "" {
		return nil, errors.New("testnet: tabbyd needs a node made with a cluster")
	}
	logPath := filepath.Join(n.Dir, fmt.Sprintf("tabbyd-%d.log", time.Now().UnixNano()))
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	args := append([]string{"--nodename", n.Name, "--kubeconfig", n.Kubeconfig, "--cni-socket", n.AgentSocket,
		"--health-listen", TabbydHealthAddr, "--log-level", "debug"}, extraArgs...)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Killed when the thread that started it ends, so that a test binary
	// that dies leaves no tabbyd behind: that thread is kept for tabbyd's
	// life (a pooled thread could be retired at any time).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	d := &Tabbyd{Node: n, Cmd: cmd, Log: logPath, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		defer close(d.done)
		// This thread enters the node's namespace and is never handed back
		// (it ends with the goroutine), so tabbyd starts inside the node.
		runtime.LockOSThread()
		if err := n.NS.Set(); err != nil {
			started <- err
			return
		}
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		d.err = cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("starting tabbyd in node %s: %w", n.Name, err)
	}
	if err := d.waitSocket(ctx); err != nil {
		_ = d.Kill()
		return nil, fmt.Errorf("tabbyd in node %s: %w\n%s", n.Name, err, d.LogTail(30))
	}
	return d, nil
}

// DefaultTabbydStartWait bounds StartTabbyd's wait for the agent socket
// when its context has no deadline.
const DefaultTabbydStartWait = 30 * time.Second

// waitSocket waits for the agent socket until ctx's deadline, or for
// DefaultTabbydStartWait when ctx has none (a VM under TCG needs longer).
func (d *Tabbyd) waitSocket(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTabbydStartWait)
		defer cancel()
	}
	for {
		if c, err := net.Dial("unix", d.Node.AgentSocket); err == nil {
			return c.Close()
		}
		select {
		case <-d.done:
			return fmt.Errorf("exited before serving %s: %v", d.Node.AgentSocket, d.err)
		case <-ctx.Done():
			return fmt.Errorf("no agent on %s: %w", d.Node.AgentSocket, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Kill ends tabbyd with SIGKILL, as a crash would (its socket stays
// behind), and waits for it.
func (d *Tabbyd) Kill() error {
	if !d.exited() {
		_ = d.Cmd.Process.Signal(syscall.SIGKILL)
		<-d.done
	}
	return nil
}

func (d *Tabbyd) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// Stop ends tabbyd with SIGTERM (it removes its socket), killing it after
// 10 s, and waits for it.
func (d *Tabbyd) Stop() error {
	if d.exited() {
		return nil
	}
	_ = d.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
		return nil
	case <-time.After(10 * time.Second):
		_ = d.Kill()
		return errors.New("tabbyd did not stop within 10s of SIGTERM")
	}
}

// LogTail is the last lines of tabbyd's log.
func (d *Tabbyd) LogTail(lines int) string {
	b, _ := os.ReadFile(d.Log)
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// Metrics reads tabbyd's /metrics (from inside the node) and returns the
// samples whose name starts with prefix, by their full name with labels,
// e.g. `tabby_cni_agent_requests_total{endpoint="assign",result="ok"}`.
func (d *Tabbyd) Metrics(ctx context.Context, prefix string) (map[string]float64, error) {
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		err = d.Node.Do(func() (err error) {
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+TabbydHealthAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading tabbyd's metrics: %w", err)
	}
	defer resp.Body.Close()
	return parseMetrics(resp.Body, prefix)
}

func parseMetrics(r io.Reader, prefix string) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}
