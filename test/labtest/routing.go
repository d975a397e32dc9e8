package labtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tabbynet/tabby/daemon/nodestatus"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/internal/testnet"
	"github.com/tabbynet/tabby/lab"
)

// DS is an admin datastore client of the lab (tabby's resources).
func (l *Lab) DS(t testing.TB) *datastore.Client {
	t.Helper()
	cfg, err := l.State.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	ds, err := datastore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return ds
}

// Node is the lab's node named name.
func (l *Lab) Node(t testing.TB, name string) *lab.Node {
	t.Helper()
	n, err := l.State.Node(name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// BGP asks a node's tabbyd for its status (sessions, routes).
func (l *Lab) BGP(t testing.TB, node string) (*nodestatus.Status, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return lab.NodeBGP(ctx, l.Node(t, node))
}

// WaitBGP waits until ok accepts the node's tabbyd status and returns it.
func (l *Lab) WaitBGP(t testing.TB, node string, d time.Duration, ok func(*nodestatus.Status) error) *nodestatus.Status {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		st, err := l.BGP(t, node)
		if err == nil {
			err = ok(st)
		}
		if err == nil {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's tabbyd: %v (waited %v)", node, err, d)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Sessions is a WaitBGP condition: the node is ready and has exactly the
// sessions want (peer node or address -> type), all Established.
func Sessions(want map[string]string) func(*nodestatus.Status) error {
	return func(st *nodestatus.Status) error {
		got := map[string]string{}
		for _, p := range st.Peers {
			key := p.Node
			if key == "" {
				key = p.Address
			}
			if !p.Established() {
				return fmt.Errorf("session with %s (%s) is %s %s", key, p.Type, p.State, p.Info)
			}
			got[key] = p.Type
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("sessions %v, want %v", got, want)
		}
		if !st.Ready {
			return fmt.Errorf("not ready: %v", st.NotReady)
		}
		return nil
	}
}

// NodeExec runs argv in a node's network namespace and returns its
// combined output and exit status.
func (l *Lab) NodeExec(t testing.TB, node string, argv ...string) (string, int) {
	t.Helper()
	return run(nil, "ip", append([]string{"netns", "exec", l.Node(t, node).NetNS}, argv...)...)
}

// NodeRoutes lists the IPv4 routes of a node's main table, one a line.
func (l *Lab) NodeRoutes(t testing.TB, node string) string {
	t.Helper()
	return l.nodeRoutes(t, node, "-4")
}

// NodeRoutes6 lists the IPv6 routes of a node's main table, one a line.
func (l *Lab) NodeRoutes6(t testing.TB, node string) string {
	t.Helper()
	return l.nodeRoutes(t, node, "-6")
}

// nodeRoutes lists the routes of a node's main table of one family ("-4"
// or "-6"), one a line.
func (l *Lab) nodeRoutes(t testing.TB, node, family string) string {
	t.Helper()
	out, code := l.NodeExec(t, node, "ip", family, "route", "show")
	if code != 0 {
		t.Fatalf("ip route on %s: %s", node, out)
	}
	return out
}

// WaitRoute waits until a node has a route to dst (the start of a line
// of ip route, e.g. "10.244.1.0/26 via 10.77.0.12", or an IPv6 one) and
// returns the line.
func (l *Lab) WaitRoute(t testing.TB, node, dst string, d time.Duration) string {
	t.Helper()
	family := "-4"
	if strings.Contains(dst, ":") {
		family = "-6"
	}
	deadline := time.Now().Add(d)
	for {
		routes := l.nodeRoutes(t, node, family)
		for _, line := range strings.Split(routes, "\n") {
			if strings.HasPrefix(line, dst) {
				return line
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has no route %s after %v:\n%s", node, dst, d, routes)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// AddHost adds a namespace tabby-<lab>-<name> to the underlay bridge of
// subnet (0 or 1) with address addr and a default route through the lab's
// router, as a router or server next to the nodes would be (lab down
// removes it and what runs in it, as any namespace of the lab). It
// returns the namespace's name.
func (l *Lab) AddHost(t testing.TB, name string, subnet int, addr netip.Prefix) string {
	t.Helper()
	ns := lab.Prefix(l.Name) + name
	underlay := lab.Layout{Name: l.Name}.UnderlayNS()
	outer := "h-" + name
	steps := [][]string{
		{"netns", "add", ns},
		{"-n", ns, "link", "set", "lo", "up"},
		{"link", "add", outer, "netns", underlay, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"-n", underlay, "link", "set", outer, "master", lab.Bridge(subnet), "up"},
		{"-n", ns, "addr", "add", addr.String(), "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", ns, "route", "add", "default", "via", lab.Gateway(subnet).Addr().String()},
	}
	for _, s := range steps {
		if out, code := run(nil, "ip", s...); code != 0 {
			t.Fatalf("ip %s: %s", strings.Join(s, " "), out)
		}
	}
	return ns
}

// Flow is a continuous probe from a pod (or a node) to a pod, to tell
// whether traffic ever stops: ping every Interval (ICMP) and a TCP
// connection to an agnhost serve-hostname server (Web) every Interval,
// both from inside the source's network namespace.
type Flow struct {
	t        testing.TB
	ping     *exec.Cmd
	out      *testnet.SyncBuffer
	stopTCP  chan struct{}
	tcpDone  sync.WaitGroup
	mu       sync.Mutex
	tcpOK    int
	tcpFails []string
	started  time.Time
}

// FlowResult is what a Flow saw.
type FlowResult struct {
	Duration time.Duration
	// Pings sent and answered, and the sequence numbers of the lost ones
	// (the last one, in flight when the flow stopped, is not counted).
	Pings, Answered int
	Lost            []int
	// TCP connections made and the failed ones, with their times.
	TCP      int
	TCPFails []string
}

// OK says nothing was lost.
func (r FlowResult) OK() bool { return len(r.Lost) == 0 && len(r.TCPFails) == 0 }

func (r FlowResult) String() string {
	fails := fmt.Sprint(r.TCPFails)
	if n := len(r.TCPFails); n > 4 {
		fails = fmt.Sprintf("[%s; %s ... %d more ... %s]", r.TCPFails[0], r.TCPFails[1], n-3, r.TCPFails[n-1])
	}
	return fmt.Sprintf("%v: %d pings, %d answered, lost %s; %d TCP connections, %d failed %s",
		r.Duration.Round(time.Millisecond), r.Pings, r.Answered, seqRanges(r.Lost), r.TCP, len(r.TCPFails), fails)
}

// seqRanges writes ascending sequence numbers as ranges: [3 7-9].
func seqRanges(seqs []int) string {
	var parts []string
	for i := 0; i < len(seqs); {
		j := i
		for j+1 < len(seqs) && seqs[j+1] == seqs[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(seqs[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d (%d)", seqs[i], seqs[j], j-i+1))
		}
		i = j + 1
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// StartFlow starts a continuous probe from the Running pod from to the
// pod to, a Web pod serving its name on port.
func (l *Lab) StartFlow(t testing.TB, from, to *corev1.Pod, port int, interval time.Duration) *Flow {
	t.Helper()
	if to.Status.PodIP == "" {
		t.Fatalf("flow %s -> %s: the pods are not wired yet", from.Name, to.Name)
	}
	return startFlow(t, l.PodNetNS(t, from.Namespace+"/"+from.Name), to, port, interval)
}

// StartNodeFlow starts a continuous probe from a node (its network
// namespace: what the node's own programs, hostNetwork pods and
// kube-proxy's forwarding send) to the pod to, a Web pod serving its name
// on port.
func (l *Lab) StartNodeFlow(t testing.TB, node string, to *corev1.Pod, port int, interval time.Duration) *Flow {
	t.Helper()
	if to.Status.PodIP == "" {
		t.Fatalf("flow %s -> %s: the pod is not wired yet", node, to.Name)
	}
	return startFlow(t, lab.NetNSPath(l.Node(t, node).NetNS), to, port, interval)
}

// startFlow starts a continuous probe from the network namespace at
// nsPath to the Web pod to.
func startFlow(t testing.TB, nsPath string, to *corev1.Pod, port int, interval time.Duration) *Flow {
	t.Helper()
	f := &Flow{t: t, out: &testnet.SyncBuffer{}, stopTCP: make(chan struct{}), started: time.Now()}
	f.ping = exec.Command("nsenter", "--net="+nsPath, "ping", "-n", "-i", fmt.Sprintf("%.3f", interval.Seconds()), "-W", "1", to.Status.PodIP)
	f.ping.Stdout, f.ping.Stderr = f.out, f.out
	f.ping.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := f.ping.Start(); err != nil {
		t.Fatalf("starting ping: %v", err)
	}
	t.Cleanup(func() { _ = f.ping.Process.Kill(); _ = f.ping.Wait() })
	addr := to.Status.PodIP + ":" + strconv.Itoa(port)
	f.tcpDone.Add(1)
	go func() {
		defer f.tcpDone.Done()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-f.stopTCP:
				return
			case <-tick.C:
			}
			var answer string
			err := controlplane.InNetNS(nsPath, func() error {
				var err error
				answer, err = lab.Probe(context.Background(), "tcp", addr, time.Second)
				return err
			})
			if err == nil && answer != to.Name {
				err = fmt.Errorf("answer %q, want %q", answer, to.Name)
			}
			f.mu.Lock()
			if err != nil {
				f.tcpFails = append(f.tcpFails, time.Now().Format("15:04:05.000")+" "+err.Error())
			} else {
				f.tcpOK++
			}
			f.mu.Unlock()
		}
	}()
	return f
}

var (
	pingReply   = regexp.MustCompile(`icmp_seq=(\d+) .*time=`)
	pingSummary = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)
)

// Stop ends the flow and returns what it saw.
func (f *Flow) Stop() FlowResult {
	f.t.Helper()
	close(f.stopTCP)
	f.tcpDone.Wait()
	_ = f.ping.Process.Signal(syscall.SIGINT)
	_ = f.ping.Wait()
	r := FlowResult{Duration: time.Since(f.started)}
	answered := map[int]bool{}
	sc := bufio.NewScanner(strings.NewReader(f.out.String()))
	for sc.Scan() {
		if m := pingReply.FindStringSubmatch(sc.Text()); m != nil {
			n, _ := strconv.Atoi(m[1])
			answered[n] = true
		}
		if m := pingSummary.FindStringSubmatch(sc.Text()); m != nil {
			r.Pings, _ = strconv.Atoi(m[1])
			r.Answered, _ = strconv.Atoi(m[2])
		}
	}
	if r.Pings == 0 {
		f.t.Errorf("ping printed no summary:\n%s", f.out.String())
	}
	for seq := 1; seq < r.Pings; seq++ {
		if !answered[seq] {
			r.Lost = append(r.Lost, seq)
		}
	}
	f.mu.Lock()
	r.TCP, r.TCPFails = f.tcpOK+len(f.tcpFails), append([]string(nil), f.tcpFails...)
	f.mu.Unlock()
	return r
}

// TabbydGet fetches path (e.g. /metrics) from a node's tabbyd, from
// inside the node.
func (l *Lab) TabbydGet(t testing.TB, node, path string) string {
	t.Helper()
	resp, err := lab.TabbydClient(l.Node(t, node), 5*time.Second).Get(lab.TabbydURL(path))
	if err != nil {
		t.Fatalf("GET %s from %s's tabbyd: %v", path, node, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// TabbydGetErr is TabbydGet returning the body, or an error instead of
// failing; an answer other than 200 is an error that carries the body
// (for /readyz, the part that is not ready).
func (l *Lab) TabbydGetErr(node, path string) (string, error) {
	n, err := l.State.Node(node)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, lab.TabbydURL(path), nil)
	if err != nil {
		return "", err
	}
	resp, err := lab.TabbydClient(n, 3*time.Second).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s: %s", path, resp.Status, strings.TrimSpace(string(body)))
	}
	return string(body), err
}
