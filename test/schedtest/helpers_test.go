package schedtest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// namespace makes a namespace for one test, deleted (with its pods) after.
func namespace(t *testing.T, cs kubernetes.Interface, labels map[string]string) string {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 50 {
		name = name[:50]
	}
	name = strings.Trim(name, "-") + fmt.Sprintf("-%d", time.Now().UnixNano()%100000)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// No kube-controller-manager runs here to make the default
	// ServiceAccount, which admission needs for every pod.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: name}}
	if _, err := cs.CoreV1().ServiceAccounts(name).Create(context.Background(), sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Without a kubelet the pods would wait for one: delete them now.
		_ = cs.CoreV1().Pods(name).DeleteCollection(context.Background(), metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}, metav1.ListOptions{})
		_ = cs.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

// pod makes a pod with labels, changed by opts, in ns.
func pod(t *testing.T, cs kubernetes.Interface, ns, name string, labels map[string]string, opts ...func(*corev1.Pod)) {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
	for _, o := range opts {
		o(p)
	}
	if _, err := cs.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// bound waits until kube-scheduler binds the pod and returns its node.
func bound(t *testing.T, cs kubernetes.Interface, ns, name string) string {
	t.Helper()
	var last *corev1.Pod
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		p, err := cs.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName != "" {
			return p.Spec.NodeName
		}
		last = p
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("pod %s/%s was not scheduled in 60s: %s", ns, name, scheduledCondition(last))
	return ""
}

// unschedulable waits until kube-scheduler gives up on the pod with a
// message that contains each of want; the pod must never be bound.
func unschedulable(t *testing.T, cs kubernetes.Interface, ns, name string, want ...string) {
	t.Helper()
	var last *corev1.Pod
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		p, err := cs.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Spec.NodeName != "" {
			t.Fatalf("pod %s/%s was scheduled to %s; it must not be", ns, name, p.Spec.NodeName)
		}
		last = p
		msg := scheduledCondition(p)
		ok := strings.Contains(msg, "Unschedulable")
		for _, w := range want {
			ok = ok && strings.Contains(msg, w)
		}
		if ok {
			t.Logf("%s: %s", name, msg)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("pod %s/%s: want Unschedulable with %q, got %s", ns, name, want, scheduledCondition(last))
}

func scheduledCondition(p *corev1.Pod) string {
	if p == nil {
		return "(no pod)"
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return fmt.Sprintf("%s %s: %s", c.Status, c.Reason, c.Message)
		}
	}
	return "no PodScheduled condition"
}

func zoneOf(node string) string {
	for _, s := range nodeSpecs {
		if s.name == node {
			return s.zone
		}
	}
	return ""
}

func oneOf(t *testing.T, what, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if got == w {
			return
		}
	}
	t.Errorf("%s landed on %s, want one of %v", what, got, want)
}

func requiredNodeAffinity(reqs ...corev1.NodeSelectorRequirement) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		if p.Spec.Affinity == nil {
			p.Spec.Affinity = &corev1.Affinity{}
		}
		p.Spec.Affinity.NodeAffinity = &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: reqs}}}}
	}
}

func nodeSelector(kv ...string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.NodeSelector = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			p.Spec.NodeSelector[kv[i]] = kv[i+1]
		}
	}
}

func podAffinity(key string, labels map[string]string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Affinity = &corev1.Affinity{PodAffinity: &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{
			{TopologyKey: key, LabelSelector: &metav1.LabelSelector{MatchLabels: labels}}}}}
	}
}

func antiAffinity(key string, labels map[string]string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{
			{TopologyKey: key, LabelSelector: &metav1.LabelSelector{MatchLabels: labels}}}}}
	}
}
