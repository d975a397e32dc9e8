package plugins_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime/metrics"
	"sort"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	extender "github.com/tabbynet/tabby/scheduler-extender"
	"github.com/tabbynet/tabby/scheduler-extender/cache"
	"github.com/tabbynet/tabby/scheduler-extender/plugins"
	"github.com/tabbynet/tabby/scheduler-extender/plugins/network"
)

// bigCluster is 5,000 nodes in 10 zones and 50,000 running pods (10 per
// node) of 500 apps; one pod in 20 has required anti-affinity to its app
// by hostname, one in 10 spreads its app over zones. Every node has a
// block with free addresses.
func bigCluster() (*cache.Cache, *network.Inputs, []*v1.Node) {
	c := cache.New()
	in := benchInputs()
	c.SetNamespace(&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default"}})
	var nodes []*v1.Node
	for i := range 5000 {
		name := fmt.Sprintf("node-%04d", i)
		n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			v1.LabelHostname: name, v1.LabelTopologyZone: fmt.Sprintf("zone-%d", i%10), "pool": fmt.Sprintf("p%d", i%4)}}}
		c.SetNode(n)
		nodes = append(nodes, n)
		in.Blocks = append(in.Blocks, network.Block{CIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 26), Node: name, Free: 50})
		for j := range 10 {
			k := i*10 + j
			app := map[string]string{"app": fmt.Sprintf("app-%d", k%500)}
			p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%d", k), Namespace: "default", UID: types.UID(fmt.Sprint(k)), Labels: app},
				Spec: v1.PodSpec{NodeName: name}, Status: v1.PodStatus{Phase: v1.PodRunning}}
			if k%20 == 0 {
				p.Spec.Affinity = &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{
					{TopologyKey: v1.LabelHostname, LabelSelector: &metav1.LabelSelector{MatchLabels: app}}}}}
			}
			if k%10 == 5 {
				p.Spec.TopologySpreadConstraints = []v1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: v1.LabelTopologyZone,
					WhenUnsatisfiable: v1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: app}}}
			}
			c.SetPod(p)
		}
	}
	return c, in, nodes
}

// benchInputs is the network's state without blocks: one pool.
func benchInputs() *network.Inputs {
	return &network.Inputs{
		Pools:   []*tabbyv1.IPPool{{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: tabbyv1.IPPoolSpec{CIDR: "10.0.0.0/8"}}},
		Config:  tabbyv1.IPAMConfigurationSpec{MaxBlocksPerHost: 20},
		Now:     time.Now(),
		Version: 1, // as the Watcher gives: one state, reused by every request
	}
}

// poster posts a JSON body to mux and returns the answer (valid until the
// next post), failing b unless it is 200. The answer is written into one
// buffer reused by every post, as the HTTP server writes into its
// connection's: httptest.ResponseRecorder's fresh, growing body per request
// would add hundreds of kilobytes of garbage per request that the
// extender, as it serves, does not make.
func poster(b *testing.B, mux *http.ServeMux) func(path string, body []byte) []byte {
	w := &reusedWriter{header: http.Header{}}
	return func(path string, body []byte) []byte {
		r := httptest.NewRequest("POST", path, bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		clear(w.header)
		w.code = 0
		w.body.Reset()
		mux.ServeHTTP(w, r)
		if w.code != 0 && w.code != http.StatusOK {
			b.Fatalf("%s: %d %s", path, w.code, w.body.Bytes())
		}
		return w.body.Bytes()
	}
}

// reusedWriter is an http.ResponseWriter whose buffers are reused.
type reusedWriter struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (w *reusedWriter) Header() http.Header { return w.header }

func (w *reusedWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

func (w *reusedWriter) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(p)
}

// incoming is the pod being placed: a node affinity, a toleration, a
// required anti-affinity and a preferred affinity, a spread constraint.
func incoming() *v1.Pod {
	app := map[string]string{"app": "app-7"}
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "new", Namespace: "default", Labels: app}, Spec: v1.PodSpec{
		Tolerations: []v1.Toleration{{Key: "spot", Operator: v1.TolerationOpExists}},
		Affinity: &v1.Affinity{
			NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{
				{MatchExpressions: []v1.NodeSelectorRequirement{{Key: "pool", Operator: v1.NodeSelectorOpNotIn, Values: []string{"p3"}}}}}}},
			PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{
				{TopologyKey: v1.LabelHostname, LabelSelector: &metav1.LabelSelector{MatchLabels: app}}}},
			PodAffinity: &v1.PodAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []v1.WeightedPodAffinityTerm{
				{Weight: 10, PodAffinityTerm: v1.PodAffinityTerm{TopologyKey: v1.LabelTopologyZone, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "app-8"}}}}}},
		},
		TopologySpreadConstraints: []v1.TopologySpreadConstraint{{MaxSkew: 2, TopologyKey: v1.LabelTopologyZone,
			WhenUnsatisfiable: v1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: app}}},
	}}
}

// BenchmarkExtender is one filter and one prioritize request, as
// kube-scheduler sends them, for 5,000 nodes and 50,000 running pods,
// through the HTTP handler: nodeCacheCapable (node names only) and not
// (full Node objects). It reports the p50 and p99 of filter+prioritize.
func BenchmarkExtender(b *testing.B) {
	c, in, nodes := bigCluster()
	fw := plugins.Default(c.Snapshot, &network.Plugin{Inputs: func() *network.Inputs { return in }})
	mux := http.NewServeMux()
	(&extender.Handler{Scheduler: fw, Nodes: c}).Register(mux)
	names := make([]string, len(nodes))
	list := &v1.NodeList{}
	for i, n := range nodes {
		names[i] = n.Name
		list.Items = append(list.Items, *n)
	}
	for _, tc := range []struct {
		name string
		args extenderv1.ExtenderArgs
	}{
		{"nodeCacheCapable", extenderv1.ExtenderArgs{Pod: incoming(), NodeNames: &names}},
		{"fullNodes", extenderv1.ExtenderArgs{Pod: incoming(), Nodes: list}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			body, err := json.Marshal(tc.args)
			if err != nil {
				b.Fatal(err)
			}
			post := poster(b, mux)
			// Prioritize gets the nodes that passed, as kube-scheduler sends.
			var fr extenderv1.ExtenderFilterResult
			if err := json.Unmarshal(post("/filter", body), &fr); err != nil {
				b.Fatal(err)
			}
			next := tc.args
			if fr.NodeNames != nil {
				next.NodeNames = fr.NodeNames
			} else {
				next.Nodes = fr.Nodes
			}
			pbody, _ := json.Marshal(next)
			passing := len(fr.FailedNodes) + len(fr.FailedAndUnresolvableNodes)
			b.ReportAllocs()
			var lat []time.Duration
			gc := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
			metrics.Read(gc)
			gc0 := gc[0].Value.Uint64()
			cpu0 := processCPU(b)
			for b.Loop() {
				t0 := time.Now()
				post("/filter", body)
				post("/prioritize", pbody)
				lat = append(lat, time.Since(t0))
			}
			// The process's CPU (all its threads: the collector's and
			// the plugins' workers too) per filter+prioritize: what the
			// extender costs per pod placed, which wall time on a
			// shared machine does not show.
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
			metrics.Read(gc)
			// Requests that meet a collection (it marks the cache's
			// 50,000 pods) are the slow ones: how many ran is the p99's
			// first suspect.
			b.ReportMetric(float64(gc[0].Value.Uint64()-gc0), "gc-cycles")
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(len(nodes)-passing), "passing-nodes")
		})
	}
}

// processCPU is the CPU time (user and system) the process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
