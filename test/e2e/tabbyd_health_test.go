package e2e

// tabbyd's health endpoints: /readyz answers from the state tabbyd keeps
// (its loops' readiness, the heartbeat's last answer from the API server),
// never with a call to the API server per probe. What tabbyd asks of the
// API server is read from its own counter tabby_apiserver_requests_total,
// which a round-tripper around every client of tabbyd keeps: a measurement
// tap, the requests still go to the real API server.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordclient "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/internal/testnet"
)

// healthClient dials from inside the node, where tabbyd's health address
// (its loopback) is.
func healthClient(n *testNode, conns int) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		MaxIdleConnsPerHost: conns,
		DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			err = n.Do(func() (err error) {
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		}}}
}

// readyz asks tabbyd's /readyz once.
func readyz(hc *http.Client) (int, string, error) {
	resp, err := hc.Get("http://" + testnet.TabbydHealthAddr + "/readyz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b)), err
}

// waitReadyz polls /readyz until it answers want (200 or 503 with a body
// containing contains), or fails the test after limit.
func waitReadyz(t *testing.T, hc *http.Client, want int, contains string, limit time.Duration) string {
	t.Helper()
	var code int
	var body string
	var err error
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		code, body, err = readyz(hc)
		if err == nil && code == want && strings.Contains(body, contains) {
			return body
		}
	}
	t.Fatalf("/readyz: %d %q (%v), want %d with %q", code, body, err, want, contains)
	return ""
}

// apiRequests reads tabbyd's tabby_apiserver_requests_total by
// "verb resource".
func apiRequests(t *testing.T, d *testnet.Tabbyd) map[string]float64 {
	t.Helper()
	m, err := d.Metrics(ctxT(t), "tabby_apiserver_requests_total{")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for k, v := range m {
		// tabby_apiserver_requests_total{resource="leases",verb="get"}
		labels := strings.TrimSuffix(strings.TrimPrefix(k, "tabby_apiserver_requests_total{"), "}")
		res, verb, _ := strings.Cut(labels, ",")
		out[strings.TrimSuffix(strings.TrimPrefix(verb, `verb="`), `"`)+" "+strings.TrimSuffix(strings.TrimPrefix(res, `resource="`), `"`)] = v
	}
	return out
}

// TestTabbydReadyzCostsNoAPICall: 50 clients asking /readyz 20 times each
// at once make tabbyd send no request to the API server (before, each
// probe was a GET /readyz there). The only requests in the window are the
// heartbeat's Lease renewals and informers re-opening their watches, on
// their own clocks. Then /readyz turns unready, saying why, when the API
// server cannot be reached from the node (the heartbeat's renewal fails),
// and ready again when it can.
func TestTabbydReadyzCostsNoAPICall(t *testing.T) {
	n := newNode(t)
	n.addPool(t, 4, nil)
	// The test cluster has no tabby-system: the heartbeat's Lease lives in
	// default.
	d, err := n.StartTabbyd(ctxT(t), tabbydBin, "--ipam-gc=false", "--namespace=default")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = d.Kill()
		if t.Failed() {
			t.Logf("tabbyd's log:\n%s", d.LogTail(40))
		}
	})
	const clients, each = 50, 20
	hc := healthClient(n, clients)
	defer hc.CloseIdleConnections()
	waitReadyz(t, hc, http.StatusOK, "ok", 60*time.Second)
	// Ready, and the heartbeat has gone out: the steady state.
	leases, err := coordclient.NewForConfig(clustertest.Cluster(t).RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, err := leases.Leases("default").Get(ctxT(t), "tabbyd-"+n.Name, metav1.GetOptions{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tabbyd's heartbeat Lease: %v", err)
		}
	}

	before := apiRequests(t, d)
	// The tap counts: tabbyd's informers watch Nodes.
	if before["watch nodes"] == 0 {
		t.Fatalf("tabby_apiserver_requests_total has no watch of Nodes: %v", before)
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, clients*each)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				code, body, err := readyz(hc)
				if err == nil && code != http.StatusOK {
					err = fmt.Errorf("%d %s", code, body)
				}
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	for err := range errs {
		t.Errorf("/readyz under load: %v", err)
		break
	}
	after := apiRequests(t, d)
	var background []string
	for k, v := range after {
		delta := v - before[k]
		if delta == 0 {
			continue
		}
		verb, resource, _ := strings.Cut(k, " ")
		if resource == "leases" || verb == "watch" {
			background = append(background, fmt.Sprintf("%s: %v", k, delta))
			continue
		}
		t.Errorf("%d /readyz requests made tabbyd send %v API requests %q", clients*each, delta, k)
	}
	t.Logf("%d /readyz requests from %d clients in %v; API requests meanwhile other than the heartbeat's and watches: none; those: %v", clients*each, clients, took.Round(time.Millisecond), background)

	restore := n.CutAPIServer()
	restored := false
	defer func() {
		if !restored {
			_ = restore()
		}
	}()
	// The heartbeat renews every 10 s, with a 5 s bound on each try.
	body := waitReadyz(t, hc, http.StatusServiceUnavailable, "heartbeat: renewing tabbyd's heartbeat Lease", 30*time.Second)
	t.Logf("with the API server cut: %s", body)
	if err := restore(); err != nil {
		t.Fatal(err)
	}
	restored = true
	// Retries back off to at most 12 s (10 s and 20% jitter).
	waitReadyz(t, hc, http.StatusOK, "ok", 30*time.Second)
}
