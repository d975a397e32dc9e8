package lab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	"sigs.k8s.io/yaml"

	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/scheduler-extender/plugins/network"
)

// The scheduler extender of the lab.
const (
	// ExtenderName is tabby-scheduler-extender's program (in the bin dir)
	// and its process's name in the lab's state and status.
	ExtenderName = "tabby-scheduler-extender"
	// ExtenderPort is where it serves, on the loopback of the control
	// plane's namespace, next to kube-scheduler: the static-pod setup that
	// deploy/scheduler/kube-scheduler-config.yaml describes.
	ExtenderPort = 8888
	// SchedulerConfigFile is the KubeSchedulerConfiguration users give
	// kube-scheduler, relative to the repository; the lab starts
	// kube-scheduler with it, its urlPrefix pointed at the lab's extender.
	SchedulerConfigFile = "deploy/scheduler/kube-scheduler-config.yaml"
)

// extenderURL is the extender's URL inside the control plane's namespace.
func extenderURL() string {
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ExtenderPort))
}

// startExtender starts tabby-scheduler-extender in the control plane's
// namespace with the admin kubeconfig, reading tabbyd's heartbeats from
// tabby's namespace, and waits until it answers /healthz (it listens once
// its caches are synced). It returns its URL.
func startExtender(ctx context.Context, s *State, c *controlplane.Cluster, path string) (string, error) {
	url := extenderURL()
	args := []string{
		"--kubeconfig", s.ControlPlane.Kubeconfig,
		"--listen", strings.TrimPrefix(url, "http://"),
		"--tabbyd-namespace", tabbyNamespace,
	}
	if s.DualStack {
		// Pods get an IPv6 address too: a node needs room in both.
		args = append(args, "--ipv6")
	}
	p, err := c.StartProcess(path, args...)
	if err != nil {
		return "", fmt.Errorf("starting %s: %w", ExtenderName, err)
	}
	hc := nsHTTPClient(s.ControlPlane.NetNS, 2*time.Second)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = poll(wctx, 100*time.Millisecond, func() error {
		if done, _ := p.Exited(); done {
			return errStop(fmt.Errorf("%s exited; the end of its log (%s):\n%s", ExtenderName, p.LogPath, controlplane.TailFile(p.LogPath, 20)))
		}
		return httpOK(wctx, hc, url+"/healthz")
	})
	if err != nil {
		return "", fmt.Errorf("waiting for %s to answer %s/healthz: %w (its log: %s)", ExtenderName, url, err, p.LogPath)
	}
	return url, nil
}

// schedulerConfig is SchedulerConfigFile of the repository with the
// extender's urlPrefix set to url; everything else as users get it.
func schedulerConfig(repo, url string) ([]byte, error) {
	path := filepath.Join(repo, SchedulerConfigFile)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("kube-scheduler's configuration: %w (the lab starts kube-scheduler with it; pass --repo)", err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	ext, _ := cfg["extenders"].([]any)
	if len(ext) != 1 {
		return nil, fmt.Errorf("%s registers %d extenders; the lab expects exactly one, tabby-scheduler-extender", path, len(ext))
	}
	e, ok := ext[0].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: extenders[0] is not a mapping", path)
	}
	e["urlPrefix"] = url
	return yaml.Marshal(cfg)
}

// nsHTTPClient is an HTTP client whose connections start inside the named
// namespace.
func nsHTTPClient(nsName string, timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			return dialInNetNS(ctx, nsName, network, address)
		},
		DisableKeepAlives: true,
	}}
}

// httpOK GETs url and fails unless the answer is 200.
func httpOK(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// ExtenderHealthz asks the lab's extender for /healthz (from inside the
// control plane's namespace).
func ExtenderHealthz(ctx context.Context, s *State) error {
	if s.ControlPlane.Extender == "" {
		return errors.New("the lab records no scheduler extender")
	}
	return httpOK(ctx, nsHTTPClient(s.ControlPlane.NetNS, 3*time.Second), s.ControlPlane.Extender+"/healthz")
}

// ExtenderRequests reads the extender's /metrics (from inside the control
// plane's namespace) and returns how many requests it answered with 200,
// by verb (filter, prioritize).
func ExtenderRequests(ctx context.Context, s *State) (map[string]int, error) {
	if s.ControlPlane.Extender == "" {
		return nil, errors.New("the lab records no scheduler extender")
	}
	hc := nsHTTPClient(s.ControlPlane.NetNS, 3*time.Second)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.ControlPlane.Extender+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s/metrics: %s", s.ControlPlane.Extender, resp.Status)
	}
	return parseExtenderRequests(resp.Body)
}

// parseExtenderRequests sums tabby_scheduler_extender_requests_total{code="200"}
// by verb from Prometheus' text format.
func parseExtenderRequests(r io.Reader) (map[string]int, error) {
	const metric = "tabby_scheduler_extender_requests_total{"
	out := map[string]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, metric) {
			continue
		}
		labels, value, ok := strings.Cut(line[len(metric):], "} ")
		if !ok {
			return nil, fmt.Errorf("unexpected metric line %q", line)
		}
		var verb, code string
		for _, kv := range strings.Split(labels, ",") {
			k, v, _ := strings.Cut(kv, "=")
			v = strings.Trim(v, `"`)
			switch k {
			case "verb":
				verb = v
			case "code":
				code = v
			}
		}
		n, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", line, err)
		}
		if code == "200" && verb != "" {
			out[verb] += int(n)
		}
	}
	return out, sc.Err()
}

// waitExtenderAccepts waits until the extender sees every node's tabbyd
// heartbeat Lease (tabbyd renews it as soon as it is ready), without which
// it filters the node out and kube-scheduler would leave pods Pending. It
// asks as kube-scheduler does (POST /filter, node names) and looks only at
// the tabbyd reasons: a lab without an IPPool fails every node for the
// probe pod's address, which is not the node's readiness.
func waitExtenderAccepts(ctx context.Context, s *State) error {
	var names []string
	for _, n := range s.Nodes {
		names = append(names, n.Name)
	}
	hc := nsHTTPClient(s.ControlPlane.NetNS, 3*time.Second)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "tabby-lab-readiness", Namespace: metav1.NamespaceDefault, UID: "tabby-lab-readiness"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "lab"}}},
	}
	body, err := json.Marshal(extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
	if err != nil {
		return err
	}
	return poll(ctx, 500*time.Millisecond, func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.ControlPlane.Extender+"/filter", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s/filter: %s: %s", s.ControlPlane.Extender, resp.Status, strings.TrimSpace(string(data)))
		}
		var res extenderv1.ExtenderFilterResult
		if err := json.Unmarshal(data, &res); err != nil {
			return fmt.Errorf("%s/filter: %w", s.ControlPlane.Extender, err)
		}
		if res.Error != "" {
			return fmt.Errorf("%s/filter: %s", s.ControlPlane.Extender, res.Error)
		}
		if res.NodeNames != nil && len(*res.NodeNames) == len(names) {
			return nil
		}
		// Only tabbyd's heartbeat is the nodes' readiness: other reasons
		// are the probe pod's (no IPPool yet in a lab made without one).
		var why []string
		for _, m := range []extenderv1.FailedNodesMap{res.FailedNodes, res.FailedAndUnresolvableNodes} {
			for n, reason := range m {
				if reason == network.ReasonNoTabbyd || reason == network.ReasonTabbydNotReady {
					why = append(why, n+": "+reason)
				}
			}
		}
		if len(why) == 0 {
			return nil
		}
		sort.Strings(why)
		return fmt.Errorf("the extender filters out %s", strings.Join(why, "; "))
	})
}
