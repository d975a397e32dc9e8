// Package clustertest gives a test package one real control plane for all
// its tests:
//
//	func TestMain(m *testing.M) { clustertest.Main(m, nil) }
//
//	func TestX(t *testing.T) {
//		ds := clustertest.Client(t)
//		...
//	}
//
// Main starts etcd and kube-apiserver (building them first if needed),
// installs tabby's CRDs and admission policies, runs the tests and stops
// everything. When the control plane cannot be had (no binaries and no way
// to build them, not root) it fails the package with the reason: tests
// that need it never pass silently.
//
// Set TABBY_KEEP_CLUSTER=1 to keep the cluster's folder (logs, etcd data)
// after the tests.
package clustertest

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane"
)

// EnvKeep keeps the cluster folder after the tests when set to a non-empty value.
const EnvKeep = "TABBY_KEEP_CLUSTER"

var (
	mu     sync.Mutex
	shared *controlplane.Cluster
)

// Main starts a control plane, installs the CRDs and policies, calls setup
// (may be nil) with the cluster, runs the package's tests and stops the
// control plane, then exits with the tests' status. Anything that goes
// wrong before the tests run exits non-zero with the reason.
func Main(m *testing.M, setup func(*controlplane.Cluster) error) {
	os.Exit(run(m, setup))
}

func run(m *testing.M, setup func(*controlplane.Cluster) error) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "FAIL: clustertest: "+format+"\n", args...)
		return 1
	}
	if !flag.Parsed() {
		flag.Parse()
	}
	if os.Geteuid() != 0 {
		return fail("these tests need root (network namespaces, a real control plane); run them as root, for example with sudo -E go test")
	}
	// A cold build of the control plane takes several minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := controlplane.Start(ctx, controlplane.Options{KeepDir: os.Getenv(EnvKeep) != ""})
	if err != nil {
		return fail("starting the control plane: %v", err)
	}
	stopped := make(chan struct{})
	defer func() {
		c.Stop()
		close(stopped)
	}()
	// Stop the control plane when the test binary is interrupted (the
	// kernel kills the processes anyway, but the folder would stay).
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "clustertest: %v: stopping the control plane\n", s)
			c.Stop()
			os.Exit(1)
		case <-stopped:
		}
	}()
	started := time.Now()
	if err := c.InstallCRDs(ctx); err != nil {
		return fail("installing tabby's CRDs and policies: %v", err)
	}
	installed := time.Now()
	if setup != nil {
		if err := setup(c); err != nil {
			return fail("setting up: %v", err)
		}
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "clustertest: control plane at %s started in %v, CRDs and policies in %v (folder %s)\n",
			c.Server, started.Sub(start).Round(time.Millisecond), installed.Sub(started).Round(time.Millisecond), c.Dir)
	}
	mu.Lock()
	shared = c
	mu.Unlock()
	code := m.Run()
	mu.Lock()
	shared = nil
	mu.Unlock()
	if code != 0 {
		if os.Getenv(EnvKeep) != "" {
			fmt.Fprintf(os.Stderr, "clustertest: the control plane's logs are in %s\n", c.Dir)
		} else {
			fmt.Fprintf(os.Stderr, "clustertest: set %s=1 to keep the control plane's logs\n", EnvKeep)
		}
	}
	return code
}

// Cluster is the running control plane; it panics outside a test package
// whose TestMain calls Main.
func Cluster() *controlplane.Cluster {
	mu.Lock()
	defer mu.Unlock()
	if shared == nil {
		panic("clustertest.Cluster: no control plane; call clustertest.Main from TestMain")
	}
	return shared
}

// Config is an admin client configuration for the running control plane.
func Config() *rest.Config { return Cluster().RESTConfig() }

// Client is a datastore client for the running control plane.
func Client(tb testing.TB) *datastore.Client {
	tb.Helper()
	ds, err := datastore.New(Config())
	if err != nil {
		tb.Fatalf("datastore client: %v", err)
	}
	return ds
}
