// Package clitest runs the real tabbyctl binary, as scripts and kubectl
// run it, against a real API server: its exit codes, every -o format of
// every command that prints a report, and `kubectl tabby` through the real
// kubectl. It needs root and the control plane (see internal/controlplane).
package clitest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/internal/testnet"
	"github.com/tabbynet/tabby/ipam"
)

// cli is the tabbyctl under test and what it runs against.
var cli clustertest.CLI

func TestMain(m *testing.M) { clustertest.Main(m, cli.Setup) }

// kubectl is the control plane's real kubectl.
func kubectl() string { return filepath.Join(cli.KubectlDir, "kubectl") }

// program is tabbyctl for the tests that need no control plane: from
// $TABBY_BIN_DIR, or built, without starting one.
func program(t *testing.T) string {
	t.Helper()
	bin, err := testnet.Binary(t.TempDir(), "tabbyctl")
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// env is the environment without anything that names an API server, with
// a HOME of its own (no ~/.kube/config) and extra added.
func env(t *testing.T, extra ...string) []string {
	var out []string
	for _, e := range os.Environ() {
		k, _, _ := strings.Cut(e, "=")
		if k == "KUBECONFIG" || k == "HOME" || strings.HasPrefix(k, "KUBERNETES_SERVICE_") {
			continue
		}
		out = append(out, e)
	}
	return append(append(out, "HOME="+t.TempDir()), extra...)
}

// run runs a program and returns what it printed and its exit status.
func run(t *testing.T, environ []string, prog string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.Env = environ
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("running %s %v: %v", prog, args, err)
	}
	t.Logf("$ %s %s\n%s", filepath.Base(prog), strings.Join(args, " "), r)
	return r
}

// ctl runs tabbyctl with the control plane's kubeconfig where it goes
// (after the command's name: --kubeconfig is not a flag of every command).
func ctl(t *testing.T, args ...string) result {
	t.Helper()
	return run(t, env(t), cli.Tabbyctl, append(args, "--kubeconfig", cli.Kubeconfig)...)
}

// fresh leaves the cluster with one pool (10.63.0.0/16), one node and one
// leaked address (allocated by the real allocator for a pod that does not
// exist), and removes every IPAM object and node when the test ends.
func fresh(t *testing.T) (ds *datastore.Client, leak string) {
	t.Helper()
	ds = clustertest.Client(t)
	clustertest.Fresh(t, ds)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := ds.IPPools.Create(ctx, &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "cli"},
		Spec: tabbyv1.IPPoolSpec{CIDR: "10.63.0.0/16", BlockSize: 26}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating the pool: %v", err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cli-node"}}
	if _, err := ds.Nodes.Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the node: %v", err)
	}
	got, err := ipam.New(ds).Assign(ctx, ipam.Request{HandleID: "k8s-pod-network.gone-sandbox", Node: node.Name,
		Namespace: "default", Pod: "gone", IPv4: true})
	if err != nil {
		t.Fatalf("allocating the address that leaks: %v", err)
	}
	return ds, got[0].IP.String()
}

// closedPort is a loopback port nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
