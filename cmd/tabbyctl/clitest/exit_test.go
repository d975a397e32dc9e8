package clitest

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/daemon/nodestatus"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
)

// tabbydStatus serves GET /status as tabbyd does, with st as the answer.
// (A real tabbyd needs a node namespace and BGP; what is under test here
// is how tabbyctl maps the answer to an exit status and prints it.)
func tabbydStatus(t *testing.T, st nodestatus.Status) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != nodestatus.Path {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(st)
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

func sampleStatus(ready bool) nodestatus.Status {
	st := nodestatus.Status{Node: "node1", Time: time.Now(), IPv4: "10.77.0.11/24", AS: 64512, RouterID: "10.77.0.11", Ready: ready,
		Peers: []nodestatus.Peer{
			{Address: "10.77.0.12", AS: 64512, Type: "node-mesh", Node: "node2", State: "Established", Since: time.Now().Add(-time.Hour),
				Synced: true, Received: 1, Accepted: 1},
			{Address: "10.77.0.13", AS: 64512, Type: "node-mesh", Node: "node3", State: "Active", Info: "dial tcp 10.77.0.13:179: connection refused"},
		},
		Routes:    nodestatus.Routes{Programmed: 2, Blackholes: 1, Learned: 1, Advertised: 1},
		LastApply: nodestatus.Apply{Time: time.Now(), Duration: 3 * time.Millisecond, Changes: 2},
	}
	if !ready {
		st.NotReady = []string{"BGP session with 10.77.0.13 is Active, not Established"}
	}
	return st
}

// TestExitCodes: 0 success, 1 a problem found, 2 usage and connection
// errors, each from the real binary.
func TestExitCodes(t *testing.T) {
	fresh(t)
	dead := filepath.Join(t.TempDir(), "dead.kubeconfig")
	if err := clustertest.Cluster(t).WriteKubeconfig(dead, "https://"+closedPort(t)); err != nil {
		t.Fatal(err)
	}
	ready, notReady := tabbydStatus(t, sampleStatus(true)), tabbydStatus(t, sampleStatus(false))
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string // in stdout for 0, stderr otherwise
	}{
		{"show", []string{"ipam", "show", "--kubeconfig", cli.Kubeconfig}, 0, "10.63.0.0/16"},
		{"version", []string{"version"}, 0, ""},
		{"node ready", []string{"node", "status", "--endpoint", ready}, 0, "is running, ready."},
		{"leak found", []string{"ipam", "check", "--kubeconfig", cli.Kubeconfig, "--confirm", "0"}, 1, "tabbyctl: ipam check found 1 problem"},
		{"node not ready", []string{"node", "status", "--endpoint", notReady}, 1, "tabbyctl: tabbyd on node1 is not ready"},
		{"release refused", []string{"ipam", "release", "--kubeconfig", cli.Kubeconfig, "--ip", "192.0.2.1"}, 1, "is in no IPPool"},
		{"bad -o", []string{"ipam", "show", "--kubeconfig", cli.Kubeconfig, "-o", "xml"}, 2, `invalid argument "xml" for "-o, --output" flag: must be one of table, wide, json, yaml`},
		{"bad -o node", []string{"node", "status", "--endpoint", ready, "-o", "jsn"}, 2, "must be one of table, wide, json, yaml"},
		{"unknown flag", []string{"version", "--kubeconfig", cli.Kubeconfig}, 2, "unknown flag: --kubeconfig (see tabbyctl version --help)"},
		{"kubeconfig on lab", []string{"lab", "status", "--kubeconfig", cli.Kubeconfig}, 2, "unknown flag: --kubeconfig"},
		{"bad args", []string{"ipam", "show", "extra", "--kubeconfig", cli.Kubeconfig}, 2, `unknown command "extra"`},
		{"unknown command", []string{"ipan"}, 2, `unknown command "ipan"`},
		{"bad address", []string{"ipam", "show", "--kubeconfig", cli.Kubeconfig, "--ip", "10.63.0.300"}, 2, "is not an IP address"},
		{"api server down", []string{"ipam", "check", "--kubeconfig", dead, "--timeout", "5s"}, 2, "cannot be reached"},
		{"no such kubeconfig", []string{"ipam", "show", "--kubeconfig", dead + ".missing"}, 2, "loading kubeconfig"},
		{"no such context", []string{"ipam", "show", "--kubeconfig", cli.Kubeconfig, "--context", "nope"}, 2, `context "nope"`},
		{"no kubeconfig", []string{"ipam", "show"}, 2, "no kubeconfig given"},
		{"tabbyd down", []string{"node", "status", "--endpoint", closedPort(t)}, 2, "asking tabbyd for its status"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, env(t), cli.Tabbyctl, tc.args...)
			got := r.stderr
			if tc.code == 0 {
				got = r.stdout
			}
			if r.code != tc.code || !strings.Contains(got, tc.want) {
				t.Errorf("tabbyctl %s: want exit %d and %q:\n%s", strings.Join(tc.args, " "), tc.code, tc.want, r)
			}
		})
	}
}

// TestHelpDocumentsExitCodes: the codes scripts rely on are in --help.
func TestHelpDocumentsExitCodes(t *testing.T) {
	r := run(t, env(t), program(t), "--help")
	for _, want := range []string{"Exit codes", "0  success", "1  the command worked and found a problem", "2  the command could not do its work"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("tabbyctl --help lacks %q:\n%s", want, r)
		}
	}
}
