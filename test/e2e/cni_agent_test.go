package e2e

// The CNI plugins with tabbyd's CNI agent: tabbyd runs as a process inside
// the node's namespace (testnet.StartTabbyd), serving the node's
// AgentSocket, which the conflists of testnet.TabbyConf name. Whether the
// agent answered is read from tabbyd's metrics.

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/internal/testnet"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/plugin"
)

// startTabbyd runs the node's tabbyd; the test's cleanup kills it (and waits
// for it) whatever happens.
func (n *testNode) startTabbyd(t *testing.T) *testnet.Tabbyd {
	t.Helper()
	d, err := n.StartTabbyd(ctxT(t), tabbydBin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = d.Kill()
		if t.Failed() {
			t.Logf("tabbyd's log:\n%s", d.LogTail(40))
		}
	})
	return d
}

// agentCounts reads tabbyd's request counters by "endpoint/result".
func agentCounts(t *testing.T, d *testnet.Tabbyd) map[string]float64 {
	t.Helper()
	m, err := d.Metrics(ctxT(t), "tabby_cni_agent_")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for k, v := range m {
		if rest, ok := strings.CutPrefix(k, `tabby_cni_agent_requests_total{endpoint="`); ok {
			ep, res, _ := strings.Cut(rest, `",result="`)
			out[ep+"/"+strings.TrimSuffix(res, `"}`)] = v
		}
		if rest, ok := strings.CutPrefix(k, `tabby_cni_agent_pod_lookups_total{source="`); ok {
			out["pod-lookup/"+strings.TrimSuffix(rest, `"}`)] = v
		}
	}
	return out
}

// wantServed checks that the agent counted exactly want more requests per
// key than before.
func wantServed(t *testing.T, what string, before, after map[string]float64, want map[string]float64) {
	t.Helper()
	for k, w := range want {
		if got := after[k] - before[k]; got != w {
			t.Errorf("%s: the agent counted %v %s, want %v (before %v, after %v)", what, got, k, w, before, after)
		}
	}
}

// waitHandle waits until the pod's IPAMHandle object lists ip: the agent
// writes it just after answering ADD.
func (n *testNode) waitHandle(t *testing.T, p *testnet.Pod, ip string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := n.heldIPs(t, p)
		if len(got) == 1 && got[0] == ip {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the handle of %s holds %v, want [%s]", p.ContainerID[:12], got, ip)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCNIAgentAddCheckDelStatus: with tabbyd running, ADD, CHECK, DEL, GC
// and STATUS of the tabby plugin are served by its agent: the pod gets an
// address of the node's pool and the MTU of its VXLAN pool, the pod's
// annotations are read from the agent's cache, the handle is recorded, DEL
// frees everything (also right after ADD), and STATUS passes, then fails
// while the node cannot reach the API server, when ADD is answered from the
// addresses tabbyd holds ahead, and then fails too.
func TestCNIAgentAddCheckDelStatus(t *testing.T) {
	n := newNode(t)
	pool := n.addPool(t, 4, func(p *tabbyv1.IPPool) { p.Spec.VXLANMode = tabbyv1.EncapAlways })
	other := n.addPool(t, 4, nil)
	_, otherNet, _ := net.ParseCIDR(other.Spec.CIDR)
	d := n.startTabbyd(t)
	list := conflist(t, "1.1.0", n.TabbyConf(nil))
	// The annotation picks the second pool.
	pod := newPod(t, n, "agent-web", map[string]string{tabbyv1.AnnotationIPv4Pools: fmt.Sprintf("[%q]", other.Name)})
	time.Sleep(200 * time.Millisecond) // the informer sees the pod, as it would before kubelet calls ADD

	before := agentCounts(t, d)
	res := n.mustAdd(t, list, pod)
	after := agentCounts(t, d)
	wantServed(t, "ADD", before, after, map[string]float64{"assign/ok": 1, "usable-pools/ok": 1, "pod-lookup/cache": 1, "pod-lookup/api": 0})
	ip := res.IPs[0].Address.IP
	if !otherNet.Contains(ip) {
		t.Errorf("address %s is not from the annotated pool %s", ip, other.Spec.CIDR)
	}
	if pl := inspectPod(t, pod); pl.mtu != uplinkMTU-plugin.OverheadVXLAN {
		t.Errorf("pod MTU %d, want %d (pool %s is VXLAN)", pl.mtu, uplinkMTU-plugin.OverheadVXLAN, pool.Name)
	}
	n.waitHandle(t, pod, ip.String())

	before = agentCounts(t, d)
	if err := n.Check(ctxT(t), list, pod, nil); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := n.Status(ctxT(t), list); err != nil {
		t.Errorf("STATUS: %v", err)
	}
	after = agentCounts(t, d)
	wantServed(t, "CHECK and STATUS", before, after, map[string]float64{"handle-ips/ok": 1, "ping/ok": 1, "usable-pools/ok": 1})

	before = agentCounts(t, d)
	if err := n.Del(ctxT(t), list, pod, nil); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if err := n.Del(ctxT(t), list, pod, nil); err != nil {
		t.Errorf("second DEL: %v", err)
	}
	after = agentCounts(t, d)
	wantServed(t, "DEL twice", before, after, map[string]float64{"release-handle/ok": 2})
	if held := n.heldIPs(t, pod); len(held) != 0 {
		t.Errorf("IPAM still holds %v after DEL", held)
	}
	if hs := n.nodeHandles(t); len(hs) != 0 {
		t.Errorf("handles left after DEL: %v", hs)
	}

	// DEL at once after ADD, while the agent may still be writing the
	// handle, and a pod the cache does not know yet (read from the API).
	quick := newPod(t, n, "agent-quick", nil)
	before = agentCounts(t, d)
	n.mustAdd(t, list, quick)
	if err := n.Del(ctxT(t), list, quick, nil); err != nil {
		t.Fatalf("DEL right after ADD: %v", err)
	}
	after = agentCounts(t, d)
	if got := after["pod-lookup/cache"] + after["pod-lookup/api"] - before["pod-lookup/cache"] - before["pod-lookup/api"]; got != 1 {
		t.Errorf("%v pod lookups for one ADD", got)
	}
	time.Sleep(200 * time.Millisecond)
	if hs := n.nodeHandles(t); len(hs) != 0 {
		t.Errorf("handles left after ADD then DEL at once: %v", hs)
	}
	if _, err := n.DS.IPAMHandles.Get(context.Background(), ipam.HandleObjectName(quick.HandleID()), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the handle object after ADD then DEL at once: %v, want NotFound", err)
	}

	// GC through the agent.
	// GC right after the ADDs: tabbyd answers them from the addresses it
	// holds ahead (spares), and lists their handles before their blocks
	// record them.
	keep, drop := newPod(t, n, "agent-keep", nil), newPod(t, n, "", nil)
	keepRes := n.mustAdd(t, list, keep)
	n.mustAdd(t, list, drop)
	before = agentCounts(t, d)
	if err := n.GC(ctxT(t), list, keep); err != nil {
		t.Fatalf("GC: %v", err)
	}
	after = agentCounts(t, d)
	wantServed(t, "GC", before, after, map[string]float64{"node-handles/ok": 1, "release-handle/ok": 1})
	n.waitHandle(t, keep, keepRes.IPs[0].Address.IP.String())
	if hs := n.nodeHandles(t); len(hs) != 1 || hs[0] != keep.HandleID() {
		t.Errorf("handles after GC: %v, want only %s", hs, keep.HandleID())
	}

	// STATUS and ADD while the node cannot reach the API server: the agent
	// answers that it cannot reach it (STATUS: not available; ADD: try
	// again later), and serves again once it can.
	restore := n.CutAPIServer()
	t.Cleanup(func() { _ = restore() })
	err := n.Status(ctxT(t), list)
	if err == nil || !strings.Contains(err.Error(), "cannot be reached") {
		t.Errorf("STATUS with the API server cut off: %v", err)
	} else if e := cniError(t, err); e.Code != plugin.ErrPluginNotAvailable {
		t.Errorf("STATUS with the API server cut off: code %d", e.Code)
	}
	// ADDs are answered from the addresses held ahead (at most
	// --cni-spare-addresses, 2), then fail until the API server is back;
	// the ones answered are recorded once it is.
	var cut *testnet.Pod
	answered := map[*testnet.Pod]string{}
	for i := 0; cut == nil; i++ {
		p := newPod(t, n, "", nil)
		res, err := n.Add(ctxT(t), list, p, nil)
		switch {
		case err == nil && i < 2:
			answered[p] = res.IPs[0].Address.IP.String()
		case err == nil:
			t.Fatalf("ADD %d with the API server cut off succeeded: tabbyd holds 2 addresses ahead", i+1)
		case !strings.Contains(err.Error(), "cannot be reached"):
			t.Fatalf("ADD with the API server cut off: %v", err)
		default:
			if e := cniError(t, err); e.Code != types.ErrTryAgainLater {
				t.Errorf("ADD with the API server cut off: code %d, want %d", e.Code, types.ErrTryAgainLater)
			}
			cut = p
		}
	}
	if err := restore(); err != nil {
		t.Fatal(err)
	}
	if err := n.Status(ctxT(t), list); err != nil {
		t.Errorf("STATUS after the API server came back: %v", err)
	}
	n.mustAdd(t, list, cut)
	for p, ip := range answered {
		n.waitHandle(t, p, ip)
	}
}

// TestCNIAgentParallelAdds: 50 ADDs at once, all answered by the agent,
// get 50 different addresses; 50 DELs at once free them all.
func TestCNIAgentParallelAdds(t *testing.T) {
	const pods = 50
	n := newNode(t)
	n.addPool(t, 4, nil)
	d := n.startTabbyd(t)
	list := conflist(t, "1.1.0", n.TabbyConf(nil))
	ps := make([]*testnet.Pod, pods)
	for i := range ps {
		ps[i] = newPod(t, n, fmt.Sprintf("agent-par-%d", i), nil)
	}
	before := agentCounts(t, d)
	seen := addAllAtOnce(t, n, list, ps)
	if len(seen) != pods {
		t.Errorf("%d distinct addresses, want %d", len(seen), pods)
	}
	wantServed(t, "50 ADDs", before, agentCounts(t, d), map[string]float64{"assign/ok": pods})
	delAllAtOnce(t, n, list, ps)
	wantServed(t, "50 ADDs and DELs", before, agentCounts(t, d), map[string]float64{"assign/ok": pods, "release-handle/ok": pods})
}

// TestCNIAgentFallback: when tabbyd is killed (its socket stays behind,
// refusing connections) the plugin reaches the API server itself and
// everything keeps working, also DEL and CHECK of a pod the agent added;
// when tabbyd is back, the plugin uses it again, also for a pod added
// without it. A tabbyd that stops cleanly removes its socket.
func TestCNIAgentFallback(t *testing.T) {
	n := newNode(t)
	n.addPool(t, 4, nil)
	list := conflist(t, "1.1.0", n.TabbyConf(nil))
	d := n.startTabbyd(t)
	viaAgent := newPod(t, n, "fb-agent", nil)
	ra := n.mustAdd(t, list, viaAgent)
	if c := agentCounts(t, d); c["assign/ok"] != 1 {
		t.Fatalf("the agent answered %v assignments, want 1", c["assign/ok"])
	}

	if err := d.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(n.AgentSocket); err != nil {
		t.Fatalf("a killed tabbyd should leave its socket behind: %v", err)
	}
	direct := newPod(t, n, "fb-direct", nil)
	rd := n.mustAdd(t, list, direct)
	if rd.IPs[0].Address.IP.Equal(ra.IPs[0].Address.IP) {
		t.Errorf("both pods got %s", ra.IPs[0].Address.IP)
	}
	// Without tabbyd, the plugin records the handle itself before answering.
	if held := n.heldIPs(t, direct); len(held) != 1 || held[0] != rd.IPs[0].Address.IP.String() {
		t.Errorf("IPAM holds %v for the pod added without tabbyd", held)
	}
	if err := n.Check(ctxT(t), list, viaAgent, nil); err != nil {
		t.Errorf("CHECK without tabbyd of the pod the agent added: %v", err)
	}
	if err := n.Status(ctxT(t), list); err != nil {
		t.Errorf("STATUS without tabbyd: %v", err)
	}
	if err := n.Del(ctxT(t), list, viaAgent, nil); err != nil {
		t.Errorf("DEL without tabbyd of the pod the agent added: %v", err)
	}
	if held := n.heldIPs(t, viaAgent); len(held) != 0 {
		t.Errorf("IPAM still holds %v after DEL without tabbyd", held)
	}

	d2 := n.startTabbyd(t)
	again := newPod(t, n, "fb-again", nil)
	n.mustAdd(t, list, again)
	if err := n.Del(ctxT(t), list, direct, nil); err != nil {
		t.Errorf("DEL through the agent of the pod added without it: %v", err)
	}
	if held := n.heldIPs(t, direct); len(held) != 0 {
		t.Errorf("IPAM still holds %v after DEL", held)
	}
	if c := agentCounts(t, d2); c["assign/ok"] != 1 || c["release-handle/ok"] != 1 {
		t.Errorf("the restarted agent answered %v assignments and %v releases, want 1 and 1", c["assign/ok"], c["release-handle/ok"])
	}
	if err := d2.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(n.AgentSocket); !os.IsNotExist(err) {
		t.Errorf("a tabbyd that stopped cleanly left its socket: %v", err)
	}
	if err := n.Del(ctxT(t), list, again, nil); err != nil {
		t.Errorf("DEL after tabbyd stopped: %v", err)
	}
	if hs := n.nodeHandles(t); len(hs) != 0 {
		t.Errorf("handles left: %v", hs)
	}
}

// TestCNIAgentErrors: IPAM's answers pass through the agent as they are,
// with the same text the plugin gives on its own, and are not retried on
// the direct path: a missing annotated pool, an address in no pool, an
// exhausted pool.
func TestCNIAgentErrors(t *testing.T) {
	n := newNode(t)
	n.addPool(t, 4, func(p *tabbyv1.IPPool) {
		// Eight addresses, in one block.
		p.Spec.CIDR = strings.Replace(p.Spec.CIDR, ".0/22", ".248/29", 1)
		p.Spec.BlockSize = 29
	})
	d := n.startTabbyd(t)
	agent := conflist(t, "1.1.0", n.TabbyConf(nil))
	directConf := n.TabbyConf(nil)
	directConf["agentSocket"] = ""
	direct := conflist(t, "1.1.0", directConf)

	// errorOf runs ADD of a new pod with annotations through a conflist
	// and returns its CNI error, with the pod's names taken out.
	errorOf := func(list *libcni.NetworkConfigList, name string, ann map[string]string) *types.Error {
		t.Helper()
		p := newPod(t, n, name, ann)
		_, err := n.Add(ctxT(t), list, p, nil)
		if err == nil {
			t.Fatalf("ADD of %s succeeded", name)
		}
		e := cniError(t, err)
		e.Msg = strings.ReplaceAll(strings.ReplaceAll(e.Msg, p.ContainerID, "CID"), name, "POD")
		if hs := n.heldIPs(t, p); len(hs) != 0 {
			t.Errorf("a failed ADD left %v held", hs)
		}
		return e
	}
	for _, tc := range []struct {
		name string
		ann  map[string]string
		want string
	}{
		{"missing-pool", map[string]string{tabbyv1.AnnotationIPv4Pools: `["no-such-pool"]`}, `requested pool "no-such-pool" does not exist`},
		{"bad-annotation", map[string]string{tabbyv1.AnnotationIPv4Pools: `no-such-pool`}, `must be a JSON list`},
		{"no-pool-for-address", map[string]string{tabbyv1.AnnotationIPAddrs: `["192.0.2.7"]`}, `is in no IP pool`},
	} {
		before := agentCounts(t, d)
		ea := errorOf(agent, "err-a-"+tc.name, tc.ann)
		wantServed(t, tc.name, before, agentCounts(t, d), map[string]float64{"assign/error": 1, "assign/ok": 0})
		ed := errorOf(direct, "err-d-"+tc.name, tc.ann)
		if !strings.Contains(ea.Msg, tc.want) {
			t.Errorf("%s through the agent: %q, want it to say %q", tc.name, ea.Msg, tc.want)
		}
		if ea.Msg != ed.Msg || ea.Code != ed.Code {
			t.Errorf("%s: the agent says\n  %d %q\nthe plugin on its own\n  %d %q", tc.name, ea.Code, ea.Msg, ed.Code, ed.Msg)
		}
	}

	// Exhaust the pool through the agent.
	for i := range 8 {
		n.mustAdd(t, agent, newPod(t, n, fmt.Sprintf("fill-%d", i), nil))
	}
	before := agentCounts(t, d)
	ea := errorOf(agent, "err-a-full", nil)
	wantServed(t, "exhausted", before, agentCounts(t, d), map[string]float64{"assign/error": 1})
	ed := errorOf(direct, "err-d-full", nil)
	for _, e := range []*types.Error{ea, ed} {
		if !strings.Contains(e.Msg, "no address available") || !strings.Contains(e.Msg, "8 addresses in use") {
			t.Errorf("exhausted: %q", e.Msg)
		}
	}
	if ea.Msg != ed.Msg {
		t.Errorf("exhausted: the agent says\n  %q\nthe plugin on its own\n  %q", ea.Msg, ed.Msg)
	}
}
