// Package bench compares tabby's CNI plugins with the reference bridge and
// host-local plugins on this machine, through libcni as a container runtime
// drives them, against a real API server (internal/controlplane):
//
//   - BenchmarkCNIAddDel: ADD and DEL latency (p50, p99) of one pod at a
//     time, every network interleaved in every iteration;
//   - BenchmarkCNIBurst100: the wall time of 100 ADDs at once on one node,
//     then 100 DELs at once.
//
// Run them with `make bench`. tabby runs as the README configures it: the
// tabby plugin with tabby-ipam, a kubeconfig, MTU detection and a Pod
// object per pod (so the pod's annotations are read), in two modes side by
// side: "tabby-agent", with the node's tabbyd running (in the node's
// namespace) so that the plugin asks its CNI agent, and "tabby-direct",
// whose config turns the agent off (agentSocket ""), so that the plugin
// reaches the API server itself, as it does when tabbyd is not there. The
// programs come from $TABBY_BIN_DIR, else they are built first.
package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/containernetworking/cni/libcni"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/internal/testnet"
)

// The reference plugins (Debian's 1.1.x) speak CNI up to 1.0.0; both
// networks use that version so that libcni does the same work for each.
const cniVersion = "1.0.0"

var binDir, tabbyd string

func TestMain(m *testing.M) {
	// Without -bench (go test ./... in make test) only the unit tests
	// run: no control plane is needed.
	flag.Parse()
	if flag.Lookup("test.bench").Value.String() == "" {
		os.Exit(m.Run())
	}
	clustertest.Main(m, func(c *controlplane.Cluster) (err error) {
		if binDir, err = testnet.PluginDir(filepath.Join(c.Dir, "cni-bin")); err != nil {
			return err
		}
		if tabbyd, err = testnet.Binary(filepath.Join(c.Dir, "cni-bin"), "tabbyd"); err != nil {
			return err
		}
		ds, err := datastore.New(c.RESTConfig())
		if err != nil {
			return err
		}
		_, err = ds.IPPools.Create(context.Background(), &tabbyv1.IPPool{
			ObjectMeta: metav1.ObjectMeta{Name: "bench-pool"},
			Spec:       tabbyv1.IPPoolSpec{CIDR: "10.244.0.0/16"},
		}, metav1.CreateOptions{})
		return err
	})
}

// subject is one network under test on the node.
type subject struct {
	name string
	list *libcni.NetworkConfigList
	// podObjects: the pods need Pod objects (tabby reads them).
	podObjects bool
}

// The subjects' names.
const (
	agentMode  = "tabby-agent"
	directMode = "tabby-direct"
	reference  = "bridge"
)

// title is how a subject appears in the tables.
func title(name string) string {
	if name == reference {
		return "bridge+host-local"
	}
	return name
}

// setup makes a node with its tabbyd and the three networks; the
// benchmark's cleanup removes them.
func setup(b *testing.B, name string) (*testnet.Node, *testnet.Tabbyd, []*subject) {
	b.Helper()
	c := clustertest.Cluster(b) // first: its setup sets binDir and tabbyd
	n, err := testnet.NewNode(context.Background(), testnet.NodeOptions{
		Name:       name,
		Dir:        b.TempDir(),
		PluginDirs: []string{binDir, testnet.ReferencePluginDir},
		Cluster:    c,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := n.Close(); err != nil {
			b.Errorf("removing node %s: %v", name, err)
		}
	})
	d, err := n.StartTabbyd(context.Background(), tabbyd)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := d.Stop(); err != nil {
			b.Errorf("stopping tabbyd: %v", err)
		}
	})
	agent, err := testnet.ConfList(cniVersion, n.TabbyConf(nil))
	if err != nil {
		b.Fatal(err)
	}
	directConf := n.TabbyConf(nil)
	directConf["agentSocket"] = ""
	direct, err := testnet.ConfList(cniVersion, directConf)
	if err != nil {
		b.Fatal(err)
	}
	bridge, err := testnet.ConfList(cniVersion, map[string]any{
		"type": "bridge", "bridge": "cni0", "isGateway": true,
		"ipam": map[string]any{
			"type":    "host-local",
			"dataDir": filepath.Join(n.Dir, "host-local"),
			"ranges":  [][]map[string]any{{{"subnet": "10.245.0.0/16"}}},
			"routes":  []map[string]any{{"dst": "0.0.0.0/0"}},
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	return n, d, []*subject{{name: agentMode, list: agent, podObjects: true}, {name: directMode, list: direct, podObjects: true}, {name: reference, list: bridge}}
}

// agentStats are tabbyd's agent metrics: the assignments it answered, the
// time it spent on them, and the pods it found in its cache and read from
// the API server.
type agentStats struct{ assigns, seconds, cached, fetched float64 }

func readAgentStats(b *testing.B, d *testnet.Tabbyd) agentStats {
	m, err := d.Metrics(context.Background(), "tabby_cni_agent_")
	if err != nil {
		b.Fatal(err)
	}
	return agentStats{
		assigns: m[`tabby_cni_agent_requests_total{endpoint="assign",result="ok"}`],
		seconds: m[`tabby_cni_agent_request_duration_seconds_sum{endpoint="assign"}`],
		cached:  m[`tabby_cni_agent_pod_lookups_total{source="cache"}`],
		fetched: m[`tabby_cni_agent_pod_lookups_total{source="api"}`],
	}
}

// makePods makes count pod namespaces (and Pod objects when s needs them)
// named prefix-i.
func makePods(ctx context.Context, n *testnet.Node, s *subject, prefix string, count int) ([]*testnet.Pod, error) {
	pods := make([]*testnet.Pod, count)
	err := parallel(count, func(i int) (err error) {
		if pods[i], err = testnet.NewPod("default", fmt.Sprintf("%s-%d", prefix, i)); err != nil {
			return err
		}
		if s.podObjects {
			return n.CreatePodObject(ctx, pods[i], nil)
		}
		return nil
	})
	if err != nil {
		removePods(n, s, pods)
		return nil, err
	}
	return pods, nil
}

// removePods removes what makePods made (after DEL, as a runtime does).
func removePods(n *testnet.Node, s *subject, pods []*testnet.Pod) {
	_ = parallel(len(pods), func(i int) error {
		if p := pods[i]; p != nil {
			_ = p.Close()
			if s.podObjects {
				_ = n.DeletePodObject(context.Background(), p)
			}
		}
		return nil
	})
}

// parallel runs f(0..count-1) at once and joins their errors.
func parallel(count int, f func(i int) error) error {
	errs := make([]error, count)
	var wg sync.WaitGroup
	for i := range count {
		wg.Go(func() { errs[i] = f(i) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// podLife is how long a pod of BenchmarkCNIAddDel runs between its ADD and
// its DEL.
const podLife = 200 * time.Millisecond

// BenchmarkCNIAddDel: one pod's ADD, then after podLife its DEL, for each
// network in every iteration (their order rotating), so noise on the
// machine hits all alike.
// Making the pod's namespace and Pod object is not timed. One untimed
// warm-up round first (tabby claims its block). The headline is
// add-p50-ratio: tabby with its agent over bridge+host-local.
func BenchmarkCNIAddDel(b *testing.B) {
	n, d, subjects := setup(b, "bench-latency")
	ctx := context.Background()
	type samples struct{ add, del []time.Duration }
	got := map[string]*samples{}
	round := func(i int, s *subject) {
		pods, err := makePods(ctx, n, s, fmt.Sprintf("lat-%s", s.name), 1)
		if err != nil {
			b.Fatal(err)
		}
		defer removePods(n, s, pods)
		b.StartTimer()
		t0 := time.Now()
		_, err = n.Add(ctx, s.list, pods[0], nil)
		t1 := time.Now()
		b.StopTimer()
		// The pod runs a moment (untimed), longer than tabbyd's writes
		// after an answer take (the handle's record, a spare's
		// transfer): the DEL releases what a pod that ran holds, rather
		// than undo an ADD that has just returned.
		time.Sleep(podLife)
		b.StartTimer()
		t2 := time.Now()
		if err == nil {
			err = n.Del(ctx, s.list, pods[0], nil)
		}
		t3 := time.Now()
		b.StopTimer()
		if err != nil {
			b.Fatalf("%s, iteration %d: %v", s.name, i, err)
		}
		if i >= 0 {
			got[s.name].add = append(got[s.name].add, t1.Sub(t0))
			got[s.name].del = append(got[s.name].del, t3.Sub(t2))
		}
	}
	for _, s := range subjects {
		got[s.name] = &samples{}
		round(-1, s)
	}
	before := readAgentStats(b, d)
	// b.Loop wants the timer running when it is called; round leaves it
	// stopped.
	b.StartTimer()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		for j := range subjects {
			round(i, subjects[(i+j)%len(subjects)])
		}
		b.StartTimer()
	}

	br := got[reference]
	// Every agent-mode ADD must have been answered by the agent.
	after := readAgentStats(b, d)
	served := after.assigns - before.assigns
	if want := float64(len(got[agentMode].add)); served != want {
		b.Fatalf("tabbyd's agent answered %v assignments during %v agent-mode ADDs", served, want)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(os.Stdout, "\nCNI ADD and DEL of one pod through libcni, %d interleaved iterations (ms)\n", len(br.add))
	fmt.Fprintln(w, "network\tADD p50\tADD p99\tDEL p50\tDEL p99\t")
	for _, s := range subjects {
		add, del := got[s.name].add, got[s.name].del
		fmt.Fprintf(w, "%s\t%.1f\t%.1f\t%.1f\t%.1f\t\n", title(s.name), ms(quantile(add, .5)), ms(quantile(add, .99)), ms(quantile(del, .5)), ms(quantile(del, .99)))
		for _, q := range []struct {
			name string
			v    time.Duration
		}{{"add-p50", quantile(add, .5)}, {"add-p99", quantile(add, .99)}, {"del-p50", quantile(del, .5)}, {"del-p99", quantile(del, .99)}} {
			b.ReportMetric(ms(q.v), s.name+"-"+q.name+"-ms")
		}
	}
	ratio := func(tv, bv []time.Duration, q float64) float64 {
		return float64(quantile(tv, q)) / float64(quantile(bv, q))
	}
	for _, mode := range []string{agentMode, directMode} {
		tb := got[mode]
		fmt.Fprintf(w, "%s / bridge\t%.2fx\t%.2fx\t%.2fx\t%.2fx\t\n", mode, ratio(tb.add, br.add, .5), ratio(tb.add, br.add, .99), ratio(tb.del, br.del, .5), ratio(tb.del, br.del, .99))
		prefix := ""
		if mode == directMode {
			prefix = "direct-"
		}
		b.ReportMetric(ratio(tb.add, br.add, .5), prefix+"add-p50-ratio")
		b.ReportMetric(ratio(tb.add, br.add, .99), prefix+"add-p99-ratio")
		b.ReportMetric(ratio(tb.del, br.del, .5), prefix+"del-p50-ratio")
		b.ReportMetric(ratio(tb.del, br.del, .99), prefix+"del-p99-ratio")
	}
	_ = w.Flush()
	fmt.Fprintf(os.Stdout, "tabbyd's agent answered all %v agent-mode assignments, in %.1f ms on average; it found %v pods in its cache and read %v from the API server\n",
		served, 1000*(after.seconds-before.seconds)/served, after.cached-before.cached, after.fetched-before.fetched)
}

// BenchmarkCNIBurst100: 100 pods created at once on one node (100
// concurrent ADDs, their namespaces made beforehand), then removed at once
// (100 concurrent DELs), for tabby and for bridge+host-local in every
// iteration. Every pod must get its own address.
func BenchmarkCNIBurst100(b *testing.B) {
	const pods = 100
	n, _, subjects := setup(b, "bench-burst")
	ctx := context.Background()
	adds, dels := map[string][]time.Duration{}, map[string][]time.Duration{}
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		for j := range subjects {
			s := subjects[(i+j)%len(subjects)]
			add, del, err := burst(ctx, b, n, s, fmt.Sprintf("burst-%s-%d", s.name, i), pods)
			if err != nil {
				b.Fatalf("%s burst %d: %v", s.name, i, err)
			}
			adds[s.name] = append(adds[s.name], add)
			dels[s.name] = append(dels[s.name], del)
		}
		b.StartTimer()
	}
	fmt.Fprintf(os.Stdout, "\n%d pods at once on one node through libcni, %d burst(s) each (seconds, median)\n", pods, len(adds[reference]))
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "network\t100 ADDs\t100 DELs\t")
	for _, s := range subjects {
		add, del := quantile(adds[s.name], .5).Seconds(), quantile(dels[s.name], .5).Seconds()
		fmt.Fprintf(w, "%s\t%.2f\t%.2f\t\n", title(s.name), add, del)
		b.ReportMetric(add, s.name+"-burst-add-s")
		b.ReportMetric(del, s.name+"-burst-del-s")
	}
	_ = w.Flush()
}

// burst makes count pods, times count concurrent ADDs and then count
// concurrent DELs, and checks that no address was handed out twice.
func burst(ctx context.Context, b *testing.B, n *testnet.Node, s *subject, prefix string, count int) (add, del time.Duration, err error) {
	pods, err := makePods(ctx, n, s, prefix, count)
	if err != nil {
		return 0, 0, err
	}
	defer removePods(n, s, pods)
	addrs := make([]net.IP, count)
	b.StartTimer()
	t0 := time.Now()
	err = parallel(count, func(i int) error {
		res, err := n.Add(ctx, s.list, pods[i], nil)
		if err == nil {
			addrs[i] = testnet.ResultIPs(res, false)[0]
		}
		return err
	})
	t1 := time.Now()
	b.StopTimer()
	if err != nil {
		return 0, 0, fmt.Errorf("ADD: %w", err)
	}
	seen := map[string]bool{}
	for _, a := range addrs {
		seen[a.String()] = true
	}
	if len(seen) != count {
		return 0, 0, fmt.Errorf("%d pods got %d distinct addresses", count, len(seen))
	}
	b.StartTimer()
	t2 := time.Now()
	err = parallel(count, func(i int) error { return n.Del(ctx, s.list, pods[i], nil) })
	t3 := time.Now()
	b.StopTimer()
	if err != nil {
		return 0, 0, fmt.Errorf("DEL: %w", err)
	}
	return t1.Sub(t0), t3.Sub(t2), nil
}

// quantile is the nearest-rank q-quantile of ds.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(ds))
	i := int(q*float64(len(s))+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func TestQuantile(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i))
	}
	for q, want := range map[float64]time.Duration{.5: 50, .99: 99, 1: 100, 0: 1} {
		if got := quantile(ds, q); got != want {
			t.Errorf("quantile(1..100, %v) = %v, want %v", q, got, want)
		}
	}
	if got := quantile([]time.Duration{7}, .99); got != 7 {
		t.Errorf("quantile of one sample = %v", got)
	}
}
