package labtest

// Dual-stack end to end: a lab up --dual-stack, whose nodes, Services and
// pods have an IPv4 and an IPv6 address, and tabbyd routes both.

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
	"k8s.io/utils/ptr"
)

// ipv6BlockSize is the default IPv6 pool's block size.
const ipv6BlockSize = 122

// podIPs is a pod's IPv4 and IPv6 address (status.podIPs), failing the
// test unless it has exactly one of each.
func podIPs(t *testing.T, p *corev1.Pod) (v4, v6 netip.Addr) {
	t.Helper()
	for _, ip := range p.Status.PodIPs {
		a, err := netip.ParseAddr(ip.IP)
		switch {
		case err != nil:
			t.Fatalf("pod %s: podIPs %v: %v", p.Name, p.Status.PodIPs, err)
		case a.Is4() && !v4.IsValid():
			v4 = a
		case a.Is6() && !v6.IsValid():
			v6 = a
		default:
			t.Fatalf("pod %s has podIPs %v, want one IPv4 and one IPv6 address", p.Name, p.Status.PodIPs)
		}
	}
	if !v4.IsValid() || !v6.IsValid() {
		t.Fatalf("pod %s has podIPs %v, want one IPv4 and one IPv6 address", p.Name, p.Status.PodIPs)
	}
	return v4, v6
}

// kubectlExec runs argv in a pod's container with kubectl exec (the API
// server, the node's kubelet and containerd, the agnhost image's
// busybox and nc).
func kubectlExec(l *Lab, pod string, argv ...string) (string, int) {
	return l.Kubectl(append([]string{"exec", pod, "--"}, argv...)...)
}

// reachDual checks that pod from reaches the Web pod to over both
// families: ping, and a TCP connection that gets to's name back.
func reachDual(t *testing.T, l *Lab, from, to *corev1.Pod) {
	t.Helper()
	v4, v6 := podIPs(t, to)
	for _, ip := range []netip.Addr{v4, v6} {
		if out, code := kubectlExec(l, from.Name, "ping", "-c", "1", "-W", "2", ip.String()); code != 0 {
			t.Errorf("ping %s (%s) -> %s (%s): %s", from.Name, from.Spec.NodeName, to.Name, ip, out)
		}
		tcpAnswers(t, l, from.Name, ip, webPort, to.Name)
	}
}

// tcpAnswers checks that a TCP connection from pod to ip:port gets want
// back, trying for a few seconds (Service rules take a moment to reach
// every node).
func tcpAnswers(t *testing.T, l *Lab, pod string, ip netip.Addr, port int, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, code := kubectlExec(l, pod, "nc", "-w", "2", ip.String(), fmt.Sprint(port))
		if code == 0 && strings.TrimSpace(out) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("TCP %s -> %s: exit %d, %q, want %q", pod, netip.AddrPortFrom(ip, uint16(port)), code, out, want)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkRoute6 checks that node has tabby's route (main table, proto 81)
// to the IPv6 block of pod via its node's IPv6 address.
func checkRoute6(t *testing.T, l *Lab, node string, pod *corev1.Pod) {
	t.Helper()
	_, v6 := podIPs(t, pod)
	block := netip.PrefixFrom(v6, ipv6BlockSize).Masked().String()
	line := l.WaitRoute(t, node, block+" ", 15*time.Second)
	want := fmt.Sprintf("%s via %s dev eth0 proto 81 ", block, l.Node(t, pod.Spec.NodeName).IP6())
	if !strings.HasPrefix(line, want) {
		t.Errorf("%s: route %q, want %q...", node, line, want)
	} else {
		t.Logf("%s: %s", node, line)
	}
}

// TestDualStack: a dual-stack lab of 3 nodes (one subnet, full mesh).
// Pods on node1 and node2 get an address of each family and reach each
// other over both (ping and TCP, from inside the pods with kubectl exec),
// along tabbyd's IPv6 routes; a RequireDualStack Service is reached over
// both ClusterIPs from the other node and CoreDNS answers A and AAAA for
// it, also over IPv6. node3 then becomes a route reflector: both families
// still flow over it.
func TestDualStack(t *testing.T) {
	t.Parallel()
	l := Up(t, "--nodes", "3", "--dual-stack")
	start := time.Now()
	for _, n := range l.State.Nodes {
		node, err := l.CS.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var internal []string
		for _, a := range node.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				internal = append(internal, a.Address)
			}
		}
		if got, want := strings.Join(internal, ","), n.NodeIPs(); got != want || n.IP6() == "" {
			t.Errorf("Node %s has InternalIPs %s, want %s", n.Name, got, want)
		}
	}
	waitMesh(t, l, 3, 30*time.Second)
	pods := webs(t, l, 1, 2)
	web1, web2 := pods["web1"], pods["web2"]
	t.Logf("podIPs: web1 %v, web2 %v", web1.Status.PodIPs, web2.Status.PodIPs)
	checkRoute6(t, l, "node1", web2)
	checkRoute6(t, l, "node2", web1)
	reachDual(t, l, web1, web2)
	reachDual(t, l, web2, web1)
	t.Logf("pods on two nodes reach each other over both families %v after lab up", time.Since(start).Round(time.Millisecond))

	svc := dualStackService(t, l, web2)
	t.Logf("Service web (RequireDualStack): ClusterIPs %v", svc.Spec.ClusterIPs)
	for _, ip := range svc.Spec.ClusterIPs {
		tcpAnswers(t, l, web1.Name, netip.MustParseAddr(ip), 80, web2.Name)
	}
	checkDNS(t, l, web1.Name, svc)

	on := "true"
	labelReflector(t, l, "node3", &on)
	for _, n := range []string{"node1", "node2"} {
		l.WaitBGP(t, n, 90*time.Second, Sessions(map[string]string{"node3": "route-reflector"}))
	}
	l.WaitBGP(t, "node3", 30*time.Second, Sessions(map[string]string{"node1": "route-reflector-client", "node2": "route-reflector-client"}))
	checkRoute6(t, l, "node1", web2)
	checkRoute6(t, l, "node2", web1)
	reachDual(t, l, web1, web2)
	reachDual(t, l, web2, web1)
	t.Logf("test done %v after lab up (lab up took %v)", time.Since(start).Round(time.Millisecond), l.UpTime.Round(time.Millisecond))
}

// dualStackService creates the RequireDualStack Service web (port 80) in
// front of pod, a Web pod, and returns it with both ClusterIPs.
func dualStackService(t *testing.T, l *Lab, pod *corev1.Pod) *corev1.Service {
	t.Helper()
	ctx := context.Background()
	if out, code := l.Kubectl("label", "pod", pod.Name, "app=dual"); code != 0 {
		t.Fatalf("labelling %s: %s", pod.Name, out)
	}
	svc, err := l.CS.CoreV1().Services(metav1.NamespaceDefault).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: metav1.NamespaceDefault},
		Spec: corev1.ServiceSpec{
			IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack),
			Selector:       map[string]string{"app": "dual"},
			Ports:          []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt(webPort)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a RequireDualStack Service: %v", err)
	}
	if len(svc.Spec.ClusterIPs) != 2 || svc.Spec.IPFamilies[0] != corev1.IPv4Protocol || svc.Spec.IPFamilies[1] != corev1.IPv6Protocol {
		t.Fatalf("Service web has ClusterIPs %v (families %v), want an IPv4 and an IPv6 one", svc.Spec.ClusterIPs, svc.Spec.IPFamilies)
	}
	return svc
}

// checkDNS checks that CoreDNS answers, to pod, svc's name with its IPv4
// ClusterIP (A) and its IPv6 one (AAAA), asked over kube-dns's IPv4
// address (the pod's resolv.conf) and over its IPv6 one.
func checkDNS(t *testing.T, l *Lab, pod string, svc *corev1.Service) {
	t.Helper()
	dns, err := l.CS.CoreV1().Services("kube-system").Get(context.Background(), "kube-dns", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dns.Spec.ClusterIPs) != 2 {
		t.Fatalf("kube-dns has ClusterIPs %v, want one of each family", dns.Spec.ClusterIPs)
	}
	name := svc.Name + "." + svc.Namespace + ".svc.cluster.local"
	for _, server := range dns.Spec.ClusterIPs {
		for i, qtype := range []string{"A", "AAAA"} {
			out, code := kubectlExec(l, pod, "dig", "+short", "+time=2", "+tries=2", "@"+server, qtype, name)
			if got := strings.TrimSpace(out); code != 0 || got != svc.Spec.ClusterIPs[i] {
				t.Errorf("dig @%s %s %s: exit %d, %q, want %s", server, qtype, name, code, got, svc.Spec.ClusterIPs[i])
			}
		}
	}
}
