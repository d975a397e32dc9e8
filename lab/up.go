package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sync/errgroup"
)

// Options configure Up.
type Options struct {
	// Name of the lab (default DefaultName); its namespaces are
	// tabby-<Name>-*. Labs with different names and folders run side by
	// side.
	Name string
	// Dir is the lab's folder (default DefaultDir). It must not exist or
	// be empty.
	Dir string
	// Nodes (default DefaultNodes) and Subnets (1 or 2; default 1).
	Nodes   int
	Subnets int
	// PodCIDR is the default IPPool's range ("" for no pool).
	PodCIDR string
	// Tabbyctl is the path of tabbyctl (it runs the kubelets, the forward,
	// the container shims and install-cni); required.
	Tabbyctl string
	// BinDir holds tabbyd, tabby, tabby-ipam and tabby-scheduler-extender;
	// required.
	BinDir string
	// ControlPlaneDir holds etcd, kube-apiserver, kube-scheduler,
	// kube-controller-manager and kubectl ("": built by
	// test/controlplane/build.sh in RepoRoot).
	ControlPlaneDir string
	// RepoRoot is the tabby repository (deploy/ is applied from it);
	// required.
	RepoRoot string
	// APIPort is the host loopback port of the API server forward (0: a
	// free one).
	APIPort int
	// TabbydArgs are added to every tabbyd's flags.
	TabbydArgs []string
	// TabbydAdmin runs tabbyd with the admin's token instead of the
	// tabby-node service account's (to tell an RBAC gap from a bug).
	TabbydAdmin bool
	// ReadyTimeout bounds the wait for the nodes to be Ready, their tabbyd
	// to answer /readyz and the scheduler extender to pass every node
	// (default 2 minutes).
	ReadyTimeout time.Duration
	// KeepOnFailure leaves a lab that failed to come up as it is, to look
	// at; otherwise Up removes it before returning the error.
	KeepOnFailure bool
	// Log receives progress lines (nil: none).
	Log io.Writer
}

// pluginLockDir is where the CNI plugin keeps its per-node IPAM lock files
// (plugin.DefaultLockDir; ipam-<nodename>.lock).
const pluginLockDir = "/var/run/tabby"

func (o *Options) progress(format string, args ...any) {
	if o.Log != nil {
		fmt.Fprintf(o.Log, format+"\n", args...)
	}
}

func (o *Options) defaults() error {
	if o.Name == "" {
		o.Name = DefaultName
	}
	if o.Dir == "" {
		o.Dir = DefaultDir
	}
	if o.Nodes == 0 {
		o.Nodes = DefaultNodes
	}
	if o.Subnets == 0 {
		o.Subnets = 1
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 2 * time.Minute
	}
	if err := (Layout{Name: o.Name, Nodes: o.Nodes, Subnets: o.Subnets}).Check(); err != nil {
		return err
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return err
	}
	o.Dir = dir
	if o.Tabbyctl == "" || o.BinDir == "" {
		return errors.New("the lab needs the paths of tabbyctl and of the folder holding tabbyd, tabby, tabby-ipam and tabby-scheduler-extender")
	}
	for what, path := range map[string]string{
		"tabbyctl":   o.Tabbyctl,
		"tabbyd":     filepath.Join(o.BinDir, "tabbyd"),
		"tabby":      filepath.Join(o.BinDir, "tabby"),
		"tabby-ipam": filepath.Join(o.BinDir, "tabby-ipam"),
		ExtenderName: filepath.Join(o.BinDir, ExtenderName),
	} {
		if st, err := os.Stat(path); err != nil || st.Mode()&0o111 == 0 {
			return fmt.Errorf("%s is missing or not executable at %s: run make build (or pass --bin-dir)", what, path)
		}
	}
	if _, err := os.Stat(filepath.Join(o.RepoRoot, "deploy", "crds")); err != nil {
		return fmt.Errorf("no tabby repository at %q (deploy/crds is applied from it): run from the repository or pass --repo", o.RepoRoot)
	}
	if _, err := os.Stat(filepath.Join(o.RepoRoot, SchedulerConfigFile)); err != nil {
		return fmt.Errorf("the tabby repository at %q lacks %s (kube-scheduler runs with it): %w", o.RepoRoot, SchedulerConfigFile, err)
	}
	return nil
}

// Up starts a lab as Options say and returns its state once every node is
// Ready, its tabbyd answers /readyz and the scheduler extender passes it.
// Its processes outlive the caller; Down removes everything. On failure
// the lab is removed (unless KeepOnFailure) and the error says what went
// wrong with the end of the log concerned.
func Up(ctx context.Context, o Options) (st *State, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the lab needs root (network namespaces, veth, a control plane): run it with sudo")
	}
	if err := o.defaults(); err != nil {
		return nil, err
	}
	l := Layout{Name: o.Name, Nodes: o.Nodes, Subnets: o.Subnets}
	if left := listNetNS(l.Prefix()); len(left) > 0 {
		return nil, fmt.Errorf("a lab named %s is already up (namespaces %v): remove it with tabbyctl lab down (with its --dir), or pick another --name", o.Name, left)
	}
	created, err := prepareDir(o.Dir)
	if err != nil {
		return nil, err
	}
	unlock, err := lockDir(o.Dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	_, lockDirErr := os.Stat(pluginLockDir)
	st = &State{
		Version:        stateVersion,
		Name:           o.Name,
		Dir:            o.Dir,
		Created:        time.Now().UTC().Truncate(time.Second),
		Subnets:        o.Subnets,
		PodCIDR:        o.PodCIDR,
		CreatedDir:     created,
		TabbydArgs:     o.TabbydArgs,
		LockDir:        pluginLockDir,
		LockDirExisted: lockDirErr == nil,
		Binaries: Binaries{
			Tabbyctl:  o.Tabbyctl,
			Tabbyd:    filepath.Join(o.BinDir, "tabbyd"),
			Extender:  filepath.Join(o.BinDir, ExtenderName),
			PluginDir: o.BinDir,
			RepoRoot:  o.RepoRoot,
		},
	}
	for i := 1; i <= o.Nodes; i++ {
		st.LockFiles = append(st.LockFiles, filepath.Join(pluginLockDir, "ipam-"+NodeName(i)+".lock"))
	}
	if err := st.update(func(*State) {}); err != nil {
		return nil, err
	}
	defer func() {
		if err == nil || o.KeepOnFailure {
			return
		}
		if derr := down(context.Background(), st, o.Name, o.Dir, io.Discard); derr != nil {
			err = fmt.Errorf("%w\n(removing the half-made lab failed too: %v; run tabbyctl lab down --dir %s)", err, derr, o.Dir)
		} else {
			err = fmt.Errorf("%w\n(the half-made lab is removed; --keep-on-failure keeps it and its logs to look at)", err)
		}
	}()
	start := time.Now()
	o.progress("lab %s in %s: %d nodes on %d subnet(s)", o.Name, o.Dir, o.Nodes, o.Subnets)
	if err := buildUnderlay(st, l); err != nil {
		return st, err
	}
	for i := 1; i <= o.Nodes; i++ {
		if err := buildNode(st, l, i); err != nil {
			return st, err
		}
	}
	o.progress("underlay: %s with bridges %v, router %s (no route out), node namespaces %s..%s",
		l.UnderlayNS(), bridges(o.Subnets), l.RouterNS(), l.NodeNS(1), l.NodeNS(o.Nodes))
	cp, err := startControlPlane(ctx, st, l, &o)
	if err != nil {
		return st, err
	}
	if err := st.update(func(s *State) { s.Binaries.ControlPlaneDir = cp.c.BinDir; s.Binaries.RepoRoot = cp.c.RepoRoot }); err != nil {
		return st, err
	}
	if err := startForward(st, cp.c, o.APIPort); err != nil {
		return st, err
	}
	o.progress("forward: %s on the host's loopback -> %s (admin kubeconfig %s)", st.Forward.Address, st.ControlPlane.Server, st.Kubeconfig)
	image, portmap, err := makeImage(ctx, st, &o)
	if err != nil {
		return st, err
	}
	// install-cni copies the plugins into the shared bin dir once; later
	// runs find them unchanged.
	if err := installNode(ctx, st, &st.Nodes[0], cp, image, portmap); err != nil {
		return st, err
	}
	rctx, cancel := context.WithTimeout(ctx, o.ReadyTimeout)
	defer cancel()
	g, gctx := errgroup.WithContext(rctx)
	g.SetLimit(8)
	for i := range st.Nodes {
		g.Go(func() error { return startNode(gctx, st, i, cp, image, portmap) })
	}
	if err := g.Wait(); err != nil {
		return st, err
	}
	// kube-scheduler leaves a pod Pending when the extender filters out
	// every node, and asks again only on some later change: wait until the
	// extender has every node and its tabbyd's heartbeat Lease.
	if err := waitExtenderAccepts(rctx, st); err != nil {
		return st, fmt.Errorf("waiting for %s to pass every node: %w (its log: %s)", ExtenderName, err,
			filepath.Join(st.ControlPlane.Dir, ExtenderName+".log"))
	}
	o.progress("%s passes every node (each node's tabbyd renews its heartbeat Lease %s/tabbyd-<node>)", ExtenderName, tabbyNamespace)
	if err := st.update(func(s *State) { s.Ready = true }); err != nil {
		return st, err
	}
	o.progress("lab %s is up in %.1fs: %d nodes Ready, tabbyd ready on each; kubeconfig: %s",
		o.Name, time.Since(start).Seconds(), o.Nodes, st.Kubeconfig)
	return st, nil
}

// startNode installs the CNI config of node i, starts its kubelet, waits
// for its Node, starts tabbyd (as the DaemonSet would, once the node is
// registered) and waits until the node is Ready and tabbyd ready.
func startNode(ctx context.Context, st *State, i int, cp *controlPlane, image string, portmap bool) error {
	n := &st.Nodes[i]
	if i > 0 {
		if err := installNode(ctx, st, n, cp, image, portmap); err != nil {
			return err
		}
	}
	if err := st.startComponent(n.Name, ComponentKubelet); err != nil {
		return err
	}
	if err := waitNodeRegistered(ctx, cp.cs, n); err != nil {
		return fmt.Errorf("waiting for the kubelet of %s to register its Node: %w", n.Name, err)
	}
	if err := st.startComponent(n.Name, ComponentTabbyd); err != nil {
		return err
	}
	if err := waitNodeReady(ctx, cp.cs, n); err != nil {
		return fmt.Errorf("waiting for %s to be ready: %w", n.Name, err)
	}
	return nil
}

func bridges(n int) []string {
	var out []string
	for s := range n {
		out = append(out, Bridge(s))
	}
	return out
}

// prepareDir makes the lab's folder, which must not exist or be empty, and
// reports whether it made it.
func prepareDir(dir string) (created bool, err error) {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return false, fmt.Errorf("creating the lab's folder: %w", err)
		}
		return true, nil
	case err != nil:
		return false, fmt.Errorf("reading the lab's folder: %w", err)
	case len(entries) == 0:
		return false, nil
	}
	if _, err := os.Stat(filepath.Join(dir, StateFile)); err == nil {
		return false, fmt.Errorf("a lab is already up in %s: remove it with tabbyctl lab down --dir %s", dir, dir)
	}
	return false, fmt.Errorf("%s is not empty: the lab needs a folder of its own (pass another --dir)", dir)
}
