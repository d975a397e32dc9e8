package bench

// The cluster the NetworkPolicy benchmarks (netpol_bench_test.go) program:
// Namespaces, Pods and NetworkPolicies as the API server holds them, and
// what reads the result back from a node's kernel.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	cnpv1 "github.com/tabbynet/tabby/api/cnp/v1beta1"
	"github.com/tabbynet/tabby/daemon/netpol"
	"github.com/tabbynet/tabby/internal/netfilter"
	"github.com/tabbynet/tabby/policy"
)

// The shape of the benchmark cluster.
const (
	// npNamespaces: pods and policies are spread over this many
	// namespaces, np-00 … np-49.
	npNamespaces = 50
	// npKinds: the policy mix repeats every npKinds policies, each
	// namespace getting one of each kind in turn (so 1,000 policies are
	// every kind in every namespace).
	npKinds = 20
	// npApps: pods carry app=app0 … app19.
	npApps = 20
	// npNode is the node being programmed; the other pods are spread over
	// npNode-1 … npNode-49.
	npNode = "bench-np-node"
)

// npWorld is a cluster: what BuildInput reads for a node.
type npWorld struct {
	Namespaces []*corev1.Namespace
	Pods       []*corev1.Pod
	Policies   []*networkingv1.NetworkPolicy
	// ClusterPolicies are ClusterNetworkPolicies (withCNPs).
	ClusterPolicies []*cnpv1.ClusterNetworkPolicy
}

// npNamespace is the name of namespace n.
func npNamespace(n int) string { return fmt.Sprintf("np-%02d", n) }

// newNPWorld is a cluster of pods pods and policies NetworkPolicies over
// npNamespaces namespaces. Pod i is in namespace n = i%50 and has index
// k = i/50 there; it carries app=app<(k+n)%20> and tier=web|api|db
// ((k+n)%3), named container ports http (TCP 8080 or 8081) and metrics
// (TCP 9090); the first two pods of np-00 are the cluster DNS
// (k8s-app=kube-dns, UDP and TCP 53). The pods with k < local/50 (local
// of them, every namespace, app and tier represented once local is 100)
// run on npNode, the others on npNode-1 … npNode-49; so the node's pods
// are the same pods with the same labels whatever the number of pods.
// Namespaces carry team=t<n%5>, env=prod|dev and np-00 role=system, np-01
// role=monitoring.
func newNPWorld(pods, policies, local int) *npWorld {
	w := &npWorld{}
	for n := range npNamespaces {
		name := npNamespace(n)
		labels := map[string]string{
			corev1.LabelMetadataName: name,
			"team":                   fmt.Sprintf("t%d", n%5),
			"env":                    []string{"prod", "dev"}[n%2],
		}
		switch n {
		case 0:
			labels["role"] = "system"
		case 1:
			labels["role"] = "monitoring"
		}
		w.Namespaces = append(w.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}})
	}
	for i := range pods {
		n, k := i%npNamespaces, i/npNamespaces
		node := npNode
		if k >= local/npNamespaces {
			node = fmt.Sprintf("%s-%d", npNode, 1+k%(npNamespaces-1))
		}
		labels := map[string]string{"app": fmt.Sprintf("app%d", (k+n)%npApps), "tier": []string{"web", "api", "db"}[(k+n)%3]}
		ports := []corev1.ContainerPort{
			{Name: "http", ContainerPort: int32(8080 + k%2), Protocol: corev1.ProtocolTCP},
			{Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP},
		}
		if n == 0 && k < 2 {
			labels["k8s-app"] = "kube-dns"
			ports = append(ports, corev1.ContainerPort{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP},
				corev1.ContainerPort{Name: "dns-tcp", ContainerPort: 53, Protocol: corev1.ProtocolTCP})
		}
		w.Pods = append(w.Pods, npPod(npNamespace(n), fmt.Sprintf("pod-%04d", k), node, labels, ports, npPodIP(i)))
	}
	for p := range policies {
		w.Policies = append(w.Policies, npPolicy(p))
	}
	return w
}

// npPodIP is the address of pod i: 10.244.0.10 onwards.
func npPodIP(i int) netip.Addr {
	j := i + 10
	return netip.AddrFrom4([4]byte{10, 244, byte(j >> 8), byte(j)})
}

// npPod is a pod as the API server holds it once the kubelet has reported
// it running with address ip.
func npPod(namespace, name, node string, labels map[string]string, ports []corev1.ContainerPort, ip netip.Addr) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
			Name: "c", Image: "registry.invalid/pause", Ports: ports,
		}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip.String(), PodIPs: []corev1.PodIP{{IP: ip.String()}}},
	}
}

// input is the compiler's input for npNode, built as tabbyd builds it
// (netpol.BuildInput: HostIface from the pod's name), with DenyUnlisted
// as tabbyd's default (--policy-deny-unlisted).
func (w *npWorld) input() *policy.Input { return w.inputWith(nil) }

// inputWith is input built by b, as tabbyd's policy loop builds each
// sync's (nil: BuildInput, without memory).
func (w *npWorld) inputWith(b *netpol.InputBuilder) *policy.Input {
	in := b.Build(npNode, w.Pods, w.Namespaces, w.Policies, nil)
	in.ClusterPolicies = w.ClusterPolicies
	in.DenyUnlisted = true
	return in
}

func sel(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func npPort(proto corev1.Protocol, port intstr.IntOrString, end int32) networkingv1.NetworkPolicyPort {
	p := networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &port}
	if end > 0 {
		p.EndPort = &end
	}
	return p
}

func ipBlock(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

// npPolicy is policy p of the mix: kind p%20 in namespace n = (p/20)%50.
func npPolicy(p int) *networkingv1.NetworkPolicy {
	kind, n := p%npKinds, (p/npKinds)%npNamespaces
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	num := intstr.FromInt32
	named := intstr.FromString
	ingress, egress := networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress
	var name string
	spec := networkingv1.NetworkPolicySpec{}
	switch {
	case kind == 0:
		name = "default-deny-ingress"
		spec.PolicyTypes = []networkingv1.PolicyType{ingress}
	case kind == 1:
		name = "default-deny-egress"
		spec.PolicyTypes = []networkingv1.PolicyType{egress}
	case kind == 2:
		name = "allow-dns"
		spec.PolicyTypes = []networkingv1.PolicyType{egress}
		spec.Egress = []networkingv1.NetworkPolicyEgressRule{{
			To:    []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("role", "system"), PodSelector: sel("k8s-app", "kube-dns")}},
			Ports: []networkingv1.NetworkPolicyPort{npPort(udp, num(53), 0), npPort(tcp, num(53), 0)},
		}}
	case kind == 3:
		name = "allow-egress-in-namespace"
		spec.PolicyTypes = []networkingv1.PolicyType{egress}
		spec.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}}}
	case kind < 14:
		// App-to-app: app A accepts app B of its namespace, on a port
		// range (even m) or the named port http (odd m).
		m := kind - 4
		a, b := (2*m+n)%npApps, (2*m+1+n)%npApps
		name = fmt.Sprintf("app%d-from-app%d", a, b)
		spec.PodSelector = *sel("app", fmt.Sprintf("app%d", a))
		port := npPort(tcp, num(8080), 8081)
		if m%2 == 1 {
			port = npPort(tcp, named("http"), 0)
		}
		spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: sel("app", fmt.Sprintf("app%d", b))}},
			Ports: []networkingv1.NetworkPolicyPort{port},
		}}
	case kind == 14:
		name = "api-from-team-web"
		spec.PodSelector = *sel("tier", "api")
		spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("team", fmt.Sprintf("t%d", n%5)), PodSelector: sel("tier", "web")}},
			Ports: []networkingv1.NetworkPolicyPort{npPort(tcp, named("http"), 0)},
		}}
	case kind == 15:
		name = "db-from-prod-and-api"
		spec.PodSelector = *sel("tier", "db")
		spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("env", "prod")}, {PodSelector: sel("tier", "api")}},
			Ports: []networkingv1.NetworkPolicyPort{npPort(tcp, num(5432), 0)},
		}}
	case kind == 16:
		name = "metrics-from-monitoring"
		spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: sel("role", "monitoring")}},
			Ports: []networkingv1.NetworkPolicyPort{npPort(tcp, named("metrics"), 0)},
		}}
	case kind == 17:
		name = "web-from-load-balancers"
		spec.PodSelector = *sel("tier", "web")
		spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{
				ipBlock("192.168.0.0/16", fmt.Sprintf("192.168.%d.0/24", n)),
				ipBlock(fmt.Sprintf("172.16.%d.0/24", n)),
			},
			Ports: []networkingv1.NetworkPolicyPort{npPort(tcp, num(80), 0), npPort(tcp, num(443), 0)},
		}}
	case kind == 18:
		name = "api-to-databases"
		spec.PodSelector = *sel("tier", "api")
		spec.PolicyTypes = []networkingv1.PolicyType{egress}
		spec.Egress = []networkingv1.NetworkPolicyEgressRule{{
			To:    []networkingv1.NetworkPolicyPeer{ipBlock("10.200.0.0/16", fmt.Sprintf("10.200.%d.0/24", n))},
			Ports: []networkingv1.NetworkPolicyPort{npPort(tcp, num(5432), 5439)},
		}}
	default:
		name = "to-internet"
		spec.PodSelector = *sel("app", fmt.Sprintf("app%d", n%npApps))
		spec.PolicyTypes = []networkingv1.PolicyType{egress}
		spec.Egress = []networkingv1.NetworkPolicyEgressRule{{
			To:    []networkingv1.NetworkPolicyPeer{ipBlock("0.0.0.0/0", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")},
			Ports: []networkingv1.NetworkPolicyPort{npPort(tcp, num(443), 0)},
		}}
	}
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: npNamespace(n), Name: fmt.Sprintf("%s-%d", name, p)},
		Spec:       spec,
	}
}

// withCNPs adds n ClusterNetworkPolicies to w (cnpMix) and returns w.
func (w *npWorld) withCNPs(n int) *npWorld {
	for i := range n {
		w.ClusterPolicies = append(w.ClusterPolicies, npCNP(i))
	}
	return w
}

// npCNP is ClusterNetworkPolicy i of a mix of four kinds over the teams
// (t0 … t4) of newNPWorld's namespaces, even i in the Admin tier and odd
// i in the Baseline tier, priorities spread over 0 … 980 so that several
// share one: deny ingress from the next team; pass web pods of prod
// namespaces to NetworkPolicy on a port range; accept egress to the
// cluster's networks on 443 and 8000-8999, then deny the rest of the
// internet; accept egress to the system namespace's named port dns.
func npCNP(i int) *cnpv1.ClusterNetworkPolicy {
	tier := cnpv1.AdminTier
	if i%2 == 1 {
		tier = cnpv1.BaselineTier
	}
	team := func(t int) *metav1.LabelSelector { return sel("team", fmt.Sprintf("t%d", t%5)) }
	tcp := func(p cnpv1.Port) cnpv1.ClusterNetworkPolicyProtocol {
		return cnpv1.ClusterNetworkPolicyProtocol{TCP: &cnpv1.ClusterNetworkPolicyProtocolTCP{DestinationPort: &p}}
	}
	spec := cnpv1.ClusterNetworkPolicySpec{Tier: tier, Priority: int32(i % 50 * 20),
		Subject: cnpv1.ClusterNetworkPolicySubject{Namespaces: team(i)}}
	switch i % 4 {
	case 0:
		spec.Ingress = []cnpv1.ClusterNetworkPolicyIngressRule{{Action: cnpv1.ActionDeny,
			From: []cnpv1.ClusterNetworkPolicyIngressPeer{{Namespaces: team(i + 1)}}}}
	case 1:
		spec.Ingress = []cnpv1.ClusterNetworkPolicyIngressRule{{Action: cnpv1.ActionPass,
			From:      []cnpv1.ClusterNetworkPolicyIngressPeer{{Pods: &cnpv1.NamespacedPod{NamespaceSelector: *sel("env", "prod"), PodSelector: *sel("tier", "web")}}},
			Protocols: []cnpv1.ClusterNetworkPolicyProtocol{tcp(cnpv1.Port{Range: &cnpv1.PortRange{Start: 8080, End: 8081}})}}}
	case 2:
		spec.Egress = []cnpv1.ClusterNetworkPolicyEgressRule{
			{Action: cnpv1.ActionAccept, To: []cnpv1.ClusterNetworkPolicyEgressPeer{{Networks: []cnpv1.CIDR{"10.0.0.0/8", "fd00::/16"}}},
				Protocols: []cnpv1.ClusterNetworkPolicyProtocol{tcp(cnpv1.Port{Number: 443}), tcp(cnpv1.Port{Range: &cnpv1.PortRange{Start: 8000, End: 8999}})}},
			{Action: cnpv1.ActionDeny, To: []cnpv1.ClusterNetworkPolicyEgressPeer{{Networks: []cnpv1.CIDR{"0.0.0.0/0", "::/0"}}}},
		}
	case 3:
		spec.Egress = []cnpv1.ClusterNetworkPolicyEgressRule{{Action: cnpv1.ActionAccept,
			To:        []cnpv1.ClusterNetworkPolicyEgressPeer{{Namespaces: sel("role", "system")}},
			Protocols: []cnpv1.ClusterNetworkPolicyProtocol{{DestinationNamedPort: "dns"}}}}
	}
	return &cnpv1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cnp-%d", i)}, Spec: spec}
}

// npSize is the size of a Ruleset.
type npSize struct{ rules, chains, sets, members int }

func rulesetSize(rs *policy.Ruleset) npSize {
	s := npSize{chains: len(rs.Chains), sets: len(rs.Sets)}
	for _, c := range rs.Chains {
		s.rules += len(c.Rules)
	}
	for _, set := range rs.Sets {
		s.members += len(set.Members)
	}
	return s
}

// kernelSize counts, in the network namespace of the calling thread, the
// rules of tabby's policy chains (both families) and the jumps to them,
// the chains, tabby's ipsets and their members, from iptables-save,
// ip6tables-save and ipset save.
func kernelSize(ctx context.Context, save4, save6 string) (npSize, error) {
	var s npSize
	for _, argv := range [][]string{{save4, "-t", "filter"}, {save6, "-t", "filter"}, {"ipset", "save"}} {
		out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).Output()
		if err != nil {
			return s, fmt.Errorf("%s: %w", strings.Join(argv, " "), err)
		}
		for line := range strings.Lines(string(out)) {
			switch {
			case strings.HasPrefix(line, ":"+policy.PolicyChainPrefix):
				s.chains++
			case strings.HasPrefix(line, "-A "+policy.PolicyChainPrefix):
				s.rules++
			case strings.HasPrefix(line, "create "+policy.SetPrefix):
				s.sets++
			case strings.HasPrefix(line, "add "+policy.SetPrefix):
				s.members++
			}
		}
	}
	return s, nil
}

// setMember is one member of one of tabby's ipsets, as the kernel is asked
// about it (ipset test) over netlink.
type setMember struct {
	set, member string
	entry       netlink.IPSetEntry
}

// newSetMember parses member as ipset prints members of a set of type t,
// as the applier does for netlink (netfilter.NetlinkEntry).
func newSetMember(set string, t policy.SetType, member string) (setMember, error) {
	e, ok := netfilter.NetlinkEntry(string(t), member)
	if !ok {
		return setMember{}, fmt.Errorf("set %s (%s): member %q is not one netlink carries", set, t, member)
	}
	return setMember{set: set, member: member, entry: e}, nil
}

// membersOf is every member of rs's sets that is about addr (the address
// itself, or addr with a port or an interface), keyed "set member".
func membersOf(rs *policy.Ruleset, addr netip.Addr) (map[string]setMember, error) {
	a := addr.String()
	out := map[string]setMember{}
	for _, s := range rs.Sets {
		for _, m := range s.Members {
			if m != a && !strings.HasPrefix(m, a+",") && !strings.HasPrefix(m, a+"/32,") && m != a+"/32" {
				continue
			}
			sm, err := newSetMember(s.Name, s.Type, m)
			if err != nil {
				return nil, err
			}
			out[s.Name+" "+m] = sm
		}
	}
	return out, nil
}

// ipsetTest asks the ipset command (in the namespace of the calling
// thread) whether m is in its set: the slow, independent check of what
// the netlink poll saw.
func ipsetTest(ctx context.Context, m setMember) (bool, error) {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "ipset", "test", m.set, m.member)
	cmd.Stderr = &stderr
	err := cmd.Run()
	if err == nil {
		return true, nil
	}
	// Exit status 1: not a member, or no such set (any more).
	if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 1 &&
		(strings.Contains(stderr.String(), "is NOT in set") || strings.Contains(stderr.String(), "does not exist")) {
		return false, nil
	}
	return false, fmt.Errorf("ipset test %s %s: %v: %s", m.set, m.member, err, stderr.String())
}

// iperfResult is what iperf3 -J reports at the end of a TCP test.
type iperfResult struct {
	End struct {
		SumReceived struct {
			BitsPerSecond float64 `json:"bits_per_second"`
			Bytes         float64 `json:"bytes"`
		} `json:"sum_received"`
		SumSent struct {
			Retransmits int `json:"retransmits"`
		} `json:"sum_sent"`
	} `json:"end"`
	Error string `json:"error"`
}

func parseIperf(out []byte) (iperfResult, error) {
	var r iperfResult
	if err := json.Unmarshal(out, &r); err != nil {
		return r, fmt.Errorf("iperf3 -J printed no JSON (%v): %.300s", err, out)
	}
	if r.Error != "" {
		return r, fmt.Errorf("iperf3: %s", r.Error)
	}
	if r.End.SumReceived.BitsPerSecond <= 0 {
		return r, fmt.Errorf("iperf3 reports no throughput: %.300s", out)
	}
	return r, nil
}
