package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	"sigs.k8s.io/yaml"

	"github.com/tabbynet/tabby/internal/controlplane"
	extender "github.com/tabbynet/tabby/scheduler-extender"
)

// passAll passes every node with equal scores: the extender's HTTP layer
// and metrics are what the test reads, not its rules.
type passAll struct{}

func (passAll) Filter(_ context.Context, _ *v1.Pod, nodes []*v1.Node) extender.FilterResult {
	return extender.FilterResult{Passing: nodes}
}

func (passAll) Prioritize(_ context.Context, _ *v1.Pod, nodes []*v1.Node) (extenderv1.HostPriorityList, error) {
	var out extenderv1.HostPriorityList
	for _, n := range nodes {
		out = append(out, extenderv1.HostPriority{Host: n.Name, Score: 5})
	}
	return out, nil
}

// TestParseExtenderRequests reads the counts from the extender's own
// /metrics after real requests, a rejected one among them.
func TestParseExtenderRequests(t *testing.T) {
	srv := httptest.NewServer(extender.NewMux(extender.Config{Scheduler: passAll{}}, prometheus.NewRegistry()))
	defer srv.Close()
	nodes := v1.NodeList{Items: []v1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "node1"}}}}
	args, err := json.Marshal(extenderv1.ExtenderArgs{Pod: &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}}, Nodes: &nodes})
	if err != nil {
		t.Fatal(err)
	}
	post := func(verb string, body []byte) {
		resp, err := http.Post(srv.URL+"/"+verb, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	post("filter", args)
	post("filter", args)
	post("prioritize", args)
	post("filter", []byte("{not json")) // 400: not counted
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := parseExtenderRequests(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if got["filter"] != 2 || got["prioritize"] != 1 || len(got) != 2 {
		t.Errorf("requests %v, want filter 2, prioritize 1", got)
	}

	if _, err := parseExtenderRequests(strings.NewReader(`tabby_scheduler_extender_requests_total{code="200",verb="filter"} x` + "\n")); err == nil {
		t.Error("a malformed value parsed")
	}
}

// TestSchedulerConfig: the repository's configuration with only the
// extender's urlPrefix changed.
func TestSchedulerConfig(t *testing.T) {
	root, err := controlplane.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	const url = "http://127.0.0.1:8888"
	data, err := schedulerConfig(root, url)
	if err != nil {
		t.Fatal(err)
	}
	orig, err := os.ReadFile(filepath.Join(root, SchedulerConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	var got, want map[string]any
	if err := yaml.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(orig, &want); err != nil {
		t.Fatal(err)
	}
	ext := got["extenders"].([]any)[0].(map[string]any)
	if ext["urlPrefix"] != url {
		t.Errorf("urlPrefix %v, want %s", ext["urlPrefix"], url)
	}
	want["extenders"].([]any)[0].(map[string]any)["urlPrefix"] = url
	gj, _ := json.Marshal(got)
	wj, _ := json.Marshal(want)
	if !bytes.Equal(gj, wj) {
		t.Errorf("configuration changed beyond urlPrefix:\n got %s\nwant %s", gj, wj)
	}
	for _, plugin := range []string{"NodeAffinity", "TaintToleration", "InterPodAffinity", "PodTopologySpread"} {
		if !strings.Contains(string(data), "name: "+plugin) {
			t.Errorf("the configuration no longer disables %s:\n%s", plugin, data)
		}
	}

	// A configuration without exactly one extender is refused, saying so.
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(SchedulerConfigFile)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, SchedulerConfigFile), []byte("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := schedulerConfig(dir, url); err == nil || !strings.Contains(err.Error(), "0 extenders") {
		t.Errorf("no extender: %v", err)
	}
	if _, err := schedulerConfig(t.TempDir(), url); err == nil || !strings.Contains(err.Error(), "--repo") {
		t.Errorf("no file: %v", err)
	}
}

func TestPolicyWant(t *testing.T) {
	// Only x may reach y, on TCP.
	for _, tc := range []struct{ from, to, want string }{
		{"x", "y", cellTCP},
		{"z", "y", cellDeny},
		{"y", "y", cellOK}, // a pod's traffic to itself never leaves it
		{"x", "x", cellOK},
		{"y", "x", cellOK}, // egress is not restricted
		{"z", "x", cellOK},
	} {
		if got := policyWant("x", "y", tc.from, tc.to); got != tc.want {
			t.Errorf("%s -> %s: %s, want %s", tc.from, tc.to, got, tc.want)
		}
	}
	for _, tc := range []struct {
		pr   DemoProbe
		want string
	}{
		{DemoProbe{TCP: true, ICMP: true}, cellOK},
		{DemoProbe{TCP: true}, cellTCP},
		{DemoProbe{ICMP: true}, cellPing},
		{DemoProbe{}, cellDeny},
	} {
		if got := cellOf(tc.pr); got != tc.want {
			t.Errorf("%+v: %s, want %s", tc.pr, got, tc.want)
		}
	}
}
