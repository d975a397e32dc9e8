package labtest

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tabbynet/tabby/lab"
)

// SmokePort is where Smoke's servers listen.
const SmokePort = 8080

// Smoke checks what every cluster with tabby must do, as users see it:
// tabby-node ready on every node, a pod on every node, and from a pod on
// the first node: each pod over TCP and ping (across nodes: BGP-learned
// routes), a ClusterIP Service by its DNS name (CoreDNS and kube-proxy) and
// a hostPort (portmap); from every node, its pods and the others'. prefix
// names its pods (smoke-<prefix>-...), which it deletes at the end.
func Smoke(t *testing.T, l *Lab, prefix string) {
	t.Helper()
	ctx := context.Background()
	nodes := len(l.State.Nodes)
	ds, err := l.CS.AppsV1().DaemonSets("tabby-system").Get(ctx, "tabby-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if int(ds.Status.NumberReady) != nodes || int(ds.Status.DesiredNumberScheduled) != nodes {
		t.Errorf("DaemonSet tabby-node: %d of %d ready", ds.Status.NumberReady, ds.Status.DesiredNumberScheduled)
	}
	var names []string
	for i, n := range l.State.Nodes {
		name := fmt.Sprintf("smoke-%s-%d", prefix, i+1)
		names = append(names, name)
		p := Web(name, n.Name, SmokePort)
		p.Labels = map[string]string{"smoke": prefix}
		if i == nodes-1 {
			p.Labels["smoke-svc"] = prefix
			p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, corev1.ContainerPort{ContainerPort: SmokePort, HostPort: 18080 + int32(len(prefix))})
		}
		l.Create(t, p)
	}
	svcName := "smoke-" + prefix
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svcName, Namespace: metav1.NamespaceDefault},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"smoke-svc": prefix},
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt(SmokePort)}},
		},
	}
	if _, err := l.CS.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = l.CS.CoreV1().Services(metav1.NamespaceDefault).Delete(context.Background(), svcName, metav1.DeleteOptions{})
		for _, n := range names {
			_ = l.CS.CoreV1().Pods(metav1.NamespaceDefault).Delete(context.Background(), n, metav1.DeleteOptions{})
		}
	})
	var pods []*corev1.Pod
	for _, n := range names {
		pods = append(pods, l.WaitPod(t, n, 2*time.Minute, Running(true)))
	}
	from := names[0]
	for _, p := range pods {
		if out, code := l.Exec(from, "ping", "-c", "1", "-W", "2", p.Status.PodIP); code != 0 {
			t.Errorf("ping %s (%s on %s) from %s: %s", p.Name, p.Status.PodIP, p.Spec.NodeName, from, out)
		}
		if got, err := l.Probe(from, "tcp", netip.AddrPortFrom(netip.MustParseAddr(p.Status.PodIP), SmokePort).String()); err != nil || got != p.Name {
			t.Errorf("TCP to %s on %s from %s: %q %v", p.Name, p.Spec.NodeName, from, got, err)
		}
	}
	// By name, through CoreDNS, kube-proxy's ClusterIP and across nodes,
	// inside the pod's own container (kubectl exec through the API server
	// and the kubelet).
	last := pods[len(pods)-1]
	var out string
	deadline := time.Now().Add(30 * time.Second)
	for {
		var code int
		out, code = l.Kubectl("exec", from, "--", "nc", "-w", "2", svcName, "80")
		if code == 0 && strings.TrimSpace(out) == last.Name {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("Service %s by name from %s: exit %d, %q (want %s)", svcName, from, code, out, last.Name)
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	// hostPort: the node's address, from a pod on another node.
	hp := netip.AddrPortFrom(netip.MustParseAddr(last.Status.HostIP), uint16(18080+len(prefix))).String()
	if got, err := l.Probe(from, "tcp", hp); err != nil || got != last.Name {
		t.Errorf("hostPort %s of %s from %s: %q %v", hp, last.Name, from, got, err)
	}
	// Node to pod: every node reaches every pod.
	for _, n := range l.State.Nodes {
		for _, p := range pods {
			if out, code := l.NodeExec(t, n.Name, "ping", "-c", "1", "-W", "2", p.Status.PodIP); code != 0 {
				t.Errorf("ping %s on %s from node %s: %s", p.Name, p.Spec.NodeName, n.Name, out)
			}
		}
	}
}

// InstallCNILog is the install-cni container's log of a node's tabby-node
// pod.
func (l *Lab) InstallCNILog(t testing.TB, node string) string {
	t.Helper()
	pods, err := l.CS.CoreV1().Pods("tabby-system").List(context.Background(), metav1.ListOptions{
		LabelSelector: lab.TabbyNodeLabel, FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("the tabby-node pod of %s: %v", node, err)
	}
	out, code := l.Kubectl("-n", "tabby-system", "logs", pods.Items[0].Name, "-c", "install-cni")
	if code != 0 {
		t.Fatalf("kubectl logs install-cni on %s: %s", node, out)
	}
	return out
}

// AddressHolder says which pod ("namespace/name") IPAM has ip allocated to,
// "" when it is free (or in no block).
func (l *Lab) AddressHolder(t testing.TB, ip netip.Addr) string {
	t.Helper()
	blocks, err := l.DS(t).IPAMBlocks.List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks.Items {
		p, err := netip.ParsePrefix(b.Spec.CIDR)
		if err != nil || !p.Contains(ip) {
			continue
		}
		ord := 0
		for a := p.Addr(); a != ip; a = a.Next() {
			ord++
		}
		if ord >= len(b.Spec.Allocations) || b.Spec.Allocations[ord] < 0 || b.Spec.Allocations[ord] >= len(b.Spec.Attributes) {
			return ""
		}
		attr := b.Spec.Attributes[b.Spec.Allocations[ord]]
		return attr.Namespace + "/" + attr.Pod
	}
	return ""
}
