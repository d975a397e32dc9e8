package labtest

// Routing end to end: tabbyd's BGP (GoBGP embedded) and routes in labs of
// real nodes, with real pods and real traffic.

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/daemon/nodestatus"
	"github.com/tabbynet/tabby/internal/testnet"
	"github.com/tabbynet/tabby/lab"
)

const webPort = 8080

// webs creates a Web pod webN (agnhost serve-hostname, answering its
// name) on each node N of nodes and returns them Running and Ready, by
// name.
func webs(t *testing.T, l *Lab, nodes ...int) map[string]*corev1.Pod {
	t.Helper()
	for _, n := range nodes {
		l.Create(t, Web(fmt.Sprintf("web%d", n), fmt.Sprintf("node%d", n), webPort))
	}
	out := map[string]*corev1.Pod{}
	for _, n := range nodes {
		name := fmt.Sprintf("web%d", n)
		out[name] = l.WaitPod(t, name, 30*time.Second, Running(true))
	}
	return out
}

// blockOf is the /26 of a pod's address (the default blockSize).
func blockOf(p *corev1.Pod) string {
	return netip.PrefixFrom(netip.MustParseAddr(p.Status.PodIP), 26).Masked().String()
}

// mesh is the sessions of node i of an n-node full mesh.
func mesh(i, n int) map[string]string {
	m := map[string]string{}
	for j := 1; j <= n; j++ {
		if j != i {
			m[fmt.Sprintf("node%d", j)] = "node-mesh"
		}
	}
	return m
}

// waitMesh waits until each of n nodes is ready with a full mesh of
// Established sessions.
func waitMesh(t *testing.T, l *Lab, n int, d time.Duration) {
	t.Helper()
	for i := 1; i <= n; i++ {
		l.WaitBGP(t, fmt.Sprintf("node%d", i), d, Sessions(mesh(i, n)))
	}
}

// reach checks that pod from reaches pod to: ping and a TCP connection
// to its serve-hostname server, which answers its name.
func reach(t *testing.T, l *Lab, from, to *corev1.Pod) {
	t.Helper()
	if out, code := l.Exec("default/"+from.Name, "ping", "-c", "1", "-W", "2", to.Status.PodIP); code != 0 {
		t.Errorf("ping %s (%s) -> %s (%s): %s", from.Name, from.Spec.NodeName, to.Name, to.Status.PodIP, out)
	}
	got, err := l.Probe("default/"+from.Name, "tcp", fmt.Sprintf("%s:%d", to.Status.PodIP, webPort))
	if err != nil || got != to.Name {
		t.Errorf("TCP %s (%s) -> %s (%s): %q %v", from.Name, from.Spec.NodeName, to.Name, to.Status.PodIP, got, err)
	}
}

// TestRoutingMesh: 3 nodes, native routing over a full mesh. Every node
// has two Established sessions, every pod reaches every other (ping and
// TCP), the routes are tabby's (proto 81) via the other nodes, and
// node status, lab status and the metrics say so.
func TestRoutingMesh(t *testing.T) {
	t.Parallel()
	l := Up(t, "--nodes", "3")
	start := time.Now()
	waitMesh(t, l, 3, 30*time.Second)
	pods := webs(t, l, 1, 2, 3)
	// The route to every other node's block is there.
	for i := 1; i <= 3; i++ {
		for j := 1; j <= 3; j++ {
			if i == j {
				continue
			}
			p := pods[fmt.Sprintf("web%d", j)]
			line := l.WaitRoute(t, fmt.Sprintf("node%d", i), blockOf(p), 10*time.Second)
			want := fmt.Sprintf("%s via %s dev eth0 proto 81", blockOf(p), l.Node(t, p.Spec.NodeName).IP())
			if strings.TrimSpace(line) != want {
				t.Errorf("node%d: route %q, want %q", i, line, want)
			}
		}
	}
	t.Logf("sessions up and routes everywhere %v after lab up", time.Since(start).Round(time.Millisecond))
	for _, from := range pods {
		for _, to := range pods {
			if from != to {
				reach(t, l, from, to)
			}
		}
	}
	// Own block: a blackhole, so unused addresses never leak out.
	if routes := l.NodeRoutes(t, "node1"); !strings.Contains(routes, "blackhole "+blockOf(pods["web1"])+" proto 81") {
		t.Errorf("node1 has no blackhole for its block:\n%s", routes)
	}

	out, code := l.NodeExec(t, "node1", Tabbyctl(), "node", "status")
	if code != 0 || strings.Count(out, "Established") != 2 || strings.Count(out, "node-mesh") != 2 {
		t.Errorf("tabbyctl node status on node1 (exit %d):\n%s", code, out)
	}
	t.Logf("tabbyctl node status on node1:\n%s", out)
	metrics := l.TabbydGet(t, "node1", "/metrics")
	for _, want := range []string{
		`tabby_bgp_sessions{state="Established",type="node-mesh"} 2`,
		`tabby_routes{kind="programmed"} 3`,
		`tabby_routing_last_apply_success 1`,
		`tabby_routing_reconcile_duration_seconds_count`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("node1's metrics lack %s", want)
		}
	}
	out, code = l.Tabbyctl("status")
	if code != 0 || strings.Count(out, "Established") != 6 {
		t.Errorf("lab status shows no 6 Established sessions:\n%s", out)
	}
	var st *nodestatus.Status
	st, err := l.BGP(t, "node2")
	if err != nil || st.Routes.Learned != 2 || st.Routes.Advertised != 1 || st.AS != tabbyv1.DefaultASNumber {
		t.Errorf("node2's status: %+v %v", st, err)
	}
}

// TestRouteReflector labels one node of a 4-node mesh a route reflector:
// every other node ends with one session, to the reflector, which has
// three route-reflector-client sessions, and a continuous probe between
// pods on two other nodes loses nothing meanwhile. Removing the label
// brings the mesh back, again without a loss.
func TestRouteReflector(t *testing.T) {
	t.Parallel()
	l := Up(t, "--nodes", "4")
	waitMesh(t, l, 4, 30*time.Second)
	pods := webs(t, l, 1, 2)
	for _, n := range []string{"node1", "node2"} {
		other := pods["web1"]
		if n == "node1" {
			other = pods["web2"]
		}
		l.WaitRoute(t, n, blockOf(other), 10*time.Second)
	}
	reach(t, l, pods["web1"], pods["web2"])

	label := func(value *string) { t.Helper(); labelReflector(t, l, "node4", value) }
	on := "true"

	f1 := l.StartFlow(t, pods["web1"], pods["web2"], webPort, 50*time.Millisecond)
	f2 := l.StartFlow(t, pods["web2"], pods["web1"], webPort, 100*time.Millisecond)
	time.Sleep(time.Second)
	start := time.Now()
	label(&on)
	for i := 1; i <= 3; i++ {
		l.WaitBGP(t, fmt.Sprintf("node%d", i), 90*time.Second, Sessions(map[string]string{"node4": "route-reflector"}))
	}
	l.WaitBGP(t, "node4", 30*time.Second, Sessions(map[string]string{"node1": "route-reflector-client", "node2": "route-reflector-client", "node3": "route-reflector-client"}))
	t.Logf("mesh -> route reflector in %v", time.Since(start).Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	for _, f := range []*Flow{f1, f2} {
		r := f.Stop()
		t.Logf("flow during mesh -> route reflector: %s", r)
		if !r.OK() {
			t.Errorf("traffic was lost while node4 became a route reflector: %s", r)
		}
	}
	reach(t, l, pods["web1"], pods["web2"])
	if out, code := l.NodeExec(t, "node1", Tabbyctl(), "node", "status"); code != 0 || !strings.Contains(out, "route-reflector") {
		t.Errorf("node status on node1:\n%s", out)
	}

	f1 = l.StartFlow(t, pods["web1"], pods["web2"], webPort, 50*time.Millisecond)
	start = time.Now()
	label(nil)
	waitMesh(t, l, 4, 90*time.Second)
	t.Logf("route reflector -> mesh in %v", time.Since(start).Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	if r := f1.Stop(); !r.OK() {
		t.Errorf("traffic was lost while node4 stopped being a route reflector: %s", r)
	} else {
		t.Logf("flow during route reflector -> mesh: %s", r)
	}
}

// labelReflector sets the route-reflector label of node to value, or
// removes it for nil.
func labelReflector(t *testing.T, l *Lab, node string, value *string) {
	t.Helper()
	v := "null"
	if value != nil {
		v = strconv.Quote(*value)
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%s}}}`, tabbyv1.LabelRouteReflector, v)
	if _, err := l.CS.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestRouteReflectorNodeWithoutPods: a node that advertises nothing (no
// pod, so no block: a new node, or one running only hostNetwork pods)
// keeps its routes to the other nodes' pods while node4 becomes a route
// reflector. The other nodes drop their mesh sessions with it once what it
// gives them (nothing) is covered, which drops them at its end too; it
// must have their blocks over the reflector by then. A continuous probe
// from the node (its own programs, hostNetwork pods and kube-proxy's
// forwarding send from there) to a pod on another node loses nothing.
func TestRouteReflectorNodeWithoutPods(t *testing.T) {
	t.Parallel()
	l := Up(t, "--nodes", "4")
	waitMesh(t, l, 4, 30*time.Second)
	// CoreDNS's pods may have given nodes a block: the node without pods
	// is one of node1..node3 that has none, the web pod goes to another.
	hasBlock := func(node string) bool {
		for _, line := range strings.Split(l.NodeRoutes(t, node), "\n") {
			if strings.HasPrefix(line, "blackhole ") && strings.Contains(line, "proto 81") {
				return true
			}
		}
		return false
	}
	var empty, other string
	for _, n := range []string{"node1", "node2", "node3"} {
		switch {
		case empty == "" && !hasBlock(n):
			empty = n
		case other == "":
			other = n
		}
	}
	if empty == "" {
		t.Fatalf("node1, node2 and node3 all have a block before the test made a pod (CoreDNS has 2)")
	}
	l.Create(t, Web("web", other, webPort))
	web := l.WaitPod(t, "web", 30*time.Second, Running(true))
	l.WaitRoute(t, empty, blockOf(web), 10*time.Second)
	if hasBlock(empty) {
		t.Fatalf("%s got a block meanwhile", empty)
	}
	t.Logf("%s has no pod and no block; web runs on %s", empty, other)

	f := l.StartNodeFlow(t, empty, web, webPort, 50*time.Millisecond)
	time.Sleep(time.Second)
	start := time.Now()
	on := "true"
	labelReflector(t, l, "node4", &on)
	for i := 1; i <= 3; i++ {
		l.WaitBGP(t, fmt.Sprintf("node%d", i), 90*time.Second, Sessions(map[string]string{"node4": "route-reflector"}))
	}
	l.WaitBGP(t, "node4", 30*time.Second, Sessions(map[string]string{"node1": "route-reflector-client", "node2": "route-reflector-client", "node3": "route-reflector-client"}))
	t.Logf("mesh -> route reflector in %v", time.Since(start).Round(time.Millisecond))
	time.Sleep(2 * time.Second)
	r := f.Stop()
	t.Logf("flow from %s to web on %s during mesh -> route reflector: %s", empty, other, r)
	if !r.OK() {
		t.Errorf("traffic from %s (no pods) to a pod on %s was lost while node4 became a route reflector: %s", empty, other, r)
	}
}

// txPackets reads a node's counter of packets sent by the VXLAN device.
func txPackets(t *testing.T, l *Lab, node string) int {
	t.Helper()
	out, code := l.NodeExec(t, node, "cat", "/sys/class/net/tabby.vxlan/statistics/tx_packets")
	if code != 0 {
		t.Fatalf("%s has no tabby.vxlan: %s", node, out)
	}
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestVXLANCrossSubnet: two subnets joined by a router, a pool with
// vxlanMode CrossSubnet. node1 and node3 share a subnet, node2 is behind
// the router: node1 reaches node3's pods natively and node2's over
// tabby.vxlan, whose counters rise only for the latter.
//
// The pool is the cluster's only one, made as users make it with the
// DaemonSet's flags (calico-node's CALICO_IPV4POOL_VXLAN=CrossSubnet): a
// node whose CNI has no pool is not Ready, so lab up cannot wait for a
// pool created after it.
func TestVXLANCrossSubnet(t *testing.T) {
	t.Parallel()
	l := Up(t, "--nodes", "3", "--subnets", "2", "--pod-cidr", "10.250.0.0/16",
		"--tabbyd-arg=--default-ipv4-pool-encapsulation=VXLANCrossSubnet")
	ctx := context.Background()
	pools, err := l.DS(t).IPPools.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pools.Items) != 1 || pools.Items[0].Spec.CIDR != "10.250.0.0/16" || pools.Items[0].Spec.VXLANMode != tabbyv1.EncapCrossSubnet {
		t.Fatalf("want one pool 10.250.0.0/16 with vxlanMode %s, have %+v", tabbyv1.EncapCrossSubnet, pools.Items)
	}
	// Every node publishes its VXLAN identity; the tunnel address comes
	// from the pool, as a Tunnel allocation.
	deadline := time.Now().Add(30 * time.Second)
	for i := 1; i <= 3; i++ {
		for {
			node, err := l.CS.CoreV1().Nodes().Get(ctx, fmt.Sprintf("node%d", i), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			a := node.Annotations[tabbyv1.AnnotationVXLANTunnelAddress]
			if a != "" && node.Annotations[tabbyv1.AnnotationVXLANTunnelMAC] != "" {
				if !strings.HasPrefix(a, "10.250.") {
					t.Errorf("node%d's VXLAN tunnel address %s is not from the pool", i, a)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("node%d published no VXLAN identity: %v", i, node.Annotations)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	pods := webs(t, l, 1, 2, 3)
	web1, web2, web3 := pods["web1"], pods["web2"], pods["web3"]
	cross := l.WaitRoute(t, "node1", blockOf(web2), 10*time.Second)
	same := l.WaitRoute(t, "node1", blockOf(web3), 10*time.Second)
	if !strings.Contains(cross, "dev tabby.vxlan") || !strings.Contains(cross, "onlink") {
		t.Errorf("node1's route across the router is not over VXLAN: %s", cross)
	}
	if want := "via " + l.Node(t, "node3").IP() + " dev eth0"; !strings.Contains(same, want) {
		t.Errorf("node1's route within its subnet is not native (%s): %s", want, same)
	}

	before := txPackets(t, l, "node1")
	if out, code := l.Exec("default/web1", "ping", "-c", "5", "-i", "0.05", "-W", "2", web3.Status.PodIP); code != 0 {
		t.Errorf("same subnet ping: %s", out)
	}
	reach(t, l, web1, web3)
	if after := txPackets(t, l, "node1"); after != before {
		t.Errorf("same-subnet traffic went through tabby.vxlan: tx_packets %d -> %d", before, after)
	}
	before2 := txPackets(t, l, "node2")
	if out, code := l.Exec("default/web1", "ping", "-c", "5", "-i", "0.05", "-W", "2", web2.Status.PodIP); code != 0 {
		t.Errorf("cross-subnet ping: %s", out)
	}
	reach(t, l, web1, web2)
	reach(t, l, web2, web3)
	after, after2 := txPackets(t, l, "node1"), txPackets(t, l, "node2")
	if after-before < 5 || after2-before2 < 5 {
		t.Errorf("cross-subnet traffic did not go through tabby.vxlan: node1 tx_packets %d -> %d, node2 %d -> %d", before, after, before2, after2)
	}
	t.Logf("tabby.vxlan tx_packets: node1 %d -> %d, node2 %d -> %d", before, after, before2, after2)
}

// torPassword signs the sessions with BIRD (TCP MD5).
const torPassword = "rack-1-secret"

// TestBIRDTopOfRack: Debian's BIRD 2 as a top-of-rack router on the
// underlay, configured in tabby by a BGPPeer every node peers with
// (iBGP, AS 64512, an MD5 password from a Secret). BIRD learns every node's blocks (and installs them in
// its kernel), and the prefix it originates, 192.0.2.0/24, is installed on
// every node: pods reach 192.0.2.1 behind BIRD.
func TestBIRDTopOfRack(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("bird"); err != nil {
		t.Fatalf("bird (Debian's bird2) is not installed: %v (make deps installs it)", err)
	}
	l := Up(t, "--nodes", "3")
	ctx := context.Background()
	tor := netip.MustParsePrefix("10.77.0.254/24")
	ns := l.AddHost(t, "tor", 0, tor)
	if out, code := run(nil, "ip", "-n", ns, "addr", "add", "192.0.2.1/32", "dev", "lo"); code != 0 {
		t.Fatal(out)
	}
	dir := t.TempDir()
	var conf strings.Builder
	fmt.Fprintf(&conf, "router id %s;\nlog stderr all;\nprotocol device {}\n", tor.Addr())
	fmt.Fprintf(&conf, "protocol kernel { ipv4 { export where source = RTS_BGP; }; }\n")
	fmt.Fprintf(&conf, "protocol static { ipv4; route 192.0.2.0/24 blackhole; }\n")
	for i := 1; i <= 3; i++ {
		n := l.Node(t, fmt.Sprintf("node%d", i))
		fmt.Fprintf(&conf, "protocol bgp node%d { local %s as 64512; neighbor %s as 64512; direct; password %q; graceful restart on; ipv4 { import all; export all; }; }\n",
			i, tor.Addr(), n.IP(), torPassword)
	}
	confPath, sock := filepath.Join(dir, "bird.conf"), filepath.Join(dir, "bird.ctl")
	if err := os.WriteFile(confPath, []byte(conf.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &testnet.SyncBuffer{}
	bird := exec.Command("nsenter", "--net=/run/netns/"+ns, "bird", "-f", "-c", confPath, "-s", sock)
	bird.Stdout, bird.Stderr = logs, logs
	bird.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := bird.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = bird.Process.Kill()
		_ = bird.Wait()
		if t.Failed() {
			t.Logf("bird.conf:\n%s\nbird's log:\n%s", conf.String(), logs.String())
		}
	})
	birdc := func(args ...string) string {
		out, _ := exec.Command("birdc", append([]string{"-s", sock}, args...)...).CombinedOutput()
		return string(out)
	}

	// The session is signed (TCP MD5) with a password from a Secret in
	// tabbyd's namespace, which tabby-node may read once granted by name,
	// with the README's two commands.
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "tor-bgp", Namespace: "tabby-system"},
		StringData: map[string]string{"password": torPassword}}
	if _, err := l.CS.CoreV1().Secrets("tabby-system").Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"-n", "tabby-system", "create", "role", "tabby-bgp-passwords", "--verb=get", "--resource=secrets", "--resource-name=tor-bgp"},
		{"-n", "tabby-system", "create", "rolebinding", "tabby-bgp-passwords", "--role=tabby-bgp-passwords", "--serviceaccount=tabby-system:tabby-node"},
	} {
		if out, code := l.Kubectl(args...); code != 0 {
			t.Fatalf("kubectl %s: %s", strings.Join(args, " "), out)
		}
	}
	peer := &tabbyv1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: "tor"},
		Spec: tabbyv1.BGPPeerSpec{PeerIP: tor.Addr().String(), ASNumber: tabbyv1.DefaultASNumber,
			Password: &tabbyv1.SecretKeyRef{Name: "tor-bgp", Key: "password"}}}
	if _, err := l.DS(t).BGPPeers.Create(ctx, peer, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for i := 1; i <= 3; i++ {
		want := mesh(i, 3)
		want[tor.Addr().String()] = "bgppeer/tor"
		l.WaitBGP(t, fmt.Sprintf("node%d", i), 60*time.Second, Sessions(want))
	}
	t.Logf("sessions with BIRD up in %v", time.Since(start).Round(time.Millisecond))
	pods := webs(t, l, 1, 2, 3)

	// BIRD learns every node's block, via that node.
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range pods {
		want := blockOf(p) + " via " + l.Node(t, p.Spec.NodeName).IP()
		for {
			out, _ := run(nil, "ip", "-n", ns, "route", "show", blockOf(p))
			if strings.HasPrefix(strings.TrimSpace(out), want) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("BIRD has no route %s (kernel: %q); birdc show route:\n%s", want, out, birdc("show", "route"))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if out := birdc("show", "route", "protocol", "node1"); !strings.Contains(out, blockOf(pods["web1"])) {
		t.Errorf("birdc show route protocol node1 lacks node1's block:\n%s", out)
	}
	// Every node installs BIRD's prefix, and its pods reach it.
	for i := 1; i <= 3; i++ {
		line := l.WaitRoute(t, fmt.Sprintf("node%d", i), "192.0.2.0/24", 20*time.Second)
		if want := "192.0.2.0/24 via " + tor.Addr().String() + " dev eth0 proto 81"; strings.TrimSpace(line) != want {
			t.Errorf("node%d: %q, want %q", i, line, want)
		}
		pod := pods[fmt.Sprintf("web%d", i)]
		if out, code := l.Exec("default/"+pod.Name, "ping", "-c", "1", "-W", "2", "192.0.2.1"); code != 0 {
			t.Errorf("%s cannot reach 192.0.2.1 behind BIRD: %s", pod.Name, out)
		}
	}
	out, _ := l.NodeExec(t, "node1", Tabbyctl(), "node", "status")
	t.Logf("tabbyctl node status on node1:\n%s", out)
	if !strings.Contains(out, "bgppeer/tor") {
		t.Errorf("node status does not show the BGPPeer session")
	}
}

// TestTabbydRestart restarts tabbyd on the nodes at both ends of two
// continuous probes (ping and TCP every 50 ms): nothing is lost. A restart
// is what users do (tabbyctl lab restart deletes the node's tabby-node
// pod; tabbyd gets SIGTERM and the DaemonSet's new pod starts a new one):
// the stopping tabbyd leaves its routes, its peers keep theirs by BGP
// graceful restart, and the new one keeps the routes until BGP has
// converged. A block claimed on another node while the new tabbyd
// converges is routed within seconds (not the minutes of a GoBGP
// deferral). Then tabbyd crashes (SIGKILL) on the third node, also at an
// end of a probe: kubelet starts the container again, and again nothing is
// lost.
func TestTabbydRestart(t *testing.T) {
	t.Parallel()
	l := Up(t, "--nodes", "3")
	ctx := context.Background()
	waitMesh(t, l, 3, 30*time.Second)
	pods := webs(t, l, 1, 2, 3)
	l.WaitRoute(t, "node1", blockOf(pods["web2"]), 10*time.Second)
	l.WaitRoute(t, "node2", blockOf(pods["web1"]), 10*time.Second)
	l.WaitRoute(t, "node3", blockOf(pods["web1"]), 10*time.Second)
	l.WaitRoute(t, "node1", blockOf(pods["web3"]), 10*time.Second)
	blue := &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "blue"}, Spec: tabbyv1.IPPoolSpec{CIDR: "10.251.0.0/16"}}
	if _, err := l.DS(t).IPPools.Create(ctx, blue, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f1 := l.StartFlow(t, pods["web1"], pods["web2"], webPort, 50*time.Millisecond)
	f2 := l.StartFlow(t, pods["web3"], pods["web1"], webPort, 50*time.Millisecond)
	time.Sleep(time.Second)

	for _, node := range []string{"node1", "node2", "node3"} {
		start := time.Now()
		old := l.TabbydProc(t, node)
		how := "restart"
		restarted := make(chan error, 1)
		if node == "node3" {
			how = "SIGKILL"
			if !old.Alive() {
				t.Fatalf("%s's tabbyd (pid %d) is gone before the kill", node, old.Pid)
			}
			if err := syscall.Kill(old.Pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			restarted <- nil
		} else {
			// lab restart returns once the new tabby-node pod is Ready,
			// when BGP has long converged: run it aside, and act as soon
			// as the new tabbyd runs.
			go func() {
				var err error
				if out, code := l.Tabbyctl("restart", node, "tabbyd"); code != 0 {
					err = fmt.Errorf("lab restart %s tabbyd (exit %d): %s", node, code, out)
				}
				restarted <- err
			}()
		}
		var proc lab.Proc
		for deadline := time.Now().Add(time.Minute); ; {
			p, err := lab.NodeProcess(l.Node(t, node), "tabbyd")
			if err == nil && p.Pid != old.Pid {
				proc = p
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no new tabbyd runs on %s a minute after the %s (%v)", node, how, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		newAt := time.Now()
		t.Logf("%s (%s): the old tabbyd (pid %d) ended and the new one (pid %d) started %v later",
			node, how, old.Pid, proc.Pid, newAt.Sub(start).Round(time.Millisecond))
		if node == "node2" {
			// A new block on node3 while node2's new tabbyd converges:
			// its route reaches node2 within seconds.
			p := Web("blue3", "node3", webPort)
			p.Annotations = map[string]string{tabbyv1.AnnotationIPv4Pools: `["blue"]`}
			l.Create(t, p)
			blue3 := l.WaitPod(t, "blue3", 30*time.Second, Running(true))
			claimed := time.Now()
			l.WaitRoute(t, "node2", blockOf(blue3), 20*time.Second)
			t.Logf("a block claimed on node3 %v after node2's new tabbyd started was routed on node2 %v later",
				claimed.Sub(newAt).Round(time.Millisecond), time.Since(claimed).Round(time.Millisecond))
			reach(t, l, pods["web2"], blue3)
		}
		if err := <-restarted; err != nil {
			t.Fatal(err)
		}
		st := l.WaitBGP(t, node, 30*time.Second, Sessions(mesh(int(node[4]-'0'), 3)))
		if st.Restart == "" {
			t.Errorf("%s's tabbyd does not say it restarted", node)
		}
		t.Logf("%s (%s): tabbyd ready with its sessions back %v after the %s (%s)", node, how, time.Since(start).Round(time.Millisecond), how, st.Restart)
	}
	time.Sleep(time.Second)
	for _, f := range []*Flow{f1, f2} {
		r := f.Stop()
		t.Logf("flow across the restarts: %s", r)
		if !r.OK() {
			t.Errorf("traffic was lost while tabbyd restarted: %s", r)
		}
	}
}
