package labtest

import (
	"context"
	"fmt"
	"math/rand"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/tabbynet/tabby/daemon/netpol"
)

// TraceAgreesWithProbes makes n random worlds on the model (pod and
// namespace labels, two to four NetworkPolicies mixing every kind of peer
// and port), and for each asks `tabbyctl policy trace`'s engine for every
// cell of the matrix, then probes the real pods: the packets must do what
// the trace says, every cell. One cell per world also goes through the
// tabbyctl binary, whose exit code must agree.
func TraceAgreesWithProbes(t *testing.T, m *NetpolModel, seed int64, n int) {
	rc, err := clientcmd.BuildConfigFromFlags("", m.Lab.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		r := rand.New(rand.NewSource(seed + int64(i)))
		ok := t.Run(fmt.Sprintf("world %d", seed+int64(i)), func(t *testing.T) {
			m.Reset(t)
			g := traceGen{r: r, m: m}
			g.relabel(t)
			for j := range 2 + r.Intn(3) {
				np := g.policy(j)
				t.Logf("policy %s/%s: %s", np.Namespace, np.Name, describePolicy(np))
				m.CreatePolicy(t, np.Namespace, np)
			}
			w, err := netpol.LoadWorld(context.Background(), rc)
			if err != nil {
				t.Fatal(err)
			}
			want := m.NewReachability(true)
			denied := 0
			want.ExpectFunc(func(from, to *NetpolPod, pp PortProto) (bool, bool) {
				ok := traceVerdict(t, w, from.String(), to.String(), pp)
				if !ok {
					denied++
				}
				return ok, true
			})
			t.Logf("the trace denies %d of %d cells", denied, len(want.want))
			m.Validate(t, "probes agree with the trace", want)
			from, to := m.Pods[r.Intn(len(m.Pods))], m.Pods[r.Intn(len(m.Pods))]
			if from != to {
				pp := NetpolPortProtos[r.Intn(len(NetpolPortProtos))]
				cliAgrees(t, m, from, to, pp, traceVerdict(t, w, from.String(), to.String(), pp))
			}
		})
		if !ok {
			return
		}
	}
}

// traceVerdict is what the trace says of a connection.
func traceVerdict(t *testing.T, w *netpol.World, from, to string, pp PortProto) bool {
	src, err := w.Resolve(from)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := w.Resolve(to)
	if err != nil {
		t.Fatal(err)
	}
	ct, err := w.Trace(src, dst, 4, strings.ToLower(string(pp.Proto)), pp.Port)
	if err != nil {
		t.Fatal(err)
	}
	return ct.Allowed
}

// cliAgrees runs the tabbyctl binary on one cell: exit 0 when allowed, 1
// when denied.
func cliAgrees(t *testing.T, m *NetpolModel, from, to *NetpolPod, pp PortProto, allowed bool) {
	t.Helper()
	bin := m.Lab.State.Binaries.Tabbyctl
	dst := fmt.Sprintf("%s:%d/%s", to, pp.Port, strings.ToLower(string(pp.Proto)))
	out, err := exec.Command(bin, "policy", "trace", from.String(), dst, "--kubeconfig", m.Lab.Kubeconfig).CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running tabbyctl: %v", err)
	}
	want := 1
	if allowed {
		want = 0
	}
	if code != want {
		t.Errorf("tabbyctl policy trace %s %s: exit %d, want %d:\n%s", from, dst, code, want, out)
		return
	}
	t.Logf("tabbyctl policy trace %s %s (exit %d):\n%s", from, dst, code, out)
}

// traceGen makes random labels and policies on the model.
type traceGen struct {
	r *rand.Rand
	m *NetpolModel
}

var (
	traceTiers = []string{"front", "back"}
	traceTeams = []string{"red", "blue"}
)

// relabel gives some pods a tier label and some namespaces a team label.
func (g *traceGen) relabel(t *testing.T) {
	for _, p := range g.m.Pods {
		if g.r.Intn(2) == 0 {
			g.m.LabelPod(t, p.String(), map[string]*string{"tier": ptr.To(traceTiers[g.r.Intn(2)])})
		}
	}
	for _, ns := range g.m.Namespaces {
		if g.r.Intn(2) == 0 {
			g.m.LabelNamespace(t, ns, map[string]*string{"team": ptr.To(traceTeams[g.r.Intn(2)])})
		}
	}
}

func (g *traceGen) selector() *metav1.LabelSelector {
	switch g.r.Intn(4) {
	case 0:
		return &metav1.LabelSelector{}
	case 1:
		return &metav1.LabelSelector{MatchLabels: map[string]string{"pod": []string{"a", "b", "c"}[g.r.Intn(3)]}}
	case 2:
		return &metav1.LabelSelector{MatchLabels: map[string]string{"tier": traceTiers[g.r.Intn(2)]}}
	}
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpDoesNotExist}}}
}

func (g *traceGen) nsSelector() *metav1.LabelSelector {
	if g.r.Intn(2) == 0 {
		return &metav1.LabelSelector{MatchLabels: map[string]string{"ns": g.m.Namespaces[g.r.Intn(len(g.m.Namespaces))]}}
	}
	return &metav1.LabelSelector{MatchLabels: map[string]string{"team": traceTeams[g.r.Intn(2)]}}
}

func (g *traceGen) peer() networkingv1.NetworkPolicyPeer {
	switch g.r.Intn(4) {
	case 0:
		return networkingv1.NetworkPolicyPeer{PodSelector: g.selector()}
	case 1:
		return networkingv1.NetworkPolicyPeer{NamespaceSelector: g.nsSelector()}
	case 2:
		return networkingv1.NetworkPolicyPeer{NamespaceSelector: g.nsSelector(), PodSelector: g.selector()}
	}
	// An ipBlock of a pod's address, or of all pods but one.
	p := g.m.Pods[g.r.Intn(len(g.m.Pods))]
	if g.r.Intn(2) == 0 {
		return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: netip.PrefixFrom(p.IP, 32).String()}}
	}
	wide, _ := p.IP.Prefix(8)
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: wide.String(), Except: []string{netip.PrefixFrom(p.IP, 32).String()}}}
}

func (g *traceGen) ports() []networkingv1.NetworkPolicyPort {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	switch g.r.Intn(5) {
	case 0:
		return nil
	case 1:
		return []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: ptr.To(intstr.FromInt32(80))}}
	case 2:
		return []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: ptr.To(intstr.FromInt32(81))}, {Port: ptr.To(intstr.FromInt32(81))}}
	case 3:
		return []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: ptr.To(intstr.FromString(NetpolPortName(TCP81)))}}
	}
	return []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: ptr.To(intstr.FromInt32(80)), EndPort: ptr.To[int32](81)}}
}

func (g *traceGen) policy(i int) *networkingv1.NetworkPolicy {
	ns := g.m.Namespaces[g.r.Intn(len(g.m.Namespaces))]
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "trace-" + strconv.Itoa(i), Namespace: ns},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: *g.selector()}}
	ingress, egress := g.r.Intn(3) != 1, g.r.Intn(3) != 0
	if ingress {
		np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
		for range g.r.Intn(3) {
			rule := networkingv1.NetworkPolicyIngressRule{Ports: g.ports()}
			for range g.r.Intn(3) {
				rule.From = append(rule.From, g.peer())
			}
			np.Spec.Ingress = append(np.Spec.Ingress, rule)
		}
	}
	if egress {
		np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
		for range g.r.Intn(3) {
			rule := networkingv1.NetworkPolicyEgressRule{Ports: g.ports()}
			for range g.r.Intn(3) {
				rule.To = append(rule.To, g.peer())
			}
			np.Spec.Egress = append(np.Spec.Egress, rule)
		}
	}
	if !ingress && !egress {
		np.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	}
	return np
}

// describePolicy is a policy's spec on one line, for the log.
func describePolicy(np *networkingv1.NetworkPolicy) string {
	return fmt.Sprintf("%+v", np.Spec)
}
