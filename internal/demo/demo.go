// Package demo is `tabbyctl demo`: tabby's CNI plugin wiring pods on one
// node, end to end, with nothing faked. It starts a real etcd and
// kube-apiserver on loopback, installs tabby's CRDs, makes a network
// namespace that stands for a node and an IPPool, creates Pod objects and
// wires each pod through libcni with the tabby conflist (as a container
// runtime would), shows each pod's address and host veth and a ping matrix
// of real ICMP probes between the pods and the node, then removes
// everything it made: also when it fails or is interrupted.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/internal/testnet"
)

// PoolCIDR is the demo's IPPool.
const PoolCIDR = "10.244.0.0/16"

// PodNames are the demo's pods, in namespace default.
var PodNames = []string{"web-0", "web-1", "db-0"}

// Options configure Run.
type Options struct {
	// PluginDir holds the tabby and tabby-ipam binaries.
	PluginDir string
	// ControlPlaneDir holds etcd and kube-apiserver; empty: internal/controlplane's
	// default (build them with test/controlplane/build.sh).
	ControlPlaneDir string
	// Out receives the demo's report.
	Out io.Writer
}

// Run runs the demo. Canceling ctx (Ctrl-C) stops it; what it made is
// removed before Run returns, whatever happened.
func Run(ctx context.Context, opts Options) (err error) {
	if err := checkRun(opts); err != nil {
		return err
	}
	r := &run{out: opts.Out}
	defer func() {
		r.teardown()
		if err != nil && ctx.Err() != nil {
			err = errors.New("interrupted; everything the demo made is removed")
		}
	}()

	fmt.Fprintln(r.out, "tabby CNI demo: one node, three pods, a real API server")
	c, err := r.startControlPlane(ctx, opts.ControlPlaneDir)
	if err != nil {
		return err
	}
	node, list, err := r.startNode(ctx, c, opts.PluginDir)
	if err != nil {
		return err
	}
	pods, results, err := r.wirePods(ctx, node, list)
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}

	fmt.Fprintln(r.out, "\nPing matrix: ICMP echo from each row to each column")
	return pingMatrix(r.out, node, pods, results)
}

// checkRun checks what the demo needs before it makes anything.
func checkRun(opts Options) error {
	if os.Geteuid() != 0 {
		return errors.New("the demo needs root (network namespaces, a control plane): run it with sudo")
	}
	for _, bin := range []string{"tabby", "tabby-ipam"} {
		if _, err := os.Stat(filepath.Join(opts.PluginDir, bin)); err != nil {
			return fmt.Errorf("the CNI plugin %s is not in %s (run make build): %w", bin, opts.PluginDir, err)
		}
	}
	return nil
}

// run is one demo: where it reports, and how to undo what it made so far.
type run struct {
	out  io.Writer
	undo []func()
}

func (r *run) step(format string, a ...any) { fmt.Fprintf(r.out, "  "+format+"\n", a...) }

// teardown undoes everything, last made first.
func (r *run) teardown() {
	if len(r.undo) > 0 {
		fmt.Fprintln(r.out, "\nTearing down:")
	}
	for i := len(r.undo) - 1; i >= 0; i-- {
		r.undo[i]()
	}
}

// startControlPlane starts etcd and kube-apiserver and installs tabby's
// CRDs.
func (r *run) startControlPlane(ctx context.Context, dir string) (*controlplane.Cluster, error) {
	start := time.Now()
	c, err := controlplane.Start(ctx, controlplane.Options{BinDir: dir})
	if err != nil {
		return nil, fmt.Errorf("starting the control plane: %w", err)
	}
	r.undo = append(r.undo, func() { c.Stop(); r.step("control plane stopped") })
	r.step("control plane   etcd + kube-apiserver at %s (%.1fs)", c.Server, time.Since(start).Seconds())
	if err := c.InstallCRDs(ctx); err != nil {
		return nil, fmt.Errorf("installing tabby's CRDs (run tabbyctl demo from the repository): %w", err)
	}
	r.step("CRDs            tabby.io/v1 installed with their admission policies")
	return c, nil
}

// startNode makes the node's namespace and the IPPool, and returns the
// node and the CNI config its pods are wired with.
func (r *run) startNode(ctx context.Context, c *controlplane.Cluster, pluginDir string) (*testnet.Node, *libcni.NetworkConfigList, error) {
	node, err := testnet.NewNode(ctx, testnet.NodeOptions{Name: "demo-node", PluginDirs: []string{pluginDir}, Cluster: c})
	if err != nil {
		return nil, nil, err
	}
	r.undo = append(r.undo, func() {
		if err := node.Close(); err != nil {
			r.step("removing the node: %v", err)
			return
		}
		r.step("node namespace removed (with every veth in it)")
	})
	r.step("node            %s: network namespace %s, %s %s and %s", node.Name, node.NS.Path(), testnet.Uplink, node.IPv4, node.IPv6)
	pool := &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "demo-pool"}, Spec: tabbyv1.IPPoolSpec{CIDR: PoolCIDR}}
	if pool, err = node.DS.IPPools.Create(ctx, pool, metav1.CreateOptions{}); err != nil {
		return nil, nil, fmt.Errorf("creating IPPool %s: %w", PoolCIDR, err)
	}
	r.step("IPPool          %s %s, blocks of /%d", pool.Name, pool.Spec.CIDR, pool.EffectiveBlockSize())
	conf := node.TabbyConf(nil)
	list, err := testnet.ConfList("1.1.0", conf)
	if err != nil {
		return nil, nil, err
	}
	r.step("CNI config      %s", list.Bytes)
	return node, list, nil
}

// wirePods wires the demo's pods, printing a row for each as it is wired.
func (r *run) wirePods(ctx context.Context, node *testnet.Node, list *libcni.NetworkConfigList) ([]*testnet.Pod, []*current.Result, error) {
	fmt.Fprintln(r.out, "\nWiring the pods through libcni (CNI ADD), as a container runtime would:")
	pods := make([]*testnet.Pod, 0, len(PodNames))
	results := make([]*current.Result, 0, len(PodNames))
	// Rows are printed as the pods are wired, in fixed-width columns.
	row := func(pod, addr, veth, took string) {
		fmt.Fprintf(r.out, "  %-14s  %-18s  %-14s  %s\n", pod, addr, veth, took)
	}
	row("POD", "ADDRESS", "HOST VETH", "ADD TOOK")
	for _, name := range PodNames {
		p, res, took, err := r.wirePod(ctx, node, list, name)
		if err != nil {
			return nil, nil, err
		}
		pods, results = append(pods, p), append(results, res)
		row(p.Namespace+"/"+name, addresses(res), res.Interfaces[0].Name, took.Round(time.Millisecond).String())
	}
	return pods, results, nil
}

// wirePod creates the Pod object and its namespace and runs CNI ADD,
// returning how long ADD took.
func (r *run) wirePod(ctx context.Context, node *testnet.Node, list *libcni.NetworkConfigList, name string) (*testnet.Pod, *current.Result, time.Duration, error) {
	p, err := testnet.NewPod("default", name)
	if err != nil {
		return nil, nil, 0, err
	}
	r.undo = append(r.undo, func() { _ = p.Close() })
	if err := node.CreatePodObject(ctx, p, nil); err != nil {
		return nil, nil, 0, err
	}
	t0 := time.Now()
	res, err := node.Add(ctx, list, p, nil)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("CNI ADD of pod %s: %w", name, err)
	}
	took := time.Since(t0)
	r.undo = append(r.undo, func() {
		// The control plane is still up here: DEL frees the address.
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := node.Del(dctx, list, p, nil); err != nil {
			r.step("CNI DEL of pod %s: %v", name, err)
			return
		}
		r.step("pod %s: CNI DEL done, address released", name)
	})
	return p, res, took, nil
}

func addresses(res *current.Result) string {
	var s []string
	for _, ipc := range res.IPs {
		s = append(s, ipc.Address.String())
	}
	return strings.Join(s, ",")
}

// pingMatrix probes every pair of pods and the node (all at once: a probe
// that gets no answer takes seconds) and prints the matrix.
func pingMatrix(out io.Writer, node *testnet.Node, pods []*testnet.Pod, results []*current.Result) error {
	type member struct {
		name string
		ns   ns.NetNS
		ip   net.IP
	}
	var ms []member
	for i, p := range pods {
		ms = append(ms, member{p.Name, p.NS, testnet.ResultIPs(results[i], false)[0]})
	}
	ms = append(ms, member{"node", node.NS, node.IPv4})
	errs := make([][]error, len(ms))
	var wg sync.WaitGroup
	for i := range ms {
		errs[i] = make([]error, len(ms))
		for j := range ms {
			if i != j {
				wg.Go(func() { errs[i][j] = testnet.Ping(ms[i].ns, ms[j].ip) })
			}
		}
	}
	wg.Wait()
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprint(w, "  from \\ to")
	for _, m := range ms {
		fmt.Fprintf(w, "\t%s", m.name)
	}
	fmt.Fprintln(w)
	var failed []string
	for i, from := range ms {
		fmt.Fprintf(w, "  %s", from.name)
		for j, to := range ms {
			switch {
			case i == j:
				fmt.Fprint(w, "\t-")
			case errs[i][j] != nil:
				fmt.Fprint(w, "\tFAIL")
				failed = append(failed, fmt.Sprintf("%s to %s (%s): %v", from.name, to.name, to.ip, errs[i][j]))
			default:
				fmt.Fprint(w, "\tOK")
			}
		}
		fmt.Fprintln(w)
	}
	_ = w.Flush()
	probes := len(ms) * (len(ms) - 1)
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d probes failed:\n  %s", len(failed), probes, strings.Join(failed, "\n  "))
	}
	fmt.Fprintf(out, "All %d probes answered.\n", probes)
	return nil
}
