package apply_test

import (
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/daemon/nflog"
	"github.com/tabbynet/tabby/internal/iptbackend"
	"github.com/tabbynet/tabby/policy"
	"github.com/tabbynet/tabby/policy/apply"
)

// TestDeniedLogged: with policy.Input.DeniedLog, the compiler's rules as
// the applier loads them send a denied packet to the NFLOG group with the
// prefix of the Denial naming the policy that isolates its destination
// (IPv4 and IPv6), or the egress policy of its source, and allowed
// connections are not logged. Every backend.
func TestDeniedLogged(t *testing.T) {
	needRoot(t)
	forEachBackend(t, testDeniedLogged)
}

func testDeniedLogged(t *testing.T, b iptbackend.Backend) {
	n := newNode(t, b, apply.Options{})
	n.forwarding()
	a, srv := n.addPod("a", "taba", 1), n.addPod("s", "tabs", 2)
	serve(t, a, srv)
	in := &policy.Input{Node: "n1", DeniedLog: &policy.DeniedLog{Group: 9}, Policies: []*networkingv1.NetworkPolicy{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "s-deny-all"},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "s"}}},
	}}}
	for _, p := range []*tpod{a, srv} {
		in.Endpoints = append(in.Endpoints, policy.Endpoint{
			Pod:       &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: p.name, Labels: map[string]string{"app": p.name}}},
			IPs:       []netip.Addr{p.v4, p.v6},
			HostIface: p.veth,
		})
	}
	rs := policy.Compile(in)
	if len(rs.Denials) != 1 || rs.Denials[0].Policies[0] != "x/s-deny-all" {
		t.Fatalf("Denials %+v, want the one of x/s-deny-all", rs.Denials)
	}
	n.apply(rs)
	got := n.readLog(t, 9)

	for fam := range 2 {
		if err := connect(srv, a, fam, 5*time.Second); err != nil {
			t.Fatalf("s -> a (allowed): %v", err)
		}
		start := time.Now()
		if err := connect(a, srv, fam, 300*time.Millisecond); err == nil {
			t.Fatalf("a -> s connected through a deny-all policy")
		}
		select {
		case p := <-got:
			if p.Prefix != rs.Denials[0].Prefix || p.Src != a.addr(fam) || p.Dst != srv.addr(fam) || p.Proto != nflog.ProtoTCP || p.DstPort != 80 {
				t.Errorf("logged %+v, want a's SYN to s:80 with prefix %s", p, rs.Denials[0].Prefix)
			}
			t.Logf("family %d: logged %s -> %s:%d with %s within %v", fam, p.Src, p.Dst, p.DstPort, p.Prefix, time.Since(start).Round(time.Millisecond))
		case <-time.After(time.Second):
			t.Fatalf("family %d: nothing logged within a second of a denied connection", fam)
		}
		drain(got)
	}

	// An egress policy on a: its chain drops (and logs) first.
	in.Policies = append(in.Policies, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "a-no-egress"},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}},
	})
	rs = policy.Compile(in)
	var eg policy.Denial
	for _, d := range rs.Denials {
		if d.Direction == "egress" {
			eg = d
		}
	}
	if len(eg.Policies) != 1 || eg.Policies[0] != "x/a-no-egress" {
		t.Fatalf("Denials %+v, want an egress one of x/a-no-egress", rs.Denials)
	}
	n.apply(rs)
	drain(got)
	if err := connect(a, srv, 0, 300*time.Millisecond); err == nil {
		t.Fatalf("a -> s connected through a no-egress policy")
	}
	select {
	case p := <-got:
		if p.Prefix != eg.Prefix || p.Src != a.v4 || p.InDev == 0 {
			t.Errorf("logged %+v, want a's SYN with prefix %s, in from a's veth", p, eg.Prefix)
		}
	case <-time.After(time.Second):
		t.Fatal("nothing logged within a second of a connection egress denies")
	}
}

// TestDeniedLoggedUnlisted: with DenyUnlisted, a packet from a pod
// interface the Ruleset does not list is dropped and logged with the
// unlisted prefix; once the pod is listed, it passes. Every backend.
func TestDeniedLoggedUnlisted(t *testing.T) {
	needRoot(t)
	forEachBackend(t, func(t *testing.T, b iptbackend.Backend) {
		n := newNode(t, b, apply.Options{})
		n.forwarding()
		a, srv := n.addPod("a", "taba", 1), n.addPod("s", "tabs", 2)
		serve(t, a, srv)
		in := &policy.Input{Node: "n1", DenyUnlisted: true, DeniedLog: &policy.DeniedLog{Group: 9}}
		endpoint := func(p *tpod) policy.Endpoint {
			return policy.Endpoint{Pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: p.name}},
				IPs: []netip.Addr{p.v4, p.v6}, HostIface: p.veth}
		}
		in.Endpoints = []policy.Endpoint{endpoint(srv)} // a is not listed yet
		n.apply(policy.Compile(in))
		got := n.readLog(t, 9)

		if err := connect(a, srv, 0, 300*time.Millisecond); err == nil {
			t.Fatal("a, unlisted, reached s")
		}
		select {
		case p := <-got:
			if want := policy.UnlistedLogPrefix(true); p.Prefix != want || p.Src != a.v4 {
				t.Errorf("logged %+v, want a's SYN with prefix %s", p, want)
			}
		case <-time.After(time.Second):
			t.Fatal("nothing logged within a second of an unlisted interface's drop")
		}
		in.Endpoints = append(in.Endpoints, endpoint(a))
		n.apply(policy.Compile(in))
		if err := connect(a, srv, 0, 5*time.Second); err != nil {
			t.Fatalf("a, listed, cannot reach s: %v", err)
		}
	})
}

// readLog reads NFLOG group in the node's namespace until the test ends:
// the packets come on the channel returned.
func (n *node) readLog(t *testing.T, group uint16) chan nflog.Packet {
	var c *nflog.Conn
	n.do(func() (err error) {
		c, err = nflog.Open(nflog.Config{Group: group, Flush: 10 * time.Millisecond})
		return err
	})
	got := make(chan nflog.Packet, 100)
	done := make(chan error, 1)
	go func() { done <- c.Read(func(p nflog.Packet) { got <- p }, nil) }()
	t.Cleanup(func() { _ = c.Close(); <-done })
	return got
}

// drain empties ch of what a probe's retries logged.
func drain(ch chan nflog.Packet) {
	time.Sleep(50 * time.Millisecond)
	for len(ch) > 0 {
		<-ch
	}
}
