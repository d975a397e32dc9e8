package clitest

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/daemon/deniedlog"
	"github.com/tabbynet/tabby/daemon/netpol"
	"github.com/tabbynet/tabby/daemon/nflog"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/policy"
)

// deniedTabbyd serves tabbyd's real /policy/denied handler with two
// denied packets recorded (a real tabbyd needs a node namespace; its log
// end to end is daemon/netpol's TestTabbydDeniedLog).
func deniedTabbyd(t *testing.T) (addr string, d *netpol.Denied) {
	t.Helper()
	d = netpol.NewDenied(netpol.DeniedConfig{Node: "node1"})
	pod := func(name, ip string) policy.Endpoint {
		return policy.Endpoint{Pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name}}, IPs: []netip.Addr{netip.MustParseAddr(ip)}}
	}
	d.Update(&policy.Input{Endpoints: []policy.Endpoint{pod("web", "10.0.0.1"), pod("db", "10.0.0.2")}},
		&policy.Ruleset{Denials: []policy.Denial{{Prefix: "tabby:I-X", Chain: "TABBY-NP-I-X", Direction: "ingress", Policies: []string{"shop/db-deny"}}}}, false)
	d.Packet(nflog.Packet{Prefix: "tabby:I-X", Time: time.Now(), Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Proto: nflog.ProtoTCP, SrcPort: 40000, DstPort: 5432})
	d.Packet(nflog.Packet{Prefix: "tabby:I-X", Time: time.Now(), Src: netip.MustParseAddr("192.0.2.7"), Dst: netip.MustParseAddr("10.0.0.9"), Proto: nflog.ProtoUDP, SrcPort: 53, DstPort: 53})
	mux := http.NewServeMux()
	mux.Handle("GET "+deniedlog.Path, d)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String(), d
}

// TestPolicyDenied runs tabbyctl policy denied against tabbyd's handler:
// the table, -o json with --pod, -f, and the errors that say what to fix.
func TestPolicyDenied(t *testing.T) {
	addr, d := deniedTabbyd(t)
	off := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "the log of denied packets is off on node node1: start tabbyd with --denied-log (and --network-policy)", http.StatusNotFound)
	}))
	t.Cleanup(off.Close)
	bin := program(t) // no control plane needed
	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string // in stdout for 0, stderr otherwise
	}{
		{"table", []string{"--endpoint", addr}, 0, []string{"DIRECTION", "shop/web (10.0.0.1:40000)", "shop/db (10.0.0.2:5432)",
			"default deny of policy shop/db-deny", "192.0.2.7:53"}},
		{"json of a pod", []string{"--endpoint", addr, "--pod", "shop/db", "-o", "json"}, 0, []string{`"pod":"shop/db"`, `"policies":["shop/db-deny"]`}},
		{"bad pod", []string{"--endpoint", addr, "--pod", "db"}, 2, []string{"--pod", "write it as NAMESPACE/NAME"}},
		{"bad -o", []string{"--endpoint", addr, "-o", "yaml"}, 2, []string{"-o must be table or json"}},
		{"tabbyd down", []string{"--endpoint", closedPort(t)}, 2, []string{"asking tabbyd at", "is tabbyd running there, with --denied-log?"}},
		{"log off", []string{"--endpoint", off.Listener.Addr().String()}, 2, []string{"404", "start tabbyd with --denied-log"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, env(t), bin, append([]string{"policy", "denied"}, tc.args...)...)
			got := r.stderr
			if tc.code == 0 {
				got = r.stdout
			}
			for _, w := range tc.want {
				if r.code != tc.code || !strings.Contains(got, w) {
					t.Errorf("want exit %d and %q:\n%s", tc.code, w, r)
				}
			}
		})
	}
	if got := run(t, env(t), bin, "policy", "denied", "--endpoint", addr, "--pod", "shop/db", "-o", "json"); strings.Count(got.stdout, "\n") != 1 {
		t.Errorf("--pod shop/db printed %d records, want 1:\n%s", strings.Count(got.stdout, "\n"), got)
	}

	// -f: what is buffered, then each new packet as it is recorded.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "policy", "denied", "--endpoint", addr, "-f", "-o", "json", "--pod", "shop/web")
	cmd.Env = env(t)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = cmd.Wait() }()
	lines := make(chan deniedlog.Record, 10)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var r deniedlog.Record
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				lines <- r
			}
		}
	}()
	next := func() deniedlog.Record {
		select {
		case r := <-lines:
			return r
		case <-time.After(5 * time.Second):
			t.Fatal("tabbyctl policy denied -f printed nothing within 5s")
			return deniedlog.Record{}
		}
	}
	if r := next(); r.Dst.Port != 5432 {
		t.Errorf("first record followed: %+v, want the buffered one to port 5432", r)
	}
	start := time.Now()
	d.Packet(nflog.Packet{Prefix: "tabby:I-X", Time: time.Now(), Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), Proto: nflog.ProtoSCTP, SrcPort: 1, DstPort: 9})
	if r := next(); r.Protocol != "SCTP" || r.Dst.Port != 9 {
		t.Errorf("followed %+v, want the new SCTP packet to port 9", r)
	} else {
		t.Logf("followed a new record in %v", time.Since(start).Round(time.Millisecond))
	}
}

// TestPolicyDeniedNode: --node asks through the API server, and says so
// when the node has no tabby-node pod.
func TestPolicyDeniedNode(t *testing.T) {
	clustertest.Cluster(t)
	r := ctl(t, "policy", "denied", "--node", "no-such-node")
	if r.code != 2 || !strings.Contains(r.stderr, `no tabby-node pod in namespace tabby-system runs on node "no-such-node"`) {
		t.Errorf("want exit 2 naming the missing pod:\n%s", r)
	}
}
