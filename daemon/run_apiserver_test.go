package daemon

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/internal/tier"
)

// inNetNSEnv marks the copy of the test binary that runs inside a network
// namespace of its own.
const inNetNSEnv = "TABBY_TEST_RUN_IN_NETNS"

// TestRunWaitsForEveryGoroutine: Run, with every part on (routing, policy,
// heartbeat, IPAM GC, CNI agent and token, default pool, both servers),
// returns only after every goroutine it started has returned: none is
// left running, and the CNI agent has removed its socket on the way out.
//
// tabbyd programs the node it runs on, so the test runs it (and a control
// plane of its own) in a copy of the test binary in a fresh network
// namespace (unshare --net), which disappears with it.
func TestRunWaitsForEveryGoroutine(t *testing.T) {
	tier.Root(t, "tabbyd and a real control plane in a network namespace of their own", "unshare")
	if os.Getenv(inNetNSEnv) == "" {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "unshare", "--net", os.Args[0], "-test.run=^TestRunWaitsForEveryGoroutine$", "-test.v")
		cmd.Env = append(os.Environ(), inNetNSEnv+"=1")
		out, err := cmd.CombinedOutput()
		t.Logf("in its own network namespace:\n%s", out)
		if err != nil {
			t.Fatal(err)
		}
		return
	}
	runWaitsInNetNS(t)
}

func runWaitsInNetNS(t *testing.T) {
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set lo up: %v: %s", err, out)
	}
	// This copy's own control plane, on the new namespace's loopback.
	c := clustertest.Cluster(t)
	ds := clustertest.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, c.Server); err != nil {
		t.Fatal(err)
	}

	var gs *goroutines
	runStarted = func(g *goroutines) { gs = g }
	defer func() { runStarted = nil }()
	socket := filepath.Join(dir, "agent.sock")
	spec := tabbyv1.IPPoolSpec{CIDR: "10.77.0.0/16"}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- Run(rctx, Config{
			NodeName: "run-waits", Kubeconfig: kubeconfig,
			HealthListen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0",
			CNISocket: socket, CNIKubeconfig: filepath.Join(dir, "cni-kubeconfig"),
			IPAMGC: true, IPAMGCInterval: time.Second, NetworkPolicy: true, DefaultIPv4Pool: &spec,
			Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		})
	}()
	// Up: the default pool was made and the agent serves its socket.
	want := []string{"CNI agent", "CNI token", "IPAM GC", "heartbeat", "metrics server", "policy", "routing"}
	deadline := time.Now().Add(time.Minute)
	for {
		_, perr := ds.IPPools.Get(ctx, DefaultPoolName, metav1.GetOptions{})
		_, serr := os.Stat(socket)
		if perr == nil && serr == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tabbyd did not come up: pool: %v, agent socket: %v", perr, serr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if running := gs.Running(); !containsAll(running, want) {
		t.Fatalf("running %v, want at least %v", running, want)
	}
	t.Logf("running before the stop: %v", gs.Running())

	stop()
	select {
	case err := <-done:
		// The CNI token's minting fails in this cluster (no service
		// account), but is retried, not returned: Run ended cleanly.
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("Run did not return 30s after its context ended; running: %v", gs.Running())
	}
	if running := gs.Running(); len(running) != 0 {
		t.Errorf("Run returned with goroutines still running: %v", running)
	}
	if _, err := os.Stat(socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the CNI agent's socket is still there after Run returned (%v): the agent had not finished", err)
	}
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}
