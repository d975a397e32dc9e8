package policy

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// scaleInput is a cluster of pods pods in 50 namespaces over nodes nodes
// (n1 has pods/nodes of them, from every namespace), with policies
// NetworkPolicies of five kinds spread over the namespaces: pod selector
// peers with numeric ports, namespace-and-pod selector peers with a named
// port, ipBlock with except and an endPort range in egress, default deny,
// and DNS egress to one namespace.
func scaleInput(pods, policies, nodes int) *Input {
	return scaleInputReplicas(pods, policies, nodes, 1)
}

// scaleInputReplicas makes every pod replicas times: same labels, own name
// and addresses, same node.
func scaleInputReplicas(pods, policies, nodes, replicas int) *Input {
	const namespaces = 50
	in := &Input{Node: "n1"}
	for i := 0; i < namespaces; i++ {
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name:   fmt.Sprintf("ns%d", i),
			Labels: map[string]string{"team": fmt.Sprintf("t%d", i%5), "env": []string{"prod", "dev"}[i%2]},
		}})
	}
	tiers := []string{"web", "api", "db"}
	for i := 0; i < pods; i++ {
		ns := i % namespaces
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", ns), Name: fmt.Sprintf("pod%d", i), Labels: map[string]string{
				"app":  fmt.Sprintf("app%d", (i/namespaces)%20),
				"tier": tiers[i%3],
			}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{
				{Name: "http", ContainerPort: int32(8080 + i%2), Protocol: corev1.ProtocolTCP},
				{Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP},
			}}}},
		}
		for r := 0; r < replicas; r++ {
			j := i*replicas + r
			p := pod
			if r > 0 {
				p = pod.DeepCopy()
				p.Name = fmt.Sprintf("pod%d-%d", i, r)
			}
			e := Endpoint{Pod: p, IPs: []netip.Addr{
				netip.AddrFrom4([4]byte{10, byte(j >> 16), byte(j >> 8), byte(j)}),
				netip.AddrFrom16([16]byte{0xfd, 0, 13: byte(j >> 16), 14: byte(j >> 8), 15: byte(j)}),
			}}
			if (i/50+i)%nodes == 0 { // spread over namespaces and apps
				e.HostIface = fmt.Sprintf("tab%011x", j)
			}
			in.Endpoints = append(in.Endpoints, e)
		}
	}
	for i := 0; i < policies; i++ {
		ns := fmt.Sprintf("ns%d", i%namespaces)
		app := fmt.Sprintf("app%d", (i/namespaces)%20)
		peerApp := fmt.Sprintf("app%d", (i/namespaces+1)%20)
		var p *networkingv1.NetworkPolicy
		switch i % 5 {
		case 0:
			p = pol(ns, "", ml("app", app), ingress(peers{selPeer(mlp("app", peerApp))}, num("TCP", 8080), num("TCP", 8081)))
		case 1:
			p = pol(ns, "", ml("app", app, "tier", "api"), ingress(peers{bothPeer(mlp("team", fmt.Sprintf("t%d", i%5)), mlp("tier", "web"))}, named("TCP", "http")))
		case 2:
			p = pol(ns, "", ml("tier", "db"), types(tIn, tEg),
				ingress(peers{selPeer(mlp("tier", "api"))}, num("TCP", 5432)),
				egress(peers{ipPeer("10.0.0.0/8", "10.1.0.0/16", "10.2.3.0/24"), ipPeer("fd00::/16", "fd00::/112")}, rng("TCP", 443, 444)))
		case 3:
			p = pol(ns, "", all, types(tIn))
		case 4:
			p = pol(ns, "", ml("app", app), types(tEg), egress(peers{nsPeer(mlp("kubernetes.io/metadata.name", "ns0"))}, num("UDP", 53), num("TCP", 53)))
		}
		p.Name = fmt.Sprintf("policy%d", i)
		in.Policies = append(in.Policies, p)
	}
	return in
}

// addScaleCNPs adds n ClusterNetworkPolicies of four kinds, half Admin,
// half Baseline, over the teams of scaleInput's namespaces: deny ingress
// from another team, pass a tier's pods to NetworkPolicy, deny egress to
// the internet after accepting the cluster's networks on some ports, and
// accept DNS to ns0 by named port.
func addScaleCNPs(in *Input, n int) {
	for i := 0; i < n; i++ {
		tier, team := admin, mlp("team", fmt.Sprintf("t%d", i%5))
		if i%2 == 1 {
			tier = baseline
		}
		var opts []cnpOpt
		switch i % 4 {
		case 0:
			opts = append(opts, cin(deny, cpeers{pNs(mlp("team", fmt.Sprintf("t%d", (i+1)%5)))}))
		case 1:
			opts = append(opts, cin(pass, cpeers{pPods(*mlp("env", "prod"), ml("tier", "web"))}, cTCPRange(8080, 8081)))
		case 2:
			opts = append(opts, ceg(accept, cpeers{pNets("10.0.0.0/8", "fd00::/16")}, cTCP(443), cTCPRange(8000, 8999)),
				ceg(deny, cpeers{pNets("0.0.0.0/0", "::/0")}))
		case 3:
			opts = append(opts, ceg(accept, cpeers{pNs(mlp("kubernetes.io/metadata.name", "ns0"))}, cNamed("http")))
		}
		in.ClusterPolicies = append(in.ClusterPolicies, cnp(fmt.Sprintf("cnp%d", i), tier, int32(i%50*20), subjNs(team), opts...))
	}
}

func rulesetSize(rs *Ruleset) (rules, sets, members int) {
	for _, c := range rs.Chains {
		rules += len(c.Rules)
	}
	for _, s := range rs.Sets {
		members += len(s.Members)
	}
	return rules, len(rs.Sets), members
}

// BenchmarkCompile: 1,000 policies over 5,000 pods, for a node with 100 of
// the pods (50 nodes) and, as the worst case, for one node with all of them.
// It reports the Ruleset's size (both families) alongside time and
// allocations.
func BenchmarkCompile(b *testing.B) {
	for _, c := range []struct {
		name        string
		nodes, cnps int
	}{{"5000pods-1000policies-100local", 50, 0}, {"5000pods-1000policies-5000local", 1, 0},
		{"5000pods-1000policies-100cnps-100local", 50, 100}, {"5000pods-1000policies-100cnps-5000local", 1, 100}} {
		b.Run(c.name, func(b *testing.B) {
			in := scaleInput(5000, 1000, c.nodes)
			addScaleCNPs(in, c.cnps)
			b.ReportAllocs()
			b.ResetTimer()
			var rs *Ruleset
			for i := 0; i < b.N; i++ {
				rs = Compile(in)
			}
			b.StopTimer()
			if len(rs.Problems) > 0 {
				b.Fatalf("problems: %v", rs.Problems[0])
			}
			rules, sets, members := rulesetSize(rs)
			b.ReportMetric(float64(rules), "rules")
			b.ReportMetric(float64(sets), "sets")
			b.ReportMetric(float64(members), "members")
			b.ReportMetric(float64(len(rs.Programmed)), "local-pods")
		})
	}
}

// TestRulesGrowWithPoliciesNotPods: more replicas of the same pods under
// the same policies add set members only, not a single rule or set (local
// pods are dispatched by set); more policies add rules in proportion.
func TestRulesGrowWithPoliciesNotPods(t *testing.T) {
	for _, deny := range []bool{false, true} {
		in1, in5 := scaleInputReplicas(1000, 200, 1, 1), scaleInputReplicas(1000, 200, 1, 5)
		in1.DenyUnlisted, in5.DenyUnlisted = deny, deny
		one, five := Compile(in1), Compile(in5)
		checkRuleset(t, one)
		checkRuleset(t, five)
		r1, s1, m1 := rulesetSize(one)
		r5, s5, m5 := rulesetSize(five)
		t.Logf("DenyUnlisted %v: 1000 local pods: %d rules, %d sets, %d members; 5000 local pods (5 replicas): %d rules, %d sets, %d members",
			deny, r1, s1, m1, r5, s5, m5)
		if !reflect.DeepEqual(one.Chains, five.Chains) || s5 != s1 {
			t.Errorf("DenyUnlisted %v: chains or sets grew with replicas: %d -> %d rules, %d -> %d sets", deny, r1, r5, s1, s5)
		}
		podMembers := func(rs *Ruleset) (n int) {
			for _, s := range rs.Sets {
				if s.Type != SetHashNet {
					n += len(s.Members)
				}
			}
			return n
		}
		if podMembers(five) != 5*podMembers(one) {
			t.Errorf("DenyUnlisted %v: pod members %d -> %d: want 5 times", deny, podMembers(one), podMembers(five))
		}
	}
	p1, _, _ := rulesetSize(Compile(scaleInput(5000, 500, 50)))
	p2, _, _ := rulesetSize(Compile(scaleInput(5000, 1000, 50)))
	t.Logf("5000 pods, 100 local: 500 policies %d rules, 1000 policies %d rules", p1, p2)
}

// BenchmarkCompileLabelFlip: one pod's labels flip (a new Pod object, as
// informers give) and the node's Ruleset is compiled again, by Compile
// and by an Incremental that compiled the world before; 5,000 pods, 1,000
// policies, 100 local.
func BenchmarkCompileLabelFlip(b *testing.B) {
	for _, c := range []struct {
		name    string
		compile func(*Input) *Ruleset
	}{{"full", Compile}, {"incremental", NewIncremental().Compile}} {
		b.Run(c.name, func(b *testing.B) {
			in := scaleInput(5000, 1000, 50)
			c.compile(in)
			labels := [2]map[string]string{in.Endpoints[7].Pod.Labels, {"app": "app3", "tier": "db"}}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				p := in.Endpoints[7].Pod.DeepCopy()
				p.Labels = labels[i%2]
				in.Endpoints[7].Pod = p
				c.compile(in)
			}
		})
	}
}
