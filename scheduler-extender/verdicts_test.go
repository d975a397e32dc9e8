package extender

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/scheduler-extender/framework"
	"github.com/tabbynet/tabby/scheduler-extender/plugins"
	"github.com/tabbynet/tabby/scheduler-extender/plugins/network"
)

// verdictCluster is a node that each of the extender's filter plugins
// fails, and one that passes, for verdictPod.
func verdictCluster() ([]*v1.Node, []*v1.Pod) {
	mk := func(name, zone, rack string) *v1.Node {
		return node(name, map[string]string{"zone": zone, "rack": rack, v1.LabelHostname: name})
	}
	taint := mk("n-taint", "a", "r1")
	taint.Spec.Taints = []v1.Taint{{Key: "dedicated", Value: "db", Effect: v1.TaintEffectNoSchedule}}
	nodes := []*v1.Node{taint, mk("n-zone-c", "c", "r1"), mk("n-net", "a", "r1"), mk("n-spread", "a", "r2"), mk("n-anti", "a", "r1"), mk("n-ok", "b", "r1")}
	running := func(name, node, app string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": app}},
			Spec: v1.PodSpec{NodeName: node}, Status: v1.PodStatus{Phase: v1.PodRunning}}
	}
	return nodes, []*v1.Pod{running("db-1", "n-spread", "db"), running("db-2", "n-spread", "db"), running("web-1", "n-anti", "web")}
}

// verdictPod wants zone a or b, one web pod a host, and racks even in db pods.
func verdictPod() *v1.Pod {
	p := requiredPod(exprs(req("zone", v1.NodeSelectorOpIn, "a", "b")))
	p.Name, p.Namespace, p.Labels = "web-2", "default", map[string]string{"app": "web"}
	p.Spec.Affinity.PodAntiAffinity = &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{
		{TopologyKey: v1.LabelHostname, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}}
	p.Spec.TopologySpreadConstraints = []v1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: "rack",
		WhenUnsatisfiable: v1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}}}}
	return p
}

// counters reads a counter vector of reg by its one label's value.
func counters(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				out[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// TestFilterVerdictMetrics: real filter requests to the extender's real
// handler, running the plugins tabby-scheduler-extender runs, count every
// node filtered out under the plugin that failed it, and every answer as
// fits or unschedulable.
func TestFilterVerdictMetrics(t *testing.T) {
	nodes, pods := verdictCluster()
	now := time.Now()
	in := &network.Inputs{
		Pools:      []*tabbyv1.IPPool{{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: tabbyv1.IPPoolSpec{CIDR: "10.244.0.0/16", BlockSize: 26}}},
		Heartbeats: map[string]time.Time{},
		Now:        now,
	}
	for _, n := range nodes {
		in.Heartbeats[n.Name] = now.Add(time.Hour)
	}
	in.Heartbeats["n-net"] = now.Add(-time.Minute) // its tabbyd stopped
	fw := plugins.Default(func() framework.Snapshot { return framework.NewSnapshot(nodes, pods, nil) },
		&network.Plugin{Inputs: func() *network.Inputs { return in }})
	reg := prometheus.NewRegistry()
	mux := NewMux(Config{Scheduler: fw}, reg)

	w := do(mux, "POST", "/filter", "application/json", mustJSON(t, extenderv1.ExtenderArgs{Pod: verdictPod(), Nodes: nodeList(nodes...)}))
	if w.Code != http.StatusOK {
		t.Fatalf("filter: %d %s", w.Code, w.Body)
	}
	var got extenderv1.ExtenderFilterResult
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Nodes.Items) != 1 || got.Nodes.Items[0].Name != "n-ok" {
		t.Fatalf("passing %v; failed %v; unresolvable %v", got.Nodes.Items, got.FailedNodes, got.FailedAndUnresolvableNodes)
	}
	want := map[string]float64{"TaintToleration": 1, "NodeAffinity": 1, "TabbyNetwork": 1, "PodTopologySpread": 1, "InterPodAffinity": 1}
	if d := cmp.Diff(want, counters(t, reg, "tabby_scheduler_extender_filtered_nodes_total")); d != "" {
		t.Errorf("filtered nodes by plugin (-want +got):\n%s\nfailed %v; unresolvable %v", d, got.FailedNodes, got.FailedAndUnresolvableNodes)
	}

	// Node names without a node cache: every one unknown, nothing fits.
	names := []string{"n-ok", "n-anti"}
	do(mux, "POST", "/filter", "application/json", mustJSON(t, extenderv1.ExtenderArgs{Pod: verdictPod(), NodeNames: &names}))
	do(mux, "POST", "/filter", "application/json", []byte("{")) // refused: no verdict
	want["UnknownNode"] = 2
	if d := cmp.Diff(want, counters(t, reg, "tabby_scheduler_extender_filtered_nodes_total")); d != "" {
		t.Errorf("filtered nodes by plugin after unknown names (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]float64{"fits": 1, "unschedulable": 1}, counters(t, reg, "tabby_scheduler_extender_filter_answers_total")); d != "" {
		t.Errorf("filter answers by verdict (-want +got):\n%s", d)
	}
}
