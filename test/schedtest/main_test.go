// Package schedtest runs the real kube-scheduler with tabby's
// KubeSchedulerConfiguration (deploy/scheduler/kube-scheduler-config.yaml:
// the in-tree NodeAffinity, TaintToleration, InterPodAffinity and
// PodTopologySpread plugins disabled, the extender registered) against the
// real tabby-scheduler-extender binary, and checks that pods land where the
// rules say.
package schedtest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/internal/testnet"
)

// extenderURL is where the test's extender serves; extender is its
// process, started with extenderBin and extenderArgs (TestExtenderOutage
// stops and starts it).
var (
	extenderURL  string
	extender     *controlplane.Process
	extenderBin  string
	extenderArgs []string
)

func TestMain(m *testing.M) { clustertest.Main(m, setup) }

func setup(c *controlplane.Cluster) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(c.RESTConfig())
	if err != nil {
		return err
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tabby-system"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	bin, err := testnet.Binary(filepath.Join(c.Dir, "bin"), "tabby-scheduler-extender")
	if err != nil {
		return err
	}
	port, err := controlplane.FreePort()
	if err != nil {
		return err
	}
	kubeconfig := filepath.Join(c.Dir, "extender.kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, ""); err != nil {
		return err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	// The extender binds (bindVerb): its client gets the scheduler's rate.
	extenderBin, extenderArgs = bin, []string{"--kubeconfig", kubeconfig, "--listen", addr, "--tabbyd-namespace", "tabby-system",
		"--kube-api-qps", strconv.Itoa(benchQPS)}
	extenderURL = "http://" + addr
	if err := startExtender(ctx, c); err != nil {
		return err
	}
	cfg, err := schedulerConfig(extenderURL)
	if err != nil {
		return err
	}
	// The client rate is raised (for both schedulers of the throughput
	// benchmark) so that it measures scheduling, not kube-scheduler's
	// default 50 API requests a second.
	_, err = c.StartScheduler(ctx, controlplane.SchedulerOptions{Config: cfg, QPS: benchQPS})
	return err
}

// schedulerConfig is deploy/scheduler/kube-scheduler-config.yaml with the
// extender's urlPrefix pointed at url: everything else as users get it.
func schedulerConfig(url string) ([]byte, error) {
	root, err := controlplane.FindRepoRoot()
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(filepath.Join(root, "deploy", "scheduler", "kube-scheduler-config.yaml"))
	if err != nil {
		return nil, err
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return nil, err
	}
	ext, ok := cfg["extenders"].([]any)
	if !ok || len(ext) != 1 {
		return nil, fmt.Errorf("kube-scheduler-config.yaml: want one extender, got %v", cfg["extenders"])
	}
	ext[0].(map[string]any)["urlPrefix"] = url
	return yaml.Marshal(cfg)
}

// startExtender starts the extender and waits until it answers.
func startExtender(ctx context.Context, c *controlplane.Cluster) error {
	p, err := c.StartProcess(extenderBin, extenderArgs...)
	if err != nil {
		return err
	}
	extender = p
	if err := waitHTTP(ctx, extenderURL+"/healthz"); err != nil {
		return fmt.Errorf("tabby-scheduler-extender did not come up (see %s): %w", p.LogPath, err)
	}
	return nil
}

func waitHTTP(ctx context.Context, url string) error {
	for {
		resp, err := http.Get(url) //nolint:gosec // a loopback health check
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
