package schedtest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
)

// The nodes: zones a (n1, n2), b (n3, n4), c (n5, n6); n1 and n2 are rack
// 1, the rest rack 2. n5 has a PreferNoSchedule taint, n6 a NoSchedule
// taint dedicated=gpu. n7 (zone c) has no tabbyd heartbeat.
var nodeSpecs = []struct {
	name, zone, rack string
	taints           []corev1.Taint
	heartbeat        bool
}{
	{"n1", "a", "1", nil, true},
	{"n2", "a", "1", nil, true},
	{"n3", "b", "2", nil, true},
	{"n4", "b", "2", nil, true},
	{"n5", "c", "2", []corev1.Taint{{Key: "spot", Value: "true", Effect: corev1.TaintEffectPreferNoSchedule}}, true},
	{"n6", "c", "2", []corev1.Taint{{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}}, true},
	{"n7", "c", "2", nil, false},
}

var fixtureOnce sync.Once

// fixture creates the nodes, their heartbeats and the pools once.
func fixture(t *testing.T) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	var ferr error
	fixtureOnce.Do(func() { ferr = makeFixture(cs, clustertest.Client(t)) })
	if ferr != nil {
		t.Fatal(ferr)
	}
	return cs
}

func makeFixture(cs kubernetes.Interface, tds *datastore.Client) error {
	ctx := context.Background()
	res := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi")}
	for _, s := range nodeSpecs {
		n := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: s.name, Labels: map[string]string{
				corev1.LabelHostname: s.name, corev1.LabelTopologyZone: s.zone, "rack": s.rack}},
			Status: corev1.NodeStatus{Capacity: res, Allocatable: res,
				Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Test"}}},
		}
		if _, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			return err
		}
		// TaintNodesByCondition added not-ready:NoSchedule at creation;
		// put the node's own taints in its place.
		taints := s.taints
		if taints == nil {
			taints = []corev1.Taint{}
		}
		patch := fmt.Sprintf(`{"spec":{"taints":%s}}`, mustJSON(taints))
		if _, err := cs.CoreV1().Nodes().Patch(ctx, s.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return err
		}
		if s.heartbeat {
			now := metav1.NewMicroTime(time.Now())
			l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "tabbyd-" + s.name, Namespace: "tabby-system"},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(s.name), LeaseDurationSeconds: ptr.To(int32(3600)), RenewTime: &now}}
			if _, err := cs.CoordinationV1().Leases("tabby-system").Create(ctx, l, metav1.CreateOptions{}); err != nil {
				return err
			}
		}
	}
	for _, p := range []*tabbyv1.IPPool{
		{ObjectMeta: metav1.ObjectMeta{Name: "default"}, Spec: tabbyv1.IPPoolSpec{CIDR: "10.244.0.0/16"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "rack1"}, Spec: tabbyv1.IPPoolSpec{CIDR: "10.245.0.0/16", NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "1"}}}},
	} {
		if _, err := tds.IPPools.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func TestNodeSelectorAndAffinity(t *testing.T) {
	cs := fixture(t)
	ns := namespace(t, cs, nil)
	pod(t, cs, ns, "zone-b", nil, nodeSelector(corev1.LabelTopologyZone, "b"))
	oneOf(t, "a pod with nodeSelector zone=b", bound(t, cs, ns, "zone-b"), "n3", "n4")
	// NotIn a, b leaves zone c: n5 (PreferNoSchedule is no bar), not n6
	// (NoSchedule) nor n7 (no tabbyd).
	pod(t, cs, ns, "not-ab", nil, requiredNodeAffinity(corev1.NodeSelectorRequirement{Key: corev1.LabelTopologyZone, Operator: corev1.NodeSelectorOpNotIn, Values: []string{"a", "b"}}))
	oneOf(t, "a pod with affinity zone NotIn [a b]", bound(t, cs, ns, "not-ab"), "n5")
	pod(t, cs, ns, "nowhere", nil, nodeSelector("rack", "9"))
	unschedulable(t, cs, ns, "nowhere", "didn't match Pod's node affinity/selector")
	pod(t, cs, ns, "prefers-b", nil, func(p *corev1.Pod) {
		p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{
			{Weight: 100, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelTopologyZone, Operator: corev1.NodeSelectorOpIn, Values: []string{"b"}}}}}}}}
	})
	oneOf(t, "a pod preferring zone b", bound(t, cs, ns, "prefers-b"), "n3", "n4")
}

func TestTaintsAndTolerations(t *testing.T) {
	cs := fixture(t)
	ns := namespace(t, cs, nil)
	pod(t, cs, ns, "no-toleration", nil, nodeSelector(corev1.LabelHostname, "n6"))
	unschedulable(t, cs, ns, "no-toleration", "untolerated taint")
	pod(t, cs, ns, "tolerates", nil, nodeSelector(corev1.LabelHostname, "n6"), func(p *corev1.Pod) {
		p.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "gpu", Effect: corev1.TaintEffectNoSchedule}}
	})
	oneOf(t, "a pod tolerating dedicated=gpu", bound(t, cs, ns, "tolerates"), "n6")
	pod(t, cs, ns, "tolerates-all", nil, nodeSelector(corev1.LabelHostname, "n6"), func(p *corev1.Pod) {
		p.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}}
	})
	oneOf(t, "a pod tolerating everything", bound(t, cs, ns, "tolerates-all"), "n6")
	// In zone c, n5's untolerated PreferNoSchedule taint scores it below
	// n6 for a pod that tolerates n6's taint.
	pod(t, cs, ns, "zone-c", nil, nodeSelector(corev1.LabelTopologyZone, "c"), func(p *corev1.Pod) {
		p.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
	})
	oneOf(t, "a pod in zone c tolerating dedicated", bound(t, cs, ns, "zone-c"), "n6")
}

func TestPodAntiAffinity(t *testing.T) {
	cs := fixture(t)
	ns := namespace(t, cs, nil)
	app := map[string]string{"app": "anti"}
	// Five nodes can take the pods (n6 is tainted, n7 has no tabbyd).
	seen := map[string]bool{}
	for i := range 5 {
		name := fmt.Sprintf("anti-%d", i)
		pod(t, cs, ns, name, app, antiAffinity(corev1.LabelHostname, app))
		n := bound(t, cs, ns, name)
		if seen[n] {
			t.Errorf("%s landed on %s, which already runs one of its group", name, n)
		}
		seen[n] = true
	}
	pod(t, cs, ns, "anti-5", app, antiAffinity(corev1.LabelHostname, app))
	unschedulable(t, cs, ns, "anti-5", "anti-affinity")
	// A pod without anti-affinity of its own may not join either: the
	// running pods' anti-affinity counts against it.
	pod(t, cs, ns, "intruder", app)
	unschedulable(t, cs, ns, "intruder", "anti-affinity")
}

func TestPodAffinity(t *testing.T) {
	cs := fixture(t)
	ns := namespace(t, cs, nil)
	pod(t, cs, ns, "db", map[string]string{"app": "db"}, nodeSelector(corev1.LabelHostname, "n3"))
	if n := bound(t, cs, ns, "db"); n != "n3" {
		t.Fatalf("db on %s", n)
	}
	pod(t, cs, ns, "web", nil, podAffinity(corev1.LabelTopologyZone, map[string]string{"app": "db"}))
	if z := zoneOf(bound(t, cs, ns, "web")); z != "b" {
		t.Errorf("web, with affinity to db's zone, landed in zone %s", z)
	}
	// The first pod of a group with affinity to itself may be placed.
	self := map[string]string{"app": "self"}
	pod(t, cs, ns, "self-0", self, podAffinity(corev1.LabelTopologyZone, self))
	first := zoneOf(bound(t, cs, ns, "self-0"))
	pod(t, cs, ns, "self-1", self, podAffinity(corev1.LabelTopologyZone, self))
	if z := zoneOf(bound(t, cs, ns, "self-1")); z != first {
		t.Errorf("the second pod of a self-affine group landed in zone %s, the first in %s", z, first)
	}
	pod(t, cs, ns, "lonely", nil, podAffinity(corev1.LabelTopologyZone, map[string]string{"app": "ghost"}))
	unschedulable(t, cs, ns, "lonely", "didn't match pod affinity rules")
}

func TestTopologySpread(t *testing.T) {
	cs := fixture(t)
	ns := namespace(t, cs, nil)
	app := map[string]string{"app": "spread"}
	spread := func(p *corev1.Pod) {
		p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone, WhenUnsatisfiable: corev1.DoNotSchedule,
			LabelSelector: &metav1.LabelSelector{MatchLabels: app}}}
	}
	zones := map[string]int{}
	for i := range 6 {
		name := fmt.Sprintf("spread-%d", i)
		pod(t, cs, ns, name, app, spread)
		zones[zoneOf(bound(t, cs, ns, name))]++
	}
	if zones["a"] != 2 || zones["b"] != 2 || zones["c"] != 2 {
		t.Errorf("six pods with maxSkew 1 over three zones: %v, want 2 each", zones)
	}
	// Pinned to zone a by nodeSelector, a pod sees only zone a as a domain
	// (nodeAffinityPolicy Honor, the default): any skew passes there.
	pod(t, cs, ns, "spread-6", app, spread, nodeSelector(corev1.LabelTopologyZone, "a"))
	oneOf(t, "a seventh pod in zone a", bound(t, cs, ns, "spread-6"), "n1", "n2")
	// With nodeAffinityPolicy Ignore every zone counts: a ninth in zone a
	// (4:2:2) would exceed maxSkew 1.
	ignore := func(p *corev1.Pod) {
		spread(p)
		p.Spec.TopologySpreadConstraints[0].NodeAffinityPolicy = ptr.To(corev1.NodeInclusionPolicyIgnore)
	}
	pod(t, cs, ns, "spread-7", app, ignore, nodeSelector(corev1.LabelTopologyZone, "a"))
	unschedulable(t, cs, ns, "spread-7", "topology spread constraints")
	pod(t, cs, ns, "spread-8", app, ignore, nodeSelector(corev1.LabelTopologyZone, "b"))
	oneOf(t, "a pod in zone b (3:3:2)", bound(t, cs, ns, "spread-8"), "n3", "n4")
}

func TestNetwork(t *testing.T) {
	cs := fixture(t)
	ns := namespace(t, cs, nil)
	rack1 := func(p *corev1.Pod) { p.Annotations = map[string]string{tabbyv1.AnnotationIPv4Pools: `["rack1"]`} }
	pod(t, cs, ns, "rack1-pool", nil, rack1)
	oneOf(t, "a pod asking for the rack1 pool", bound(t, cs, ns, "rack1-pool"), "n1", "n2")
	pod(t, cs, ns, "rack1-on-n3", nil, nodeSelector(corev1.LabelHostname, "n3"), rack1)
	unschedulable(t, cs, ns, "rack1-on-n3", `node(s) had no tabby IPv4 pool the pod may use (pool rack1: its nodeSelector "rack=1" does not match)`)
	pod(t, cs, ns, "on-n7", nil, nodeSelector(corev1.LabelHostname, "n7"))
	unschedulable(t, cs, ns, "on-n7", "node(s) had no tabbyd running")
	// A hostNetwork pod (tabbyd's own, for one) needs no tabbyd and no
	// address: it may go there.
	pod(t, cs, ns, "host-on-n7", nil, nodeSelector(corev1.LabelHostname, "n7"), func(p *corev1.Pod) { p.Spec.HostNetwork = true })
	oneOf(t, "a hostNetwork pod on n7", bound(t, cs, ns, "host-on-n7"), "n7")
	// Pods without constraints land anywhere but n6 (tainted) and n7.
	for i := range 6 {
		name := fmt.Sprintf("free-%d", i)
		pod(t, cs, ns, name, nil)
		if n := bound(t, cs, ns, name); n == "n7" || n == "n6" {
			t.Errorf("%s landed on %s", name, n)
		}
	}
}

// TestExtenderManifest applies deploy/scheduler's manifests to the real
// API server: every object must be valid as users get it, the static pod
// too (server-side dry run), and rbac.yaml lets both identities the
// extender runs as read what it reads and bind pods. (The scheduler configuration next
// to them is what TestMain started kube-scheduler with.)
func TestExtenderManifest(t *testing.T) {
	fixture(t)
	root, err := controlplane.FindRepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "deploy", "scheduler")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.AppsV1().Deployments("tabby-system").Delete(context.Background(), "tabby-scheduler-extender", metav1.DeleteOptions{})
		_ = cs.NetworkingV1().NetworkPolicies("tabby-system").Delete(context.Background(), "tabby-scheduler-extender", metav1.DeleteOptions{})
	})
	for _, f := range []string{"rbac.yaml", "extender.yaml", "extender-networkpolicy.yaml"} {
		if err := controlplane.ApplyManifests(ctx, clustertest.Config(t), filepath.Join(dir, f)); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	d, err := cs.AppsV1().Deployments("tabby-system").Get(ctx, "tabby-scheduler-extender", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Spec.Template.Spec.ServiceAccountName; got != "tabby-scheduler-extender" {
		t.Errorf("service account %q", got)
	}
	if _, err := cs.PolicyV1().PodDisruptionBudgets("tabby-system").Get(ctx, "tabby-scheduler-extender", metav1.GetOptions{}); err != nil {
		t.Errorf("the Deployment's PodDisruptionBudget: %v", err)
	}

	data, err := os.ReadFile(filepath.Join(dir, "extender-static-pod.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	static := &corev1.Pod{}
	if err := yaml.UnmarshalStrict(data, static); err != nil {
		t.Fatalf("extender-static-pod.yaml: %v", err)
	}
	// No kube-controller-manager runs here to make the namespace's default
	// ServiceAccount, which admission looks up for every pod.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: static.Namespace}}
	if _, err := cs.CoreV1().ServiceAccounts(static.Namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods(static.Namespace).Create(ctx, static, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("extender-static-pod.yaml: %v", err)
	}
	if !slices.Contains(static.Spec.Containers[0].Args, "--listen=127.0.0.1:8888") || !static.Spec.HostNetwork {
		t.Errorf("the static pod must serve on the node's loopback, where kube-scheduler-config.yaml's urlPrefix points: %v", static.Spec.Containers[0].Args)
	}

	for _, user := range []struct {
		name   string
		groups []string
	}{
		{"system:serviceaccount:tabby-system:tabby-scheduler-extender", []string{"system:serviceaccounts"}},
		{"system:kube-scheduler", nil},
	} {
		for _, ra := range []authorizationv1.ResourceAttributes{
			{Verb: "watch", Group: "tabby.io", Resource: "ipamblocks"},
			{Verb: "list", Group: "coordination.k8s.io", Resource: "leases", Namespace: "tabby-system"},
			// kube-scheduler-config.yaml's bindVerb.
			{Verb: "create", Resource: "pods", Subresource: "binding", Namespace: "default"},
		} {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user.name, Groups: user.groups, ResourceAttributes: &ra}}
			res, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !res.Status.Allowed {
				t.Errorf("%s may not %s %s: %s", user.name, ra.Verb, strings.TrimSuffix(ra.Resource+"/"+ra.Subresource, "/"), res.Status.Reason)
			}
		}
	}
}
