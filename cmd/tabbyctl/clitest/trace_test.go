package clitest

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tabbynet/tabby/daemon/netpol"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/ipam"
)

// TestPolicyTrace runs `tabbyctl policy trace` against pods, a
// NetworkPolicy and IPAM blocks in the API server: its verdicts and exit
// codes, the policy and rule it names, --explain, -o json, and the errors
// for what does not exist.
func TestPolicyTrace(t *testing.T) {
	ds, _ := fresh(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The control plane makes the default ServiceAccount, which pods need,
	// only in namespace default.
	const ns = "default"
	alloc := ipam.New(ds)
	for _, p := range []struct{ name, node, app string }{{"client", "cli-node", "client"}, {"web", "cli-node", "web"}, {"other", "cli-node2", "other"}} {
		_, err := ds.Pods(ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: ns, Labels: map[string]string{"app": p.app}},
			Spec:       corev1.PodSpec{NodeName: p.node, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			zero := int64(0)
			_ = ds.Pods(ns).Delete(context.Background(), p.name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		})
		if _, err := alloc.Assign(ctx, ipam.Request{HandleID: "trace." + p.name, Node: p.node, Namespace: ns, Pod: p.name, IPv4: true}); err != nil {
			t.Fatal(err)
		}
	}
	pc, err := netpol.NewPolicyClient(clustertest.Config(t), ns)
	if err != nil {
		t.Fatal(err)
	}
	tcp, port := corev1.ProtocolTCP, intstr.FromInt32(80)
	_, err = pc.Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "web-from-client", Namespace: ns},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Delete(context.Background(), "web-from-client", metav1.DeleteOptions{}) })

	for _, c := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"allowed by the policy's rule", []string{"default/client", "default/web:80"}, 0,
			[]string{"ALLOWED", "ingress to default/web: allow: allowed by default/web-from-client", "rule: -p tcp -m tcp --dport 80", "egress from default/client: allow: no egress policy selects the pod"}},
		{"another port", []string{"default/client", "default/web:81"}, 1,
			[]string{"DENIED", "ingress to default/web: deny: selected by default/web-from-client: no rule of these allows it"}},
		{"another pod, on another node", []string{"default/other", "default/web:80/tcp"}, 1, []string{"DENIED"}},
		{"ping", []string{"default/client", "default/web"}, 1, []string{"ping (ICMP echo)", "DENIED"}},
		{"to an unselected pod", []string{"default/web", "default/other:9000/udp"}, 0, []string{"ALLOWED"}},
		{"explain", []string{"default/other", "default/web:80", "--explain"}, 1,
			[]string{"default/web-from-client selects it for Ingress: podSelector {app=web} matches", "default/web-from-client does not select it: podSelector {app=web} does not match the pod's labels app=other"}},
		{"wide", []string{"default/client", "default/web:80", "-o", "wide"}, 0, []string{"rules on cli-node", "TABBY-NP-TO-POD"}},
		{"no such pod", []string{"default/client", "default/nosuch:80"}, 2, []string{"no pod default/nosuch"}},
		{"no pods at all", []string{"192.0.2.1", "192.0.2.2:80"}, 2, []string{"neither 192.0.2.1 nor 192.0.2.2 is a pod"}},
		{"bad port", []string{"default/client", "default/web:http"}, 2, []string{`port "http" is not a number`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := ctl(t, append([]string{"policy", "trace"}, c.args...)...)
			if r.code != c.code {
				t.Fatalf("exit %d, want %d:\n%s", r.code, c.code, r)
			}
			for _, w := range c.want {
				if !strings.Contains(r.stdout+r.stderr, w) {
					t.Errorf("the output lacks %q:\n%s", w, r)
				}
			}
		})
	}

	r := ctl(t, "policy", "trace", "default/client", "default/web:81", "-o", "json")
	if r.code != 1 {
		t.Fatalf("-o json: exit %d, want 1:\n%s", r.code, r)
	}
	var rep netpol.TraceReport
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("-o json does not decode into the report: %v\n%s", err, r.stdout)
	}
	if rep.Allowed || rep.Ingress == nil || rep.Ingress.Verdict != "deny" || rep.Egress == nil || rep.Egress.Verdict != "allow" || len(rep.Hops) != 1 {
		t.Errorf("-o json: %+v", rep)
	}
}
