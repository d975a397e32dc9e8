package labtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/deploy"
	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/lab"
	"github.com/tabbynet/tabby/lab/labimage"
)

// TestLabUpgrade upgrades tabby as users do, under a continuous probe: a
// new image tag is loaded into the nodes, deploy/tabby.yaml rendered with
// it is applied again with kubectl, and the DaemonSet rolls tabby-node
// over node by node. Pods on two nodes keep talking the whole time: not
// one ping or TCP connection is lost.
func TestLabUpgrade(t *testing.T) {
	t.Parallel()
	l := Up(t, "--nodes", "2")
	ctx := context.Background()
	l.Create(t, Web("server", "node2", 8080), Sleeper("client", "node1"))
	srv := l.WaitPod(t, "server", time.Minute, Running(true))
	l.WaitPod(t, "client", time.Minute, Running(true))
	nsPath := l.PodNetNS(t, "default/client")

	// The new version: the same programs under another tag, which is
	// what changes the DaemonSet's template.
	ref := "ghcr.io/tabbynet/tabby:upgrade-" + randHex(4)
	tarball := filepath.Join(t.TempDir(), "tabby.tar")
	cache, err := labimage.DefaultCacheDir(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	spec := labimage.Tabby(Binaries.Dir, strings.TrimPrefix(ref, "ghcr.io/tabbynet/tabby:"))
	if _, err := labimage.Build(ctx, spec, labimage.NewDebCache(labimage.DebCacheDir(cache)), tarball); err != nil {
		t.Fatal(err)
	}
	if out, code := l.Tabbyctl("load", tarball); code != 0 {
		t.Fatalf("lab load: %s", out)
	}
	manifest, err := deploy.Render(filepath.Join(Binaries.Repo, "deploy"), deploy.RenderOptions{Image: ref, PodCIDR: lab.DefaultPodCIDR})
	if err != nil {
		t.Fatal(err)
	}

	// The probes: one ping every 50 ms and one TCP connection every 50 ms
	// from the client pod on node1 to the server pod on node2.
	ping := exec.Command("nsenter", "--net="+nsPath, "ping", "-n", "-O", "-D", "-i", "0.05", "-W", "1", srv.Status.PodIP)
	var pingOut strings.Builder
	ping.Stdout = &pingOut
	ping.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := ping.Start(); err != nil {
		t.Fatal(err)
	}
	var tcpOK, tcpFail atomic.Int64
	var failMu sync.Mutex
	var failures []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			var got string
			err := controlplane.InNetNS(nsPath, func() error {
				var err error
				got, err = lab.Probe(ctx, "tcp", srv.Status.PodIP+":8080", 2*time.Second)
				return err
			})
			if err == nil && got == "server" {
				tcpOK.Add(1)
				continue
			}
			tcpFail.Add(1)
			failMu.Lock()
			failures = append(failures, fmt.Sprintf("%s: %q %v", time.Now().Format("15:04:05.000"), got, err))
			failMu.Unlock()
		}
	})

	time.Sleep(time.Second)
	start := time.Now()
	if out, code := l.Kubectl("apply", "--server-side", "-f", writeTemp(t, manifest)); code != 0 {
		t.Fatalf("kubectl apply of the new tabby.yaml: %s", out)
	}
	if out, code := l.Kubectl("-n", "tabby-system", "rollout", "status", "daemonset/tabby-node", "--timeout=3m"); code != 0 {
		t.Fatalf("rollout status: %s", out)
	}
	t.Logf("tabby-node rolled over to %s on 2 nodes in %v", ref, time.Since(start).Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	_ = ping.Process.Signal(syscall.SIGINT)
	_ = ping.Wait()

	pods, err := l.CS.CoreV1().Pods("tabby-system").List(ctx, metav1.ListOptions{LabelSelector: lab.TabbyNodeLabel})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Spec.Containers[0].Image != ref || !IsReady(&p) {
			t.Errorf("tabby-node pod %s on %s: image %s, ready %v", p.Name, p.Spec.NodeName, p.Spec.Containers[0].Image, IsReady(&p))
		}
	}
	sent, received := pingCounts(pingOut.String())
	t.Logf("during the upgrade: %d of %d pings answered, %d TCP connections answered, %d failed", received, sent, tcpOK.Load(), tcpFail.Load())
	if sent == 0 || received != sent || tcpOK.Load() == 0 || tcpFail.Load() != 0 {
		// When (-D) which pings went unanswered (-O), next to what the
		// new tabbyds logged, to tell which step of the rollover lost them.
		var missed []string
		for _, line := range strings.Split(pingOut.String(), "\n") {
			if strings.Contains(line, "no answer") && len(missed) < 20 {
				missed = append(missed, line)
			}
		}
		logs, _ := l.Kubectl("-n", "tabby-system", "logs", "-l", lab.TabbyNodeLabel, "-c", "tabbyd", "--tail", "60", "--prefix", "--timestamps")
		t.Errorf("traffic lost during the upgrade: %d of %d pings answered, %d TCP failures: %v\n%s\nunanswered:\n%s\ntabbyd after the rollover:\n%s",
			received, sent, tcpFail.Load(), failures, lastLines(pingOut.String(), 5), strings.Join(missed, "\n"), logs)
	}
}

// pingCounts reads ping's summary: "N packets transmitted, M received".
func pingCounts(out string) (sent, received int) {
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "packets transmitted") {
			_, _ = fmt.Sscanf(strings.TrimSpace(line), "%d packets transmitted, %d received", &sent, &received)
		}
	}
	return sent, received
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// writeTemp writes data to a file of the test's and returns its path.
func writeTemp(t *testing.T, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "manifest.yaml")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
