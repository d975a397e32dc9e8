package schedtest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

const (
	burstNodes = 20 // in burstZones zones, 5 each
	burstZones = 4
	burstPods  = 16
	burstReps  = 3
	// burstZoneKey is the burst nodes' zone label (not the fixture's).
	burstZoneKey = "tabby.io/burst-zone"
)

// TestBurst creates bursts of pods at once, as a Deployment's scale-up
// does, whose rules depend on each other: required anti-affinity on the
// hostname, and a DoNotSchedule spread over zones with maxSkew 1. Every
// pod also prefers zone z0 (weight 100), so a pod placed without seeing
// the pods placed just before it would go to z0. kube-scheduler schedules
// the next pod before the previous one's binding reaches the extender's
// watch; the extender binds (bindVerb) and waits for placements in flight,
// so each pod is decided with every earlier pod of the burst counted.
func TestBurst(t *testing.T) {
	cs := fixture(t)
	nodes := makeBurstNodes(t, cs)
	t.Run("anti-affinity", func(t *testing.T) {
		bad := 0
		for rep := range burstReps {
			app := map[string]string{"app": fmt.Sprintf("burst-anti-%d", rep)}
			placed := burst(t, cs, app, func(p *corev1.Pod) {
				p.Spec.Affinity.PodAntiAffinity = &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{
					{TopologyKey: corev1.LabelHostname, LabelSelector: &metav1.LabelSelector{MatchLabels: app}}}}
			})
			perNode := map[string][]string{}
			for pod, node := range placed {
				perNode[node] = append(perNode[node], pod)
			}
			shared := 0
			for node, pods := range perNode {
				if len(pods) > 1 {
					sort.Strings(pods)
					t.Errorf("burst %d: %v share node %s against their required anti-affinity", rep, pods, node)
					shared += len(pods) - 1
				}
			}
			t.Logf("burst %d: %d pods on %d nodes, %d pods placed on a node already running one of their group", rep, len(placed), len(perNode), shared)
			if shared > 0 {
				bad++
			}
		}
		t.Logf("%d of %d anti-affinity bursts broke the rule", bad, burstReps)
	})
	t.Run("spread", func(t *testing.T) {
		bad := 0
		for rep := range burstReps {
			app := map[string]string{"app": fmt.Sprintf("burst-spread-%d", rep)}
			placed := burst(t, cs, app, func(p *corev1.Pod) {
				p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: burstZoneKey,
					WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: app}}}
			})
			perZone := map[string]int{}
			for z := range burstZones {
				perZone[fmt.Sprintf("z%d", z)] = 0
			}
			for _, node := range placed {
				perZone[nodes[node]]++
			}
			lo, hi := burstPods, 0
			for _, n := range perZone {
				lo, hi = min(lo, n), max(hi, n)
			}
			t.Logf("burst %d: pods per zone %v, skew %d", rep, perZone, hi-lo)
			if hi-lo > 1 {
				t.Errorf("burst %d: pods per zone %v: skew %d, more than maxSkew 1", rep, perZone, hi-lo)
				bad++
			}
		}
		t.Logf("%d of %d spread bursts broke the rule", bad, burstReps)
	})
	logPlacementWaits(t)
}

// makeBurstNodes adds burstNodes nodes with tabbyd heartbeats, labelled
// with a zone of burstZoneKey and tainted so that only the burst pods go
// there; they are deleted after the test. It returns each node's zone.
func makeBurstNodes(t *testing.T, cs kubernetes.Interface) map[string]string {
	t.Helper()
	ctx := context.Background()
	res := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi")}
	zones := map[string]string{}
	for i := range burstNodes {
		name, zone := fmt.Sprintf("burst-%02d", i), fmt.Sprintf("z%d", i/(burstNodes/burstZones))
		zones[name] = zone
		t.Cleanup(func() {
			_ = cs.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
			_ = cs.CoordinationV1().Leases("tabby-system").Delete(context.Background(), "tabbyd-"+name, metav1.DeleteOptions{})
		})
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			corev1.LabelHostname: name, burstZoneKey: zone, "burst": "true"}},
			Status: corev1.NodeStatus{Capacity: res, Allocatable: res,
				Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Test"}}}}
		if _, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// In place of the not-ready taint added at creation.
		patch := `{"spec":{"taints":[{"key":"burst","value":"true","effect":"NoSchedule"}]}}`
		if _, err := cs.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		now := metav1.NewMicroTime(time.Now())
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "tabbyd-" + name, Namespace: "tabby-system"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To(int32(3600)), RenewTime: &now}}
		if _, err := cs.CoordinationV1().Leases("tabby-system").Create(ctx, l, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The extender must see every node ready before the bursts: a node it
	// has not seen yet fails the filter, which is not what is tested.
	probe := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: "default"}}
	burstSpec(probe, nil)
	deadline := time.Now().Add(30 * time.Second)
	for {
		passed, err := extenderFilter(probe, burstNodes)
		if err == nil && passed == burstNodes {
			return zones
		}
		if time.Now().After(deadline) {
			t.Fatalf("the extender passes %d of the %d burst nodes after 30 s (%v)", passed, burstNodes, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// burstSpec makes p a burst pod: on the burst nodes, preferring zone z0.
func burstSpec(p *corev1.Pod, labels map[string]string) {
	p.Labels = labels
	p.Spec.Containers = []corev1.Container{{Name: "c", Image: "none"}}
	p.Spec.NodeSelector = map[string]string{"burst": "true"}
	p.Spec.Tolerations = []corev1.Toleration{{Key: "burst", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{
		{Weight: 100, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: burstZoneKey, Operator: corev1.NodeSelectorOpIn, Values: []string{"z0"}}}}}}}}
}

// burst creates burstPods pods with labels, changed by opt, at once in a
// namespace of their own, waits until all are bound and returns each
// pod's node.
func burst(t *testing.T, cs kubernetes.Interface, labels map[string]string, opt func(*corev1.Pod)) map[string]string {
	t.Helper()
	ns := namespace(t, cs, nil)
	ctx := context.Background()
	var err error
	parallel(burstPods, func(i int) error {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%02d", i), Namespace: ns}}
		burstSpec(p, labels)
		opt(p)
		_, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		return err
	}, &err)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		l, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		placed := map[string]string{}
		var waiting []string
		for _, p := range l.Items {
			if p.Spec.NodeName == "" {
				waiting = append(waiting, p.Name+": "+scheduledCondition(&p))
				continue
			}
			placed[p.Name] = p.Spec.NodeName
		}
		if len(placed) == burstPods {
			return placed
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d pods unscheduled after 60 s: %s", len(waiting), burstPods, strings.Join(waiting, "; "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// extenderFilter asks the extender as kube-scheduler does and counts the
// burst nodes that pass.
func extenderFilter(p *corev1.Pod, n int) (int, error) {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("burst-%02d", i)
	}
	body := mustJSON(map[string]any{"Pod": p, "NodeNames": names})
	resp, err := http.Post(extenderURL+"/filter", "application/json", strings.NewReader(body)) //nolint:gosec // the test's extender on loopback
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", resp.Status, data)
	}
	var res struct{ NodeNames []string }
	if err := json.Unmarshal(data, &res); err != nil {
		return 0, err
	}
	return len(res.NodeNames), nil
}

// logPlacementWaits logs the extender's counts of placements it waited
// for (absent from extenders without the wait), its requests and the time
// it took to answer them, by verb.
func logPlacementWaits(t testing.TB) {
	resp, err := http.Get(extenderURL + "/metrics") //nolint:gosec // the test's extender on loopback
	if err != nil {
		t.Logf("extender metrics: %v", err)
		return
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "tabby_scheduler_extender_placement_wait") && !strings.Contains(line, "_bucket") ||
			strings.HasPrefix(line, "tabby_scheduler_extender_requests_total") ||
			strings.HasPrefix(line, "tabby_scheduler_extender_request_duration_seconds_sum") {
			t.Logf("extender: %s", line)
		}
	}
}
