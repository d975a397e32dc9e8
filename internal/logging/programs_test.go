package logging_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tabbynet/tabby/internal/testnet"
	"github.com/tabbynet/tabby/internal/tier"
)

// refusedKubeconfig names an API server on a loopback port nothing
// listens on: client-go's reflectors fail and log through klog.
const refusedKubeconfig = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`

// TestJSONLogIsAllJSON runs the real tabbyd and tabby-scheduler-extender
// with --log-format=json against an API server that refuses, until
// client-go's reflectors have logged their failures, and checks that
// every line of stderr is a JSON object, the reflectors' too (klog would
// otherwise write its own "E1201 ..." lines), down to the line that
// says why the program stopped.
func TestJSONLogIsAllJSON(t *testing.T) {
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte(refusedKubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	common := []string{"--kubeconfig", kc, "--log-format=json", "--log-level=debug"}
	for _, tc := range []struct {
		name string
		args []string
		root bool
	}{
		{"tabby-scheduler-extender", []string{"--listen", "127.0.0.1:0"}, false},
		// tabbyd in a network namespace of its own: whatever it would
		// program stays there.
		{"tabbyd", []string{"--nodename", "jsonlog", "--health-listen", "127.0.0.1:0", "--cni-socket=", "--network-policy=false", "--ipam-gc=false"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root {
				tier.Root(t, "to run tabbyd in a network namespace of its own")
			}
			bin, err := testnet.Binary(dir, tc.name)
			if err != nil {
				t.Fatal(err)
			}
			argv := append([]string{bin}, append(common, tc.args...)...)
			if tc.root {
				argv = append([]string{"unshare", "--net", "--"}, argv...)
			}
			var stderr testnet.SyncBuffer
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				<-done
			})
			// The reflectors back off before they log a failure: wait for one.
			deadline := time.Now().Add(30 * time.Second)
			for !strings.Contains(stderr.String(), `"reflector":`) && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
				done <- nil
			case <-time.After(20 * time.Second):
				t.Errorf("%s did not stop within 20s of SIGTERM", tc.name)
			}
			out := stderr.String()
			if !strings.Contains(out, `"reflector":`) {
				t.Fatalf("no line of client-go's reflectors within 30s; stderr:\n%s", out)
			}
			sc := bufio.NewScanner(strings.NewReader(out))
			sc.Buffer(nil, 1<<20)
			n := 0
			for sc.Scan() {
				n++
				var m map[string]any
				if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
					t.Errorf("stderr line %d is not JSON (%v): %s", n, err, sc.Text())
				} else if m["msg"] == nil || m["level"] == nil {
					t.Errorf("stderr line %d lacks msg or level: %s", n, sc.Text())
				}
			}
			t.Logf("%s: %d lines of stderr, all JSON", tc.name, n)
		})
	}
}

// TestInstallCNIFinalErrorIsJSON runs the real tabbyctl install-cni, as
// the DaemonSet's init container with --log-format=json, where it cannot
// work (no plugins to copy, no API server): every line of stderr is JSON,
// the error that ends it too, which says what failed, and the exit status
// stays 2. With --log-format=text the error stays tabbyctl's plain line.
func TestInstallCNIFinalErrorIsJSON(t *testing.T) {
	dir := t.TempDir()
	bin, err := testnet.Binary(dir, "tabbyctl")
	if err != nil {
		t.Fatal(err)
	}
	run := func(format string) (string, int) {
		t.Helper()
		cmd := exec.Command(bin, "install-cni", "--log-format="+format, "--bin-source", filepath.Join(dir, "no-such-folder"),
			"--cni-bin-dir", filepath.Join(dir, "bin"), "--cni-conf-dir", filepath.Join(dir, "net.d"), "--nodename", "n1")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("install-cni --log-format=%s: %v, want a failure; stderr:\n%s", format, err, stderr.String())
		}
		return stderr.String(), ee.ExitCode()
	}

	out, code := run("json")
	if code != 2 {
		t.Errorf("exit status %d, want 2", code)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Errorf("stderr line %d is not JSON (%v): %s", i+1, err, l)
		}
	}
	var last struct{ Level, Msg, Error string }
	_ = json.Unmarshal([]byte(lines[len(lines)-1]), &last)
	if last.Level != "ERROR" || !strings.Contains(last.Error, "install-cni: ") || !strings.Contains(last.Error, "no-such-folder") {
		t.Errorf("the last line is not the error that ended install-cni: %s", lines[len(lines)-1])
	}
	t.Logf("json: %s", lines[len(lines)-1])

	out, code = run("text")
	if code != 2 || !strings.HasPrefix(out, "tabbyctl: install-cni: ") || strings.Count(out, "install-cni: ") != 1 {
		t.Errorf("--log-format=text: exit %d, stderr:\n%s", code, out)
	}
}
