package apply_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tabbynet/tabby/internal/iptbackend"
	"github.com/tabbynet/tabby/internal/netnstest"
	"github.com/tabbynet/tabby/policy"
	"github.com/tabbynet/tabby/policy/apply"
)

// bigRuleset is a Ruleset at the scale of issue 4's benchmark: per family
// 1,000 policy chains of 5 rules and a dispatch chain with a rule for each,
// so 2,002 chains and 12,002 rules in all; 2,000 sets (per family 500
// hash:ip and 500 hash:net) with 5,000 members in all.
func bigRuleset() *policy.Ruleset {
	const chains, setsPerKind = 1000, 500
	rs := &policy.Ruleset{
		Jumps: []policy.Jump{{Chain: "FORWARD", Rule: r("-m comment --comment tabby:network-policy -j TABBY-NP-TO-POD")}},
	}
	for fi, fam := range []string{policy.FamilyIPv4, policy.FamilyIPv6} {
		d := "46"[fi : fi+1]
		for s := range setsPerKind {
			p := policy.Set{Name: fmt.Sprintf("tabby-np-p%s-%05d", d, s), Type: policy.SetHashIP, Family: fam}
			n := policy.Set{Name: fmt.Sprintf("tabby-np-n%s-%05d", d, s), Type: policy.SetHashNet, Family: fam}
			for m := range 4 {
				p.Members = append(p.Members, podIP(fi, s*4+m))
			}
			if fi == 0 {
				n.Members = []string{fmt.Sprintf("172.%d.%d.0/24", 16+s/256, s%256)}
			} else {
				n.Members = []string{fmt.Sprintf("fd00:%x::/64", s)}
			}
			rs.Sets = append(rs.Sets, p, n)
		}
		dispatch := policy.Chain{Name: "TABBY-NP-TO-POD", Family: fam}
		for c := range chains {
			name := fmt.Sprintf("TABBY-NP-PI-%05d", c)
			s := c % setsPerKind
			rs.Chains = append(rs.Chains, chain(name, fam,
				fmt.Sprintf("-p tcp -m tcp --dport 80 -m set --match-set tabby-np-p%s-%05d src %s", d, s, mark),
				fmt.Sprintf("-p udp -m udp --dport 53 -m set --match-set tabby-np-p%s-%05d src %s", d, s, mark),
				fmt.Sprintf("-m set --match-set tabby-np-n%s-%05d src %s", d, s, mark),
				"-p tcp -m multiport --dports 8080,8443 "+mark,
				"-m mark --mark 0x10000/0x10000 -j RETURN"))
			dispatch.Rules = append(dispatch.Rules, r(fmt.Sprintf("-o tab%05d -g %s", c, name)))
		}
		rs.Chains = append(rs.Chains, dispatch)
	}
	return rs
}

func podIP(fam, i int) string {
	if fam == 0 {
		return fmt.Sprintf("10.244.%d.%d", i/250, i%250+1)
	}
	return fmt.Sprintf("fd00:10:244::%x", i+1)
}

// moveMember moves the first member of set a to set b (a pod relabelled
// out of one selector into another).
func moveMember(rs *policy.Ruleset, a, b int) {
	m := rs.Sets[a].Members[0]
	rs.Sets[a].Members = slices.Clone(rs.Sets[a].Members[1:])
	rs.Sets[b].Members = append(slices.Clone(rs.Sets[b].Members), m)
}

func benchApply(b *testing.B, n ns.NetNS, a *apply.Applier, rs *policy.Ruleset) apply.Stats {
	b.Helper()
	var st apply.Stats
	var err error
	_ = n.Do(func(ns.NetNS) error {
		st, err = a.Apply(context.Background(), rs)
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return st
}

func newBenchApplier(b *testing.B, n ns.NetNS, be iptbackend.Backend) *apply.Applier {
	b.Helper()
	var a *apply.Applier
	err := n.Do(func(ns.NetNS) error {
		var err error
		a, err = apply.New(apply.Options{Backend: &be, Logger: testLogger(b)})
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return a
}

// BenchmarkApplyIncremental: changes to a namespace holding bigRuleset. It
// runs before BenchmarkApplyFullSync, whose namespaces the kernel tears
// down in the background, slowing whatever runs next.
func BenchmarkApplyIncremental(b *testing.B) {
	needRoot(b)
	rs := bigRuleset()
	for _, be := range backends(b) {
		b.Run(string(be.Mode), func(b *testing.B) { benchIncremental(b, be, rs) })
	}
}

// BenchmarkApplyFullSync: bigRuleset into a fresh namespace.
func BenchmarkApplyFullSync(b *testing.B) {
	needRoot(b)
	rs := bigRuleset()
	for _, be := range backends(b) {
		b.Run(string(be.Mode), func(b *testing.B) {
			var phases [4]time.Duration
			defer func() {
				for i, name := range []string{"read", "ipset", "chains", "jumps"} {
					b.ReportMetric(float64(phases[i].Nanoseconds())/float64(b.N), name+"-ns/op")
				}
			}()
			for b.Loop() {
				b.StopTimer()
				n := netnstest.New(b, "apply-bench")
				a := newBenchApplier(b, n, be)
				b.StartTimer()
				st := benchApply(b, n, a, rs)
				b.StopTimer()
				if st.ChainsWritten != 2002 || st.SetsCreated != 2000 || st.MembersAdded != 5000 {
					b.Errorf("full sync: %+v", st)
				}
				phases[0] += st.ReadTime
				phases[1] += st.SetsTime
				phases[2] += st.ChainsTime
				phases[3] += st.JumpsTime
				n.Remove()
				b.StartTimer()
			}
		})
	}
}

func benchIncremental(b *testing.B, be iptbackend.Backend, rs *policy.Ruleset) {
	n := netnstest.New(b, "apply-bench")
	a := newBenchApplier(b, n, be)
	benchApply(b, n, a, rs)

	// A pod label flip: one member moves between two sets.
	b.Run("member-move", func(b *testing.B) {
		cur := rs
		i := 0
		var sets time.Duration
		for b.Loop() {
			b.StopTimer()
			next := *cur
			next.Sets = slices.Clone(cur.Sets)
			if i%2 == 0 {
				moveMember(&next, 0, 2)
			} else {
				moveMember(&next, 2, 0)
			}
			i++
			cur = &next
			b.StartTimer()
			st := benchApply(b, n, a, cur)
			if st.Restores != 0 || st.MembersAdded != 1 || st.MembersRemoved != 1 {
				b.Errorf("member move: %+v", st)
			}
			sets += st.SetsTime
		}
		b.ReportMetric(float64(sets.Nanoseconds())/float64(b.N), "ipset-ns/op")
		// Back to rs for the next sub-benchmark.
		benchApply(b, n, a, rs)
	})

	// A policy changed: one chain's rule in each family.
	b.Run("one-chain-change", func(b *testing.B) {
		i := 0
		var chains time.Duration
		for b.Loop() {
			b.StopTimer()
			next := *rs
			next.Chains = slices.Clone(rs.Chains)
			for j, c := range next.Chains {
				if c.Name == "TABBY-NP-PI-00007" {
					c.Rules = slices.Clone(c.Rules)
					c.Rules[3] = r(fmt.Sprintf("-p tcp -m multiport --dports 8080,%d %s", 9000+i%2, mark))
					next.Chains[j] = c
				}
			}
			i++
			b.StartTimer()
			st := benchApply(b, n, a, &next)
			if st.ChainsWritten != 2 {
				b.Errorf("one chain changed: %+v", st)
			}
			chains += st.ChainsTime
		}
		b.ReportMetric(float64(chains.Nanoseconds())/float64(b.N), "chains-ns/op")
		benchApply(b, n, a, rs)
	})

	// The periodic resync: the kernel read again, nothing to change.
	b.Run("resync-unchanged", func(b *testing.B) {
		var read time.Duration
		for b.Loop() {
			a.Invalidate()
			st := benchApply(b, n, a, rs)
			if st.Changed() != 0 || !st.KernelRead {
				b.Errorf("resync: %+v", st)
			}
			read += st.ReadTime
		}
		b.ReportMetric(float64(read.Nanoseconds())/float64(b.N), "read-ns/op")
	})

	// CheckJumps, as the controller runs it periodically.
	b.Run("check-jumps", func(b *testing.B) {
		for b.Loop() {
			var got int
			var err error
			_ = n.Do(func(ns.NetNS) error {
				got, err = a.CheckJumps(context.Background())
				return nil
			})
			if err != nil || got != 0 {
				b.Errorf("CheckJumps = %d, %v", got, err)
			}
		}
	})
}

// churnInput is one node's compiler input as tabbyd builds it with
// --policy-deny-unlisted: local pods local pods in 10 namespaces (labels
// app0..app9, so a few pods share each combination of policies), 20
// NetworkPolicies (a default deny for ingress in half the namespaces, an
// allow from app+1 on TCP 8080 and an egress to DNS), and as many remote
// pods as peers.
func churnInput(local int) *policy.Input {
	in := &policy.Input{Node: "n1", DenyUnlisted: true}
	for i := range 10 {
		in.Namespaces = append(in.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns%d", i)}})
	}
	for i := range 2 * local {
		p := churnPod(fmt.Sprintf("ns%d", i%10), fmt.Sprintf("pod%d", i), fmt.Sprintf("app%d", (i/10)%10))
		e := policy.Endpoint{Pod: p, IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}), netip.AddrFrom16([16]byte{0xfd, 0, 14: byte(i >> 8), 15: byte(i)})}}
		if i < local {
			e.HostIface = fmt.Sprintf("tab%011x", i)
		}
		in.Endpoints = append(in.Endpoints, e)
	}
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	p8080, p53 := intstr.FromInt32(8080), intstr.FromInt32(53)
	for i := range 20 {
		ns := fmt.Sprintf("ns%d", i%10)
		var np *networkingv1.NetworkPolicy
		switch {
		case i < 5:
			np = &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
		case i < 15:
			np = &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app%d", i%10)}},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app%d", (i+1)%10)}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p8080}},
				}},
			}}
		default:
			np = &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app%d", i%10)}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
				Egress: []networkingv1.NetworkPolicyEgressRule{{
					To:    []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "ns0"}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: &p53}},
				}},
			}}
		}
		np.Namespace, np.Name = ns, fmt.Sprintf("policy%d", i)
		in.Policies = append(in.Policies, np)
	}
	return in
}

func churnPod(ns, name, app string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": app}}}
}

// BenchmarkLocalPodChurn: what a local pod's CNI ADD or DEL costs the
// node's policy sync (Compile and Apply, as tabbyd runs them) on a node
// with 100 local pods under churnInput's policies: every iteration a new
// local pod appears (even iterations) or goes (odd ones). "unselected": no
// policy selects it; "selected": policies already selecting other pods
// select it too. It reports how many chains were rewritten per op.
func BenchmarkLocalPodChurn(b *testing.B) {
	needRoot(b)
	for _, be := range backends(b) {
		b.Run(string(be.Mode), func(b *testing.B) {
			for _, c := range []struct{ name, ns, app string }{{"unselected", "ns7", "none"}, {"selected", "ns2", "app2"}} {
				b.Run(c.name, func(b *testing.B) {
					n := netnstest.New(b, "apply-bench")
					a := newBenchApplier(b, n, be)
					base := churnInput(100)
					with := *base
					with.Endpoints = append(slices.Clone(base.Endpoints), policy.Endpoint{
						Pod:       churnPod(c.ns, "churn", c.app),
						IPs:       []netip.Addr{netip.MustParseAddr("10.244.200.1"), netip.MustParseAddr("fd00::c8:1")},
						HostIface: "tabffffffffff0",
					})
					benchApply(b, n, a, policy.Compile(base))
					chains, restores := 0, 0
					i := 0
					for b.Loop() {
						in := base
						if i%2 == 0 {
							in = &with
						}
						i++
						st := benchApply(b, n, a, policy.Compile(in))
						chains += st.ChainsWritten
						restores += st.Restores
					}
					b.ReportMetric(float64(chains)/float64(b.N), "chains-written/op")
					b.ReportMetric(float64(restores)/float64(b.N), "iptables-restores/op")
				})
			}
		})
	}
}

// hostileInput is churnInput(20) plus issue 11's policy: egress of one
// namespace's pods to 0.0.0.0/0 and (with v6) ::/0, each with 11,000
// excepts spread over the address space.
func hostileInput(v6 bool) *policy.Input {
	in := churnInput(20)
	var v4x, v6x []string
	for i := 0; len(v4x) < 11000; i++ {
		x := uint32(i) * 390451 &^ 1
		a := [4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)}
		if a[0] == 10 {
			continue
		}
		v4x = append(v4x, netip.PrefixFrom(netip.AddrFrom4(a), 31).String())
		v6x = append(v6x, netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, a[0], a[1], a[2], a[3], 14: byte(i >> 8), 15: byte(i) &^ 1}), 127).String())
	}
	peers := []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: v4x}}}
	if v6 {
		peers = append(peers, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "::/0", Except: v6x}})
	}
	in.Policies = append(in.Policies, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns3", Name: "hostile"},
		Spec: networkingv1.NetworkPolicySpec{
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress:      []networkingv1.NetworkPolicyEgressRule{{To: peers}},
		},
	})
	return in
}

// BenchmarkHostilePolicySync: a node's whole first sync (Compile, then
// Apply into a fresh namespace) with issue 11's policy next to
// churnInput's: its IPv4 half alone, and both halves. It reports the set
// members of the whole ruleset and the time of each phase.
func BenchmarkHostilePolicySync(b *testing.B) {
	needRoot(b)
	be := backends(b)[0]
	for _, c := range []struct {
		name string
		v6   bool
	}{{"v4", false}, {"v4+v6", true}} {
		b.Run(c.name, func(b *testing.B) {
			in := hostileInput(c.v6)
			var compile, apply time.Duration
			members := 0
			for b.Loop() {
				b.StopTimer()
				n := netnstest.New(b, "apply-bench")
				a := newBenchApplier(b, n, be)
				b.StartTimer()
				start := time.Now()
				rs := policy.Compile(in)
				compiled := time.Now()
				benchApply(b, n, a, rs)
				compile += compiled.Sub(start)
				apply += time.Since(compiled)
				b.StopTimer()
				members = 0
				for _, s := range rs.Sets {
					members += len(s.Members)
				}
				n.Remove()
				b.StartTimer()
			}
			b.ReportMetric(float64(members), "members")
			b.ReportMetric(float64(compile.Nanoseconds())/float64(b.N), "compile-ns/op")
			b.ReportMetric(float64(apply.Nanoseconds())/float64(b.N), "apply-ns/op")
		})
	}
}
