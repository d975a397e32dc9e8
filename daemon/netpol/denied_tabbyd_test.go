package netpol

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/daemon/deniedlog"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/internal/testnet"
)

// TestTabbydDeniedLog runs tabbyd --denied-log in a node with a client
// and a server pod that a deny-all policy isolates: a denied connection
// appears within a second in `tabbyctl policy denied` (the real binary,
// asking the node's tabbyd), with both pods, the port and the policy; in
// the JSON-lines file; and in the counter. A UDP flood from the client
// is bounded by the kernel's rate limit before tabbyd sees it; the test
// logs tabbyd's CPU during the flood, with the limits and without.
func TestTabbydDeniedLog(t *testing.T) {
	e := newE2E(t)
	e.policy(t, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "server-deny-all"},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}}},
	})
	file := filepath.Join(t.TempDir(), "denied.jsonl")
	e.startTabbyd(t, "--denied-log", "--denied-log-file="+file)
	server := e.mustAdd(t, "server", map[string]string{"app": "server"})
	client := e.mustAdd(t, "client", map[string]string{"app": "client"})
	addr := serve(t, server)
	ctl := tabbyctl(t)

	// Following the server's records, a denied connection shows within a
	// second.
	follow := e.follow(t, ctl, "--pod="+e.ns+"/server")
	start := time.Now()
	probed := make(chan bool, 1)
	go func() { probed <- reaches(client, addr) }() // blocks its second: SYNs are dropped
	var r deniedlog.Record
	select {
	case r = <-follow:
		t.Logf("record printed %v after the connection began: %+v", time.Since(start).Round(time.Millisecond), r)
	case <-time.After(time.Second):
		t.Fatal("no record from tabbyctl policy denied -f within a second of a denied connection")
	}
	if <-probed {
		t.Fatal("the client reached the server through a deny-all policy")
	}
	want := deniedlog.Record{Node: e.node, Direction: "ingress", Protocol: "TCP",
		Src:      deniedlog.Endpoint{IP: client.ip.String(), Pod: e.ns + "/client"},
		Dst:      deniedlog.Endpoint{IP: server.ip.String(), Port: 80, Pod: e.ns + "/server"},
		Policies: []string{e.ns + "/server-deny-all"}}
	if r.Node != want.Node || r.Direction != want.Direction || r.Protocol != want.Protocol || r.Src.IP != want.Src.IP ||
		r.Src.Pod != want.Src.Pod || r.Dst != want.Dst || strings.Join(r.Policies, ",") != strings.Join(want.Policies, ",") ||
		!strings.Contains(r.Reason, "default deny of policy "+e.ns+"/server-deny-all") {
		t.Errorf("record %+v, want %+v with the reason naming the policy", r, want)
	}

	// The whole buffer, as a table, through the real tabbyctl.
	out := e.ctl(t, ctl)
	if !strings.Contains(out, e.ns+"/client ("+client.ip.String()) || !strings.Contains(out, e.ns+"/server ("+server.ip.String()+":80)") {
		t.Errorf("tabbyctl policy denied printed:\n%s", out)
	}
	if b, err := os.ReadFile(file); err != nil || !strings.Contains(string(b), `"pod":"`+e.ns+`/server"`) {
		t.Errorf("--denied-log-file: %v\n%s", err, b)
	}
	series := fmt.Sprintf(`tabby_policy_denied_packets_logged_total{direction="ingress",namespace="%s",policy="server-deny-all"}`, e.ns)
	if got := e.metrics()[series]; got < 1 {
		t.Errorf("%s = %v, want at least 1", series, got)
	}

	// A flood from one source: the kernel logs what the limits allow
	// (--denied-log-rate 10/s, burst 20), whatever is sent.
	const flood = 3 * time.Second
	before := e.metrics()[series]
	sent, cpu := e.udpFlood(t, client, server, flood)
	logged := e.metrics()[series] - before
	t.Logf("flood of %v: %d denied UDP packets sent (%.0f/s), %v logged; tabbyd used %v of CPU (%.1f%% of one core)",
		flood, sent, float64(sent)/flood.Seconds(), logged, cpu, 100*cpu.Seconds()/flood.Seconds())
	if limit := 20 + 10*(flood.Seconds()+1); logged > limit {
		t.Errorf("%v packets of one source logged in %v, over the limits' %v", logged, flood, limit)
	}
	if logged < 10 {
		t.Errorf("only %v packets of the flood logged", logged)
	}
	if sent < 1000 {
		t.Errorf("the flood sent only %d packets", sent)
	}
}

// TestTabbydDeniedLogCost measures the log's cost, with it off, with the
// default limits and with limits far above a flood: tabbyd's CPU during
// a 3s UDP flood of denied packets (and how many the sender got through
// the node's drop path), and iperf3's TCP throughput of an allowed flow
// between the same pods, which never meets a log rule (replies and
// established packets are accepted before the per-pod chains).
func TestTabbydDeniedLogCost(t *testing.T) {
	if testing.Short() {
		t.Skip("a measurement")
	}
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Fatalf("iperf3 is missing (make deps installs it): %v", err)
	}
	e := newE2E(t)
	e.policy(t, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "server-iperf-only"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "server"}},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{Ports: tcpPort(5201)}},
		},
	})
	stop := e.startTabbyd(t)
	server := e.mustAdd(t, "server", map[string]string{"app": "server"})
	client := e.mustAdd(t, "client", map[string]string{"app": "client"})
	iperfServer(t, server)
	series := fmt.Sprintf(`tabby_policy_denied_packets_logged_total{direction="ingress",namespace="%s",policy="server-iperf-only"}`, e.ns)
	restart := func(args ...string) {
		stop()
		stop = e.startTabbyd(t, args...)
		eventually(t, "tabbyd synced", func() bool { return e.metrics()[`tabby_policy_syncs_total{result="ok"}`] >= 1 })
	}
	configs := []struct {
		name string
		args []string
	}{
		{"off", nil},
		{"on, default limits", []string{"--denied-log"}},
		{"on, limits 10000/s per source", []string{"--denied-log", "--denied-log-rate=10000", "--denied-log-node-rate=100000", "--denied-log-burst=10000"}},
	}
	const flood = 3 * time.Second
	for _, c := range configs {
		restart(c.args...)
		hits := e.logRuleHits(t)
		sent, cpu := e.udpFlood(t, client, server, flood)
		hits = e.logRuleHits(t) - hits
		if (c.args == nil) != (hits == 0) {
			t.Errorf("log %s: %d packets of the flood through the log rules", c.name, hits)
		}
		m := e.metrics()
		t.Logf("log %s: flood %d packets in %v (%.0f/s), %v logged, %v lost, tabbyd CPU %v (%.1f%% of a core)",
			c.name, sent, flood, float64(sent)/flood.Seconds(), m[series], m["tabby_policy_denied_lost_total"], cpu, 100*cpu.Seconds()/flood.Seconds())
	}
	// iperf3 off and on in turn, three rounds: the best of each (the
	// machine is shared, and one run can be slowed by anything).
	// The log rule's own counters say what the allowed flow cost it:
	// none of its packets reach the rule.
	var best [2]float64
	for round := range 3 {
		for i, c := range configs[:2] {
			restart(c.args...)
			hits := e.logRuleHits(t)
			g := iperf(t, client, server)
			best[i] = max(best[i], g)
			hits = e.logRuleHits(t) - hits
			t.Logf("round %d, log %s: iperf3 TCP %.2f Gbit/s, %d packets through the log rules", round+1, c.name, g, hits)
			if hits != 0 {
				t.Errorf("the allowed iperf3 flow sent %d packets through the log rules, want none", hits)
			}
		}
	}
	t.Logf("iperf3 TCP, best of 3: log off %.2f Gbit/s, log on %.2f Gbit/s", best[0], best[1])
	if best[1] < best[0]/2 {
		t.Errorf("allowed TCP with the log on: %.2f Gbit/s at best, under half of %.2f with it off", best[1], best[0])
	}
}

// logRuleHits is the sum of the packet counters of the node's NFLOG
// rules (both backends, both families).
func (e *e2e) logRuleHits(t *testing.T) int {
	t.Helper()
	total := 0
	err := e.n.Do(func() error {
		for _, save := range []string{"iptables-nft-save", "iptables-legacy-save", "ip6tables-nft-save", "ip6tables-legacy-save"} {
			if _, err := exec.LookPath(save); err != nil {
				continue
			}
			out, err := exec.Command(save, "-c", "-t", "filter").CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s: %v: %s", save, err, out)
			}
			for _, line := range strings.Split(string(out), "\n") {
				if !strings.Contains(line, "-j NFLOG") || !strings.HasPrefix(line, "[") {
					continue
				}
				pkts, _, _ := strings.Cut(strings.TrimPrefix(line, "["), ":")
				n, err := strconv.Atoi(pkts)
				if err != nil {
					return fmt.Errorf("%s counter in %q", save, line)
				}
				total += n
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total
}

// iperfServer runs iperf3 -s in the pod until the test ends.
func iperfServer(t *testing.T, p *e2ePod) {
	t.Helper()
	cmd := exec.Command("nsenter", "--net="+p.NS.Path(), "iperf3", "-s", "-B", p.ip.String())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	time.Sleep(300 * time.Millisecond)
}

// iperf runs 3 seconds of iperf3 TCP from one pod to another and returns
// the throughput received, in Gbit/s.
func iperf(t *testing.T, from, to *e2ePod) float64 {
	t.Helper()
	out, err := exec.Command("nsenter", "--net="+from.NS.Path(), "iperf3", "-c", to.ip.String(), "-t", "3", "-J").Output()
	if err != nil {
		t.Fatalf("iperf3: %v\n%s", err, out)
	}
	var res struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("iperf3 -J: %v\n%s", err, out)
	}
	return res.End.SumReceived.BitsPerSecond / 1e9
}

// udpFlood sends UDP from one pod to another's port 9 as fast as one
// socket can for d, and returns how many datagrams it sent and the CPU
// tabbyd used meanwhile.
func (e *e2e) udpFlood(t *testing.T, from, to *e2ePod, d time.Duration) (int, time.Duration) {
	t.Helper()
	cpu0 := processCPU(t, e.d.Cmd.Process.Pid)
	sent := 0
	err := from.NS.Do(func(ns.NetNS) error {
		c, err := net.Dial("udp", net.JoinHostPort(to.ip.String(), "9"))
		if err != nil {
			return err
		}
		defer c.Close()
		msg := make([]byte, 64)
		for end := time.Now().Add(d); time.Now().Before(end); {
			for range 100 {
				if _, err := c.Write(msg); err == nil {
					sent++
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the last batch
	return sent, processCPU(t, e.d.Cmd.Process.Pid) - cpu0
}

// processCPU is the user and system CPU time a process has used.
func processCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// After the command's name in parentheses: fields 3 on; utime and
	// stime are the 14th and 15th, in clock ticks (100 a second).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	utime, _ := strconv.Atoi(f[11])
	stime, _ := strconv.Atoi(f[12])
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// tabbyctl is the tabbyctl binary under test.
func tabbyctl(t *testing.T) string {
	t.Helper()
	bin, err := testnet.Binary(filepath.Join(clustertest.Cluster(t).Dir, "netpol-bin"), "tabbyctl")
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// ctl runs tabbyctl policy denied in the node (whose tabbyd it asks).
func (e *e2e) ctl(t *testing.T, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command("nsenter", append([]string{"--net=" + e.n.NS.Path(), bin, "policy", "denied"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("tabbyctl policy denied %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// follow runs tabbyctl policy denied -f -o json in the node until the
// test ends, and sends each record it prints.
func (e *e2e) follow(t *testing.T, bin string, args ...string) <-chan deniedlog.Record {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + e.n.NS.Path(), bin, "policy", "denied", "-f", "-o", "json"}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := make(chan deniedlog.Record, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var r deniedlog.Record
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Errorf("tabbyctl policy denied -f printed %q: %v", sc.Text(), err)
				continue
			}
			ch <- r
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("tabbyctl policy denied -f stderr: %s", stderr.String())
		}
	})
	// Give it the time to connect: records before that come from the
	// buffer anyway.
	time.Sleep(200 * time.Millisecond)
	return ch
}
