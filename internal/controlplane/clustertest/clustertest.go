// Package clustertest gives a test package one real control plane, started
// for the first test that asks for it and shared by the rest:
//
//	func TestMain(m *testing.M) { clustertest.Main(m, nil) }
//
//	func TestX(t *testing.T) {
//		ds := clustertest.Client(t)
//		...
//	}
//
// Main only runs the tests and stops the control plane at the end, so the
// package's pure tests run without root and without waiting for one. The
// first Cluster, Config or Client starts etcd and kube-apiserver (building
// them first if needed), installs tabby's CRDs and admission policies and
// calls Main's setup. As non-root those calls skip the test loudly
// (tier.Root); as root a control plane that cannot be had fails every test
// that asks for it, with the reason: it never skips.
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
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/internal/testnet"
	"github.com/tabbynet/tabby/internal/tier"
)

// EnvKeep keeps the cluster folder after the tests when set to a non-empty value.
const EnvKeep = "TABBY_KEEP_CLUSTER"

// The package's control plane: started at most once (the first attempt's
// error is every later caller's error too), stopped by Main.
var (
	mu       sync.Mutex
	inMain   bool
	setupFn  func(*controlplane.Cluster) error
	shared   *controlplane.Cluster
	startErr error
	tried    bool
)

// Main runs the package's tests and stops the control plane if one of
// them started it, then exits with the tests' status. setup (may be nil)
// runs once, right after the control plane starts.
func Main(m *testing.M, setup func(*controlplane.Cluster) error) {
	if !flag.Parsed() {
		flag.Parse()
	}
	mu.Lock()
	inMain, setupFn = true, setup
	mu.Unlock()
	stopOnSignal()
	code := m.Run()
	mu.Lock()
	c := shared
	shared = nil
	mu.Unlock()
	if c != nil {
		if code != 0 {
			if os.Getenv(EnvKeep) != "" {
				fmt.Fprintf(os.Stderr, "clustertest: the control plane's logs are in %s\n", c.Dir)
			} else {
				fmt.Fprintf(os.Stderr, "clustertest: set %s=1 to keep the control plane's logs\n", EnvKeep)
			}
		}
		c.Stop()
	}
	os.Exit(code)
}

// stopOnSignal stops the control plane when the test binary is
// interrupted (the kernel kills the processes anyway, but the folder
// would stay).
func stopOnSignal() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-sigs
		mu.Lock()
		c := shared
		mu.Unlock()
		if c != nil {
			fmt.Fprintf(os.Stderr, "clustertest: %v: stopping the control plane\n", s)
			c.Stop()
		}
		os.Exit(1)
	}()
}

// Cluster is the package's control plane, started on the first call. As
// non-root it skips tb; when the control plane cannot be started it fails
// tb with the reason.
func Cluster(tb testing.TB) *controlplane.Cluster {
	tb.Helper()
	tier.Root(tb, "a real control plane (etcd, kube-apiserver) and network namespaces")
	mu.Lock()
	defer mu.Unlock()
	if !inMain {
		tb.Fatal("clustertest: no TestMain; add func TestMain(m *testing.M) { clustertest.Main(m, nil) } to the package")
	}
	if !tried {
		tried = true
		shared, startErr = start(setupFn)
	}
	if startErr != nil {
		tb.Fatalf("clustertest: %v", startErr)
	}
	return shared
}

// start starts a control plane, installs the CRDs and policies and calls
// setup; on error nothing is left running.
func start(setup func(*controlplane.Cluster) error) (_ *controlplane.Cluster, err error) {
	// A cold build of the control plane takes several minutes.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	begin := time.Now()
	c, err := controlplane.Start(ctx, controlplane.Options{KeepDir: os.Getenv(EnvKeep) != ""})
	if err != nil {
		return nil, fmt.Errorf("starting the control plane: %w", err)
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	started := time.Now()
	if err := c.InstallCRDs(ctx); err != nil {
		return nil, fmt.Errorf("installing tabby's CRDs and policies: %w", err)
	}
	installed := time.Now()
	if setup != nil {
		if err := setup(c); err != nil {
			return nil, fmt.Errorf("setting up: %w", err)
		}
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "clustertest: control plane at %s started in %v, CRDs and policies in %v (folder %s)\n",
			c.Server, started.Sub(begin).Round(time.Millisecond), installed.Sub(started).Round(time.Millisecond), c.Dir)
	}
	return c, nil
}

// Config is an admin client configuration for the package's control plane.
func Config(tb testing.TB) *rest.Config {
	tb.Helper()
	return Cluster(tb).RESTConfig()
}

// Client is a datastore client for the package's control plane.
func Client(tb testing.TB) *datastore.Client {
	tb.Helper()
	return client(tb, Config(tb))
}

// UnthrottledClient is Client without client-go's rate limit, for tests
// where many goroutines share the one client (as many CNI calls, each
// with a client of its own, would not).
func UnthrottledClient(tb testing.TB) *datastore.Client {
	tb.Helper()
	cfg := Config(tb)
	cfg.QPS = -1
	return client(tb, cfg)
}

func client(tb testing.TB, cfg *rest.Config) *datastore.Client {
	tb.Helper()
	ds, err := datastore.New(cfg)
	if err != nil {
		tb.Fatalf("datastore client: %v", err)
	}
	return ds
}

// CLI is what a package that runs the tabbyctl program against its
// control plane needs. Pass its Setup to Main:
//
//	var cli clustertest.CLI
//
//	func TestMain(m *testing.M) { clustertest.Main(m, cli.Setup) }
type CLI struct {
	// Tabbyctl is the program under test: $TABBY_BIN_DIR/tabbyctl, else
	// built into the control plane's folder.
	Tabbyctl string
	// Kubeconfig is an admin kubeconfig of the control plane.
	Kubeconfig string
	// KubectlDir is the folder of the control plane's kubectl.
	KubectlDir string
}

// Setup fills cli in for the control plane c.
func (cli *CLI) Setup(c *controlplane.Cluster) (err error) {
	if cli.Tabbyctl, err = testnet.Binary(filepath.Join(c.Dir, "bin"), "tabbyctl"); err != nil {
		return err
	}
	cli.KubectlDir = c.BinDir
	cli.Kubeconfig = filepath.Join(c.Dir, "tabbyctl.kubeconfig")
	return c.WriteKubeconfig(cli.Kubeconfig, "")
}

// Fresh removes tabby's IPAM objects (handles, blocks, affinities, IPAM
// configurations), every IPPool and Node, and the Pods of namespaces, now
// and when tb ends, so tests sharing the package's control plane neither
// see nor leave each other's addresses.
func Fresh(tb testing.TB, ds *datastore.Client, namespaces ...string) {
	tb.Helper()
	wipe := func() {
		ctx := context.Background()
		all := metav1.ListOptions{}
		zero := int64(0)
		for _, ns := range namespaces {
			_ = ds.Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, all)
		}
		_ = ds.IPAMHandles.DeleteCollection(ctx, metav1.DeleteOptions{}, all)
		_ = ds.IPAMBlocks.DeleteCollection(ctx, metav1.DeleteOptions{}, all)
		_ = ds.BlockAffinities.DeleteCollection(ctx, metav1.DeleteOptions{}, all)
		_ = ds.IPPools.DeleteCollection(ctx, metav1.DeleteOptions{}, all)
		_ = ds.IPAMConfigurations.DeleteCollection(ctx, metav1.DeleteOptions{}, all)
		_ = ds.Nodes.DeleteCollection(ctx, metav1.DeleteOptions{}, all)
	}
	wipe()
	tb.Cleanup(wipe)
}
