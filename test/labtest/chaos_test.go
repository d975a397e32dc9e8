package labtest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tabbynet/tabby/internal/tier"
	"github.com/tabbynet/tabby/ipam/gc"
	"github.com/tabbynet/tabby/lab"
)

// The chaos lab's IPAM garbage collector: a short grace period so that
// leaks are collected within the test.
const (
	chaosGrace    = 10 * time.Second
	chaosInterval = 2 * time.Second
	chaosLabel    = "tabby-chaos"
	// chaosOutage is how long the API server stays down.
	chaosOutage = 20 * time.Second
	// chaosReleaseBound: an address of a deleted pod is back in its pool
	// within the grace period plus one pass of the collector, counted from
	// when the collector could act (the pod gone, the collector started),
	// with a second of slack for its caches and the pass itself.
	chaosReleaseBound = chaosGrace + chaosInterval + time.Second
	// chaosBackBound is how long a restarted tabbyd or a re-added node
	// may take to be ready again: it catches a hang, it does not measure
	// (the test logs how long each took). Under the churn, 2 cores run at
	// a load of 60 to 80; containerd then takes up to a minute to handle
	// the exit of a SIGKILLed container (its task deletions time out
	// again and again), and only then does the kubelet start it again.
	chaosBackBound = 3 * time.Minute
)

// churner creates and deletes pods in a loop on the nodes it is given.
type churner struct {
	l   *Lab
	ctx context.Context

	mu     sync.Mutex
	rng    *rand.Rand
	nodes  []string
	paused bool
	busy   sync.Mutex // held while an operation is in flight
	seq    int
	// live are the pods created and not deleted (desired), by name -> node.
	live map[string]string
	// deleted are the pods deleted, by name -> when the delete was asked.
	deleted                                  map[string]time.Time
	created, deletes, createErrs, deleteErrs int
	lastErr                                  string

	stop chan struct{}
	done chan struct{}
}

// chaosPod is an agnhost pause pod with no volume at all (no service
// account token: its kubelet needs nothing from the API server to run its
// sandbox, so that ADDs run during the API server's outage).
func chaosPod(name, node string) *corev1.Pod {
	p := Sleeper(name, node)
	p.Labels = map[string]string{"app": chaosLabel}
	p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](1)
	p.Spec.AutomountServiceAccountToken = ptr.To(false)
	p.Spec.EnableServiceLinks = ptr.To(false)
	return p
}

func startChurn(l *Lab, nodes []string, seed uint64) *churner {
	c := &churner{l: l, ctx: context.Background(), rng: rand.New(rand.NewPCG(seed, 1)), nodes: append([]string(nil), nodes...),
		live: map[string]string{}, deleted: map[string]time.Time{}, stop: make(chan struct{}), done: make(chan struct{})}
	go c.run()
	return c
}

func (c *churner) run() {
	defer close(c.done)
	for {
		c.mu.Lock()
		d := time.Duration(250+c.rng.IntN(250)) * time.Millisecond
		c.mu.Unlock()
		select {
		case <-c.stop:
			return
		case <-time.After(d):
		}
		c.step()
	}
}

// step creates or deletes one pod on a random node: nodes with few pods
// get one more, nodes with many lose one, the others either.
func (c *churner) step() {
	c.busy.Lock()
	defer c.busy.Unlock()
	c.mu.Lock()
	if c.paused || len(c.nodes) == 0 {
		c.mu.Unlock()
		return
	}
	node := c.nodes[c.rng.IntN(len(c.nodes))]
	var mine []string
	for name, n := range c.live {
		if n == node {
			mine = append(mine, name)
		}
	}
	sort.Strings(mine)
	create := len(mine) < 3 || (len(mine) < 7 && c.rng.IntN(2) == 0)
	var victim string
	if !create {
		victim = mine[c.rng.IntN(len(mine))]
	} else {
		c.seq++
		victim = fmt.Sprintf("chaos-%03d", c.seq)
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
	defer cancel()
	pods := c.l.CS.CoreV1().Pods(metav1.NamespaceDefault)
	if create {
		_, err := pods.Create(ctx, chaosPod(victim, node), metav1.CreateOptions{})
		c.mu.Lock()
		if err != nil {
			c.createErrs++
			c.lastErr = err.Error()
		} else {
			c.created++
			c.live[victim] = node
		}
		c.mu.Unlock()
		return
	}
	err := pods.Delete(ctx, victim, metav1.DeleteOptions{})
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil && !apierrors.IsNotFound(err) {
		c.deleteErrs++
		c.lastErr = err.Error()
		return
	}
	c.deletes++
	delete(c.live, victim)
	c.deleted[victim] = time.Now()
}

// pause stops (or resumes) the churn; it returns once no operation is in
// flight.
func (c *churner) pause(p bool) {
	c.mu.Lock()
	c.paused = p
	c.mu.Unlock()
	c.busy.Lock()
	c.busy.Unlock() //nolint:staticcheck // waits for the operation in flight
}

// removeNode stops using node and forgets its pods (the caller deletes
// them), returning their names.
func (c *churner) removeNode(node string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nodes = slices.DeleteFunc(c.nodes, func(n string) bool { return n == node })
	var out []string
	for name, n := range c.live {
		if n == node {
			out = append(out, name)
			delete(c.live, name)
			c.deleted[name] = time.Now()
			c.deletes++
		}
	}
	sort.Strings(out)
	return out
}

func (c *churner) addNode(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nodes = append(c.nodes, node)
}

// add records pods created outside the loop as desired.
func (c *churner) add(name, node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.live[name] = node
	c.created++
}

func (c *churner) forget(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.live[name]; ok {
		delete(c.live, name)
		c.deleted[name] = time.Now()
		c.deletes++
	}
}

func (c *churner) next() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	return fmt.Sprintf("chaos-%03d", c.seq)
}

func (c *churner) livePods(node string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for name, n := range c.live {
		if node == "" || n == node {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

func (c *churner) halt() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	<-c.done
}

// gcLeader is the node whose tabbyd holds the IPAM garbage collector's
// Lease ("" when it cannot be read).
func gcLeader(l *Lab) string {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	lease, err := l.CS.CoordinationV1().Leases("tabby-system").Get(ctx, gc.DefaultLeaseName, metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		return ""
	}
	return *lease.Spec.HolderIdentity
}

// restartTabbyd restarts a node's tabbyd: gracefully, as a user does, by
// deleting its tabby-node pod (tabbyctl lab restart: SIGTERM, a new pod
// from the DaemonSet), or by SIGKILL of the tabbyd process (its kubelet
// starts the container again).
func restartTabbyd(t *testing.T, l *Lab, node string, kill bool) {
	t.Helper()
	start := time.Now()
	if kill {
		old := l.TabbydProc(t, node)
		if err := KillProc(old); err != nil {
			t.Fatal(err)
		}
		started := waitTabbydBack(t, l, node, old, chaosBackBound)
		t.Logf("%s: tabbyd SIGKILLed; its kubelet started it again %v later, ready %v after the kill", node,
			started.Sub(start).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		return
	}
	if out, code := l.Tabbyctl("restart", node, lab.ComponentTabbyd, "--grace", "10s"); code != 0 {
		t.Fatalf("lab restart %s tabbyd: %s", node, out)
	}
	t.Logf("%s: tabby-node pod deleted (SIGTERM); the DaemonSet's new one ready in %v", node, time.Since(start).Round(time.Millisecond))
}

// waitTabbydBack waits until another tabbyd process than old runs on node
// and answers /readyz, and returns when that process was first seen.
func waitTabbydBack(t *testing.T, l *Lab, node string, old lab.Proc, d time.Duration) time.Time {
	t.Helper()
	n := l.Node(t, node)
	start := time.Now()
	deadline := start.Add(d)
	var seen time.Time
	for {
		p, err := lab.NodeProcess(n, "tabbyd")
		if err == nil && p.Pid == old.Pid && p.Start == old.Start {
			err = fmt.Errorf("still the old tabbyd (pid %d)", old.Pid)
		}
		if err == nil {
			if seen.IsZero() {
				seen = time.Now()
			}
			_, err = l.TabbydGetErr(node, "/readyz")
		}
		if err == nil {
			return seen
		}
		if time.Now().After(deadline) {
			l.Suspect = node
			when := "no new tabbyd process yet"
			if !seen.IsZero() {
				when = fmt.Sprintf("a new tabbyd process since %v after the wait began", seen.Sub(start).Round(time.Millisecond))
			}
			t.Fatalf("%s's tabbyd is not back after %v (%s): %v", node, d, when, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitNodeBack waits until node is Ready and untainted and its tabbyd
// answers /readyz.
func waitNodeBack(t *testing.T, l *Lab, node string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			n, err := l.CS.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			if err != nil {
				return err
			}
			ready := false
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					ready = true
				}
			}
			if !ready || len(n.Spec.Taints) > 0 {
				return fmt.Errorf("node %s: not Ready or tainted (%v)", node, n.Spec.Taints)
			}
			_, err = l.TabbydGetErr(node, "/readyz")
			return err
		}()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			l.Suspect = node
			t.Fatalf("node %s is not back after %v: %v", node, d, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ipamCheck runs tabbyctl ipam check -o json against the lab.
func ipamCheck(l *Lab) (string, int) {
	return run(nil, Tabbyctl(), "--kubeconfig", l.Kubeconfig, "ipam", "check", "-o", "json")
}

// gcRunStarts are the times a tabbyd's collector started its passes with
// an empty memory (it became the leader), from the tabbyds' logs.
func gcRunStarts(logs *ContainerLogs) []time.Time {
	var out []time.Time
	for _, ll := range logs.Lines(func(ll LogLine) bool { return ll.Msg == "IPAM garbage collector running" }) {
		out = append(out, ll.Time)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// lastBefore is the latest time in sorted ts at or before at (zero when none).
func lastBefore(ts []time.Time, at time.Time) time.Time {
	var out time.Time
	for _, x := range ts {
		if !x.After(at) {
			out = x
		}
	}
	return out
}

func maxTime(ts ...time.Time) time.Time {
	var out time.Time
	for _, x := range ts {
		if x.After(out) {
			out = x
		}
	}
	return out
}

// addOf is the ADD whose failure the kubelet logged in ll: of the ADDs
// of its pod on its node, the last to end before the line's time, give or
// take 2 s (the killer learns of an exit a moment late under load; taking
// the last keeps an earlier attempt from standing in for this one). Nil
// when the killer saw none; one still running when the killer stopped has
// no end and is not taken.
func addOf(adds []CNIAdd, ll LogLine) *CNIAdd {
	pod := strings.TrimPrefix(ll.Attrs["pod"], metav1.NamespaceDefault+"/")
	var out *CNIAdd
	for i := range adds {
		a := &adds[i]
		if a.Node != ll.Node || a.Pod != pod || a.End.IsZero() || a.End.After(ll.Time.Add(2*time.Second)) {
			continue
		}
		if out == nil || a.End.After(out.End) {
			out = a
		}
	}
	return out
}

// sandboxFailures are the kubelet's "Failed to create sandbox" (CNI ADD
// failed) lines of every node for which keep returns true.
func sandboxFailures(t *testing.T, l *Lab, nodes []string, keep func(LogLine) bool) []LogLine {
	var out []LogLine
	for _, n := range nodes {
		out = append(out, l.KubeletLog(t, n, func(ll LogLine) bool {
			return ll.Msg == "Failed to create sandbox for pod" && keep(ll)
		})...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out
}

// TestIPAMChaos is issue 6 §3 in a 3-node lab of real nodes (kubelet,
// containerd, tabbyd as the tabby-node DaemonSet), with the IPAM garbage
// collector at a 10 s grace and a 2 s interval:
//
//   - pods are created and deleted in a loop on every node while the CNI
//     plugins that containerd runs are SIGKILLed in the middle of ADD
//     (containerd undoes the sandbox, the kubelet retries), tabbyd is
//     restarted (its pod deleted, and SIGKILL of the process), and a node
//     dies (its kubelet and tabbyd killed; its pods keep running) and is
//     deleted (its Node and pods, as the pod GC does), then comes back;
//     then a tabbyd dies and the collector's leader restarts;
//   - last, the API server is stopped for 20 s (pods created and deleted
//     just before, their kubelets frozen until it is down): the ADDs that
//     tabbyd's spare addresses cannot answer fail with an error naming the
//     unreachable API server, and all converge once it is back;
//   - all along, every 200 ms and on every pod event, no address is held
//     by two Running pods, by their status in the API nor on the eth0 of
//     their sandboxes in the kernel;
//   - afterwards every desired pod is Running with an address of its own,
//     every address of a deleted pod is back in its pool within the grace
//     period plus a pass of the collector (counted from when its pod was
//     gone, or from when the collector that freed it started), and
//     tabbyctl ipam check finds nothing wrong.
//
// It takes about 3 minutes. With $TABBY_CHAOS_LOGS set, the lab's logs are
// copied there at the end.
func TestIPAMChaos(t *testing.T) {
	tier.Root(t, "the chaos test brings up a lab (network namespaces, a control plane)")
	testStart := time.Now()
	l := Up(t, "--nodes", "3",
		"--tabbyd-arg=--ipam-gc-grace="+chaosGrace.String(),
		"--tabbyd-arg=--ipam-gc-interval="+chaosInterval.String())
	var nodes []string
	for _, n := range l.State.Nodes {
		nodes = append(nodes, n.Name)
	}
	tabbydLogs := l.FollowContainerLogs(t, "tabby-system", "tabby-node-", "tabbyd")
	keepLogs(t, l, tabbydLogs)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	mon := l.StartAddressMonitor(t, 200*time.Millisecond)
	t.Cleanup(mon.Stop)
	killer := l.StartCNIKiller(metav1.NamespaceDefault, 0.4, 150*time.Millisecond, seed)
	t.Cleanup(func() { killer.Stop() })
	t.Logf("CNI killer: containerd's children, found by %s", killer.Mode)
	ch := startChurn(l, nodes, seed)
	t.Cleanup(ch.halt)
	restarts := 0
	ctx := context.Background()

	// Phase 1: churn, kills, tabbyd restarts, a node deleted and re-added.
	time.Sleep(4 * time.Second)
	restartTabbyd(t, l, "node1", false)
	restarts++
	time.Sleep(2 * time.Second)

	leader := gcLeader(l)
	victim := "node3"
	if leader == victim {
		victim = "node2"
	}
	var bystander string
	for _, n := range nodes {
		if n != victim && n != leader {
			bystander = n
		}
	}
	t.Logf("IPAM GC leader %q; deleting %s", leader, victim)
	ch.pause(true)
	victimPods := ch.removeNode(victim)
	mon.NodeDown(victim, true)
	l.Reload(t)
	vn := l.Node(t, victim)
	// The machine dies: its kubelet, then its tabbyd are killed (the
	// containers of its pods keep running, stale), then the Node is
	// deleted and its pods with it, as the pod GC does 40 s later.
	vTabbyd := l.TabbydProc(t, victim)
	for _, p := range []lab.Proc{vn.Kubelet, vTabbyd} {
		if err := KillProc(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.CS.CoreV1().Nodes().Delete(ctx, victim, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting Node %s: %v", victim, err)
	}
	nodeDeleted := time.Now()
	vpods, err := l.CS.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + victim})
	if err != nil {
		t.Fatal(err)
	}
	// Its pods (tabby-node, kube-proxy, maybe CoreDNS too), and the chaos
	// pods meant for it and not scheduled yet.
	var doomed []string
	for _, name := range victimPods {
		doomed = append(doomed, metav1.NamespaceDefault+"/"+name)
	}
	for _, p := range vpods.Items {
		if key := p.Namespace + "/" + p.Name; !slices.Contains(doomed, key) {
			doomed = append(doomed, key)
		}
	}
	for _, key := range doomed {
		ns, name, _ := strings.Cut(key, "/")
		err := l.CS.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("deleting pod %s of the deleted node: %v", key, err)
		}
		if ns == metav1.NamespaceDefault {
			ch.forget(name)
		}
	}
	podsDeleted := time.Now()
	ch.pause(false)
	t.Logf("%s died and was deleted with its %d pods (%d bound to it)", victim, len(doomed), len(vpods.Items))
	// tabbyd of a bystander dies meanwhile (not the leader's: the
	// collector that frees the node is timed).
	time.Sleep(3 * time.Second)
	if bystander != "" {
		restartTabbyd(t, l, bystander, true)
		restarts++
	}
	// The collector frees the node's addresses and blocks.
	deadline := podsDeleted.Add(chaosGrace + 3*chaosInterval + 25*time.Second)
	for {
		allocs, blocks := mon.NodeAllocations(victim)
		if allocs == 0 && blocks == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's allocations (%d) and blocks (%d) are still there %v after it was deleted", victim, allocs, blocks, time.Since(nodeDeleted))
		}
		time.Sleep(100 * time.Millisecond)
	}
	nodeFreed := time.Since(podsDeleted)
	affs, err := l.DS(t).BlockAffinities.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range affs.Items {
		if a.Spec.Node == victim {
			t.Errorf("BlockAffinity %s of the deleted node %s is still there after its blocks were freed", a.Name, victim)
		}
	}
	t.Logf("%s: its addresses and blocks were freed %v after its pods were deleted (grace %v + interval %v)",
		victim, nodeFreed.Round(time.Millisecond), chaosGrace, chaosInterval)
	// It comes back: the kubelet registers the Node again and tears down
	// the sandboxes of the pods deleted meanwhile (CNI DEL of sandboxes
	// whose addresses may be another pod's by now); the DaemonSet starts
	// tabby-node there again.
	back := time.Now()
	if out, code := l.Tabbyctl("restart", victim, lab.ComponentKubelet); code != 0 {
		t.Fatalf("lab restart %s kubelet: %s", victim, out)
	}
	l.Reload(t)
	waitNodeBack(t, l, victim, chaosBackBound)
	waitStaleGone(t, mon, victim, 60*time.Second)
	mon.NodeDown(victim, false)
	ch.addNode(victim)
	t.Logf("%s re-added %v after it was deleted (kubelet started, Node Ready and tabbyd ready, stale sandboxes gone in %v)",
		victim, time.Since(nodeDeleted).Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
	time.Sleep(3 * time.Second)

	// Phase 2: more churn and kills; a tabbyd dies, then the collector's
	// leader restarts (its pod deleted, a new one from the DaemonSet).
	restartTabbyd(t, l, nodes[rand.New(rand.NewPCG(seed, 2)).IntN(len(nodes))], true)
	restarts++
	time.Sleep(3 * time.Second)
	if ld := gcLeader(l); ld != "" {
		restartTabbyd(t, l, ld, false)
		restarts++
	}
	time.Sleep(3 * time.Second)

	// Phase 3: the API server stops for 20 s, with ADDs and DELs under way.
	// The kubelets are frozen (SIGSTOP) while pods are created for them and
	// others deleted, and thawed once the API server is down: they read the
	// watch events the API server sent before it went, and run those ADDs
	// and DELs without it.
	ch.pause(true)
	l.Reload(t)
	var frozen []lab.Proc
	thaw := func() {
		for _, p := range frozen {
			if p.Alive() {
				_ = syscall.Kill(p.Pid, syscall.SIGCONT)
			}
		}
		frozen = nil
	}
	t.Cleanup(thaw)
	for _, n := range l.State.Nodes {
		if n.Kubelet.Alive() && syscall.Kill(n.Kubelet.Pid, syscall.SIGSTOP) == nil {
			frozen = append(frozen, n.Kubelet)
		}
	}
	var wg sync.WaitGroup
	var batch []string
	for _, n := range nodes {
		// More than each tabbyd holds ahead (--cni-spare-addresses, 2):
		// those ADDs are answered without the API server, the others
		// fail naming it.
		for range 4 {
			name := ch.next()
			batch = append(batch, name)
			p := chaosPod(name, "")
			p.Spec.NodeName = n // bound at once: the kubelet starts ADD
			wg.Go(func() {
				if _, err := l.CS.CoreV1().Pods(metav1.NamespaceDefault).Create(ctx, p, metav1.CreateOptions{}); err != nil {
					t.Errorf("creating %s: %v", p.Name, err)
					return
				}
				ch.add(p.Name, n)
			})
		}
		if live := ch.livePods(n); len(live) > 0 {
			name := live[0]
			wg.Go(func() {
				if err := l.CS.CoreV1().Pods(metav1.NamespaceDefault).Delete(ctx, name, metav1.DeleteOptions{}); err == nil {
					ch.forget(name)
				}
			})
		}
	}
	wg.Wait()
	time.Sleep(500 * time.Millisecond) // the watch events reach the kubelets' sockets
	stopAsked := time.Now()
	if err := lab.StopAPIServer(l.State, 0); err != nil {
		thaw()
		t.Fatal(err)
	}
	apiDown := time.Now()
	thaw()
	t.Logf("API server stopped in %v, %d pods created and a few deleted just before", apiDown.Sub(stopAsked).Round(time.Millisecond), len(batch))
	time.Sleep(chaosOutage)
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	startAsked := time.Now()
	err = lab.StartAPIServer(sctx, l.State)
	cancel()
	if err != nil {
		t.Fatalf("starting the API server again: %v", err)
	}
	apiUp := time.Now()
	t.Logf("API server down from %s to %s", apiDown.Format("15:04:05.000"), apiUp.Format("15:04:05.000"))
	t.Logf("API server down for %v (back and ready %v after the start)", apiUp.Sub(apiDown).Round(time.Millisecond), apiUp.Sub(startAsked).Round(time.Millisecond))

	// Phase 4: quiet from when the API server is back (the kubelets'
	// watches back off while it is down, and may not see new pods for up
	// to a minute after): everything converges.
	ch.halt()
	kr := killer.Stop()
	quiet := time.Now()
	desired := ch.livePods("")
	var desiredKeys []string
	for _, name := range desired {
		desiredKeys = append(desiredKeys, metav1.NamespaceDefault+"/"+name)
	}
	t.Logf("chaos over after %v: %d pods created, %d deleted (create errors %d, delete errors %d; last %q); %d desired",
		quiet.Sub(testStart).Round(time.Second), ch.created, ch.deletes, ch.createErrs, ch.deleteErrs, ch.lastErr, len(desired))
	var lifetimes []time.Duration
	outageStarts := 0
	for _, a := range kr.Adds {
		if !a.Killed && !a.End.IsZero() {
			lifetimes = append(lifetimes, a.End.Sub(a.Start))
		}
		if !a.Start.Before(apiDown) && a.Start.Before(apiUp) {
			outageStarts++
		}
	}
	slices.Sort(lifetimes)
	killedPods := map[string]bool{}
	byBinary := map[string]int{}
	for _, k := range kr.Kills {
		killedPods[k.Pod] = true
		byBinary[k.Binary]++
	}
	t.Logf("CNI ADDs seen %d, killed mid-ADD %d (%v) in %d pods; ADDs not killed ran p50 %v, max %v (events lost %d)",
		len(kr.Adds), len(kr.Kills), byBinary, len(killedPods), percentile(lifetimes, 50).Round(time.Millisecond),
		percentile(lifetimes, 100).Round(time.Millisecond), kr.LostEvents)

	// All desired pods Running with an address of their own.
	convDeadline := time.Now().Add(150 * time.Second)
	lastWhy := time.Now()
	for {
		pods, err := l.CS.CoreV1().Pods(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{LabelSelector: "app=" + chaosLabel})
		var why string
		if err != nil {
			why = err.Error()
		} else {
			why = converged(pods.Items, desired)
		}
		if why == "" {
			break
		}
		if time.Now().After(convDeadline) {
			t.Fatalf("not converged %v after the chaos: %s", time.Since(quiet).Round(time.Second), why)
		}
		if time.Since(lastWhy) > 10*time.Second {
			t.Logf("converging (%v): %s", time.Since(quiet).Round(time.Second), why)
			lastWhy = time.Now()
		}
		time.Sleep(250 * time.Millisecond)
	}
	convergedAfter := time.Since(quiet)
	t.Logf("all %d desired pods Running with unique addresses %v after the chaos", len(desired), convergedAfter.Round(time.Millisecond))

	// Every address of a deleted pod back in its pool.
	freeDeadline := time.Now().Add(chaosGrace + 3*chaosInterval + 30*time.Second)
	for {
		var held []string
		for key, r := range mon.Pods() {
			if slices.Contains(desiredKeys, key) || len(r.Alloc) == 0 {
				continue
			}
			if !r.GoneAt.IsZero() {
				held = append(held, fmt.Sprintf("%s %v", key, addrKeys(r.Alloc)))
			}
		}
		if len(held) == 0 {
			break
		}
		if time.Now().After(freeDeadline) {
			t.Fatalf("addresses of deleted pods still allocated %v after the chaos: %v", time.Since(quiet).Round(time.Second), held)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// The collector has had a grace period and a pass since its last
	// (re)start and since the chaos ended: ipam check must be clean.
	starts := gcRunStarts(tabbydLogs)
	settle := maxTime(quiet, lastBefore(starts, time.Now())).Add(chaosGrace + 2*chaosInterval + time.Second)
	if d := time.Until(settle); d > 0 {
		time.Sleep(d)
	}
	out, code := ipamCheck(l)
	var rep struct {
		OK       bool `json:"ok"`
		Problems int  `json:"problems"`
		Notes    int  `json:"notes"`
		Findings []struct {
			Kind, Severity, IP, Message string
		} `json:"findings"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil && code == 0 {
		t.Errorf("tabbyctl ipam check -o json printed no report: %v\n%s", err, out)
	}
	if code != 0 {
		t.Errorf("tabbyctl ipam check exits %d after the chaos:\n%s", code, out)
	} else {
		t.Logf("tabbyctl ipam check: clean (exit 0, %d notes)", rep.Notes)
	}

	// Continuous checks; first, proof that the kernel check sees a double
	// holding in the real sandboxes.
	mon.Stop()
	if v, err := mon.ProveKernelCheck(); err != nil {
		t.Errorf("the kernel check: %v", err)
	} else {
		t.Logf("the kernel check catches a double holding: it found %s on two sandboxes (%v) when the address was added to the second", v.IP, v.Holders)
	}
	r := mon.Report()
	t.Logf("monitor: %d API checks (lists every 200 ms and every pod event; %d lists failed, last: %s; up to %d Running pods with addresses at once), %d kernel checks (every 200 ms, every sandbox in the nodes' cgroups; %d pod addresses read, %d sandboxes of Running pods; read errors %d %s)",
		r.APISamples, r.ListErrors, r.LastListError, r.MaxRunning, r.KernelSamples, r.KernelAddrs, r.KernelRunning, r.KernelErrors, r.LastKernelError)
	if r.MaxRunning < 2 || r.KernelAddrs == 0 || r.KernelRunning == 0 {
		t.Errorf("the monitor saw too little to judge (%d Running pods at most, %d kernel addresses, %d sandboxes of Running pods)", r.MaxRunning, r.KernelAddrs, r.KernelRunning)
	}
	if len(r.Mismatches) > 0 {
		t.Logf("Running pods whose eth0 lacked their status address (samples): %v", r.Mismatches)
	}
	for _, s := range r.Stale {
		t.Logf("stale sandbox on the dead node %s: %s kept %s while %s held it (%s to %s)", s.Node, s.Sandbox, s.IP, s.Holder,
			s.First.Format("15:04:05.000"), s.Last.Format("15:04:05.000"))
	}
	for _, v := range r.Violations {
		t.Errorf("VIOLATION %s", v)
	}
	t.Logf("violations: %d", len(r.Violations))

	// The kubelet retried every killed ADD (the killed pods that are
	// desired are Running: checked above); what it logged.
	killedRetried := len(sandboxFailures(t, l, nodes, func(ll LogLine) bool { return strings.Contains(ll.Attrs["err"], "signal: killed") }))
	t.Logf("kubelet: %d sandboxes failed with a killed plugin and were retried", killedRetried)
	if len(kr.Kills) == 0 {
		t.Errorf("no CNI ADD was killed: the chaos did not test what it claims (ADDs seen %d)", len(kr.Adds))
	}

	// ADDs while the API server was down: the kubelet's sandbox failures
	// logged then (a failure is logged when its ADD returns).
	outageAdds := sandboxFailures(t, l, nodes, func(ll LogLine) bool {
		return strings.Contains(ll.Attrs["err"], "failed (add)") && !ll.Time.Before(apiDown) && ll.Time.Before(apiUp)
	})
	t.Logf("%d ADDs failed while the API server was down (%d ADDs started then)", len(outageAdds), outageStarts)
	texts := map[string]int{}
	endedBefore := 0
	for _, ll := range outageAdds {
		e := ll.Attrs["err"]
		if strings.Contains(e, "signal: killed") {
			continue
		}
		// The kubelets were frozen until the API server was down, so a
		// failure is logged then even when its ADD ended before: the
		// ADD's own end (the plugin's exit) says which it was.
		add := addOf(kr.Adds, ll)
		if add != nil && add.End.Before(apiDown) {
			endedBefore++
			continue
		}
		// The API server answered this one: the pod was deleted just
		// before the outage (the chaos deletes pods right up to the stop),
		// and the ADD's failure was logged only after the stop began.
		if strings.Contains(e, "does not exist in the API server") && ll.Time.Sub(apiDown) < 5*time.Second {
			continue
		}
		if !strings.Contains(e, "API server") || !(strings.Contains(e, "cannot be reached") || strings.Contains(e, "could not be reached")) {
			ran := "the ADD's run was not seen"
			if add != nil {
				ran = fmt.Sprintf("the ADD ran %s-%s", add.Start.Format("15:04:05.000"), add.End.Format("15:04:05.000"))
			}
			t.Errorf("an ADD failed during the outage without naming the unreachable API server (%s, %s; %s): %s", ll.Node, ll.Attrs["pod"], ran, e)
		}
		texts[normalizeErr(e)]++
	}
	for txt, n := range texts {
		t.Logf("outage ADD error (%d×): %s", n, txt)
	}
	if endedBefore > 0 {
		t.Logf("%d of those ADDs ended before the API server stopped (their kubelets, frozen, logged them after)", endedBefore)
	}
	if len(outageAdds) == 0 {
		t.Errorf("no ADD failed while the API server was down: the outage caught no ADD")
	}
	// ADDs that failed after the API server was back (tabbyd's and the
	// kubelets' watches back off while it is down, and catch up later).
	afterAdds := sandboxFailures(t, l, nodes, func(ll LogLine) bool {
		return strings.Contains(ll.Attrs["err"], "failed (add)") && !ll.Time.Before(apiUp) && !strings.Contains(ll.Attrs["err"], "signal: killed")
	})
	if len(afterAdds) > 0 {
		why := map[string]int{}
		for _, ll := range afterAdds {
			e := ll.Attrs["err"]
			if _, rest, ok := strings.Cut(e, "failed (add): "); ok {
				e = rest
			}
			if i := strings.Index(e, " within "); i > 0 {
				e = e[:i]
			}
			why[ipInParens.ReplaceAllString(normalizeErr(e), "(…)")]++
		}
		t.Logf("%d ADDs failed after the API server was back, the last %v after it:", len(afterAdds), afterAdds[len(afterAdds)-1].Time.Sub(apiUp).Round(time.Millisecond))
		for e, n := range why {
			t.Logf("  (%d×) %s", n, e)
		}
	}
	var outageDels []LogLine
	sandboxes := map[string]bool{}
	for _, n := range nodes {
		outageDels = append(outageDels, l.KubeletLog(t, n, func(ll LogLine) bool {
			return ll.Msg == "StopPodSandbox from runtime service failed" && strings.Contains(ll.Attrs["err"], "failed (delete)") &&
				!ll.Time.Before(apiDown) && ll.Time.Before(apiUp)
		})...)
	}
	for _, ll := range outageDels {
		sandboxes[ll.Attrs["podSandboxID"]] = true
	}
	if len(outageDels) > 0 {
		t.Logf("%d DELs of %d sandboxes failed (and were retried) while the API server was down, e.g.: %s", len(outageDels), len(sandboxes), normalizeErr(outageDels[0].Attrs["err"]))
	}

	// Time for a deleted pod's addresses to be back in the pool: freed by
	// CNI DEL before the pod object goes (the kubelet deletes it after
	// DEL), or by the collector (its log names the pod) afterwards.
	rels := gcReleases(tabbydLogs)
	relByPod := map[string]time.Time{}
	reasons := map[string]int{}
	var dueAfter []time.Duration
	for _, r := range rels {
		reasons[r.Reason]++
		if r.Pod != "" && r.At.After(relByPod[r.Pod]) {
			relByPod[r.Pod] = r.At
		}
		if !r.Since.IsZero() {
			dueAfter = append(dueAfter, r.At.Sub(r.Since))
		}
	}
	slices.Sort(dueAfter)
	// Each release is decided by the pass that runs when the grace period
	// since the collector first found the address a candidate ends (it
	// schedules one then), not a pass later: a pass later, an address
	// takes up to grace + 2 passes to come back. Judged by the pass's own
	// time (decidedAt), so that slow API calls under load do not count.
	latePass := 0
	for _, r := range rels {
		if r.Since.IsZero() || r.Decided.IsZero() {
			continue
		}
		if late := r.Decided.Sub(r.Since.Add(chaosGrace)); late >= chaosInterval/2 {
			latePass++
			t.Errorf("the collector released %s (pod %s) in a pass at %s, %v after it was due (candidate since %s, grace %v): a pass (%v) late",
				r.IP, r.Pod, r.Decided.Format("15:04:05.000"), late.Round(time.Millisecond), r.Since.Format("15:04:05.000"), chaosGrace, chaosInterval)
		}
	}
	var byDEL, byGC, overSpec int
	var worstDEL, worstGC, worstEff time.Duration
	var worstPod string
	recs := mon.Pods()
	for _, key := range sortedKeys(recs) {
		rec := recs[key]
		if slices.Contains(desiredKeys, key) || !rec.EverAllocated || rec.GoneAt.IsZero() {
			continue
		}
		freed, by := rec.AllocFreedAt, "CNI DEL"
		if rt, ok := relByPod[key]; ok && !rt.Before(rec.GoneAt) {
			freed, by = rt, "the collector"
		}
		lat := max(freed.Sub(rec.GoneAt), 0)
		if by == "CNI DEL" {
			byDEL++
			worstDEL = max(worstDEL, lat)
			continue
		}
		byGC++
		worstGC = max(worstGC, lat)
		// The collector can act from when the pod is gone, or from when
		// it (re)started with an empty memory, or the API server came back.
		gcStart := lastBefore(starts, freed)
		from := maxTime(rec.GoneAt, gcStart)
		if rec.GoneAt.Before(apiUp) && freed.After(apiUp) {
			from = maxTime(from, apiUp)
		}
		eff := freed.Sub(from)
		if eff > worstEff {
			worstEff, worstPod = eff, key
		}
		t.Logf("  %s on %s: gone %s, freed by %s %s: %v later (%v after the collector could act; it started %s)", key, rec.Node,
			rec.GoneAt.Format("15:04:05.000"), by, freed.Format("15:04:05.000"), lat.Round(time.Millisecond), eff.Round(time.Millisecond),
			gcStart.Format("15:04:05.000"))
		if eff > chaosReleaseBound {
			overSpec++
			t.Errorf("pod %s: its addresses were freed %v after it was gone (%v after the collector could act), more than the grace period %v plus a pass (%v) and %v of slack",
				key, lat.Round(time.Millisecond), eff.Round(time.Millisecond), chaosGrace, chaosInterval, chaosReleaseBound-chaosGrace-chaosInterval)
		}
	}
	t.Logf("deleted pods that had addresses: %d freed by CNI DEL (worst %v after the pod was gone, at the monitor's 200 ms resolution), %d freed by the collector (worst %v after the pod was gone, %v after the collector could act [%s]; %d over the bound %v)",
		byDEL, worstDEL.Round(time.Millisecond), byGC, worstGC.Round(time.Millisecond), worstEff.Round(time.Millisecond), worstPod, overSpec, chaosReleaseBound)
	t.Logf("collector: %d addresses released %v; released after first seen a candidate: min %v, max %v (%d decided a pass later than due); %d collector (re)starts; tabbyd restarts %d; total %v",
		len(rels), reasons, percentile(dueAfter, 0), percentile(dueAfter, 100), latePass, len(starts), restarts, time.Since(testStart).Round(time.Second))
}

// gcRelease is one address the collector released (from its log).
type gcRelease struct {
	At, Since, Decided    time.Time
	IP, Pod, Node, Reason string
}

// gcReleases reads the releases of every tabbyd's collector.
func gcReleases(logs *ContainerLogs) []gcRelease {
	var out []gcRelease
	for _, ll := range logs.Lines(func(ll LogLine) bool { return ll.Msg == "released a leaked address" }) {
		r := gcRelease{At: ll.Time, IP: ll.Attrs["ip"], Pod: ll.Attrs["pod"], Node: ll.Attrs["node"], Reason: ll.Attrs["reason"]}
		r.Since, _ = time.Parse(time.RFC3339, ll.Attrs["candidateSince"])
		r.Decided, _ = time.Parse(time.RFC3339, ll.Attrs["decidedAt"])
		out = append(out, r)
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// converged says why the pods are not as desired ("" when they are): every
// desired pod Running with an address no other pod has, and no other
// chaos pod left.
func converged(pods []corev1.Pod, desired []string) string {
	seen := map[string]bool{}
	by := map[string][]string{}
	var why []string
	for _, p := range pods {
		if !slices.Contains(desired, p.Name) {
			why = append(why, "pod "+p.Name+" should be gone")
			continue
		}
		seen[p.Name] = true
		if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
			why = append(why, fmt.Sprintf("%s is %s with IP %q", p.Name, p.Status.Phase, p.Status.PodIP))
			continue
		}
		by[p.Status.PodIP] = append(by[p.Status.PodIP], p.Name)
	}
	for _, d := range desired {
		if !seen[d] {
			why = append(why, d+" is missing")
		}
	}
	for ip, ps := range by {
		if len(ps) > 1 {
			why = append(why, fmt.Sprintf("%s held by %v", ip, ps))
		}
	}
	if len(why) > 5 {
		why = append(why[:5], fmt.Sprintf("and %d more", len(why)-5))
	}
	return strings.Join(why, "; ")
}

func addrKeys(m map[netip.Addr]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k.String())
	}
	sort.Strings(out)
	return out
}

var (
	hexID     = regexp.MustCompile(`[0-9a-f]{64}`)
	podUID    = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	chaosName = regexp.MustCompile(`chaos-\d+`)
	// ipInParens is a pod's address as the plugin's errors name it.
	ipInParens = regexp.MustCompile(`\(\d+\.\d+\.\d+\.\d+\)`)
)

// normalizeErr drops the names that differ between pods and sandboxes.
func normalizeErr(e string) string {
	e = hexID.ReplaceAllString(e, "…")
	e = podUID.ReplaceAllString(e, "…")
	return chaosName.ReplaceAllString(e, "chaos-…")
}

// waitStaleGone waits until the re-added node's kubelet has torn down the
// sandboxes of the pods deleted while it was dead.
func waitStaleGone(t *testing.T, mon *AddressMonitor, node string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	from := mon.KernelSamples()
	for {
		left := mon.StaleSandboxes(node)
		if mon.KernelSamples() > from && len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's kubelet did not tear down the sandboxes of its deleted pods within %v: %v", node, d, left)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// envChaosLogs names a folder that receives the lab's logs at the end of a
// chaos test (the lab itself is removed).
const envChaosLogs = "TABBY_CHAOS_LOGS"

// keepLogs copies the lab's logs (the nodes' kubelet and containerd, the
// tabbyd containers' as followed, the control plane's) to
// $TABBY_CHAOS_LOGS/<lab name> when the test ends.
func keepLogs(t *testing.T, l *Lab, tabbyd *ContainerLogs) {
	dst := os.Getenv(envChaosLogs)
	if dst == "" {
		return
	}
	t.Cleanup(func() {
		dir := filepath.Join(dst, l.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Log(err)
			return
		}
		files, _ := filepath.Glob(filepath.Join(l.Dir, "nodes", "*", "*.log"))
		cp, _ := filepath.Glob(filepath.Join(l.Dir, "cp", "*.log"))
		for _, f := range append(files, cp...) {
			data, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			rel, _ := filepath.Rel(l.Dir, f)
			_ = os.WriteFile(filepath.Join(dir, strings.ReplaceAll(rel, "/", "_")), data, 0o644)
		}
		if err := tabbyd.WriteTo(dir, "tabbyd"); err != nil {
			t.Log(err)
		}
		t.Logf("the lab's logs are in %s", dir)
	})
}

// TestChaosLogParsers: the log formats the chaos test reads.
func TestChaosLogParsers(t *testing.T) {
	ref := time.Date(2026, 12, 1, 16, 0, 0, 0, time.Local)
	kl := parseKlog(`E1201 15:20:41.606134    8269 kuberuntime_sandbox.go:71] "Failed to create sandbox for pod" err="rpc error: plugin type=\"tabby\" failed (add): netplugin failed with no error message: signal: killed" pod="default/t2"`, ref)
	if kl.Level != "E" || kl.Msg != "Failed to create sandbox for pod" || kl.Attrs["pod"] != "default/t2" ||
		!strings.HasSuffix(kl.Attrs["err"], "signal: killed") || !kl.Time.Equal(time.Date(2026, 12, 1, 15, 20, 41, 606134000, time.Local)) {
		t.Errorf("klog: %+v", kl)
	}
	sl := parseSlog(`time=2026-12-01T15:21:03.079Z level=INFO msg="released a leaked address" ip=10.244.1.2 pod=default/chaos-001 candidateSince=2026-12-01T15:20:53Z`)
	if sl.Msg != "released a leaked address" || sl.Attrs["pod"] != "default/chaos-001" || sl.Time.IsZero() || sl.Level != "INFO" {
		t.Errorf("slog: %+v", sl)
	}
}
