// Package apitest checks the InterPodAffinity plugin against pods and
// namespaces as a real kube-apiserver v1.35 stores them: the plugin, like
// kube-scheduler, leaves matchLabelKeys and mismatchLabelKeys to the API
// server, which merges them into labelSelector when a pod is created.
package apitest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/scheduler-extender/framework"
	"github.com/tabbynet/tabby/scheduler-extender/plugins/interpodaffinity"
)

func TestMain(m *testing.M) { clustertest.Main(m, nil) }

const hostname = "kubernetes.io/hostname"

func clientset(t *testing.T) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// namespace creates a namespace with labels, deleted (with its pods) when
// the test ends.
func namespace(t *testing.T, cs *kubernetes.Clientset, name string, labels map[string]string) *v1.Namespace {
	t.Helper()
	ctx := context.Background()
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// No controller manager runs here to make the namespace's default
	// service account, which the API server's admission wants for pods.
	if _, err := cs.CoreV1().ServiceAccounts(name).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		zero := int64(0)
		if err := cs.CoreV1().Pods(name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
			t.Errorf("deleting the pods of %s: %v", name, err)
		}
		if err := cs.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting namespace %s: %v", name, err)
		}
	})
	return ns
}

// create creates the pod and returns it as stored.
func create(t *testing.T, cs *kubernetes.Clientset, p *v1.Pod) *v1.Pod {
	t.Helper()
	if len(p.Spec.Containers) == 0 {
		p.Spec.Containers = []v1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}
	}
	got, err := cs.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s/%s: %v", p.Namespace, p.Name, err)
	}
	return got
}

func pod(ns, name, node string, labels map[string]string, a *v1.Affinity) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:       v1.PodSpec{NodeName: node, Affinity: a},
	}
}

func selector(key string, op metav1.LabelSelectorOperator, vals ...string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: op, Values: vals}}}
}

func nodes(names ...string) []*v1.Node {
	var out []*v1.Node
	for _, n := range names {
		out = append(out, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{hostname: n, "zone": "zone-" + n}}})
	}
	return out
}

// filter runs the plugin's filter over nodes for pod, the cluster being
// pods and namespaces; it returns each node's reason ("" when it passes).
func filter(t *testing.T, ns []*v1.Namespace, pods []*v1.Pod, nodes []*v1.Node, p *v1.Pod) []string {
	t.Helper()
	snap := framework.NewSnapshot(nodes, pods, ns)
	check, err := interpodaffinity.New().PreFilter(context.Background(), snap, p)
	if err != nil {
		t.Fatalf("PreFilter: %v", err)
	}
	out := make([]string, len(nodes))
	for i, n := range nodes {
		if check == nil {
			continue
		}
		if st := check(snap.Get(n.Name)); st != nil {
			out[i] = st.Reason
		}
	}
	return out
}

func TestMatchLabelKeysMergedByAPIServer(t *testing.T) {
	cs := clientset(t)
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e6)
	ns := namespace(t, cs, "ipa-rollout-"+suffix, nil)
	// A rolling update: the old ReplicaSet's pod on n1, the new one's on
	// n2; the new pods spread by hostname among themselves only.
	old := create(t, cs, pod(ns.Name, "web-old", "n1", map[string]string{"app": "web", "pod-template-hash": "old"}, nil))
	cur := create(t, cs, pod(ns.Name, "web-new", "n2", map[string]string{"app": "web", "pod-template-hash": "new"}, nil))
	incoming := create(t, cs, pod(ns.Name, "web-new-2", "", map[string]string{"app": "web", "pod-template-hash": "new"}, &v1.Affinity{
		PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{
			LabelSelector:  selector("app", metav1.LabelSelectorOpIn, "web"),
			MatchLabelKeys: []string{"pod-template-hash"},
			TopologyKey:    hostname,
		}}},
	}))
	stored := incoming.Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0]
	want := metav1.LabelSelectorRequirement{Key: "pod-template-hash", Operator: metav1.LabelSelectorOpIn, Values: []string{"new"}}
	if !slices.ContainsFunc(stored.LabelSelector.MatchExpressions, func(r metav1.LabelSelectorRequirement) bool {
		return r.Key == want.Key && r.Operator == want.Operator && slices.Equal(r.Values, want.Values)
	}) {
		t.Fatalf("the API server did not merge matchLabelKeys: stored selector %v", stored.LabelSelector)
	}
	got := filter(t, []*v1.Namespace{ns}, []*v1.Pod{old, cur}, nodes("n1", "n2", "n3"), incoming)
	if want := []string{"", interpodaffinity.ErrReasonAntiAffinityRulesNotMatch, ""}; !slices.Equal(got, want) {
		t.Errorf("filter %q, want %q", got, want)
	}
}

func TestMismatchLabelKeysAndNamespaceSelector(t *testing.T) {
	cs := clientset(t)
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e6)
	red := namespace(t, cs, "ipa-red-"+suffix, map[string]string{"shared-nodes": "yes", "tenant": "red"})
	blue := namespace(t, cs, "ipa-blue-"+suffix, map[string]string{"shared-nodes": "yes", "tenant": "blue"})
	other := namespace(t, cs, "ipa-other-"+suffix, map[string]string{"tenant": "other"})
	all := []*v1.Namespace{red, blue, other}
	// Each tenant keeps its nodes to itself among the namespaces that
	// share nodes: anti-affinity to every tenant's pods but its own.
	isolated := func(ns *v1.Namespace, name, node string) *v1.Pod {
		return pod(ns.Name, name, node, map[string]string{"tenant": ns.Labels["tenant"]}, &v1.Affinity{
			PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{
				LabelSelector:     selector("tenant", metav1.LabelSelectorOpExists),
				MismatchLabelKeys: []string{"tenant"},
				NamespaceSelector: selector("shared-nodes", metav1.LabelSelectorOpIn, "yes"),
				TopologyKey:       hostname,
			}}},
		})
	}
	running := []*v1.Pod{
		create(t, cs, isolated(red, "red-1", "n1")),
		create(t, cs, isolated(blue, "blue-1", "n2")),
		create(t, cs, pod(other.Name, "other-1", "n3", map[string]string{"tenant": "other"}, nil)),
	}
	stored := running[0].Spec.Affinity.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0]
	if !slices.ContainsFunc(stored.LabelSelector.MatchExpressions, func(r metav1.LabelSelectorRequirement) bool {
		return r.Key == "tenant" && r.Operator == metav1.LabelSelectorOpNotIn && slices.Equal(r.Values, []string{"red"})
	}) {
		t.Fatalf("the API server did not merge mismatchLabelKeys: stored selector %v", stored.LabelSelector)
	}
	n := nodes("n1", "n2", "n3", "n4")
	anti := interpodaffinity.ErrReasonAntiAffinityRulesNotMatch
	existing := interpodaffinity.ErrReasonExistingAntiAffinityRulesNotMatch
	for _, tc := range []struct {
		name string
		pod  *v1.Pod
		want []string
	}{
		// n2: blue's pod keeps red off (and red's term selects blue).
		// n3: the other tenant's namespace does not share nodes.
		{"red", isolated(red, "red-2", ""), []string{"", anti, "", ""}},
		{"blue", isolated(blue, "blue-2", ""), []string{anti, "", "", ""}},
		// A pod without terms in a sharing namespace: the running
		// tenants' terms select it unless it is theirs.
		{"plain red", pod(red.Name, "red-plain", "", map[string]string{"tenant": "red"}, nil), []string{"", existing, "", ""}},
		// Outside the sharing namespaces nobody's terms select it.
		{"other", pod(other.Name, "other-2", "", map[string]string{"tenant": "other"}, nil), []string{"", "", "", ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := create(t, cs, tc.pod)
			if got := filter(t, all, running, n, p); !slices.Equal(got, tc.want) {
				t.Errorf("filter %q, want %q", got, tc.want)
			}
		})
	}
}
