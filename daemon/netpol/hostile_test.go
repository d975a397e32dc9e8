package netpol

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/tabbynet/tabby/datastore/events"
	"github.com/tabbynet/tabby/internal/testnet"
	"github.com/tabbynet/tabby/policy"
)

// hostileExcepts are n distinct /31 (IPv4) or /127 (IPv6) excepts spread
// over the whole address space, avoiding 10.0.0.0/8 (the tests' pods).
func hostileExcepts(n int, v6 bool) []string {
	out := make([]string, 0, n)
	seen := map[uint32]bool{}
	for i := 0; len(out) < n; i++ {
		x := uint32(i) * 390451 &^ 1
		a := [4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)}
		if a[0] == 10 || seen[x] {
			continue
		}
		seen[x] = true
		if v6 {
			b := [16]byte{0x20, 0x01, a[0], a[1], a[2], a[3], 14: byte(i >> 8), 15: byte(i) &^ 1}
			out = append(out, netip.PrefixFrom(netip.AddrFrom16(b), 127).String())
		} else {
			out = append(out, net.IP(a[:]).String()+"/31")
		}
	}
	return out
}

// hostilePolicy is issue 11's policy: egress of the pods app=hostile to
// 0.0.0.0/0 and ::/0, each with n excepts, plus the extra IPv4 excepts.
func hostilePolicy(n int, extra ...string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "hostile"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "hostile"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{
				{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: append(hostileExcepts(n, false), extra...)}},
				{IPBlock: &networkingv1.IPBlock{CIDR: "::/0", Except: hostileExcepts(n, true)}},
			}}},
		},
	}
}

// readyz is the status of the running tabbyd's /readyz, asked from inside
// the node.
func (e *e2e) readyz(t *testing.T) (int, string) {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		err = e.n.Do(func() (err error) {
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://" + testnet.TabbydHealthAddr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// nomatchMembers counts, in a kernel dump, the members of each hash:net
// set that are nomatch entries.
func nomatchMembers(kernel string) map[string]int {
	out := map[string]int{}
	for _, m := range regexp.MustCompile(`(?m)^add (tabby-np-n[46]-\S+) \S+ nomatch$`).FindAllStringSubmatch(kernel, -1) {
		out[m[1]]++
	}
	return out
}

// TestTabbydHostilePolicy: issue 11's policy (0.0.0.0/0 and ::/0 with
// 11,000 excepts each) next to normal ones, with the real tabbyd and
// plugins and real packets. With the default limits it is programmed
// compactly (nomatch entries) and enforced; under a member limit it does
// not fit, it fails closed for the pod it selects and is reported, and in
// both cases the normal policies are enforced, new pods (selected by it
// or not) start, and the node stays ready.
func TestTabbydHostilePolicy(t *testing.T) {
	e := newE2E(t)
	e.policy(t, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "server-from-client"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
				Ports: tcpPort(80),
			}},
		},
	})
	stop := e.startTabbyd(t)
	server := e.mustAdd(t, "server", map[string]string{"app": "server"})
	client := e.mustAdd(t, "client", map[string]string{"app": "client"})
	peer := e.mustAdd(t, "peer", map[string]string{"app": "peer"})
	hostile := e.mustAdd(t, "hostile", map[string]string{"app": "hostile"})
	serverAddr, clientAddr, peerAddr := serve(t, server), serve(t, client), serve(t, peer)

	// The normal policies are enforced (both ways: the block is the
	// policy, not a broken network).
	normalEnforced := func(when string) {
		t.Helper()
		if !reaches(client, serverAddr) {
			t.Errorf("%s: the client does not reach the server its policy allows", when)
		}
		if reaches(peer, serverAddr) {
			t.Errorf("%s: the peer reaches the server its policy does not allow", when)
		}
	}
	normalEnforced("before the hostile policy")
	if !reaches(hostile, peerAddr) {
		t.Fatal("before the hostile policy, its pod does not reach the peer")
	}

	// The hostile policy, with the peer's address among its excepts.
	e.policy(t, hostilePolicy(11000, peer.ip.String()+"/32"))
	eventually(t, "the hostile policy's except enforced", func() bool { return !reaches(hostile, peerAddr) })
	if !reaches(hostile, clientAddr) {
		t.Errorf("the hostile policy's pod does not reach the client, which 0.0.0.0/0 allows")
	}
	normalEnforced("with the hostile policy")
	k := e.filter(t)
	nm := nomatchMembers(k)
	// The pods have IPv4 addresses only, so the policy's IPv6 chain and
	// sets are not written (nothing of that family jumps to them).
	if len(nm) != 1 {
		t.Fatalf("want one hash:net set with nomatch members, in IPv4 alone, have %v", nm)
	}
	total := 0
	for set, n := range nm {
		if n < 11000 {
			t.Errorf("set %s has %d nomatch members, want the 11,000 excepts", set, n)
		}
		total += n
	}
	t.Logf("the hostile policy takes %d nomatch members in %v, and ipset reports %v members in all", total, nm, e.metrics()["tabby_policy_ipset_members"])
	m := e.metrics()
	if m["tabby_policy_last_sync_success"] != 1 || m[`tabby_policy_networkpolicies_over_limit{limit="`+policy.FlagMaxSetMembers+`"}`] != 0 {
		t.Errorf("metrics with the hostile policy enforced: %v", m)
	}
	if code, body := e.readyz(t); code != http.StatusOK {
		t.Errorf("/readyz with the hostile policy enforced: %d %s", code, body)
	}
	// New pods start, selected by it or not.
	e.mustAdd(t, "late", map[string]string{"app": "late"})
	e.mustAdd(t, "hostile2", map[string]string{"app": "hostile"})

	// Under a member limit it does not fit in: reported, fail closed.
	stop()
	e.startTabbyd(t, "--"+policy.FlagMaxSetMembers+"=10000")
	eventually(t, "the hostile policy reported over the member limit", func() bool {
		return e.metrics()[`tabby_policy_networkpolicies_over_limit{limit="`+policy.FlagMaxSetMembers+`"}`] == 1
	})
	if nm := nomatchMembers(e.filter(t)); len(nm) != 0 {
		t.Errorf("the sets of the policy over the limit are still in the kernel: %v", nm)
	}
	if reaches(hostile, clientAddr) {
		t.Errorf("the pod of the policy over the limit reaches the client: it must fail closed")
	}
	if reaches(hostile, peerAddr) {
		t.Errorf("the pod of the policy over the limit reaches the peer")
	}
	normalEnforced("with the hostile policy over the limit")
	e.mustAdd(t, "late2", map[string]string{"app": "late"})
	h3 := e.mustAdd(t, "hostile3", map[string]string{"app": "hostile"})
	if reaches(h3, clientAddr) {
		t.Errorf("a new pod of the policy over the limit reaches the client")
	}
	if m := e.metrics(); m["tabby_policy_last_sync_success"] != 1 {
		t.Errorf("the sync failed with the policy over the limit: %v", m)
	}
	if code, body := e.readyz(t); code != http.StatusOK {
		t.Errorf("/readyz with the policy over the limit: %d %s", code, body)
	}
	eventually(t, "the Event on the hostile policy", func() bool {
		l, err := events.Client(e.ds, e.ns).List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("involvedObject.name", "hostile").String(),
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range l.Items {
			if ev.Type == corev1.EventTypeWarning && ev.Reason == ReasonNotEnforced &&
				strings.Contains(ev.Message, "--"+policy.FlagMaxSetMembers) && strings.Contains(ev.Message, "allows them nothing") {
				return true
			}
		}
		return false
	})
}
