package e2e

// tabbyd and address families: a pool of a family the node has no address
// of is reported (an Event on the Node, tabbyctl node status), not left to
// blackhole pod traffic between nodes.

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/daemon"
	"github.com/tabbynet/tabby/daemon/nodestatus"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/internal/testnet"
)

// nodeStatus runs `tabbyctl node status` inside the node, as a user on it
// would, and returns what it printed.
func nodeStatus(t *testing.T, n *testNode, tabbyctl string, args ...string) string {
	t.Helper()
	var out []byte
	_ = n.Do(func() error {
		// Exit status 1 is "not ready", which is beside the point here.
		out, _ = exec.Command(tabbyctl, append([]string{"node", "status"}, args...)...).CombinedOutput()
		return nil
	})
	return string(out)
}

// TestTabbydNoIPv6Address: a node with only an IPv4 address whose pods
// get addresses from an IPv6 pool too. tabbyd records a Warning Event
// NoIPv6Address on the Node naming the pool and saying what to do, and
// `tabbyctl node status` shows it. Given an IPv6 address on the interface
// of its IPv4 one and restarted, tabbyd publishes it
// (tabby.io/ipv6-address) and the problem is gone.
func TestTabbydNoIPv6Address(t *testing.T) {
	n := newNodeWith(t, testnet.NodeOptions{UplinkAddrs: []string{"10.254.0.1/24"}})
	n.addPool(t, 4, nil)
	p6 := n.addPool(t, 6, nil)
	tabbyctl, err := testnet.Binary(t.TempDir(), "tabbyctl")
	if err != nil {
		t.Fatal(err)
	}
	d := n.startTabbyd(t)

	ctx := ctxT(t)
	cs, err := kubernetes.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	sel := fmt.Sprintf("involvedObject.kind=Node,involvedObject.name=%s,reason=%s", n.Name, daemon.ReasonNoIPv6Address)
	var ev *corev1.Event
	for deadline := time.Now().Add(30 * time.Second); ev == nil; time.Sleep(200 * time.Millisecond) {
		list, err := cs.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) > 0 {
			ev = &list.Items[0]
		} else if time.Now().After(deadline) {
			t.Fatalf("no Event %s on Node %s within 30s; tabbyd's log:\n%s", daemon.ReasonNoIPv6Address, n.Name, d.LogTail(30))
		}
	}
	t.Logf("Event %s %s on Node %s: %s", ev.Type, ev.Reason, ev.InvolvedObject.Name, ev.Message)
	if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, p6.Name+" ("+p6.Spec.CIDR+")") || !strings.Contains(ev.Message, "--node-ip <IPv4>,<IPv6>") {
		t.Errorf("the Event does not name the pool %s and say what to do: %+v", p6.Name, ev)
	}
	// The Event is recorded during the reconcile that publishes the status,
	// before the status is: wait for the status to have caught up.
	var out string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		out = nodeStatus(t, n, tabbyctl)
		if strings.Contains(out, "Problem: ") || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("tabbyctl node status:\n%s", out)
	if !strings.Contains(out, "Node address 10.254.0.1/24,") || !strings.Contains(out, "Problem: "+daemon.ReasonNoIPv6Address+": ") || !strings.Contains(out, p6.Name) {
		t.Errorf("tabbyctl node status does not show the node's IPv4 address and the problem")
	}

	// The fix the message names: an IPv6 address (here on the interface
	// holding the IPv4 one, with no IPv6 default route), then a restart.
	err = n.Do(func() error {
		l, err := netlink.LinkByName(testnet.Uplink)
		if err != nil {
			return err
		}
		// No duplicate address detection: tentative for a second, it
		// would not count yet (an admin's address has long passed it).
		a, _ := netlink.ParseAddr("fd00:254::1/64")
		a.Flags = unix.IFA_F_NODAD
		return netlink.AddrAdd(l, a)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	d = n.startTabbyd(t)
	hc := healthClient(n, 1)
	var st *nodestatus.Status
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		st, err = nodestatus.Fetch(ctx, hc, testnet.TabbydHealthAddr)
		if err == nil && st.Reconciles > 0 && len(st.Problems) == 0 && st.IPv6 == "fd00:254::1/64" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the fix: status %+v (%v); tabbyd's log:\n%s", st, err, d.LogTail(30))
		}
	}
	node, err := n.DS.Nodes.Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := node.Annotations[tabbyv1.AnnotationNodeIPv6Address]; got != "fd00:254::1/64" {
		t.Errorf("%s = %q after the fix, want fd00:254::1/64", tabbyv1.AnnotationNodeIPv6Address, got)
	}
	out = nodeStatus(t, n, tabbyctl)
	t.Logf("tabbyctl node status after the fix:\n%s", out)
	if !strings.Contains(out, "Node address 10.254.0.1/24 fd00:254::1/64,") || strings.Contains(out, "Problem:") {
		t.Errorf("tabbyctl node status after the fix shows no IPv6 address or still a problem")
	}
}
