package schedtest

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
)

// TestExtenderOutage stops the extender and creates pods whose rules only
// the extender decides (kube-scheduler-config.yaml disables the in-tree
// NodeAffinity, TaintToleration, InterPodAffinity and PodTopologySpread):
// with the extender non-ignorable, none is placed while it is down, each
// gets a FailedScheduling event naming the extender, and once it is back
// each is placed as its rules say.
func TestExtenderOutage(t *testing.T) {
	cs := fixture(t)
	ns := namespace(t, cs, nil)
	// One pod of an anti-affine group is placed (in zone a: n1 or n2)
	// before the outage; the second, created during it, has one node left.
	app := map[string]string{"app": "outage-anti"}
	antiInZoneA := []func(*corev1.Pod){nodeSelector(corev1.LabelTopologyZone, "a"), antiAffinity(corev1.LabelHostname, app)}
	pod(t, cs, ns, "anti-0", app, antiInZoneA...)
	first := bound(t, cs, ns, "anti-0")
	// The extender must have seen it bound (its watch) before it stops,
	// as it would in a cluster where the pod has been running.
	time.Sleep(time.Second)
	extender.Stop(5 * time.Second)
	restarted := false
	restart := func() {
		if restarted {
			return
		}
		restarted = true
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := startExtender(ctx, clustertest.Cluster(t)); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(restart) // the other tests need it, whatever happens here

	tolerateGPU := func(p *corev1.Pod) {
		p.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "gpu", Effect: corev1.TaintEffectNoSchedule}}
	}
	// Ignoring the rules, each could land on any of the seven nodes.
	pod(t, cs, ns, "zone-b", nil, nodeSelector(corev1.LabelTopologyZone, "b"))
	pod(t, cs, ns, "taint", nil, nodeSelector(corev1.LabelHostname, "n6"))
	pod(t, cs, ns, "gpu", nil, nodeSelector(corev1.LabelHostname, "n6"), tolerateGPU)
	pod(t, cs, ns, "no-tabbyd", nil, nodeSelector(corev1.LabelHostname, "n7"))
	pod(t, cs, ns, "anti-1", app, antiInZoneA...)
	names := []string{"zone-b", "taint", "gpu", "no-tabbyd", "anti-1"}

	// While it is down: every pod gets a FailedScheduling event that says
	// the extender could not be reached, and none is bound. The scheduler
	// retries with backoff meanwhile (at most 10 s apart), so 15 s sees
	// several attempts.
	deadline := time.Now().Add(15 * time.Second)
	seen := map[string]string{}
	for time.Now().Before(deadline) {
		for _, name := range names {
			p, err := cs.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if p.Spec.NodeName != "" {
				t.Fatalf("pod %s was placed on %s while the extender was down", name, p.Spec.NodeName)
			}
			if msg := failedScheduling(t, cs, ns, name); msg != "" {
				seen[name] = msg
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The latest event counts: the first attempt after the stop may go out
	// on a kept-alive connection the stopping extender closed, and that
	// POST (not retried by Go's transport) fails with EOF; every later
	// attempt dials and is refused.
	for _, name := range names {
		msg := seen[name]
		if !strings.Contains(msg, extenderURL+"/filter") || !strings.Contains(msg, "connection refused") {
			t.Errorf("pod %s: latest FailedScheduling event %q; want one naming %s/filter and the refused connection", name, msg, extenderURL)
		}
	}
	t.Logf("while the extender was down, for 15 s, no pod was placed; zone-b's event: %s", seen["zone-b"])

	// Back: each is placed by its rules, or stays unschedulable for them.
	restart()
	oneOf(t, "zone-b", bound(t, cs, ns, "zone-b"), "n3", "n4")
	oneOf(t, "gpu", bound(t, cs, ns, "gpu"), "n6")
	other := map[string]string{"n1": "n2", "n2": "n1"}[first]
	oneOf(t, "anti-1 (anti-0 is on "+first+")", bound(t, cs, ns, "anti-1"), other)
	unschedulable(t, cs, ns, "taint", "untolerated taint")
	unschedulable(t, cs, ns, "no-tabbyd", "node(s) had no tabbyd running")
}

// failedScheduling returns the message of the pod's latest FailedScheduling
// event, or "".
func failedScheduling(t *testing.T, cs kubernetes.Interface, ns, name string) string {
	t.Helper()
	evs, err := cs.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: fields.SelectorFromSet(fields.Set{
		"involvedObject.name": name, "reason": "FailedScheduling"}).String()})
	if err != nil {
		t.Fatal(err)
	}
	msg := ""
	var last time.Time
	for _, e := range evs.Items {
		ts := e.LastTimestamp.Time
		if e.EventTime.After(ts) {
			ts = e.EventTime.Time
		}
		if msg == "" || ts.After(last) {
			msg, last = e.Message, ts
		}
	}
	return msg
}
