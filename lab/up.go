package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

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
	// Runtime is the nodes' container runtime: RuntimeContainerd (the
	// default) or RuntimeContainerd16.
	Runtime string
	// PodCIDR is the default IPPool's range ("" for no pool).
	PodCIDR string
	// DualStack makes an IPv4/IPv6 dual-stack lab: nodes, the control
	// plane and the router get an IPv6 address (a ULA) next to their IPv4
	// one, Services a range of each family, pods an address of each from
	// the default pools (IPv6PodCIDR, default DefaultIPv6PodCIDR, next to
	// PodCIDR, which it needs). No IPv6-only lab: IPv4 stays the primary
	// family.
	DualStack   bool
	IPv6PodCIDR string
	// Tabbyctl is the path of tabbyctl (it holds the nodes' mount
	// namespaces and runs the forward); required.
	Tabbyctl string
	// BinDir holds tabby's five programs, loopback and portmap (make
	// build): tabby's image is built from it; required.
	BinDir string
	// ControlPlaneDir holds the Kubernetes programs
	// (test/controlplane/build.sh) and RuntimeDir containerd and CoreDNS
	// (test/runtime/build.sh); "": built from RepoRoot.
	ControlPlaneDir string
	RuntimeDir      string
	// CacheDir holds built images and Debian packages ("": the build
	// cache, see hack/lib/buildcache.sh).
	CacheDir string
	// RepoRoot is the tabby repository (deploy/ is applied from it);
	// required.
	RepoRoot string
	// APIPort is the host loopback port of the API server forward (0: a
	// free one).
	APIPort int
	// TabbydArgs are added to the tabbyd container's flags in the
	// DaemonSet the lab applies.
	TabbydArgs []string
	// ReadyTimeout bounds the wait for the nodes, tabby and CoreDNS to be
	// ready (default 3 minutes).
	ReadyTimeout time.Duration
	// KeepOnFailure leaves a lab that failed to come up as it is, to look
	// at; otherwise Up removes it before returning the error.
	KeepOnFailure bool
	// Log receives progress lines (nil: none).
	Log io.Writer
}

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
	if o.Runtime == "" {
		o.Runtime = RuntimeContainerd
	}
	if !slices.Contains(Runtimes, o.Runtime) {
		return fmt.Errorf("runtime %q: use %s", o.Runtime, strings.Join(Runtimes, " or "))
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 3 * time.Minute
	}
	if err := o.dualStackDefaults(); err != nil {
		return err
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
		return errors.New("the lab needs the paths of tabbyctl and of the folder holding tabby's programs")
	}
	for _, name := range TabbyImagePrograms {
		path := filepath.Join(o.BinDir, name)
		if st, err := os.Stat(path); err != nil || st.Mode()&0o111 == 0 {
			return fmt.Errorf("%s is missing or not executable at %s: run make build (or pass --bin-dir)", name, path)
		}
	}
	if _, err := os.Stat(filepath.Join(o.RepoRoot, "deploy", "crds")); err != nil {
		return fmt.Errorf("no tabby repository at %q (deploy/ is applied from it): run from the repository or pass --repo", o.RepoRoot)
	}
	if _, err := os.Stat(filepath.Join(o.RepoRoot, SchedulerConfigFile)); err != nil {
		return fmt.Errorf("the tabby repository at %q lacks %s (kube-scheduler runs with it): %w", o.RepoRoot, SchedulerConfigFile, err)
	}
	return nil
}

// dualStackDefaults checks and defaults the dual-stack options.
func (o *Options) dualStackDefaults() error {
	if !o.DualStack {
		if o.IPv6PodCIDR != "" {
			return fmt.Errorf("an IPv6 pod CIDR (%s) needs a dual-stack lab: add --dual-stack", o.IPv6PodCIDR)
		}
		return nil
	}
	if o.PodCIDR == "" {
		return errors.New("a dual-stack lab needs its IPv4 pool too (IPv4 is the primary family): drop --pod-cidr \"\" or --dual-stack")
	}
	if o.IPv6PodCIDR == "" {
		o.IPv6PodCIDR = DefaultIPv6PodCIDR
	}
	p, err := netip.ParsePrefix(o.IPv6PodCIDR)
	if err != nil || !p.Addr().Is6() || p.Addr().Is4In6() || p != p.Masked() {
		return fmt.Errorf("IPv6 pod CIDR %q is not an IPv6 network in CIDR notation such as %s", o.IPv6PodCIDR, DefaultIPv6PodCIDR)
	}
	if _, err := os.Stat("/proc/sys/net/ipv6"); err != nil {
		return errors.New("a dual-stack lab needs IPv6 in this machine's kernel (/proc/sys/net/ipv6 is missing: boot without ipv6.disable=1)")
	}
	return nil
}

// Up starts a lab as Options say and returns its state once every node is
// Ready with tabby-node, kube-proxy and CoreDNS running and the scheduler
// extender passes every node. Its processes outlive the caller; Down
// removes everything. On failure the lab is removed (unless KeepOnFailure)
// and the error says what went wrong with the end of the log concerned.
func Up(ctx context.Context, o Options) (st *State, err error) {
	l, err := checkUp(&o)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	bins, err := findBinaries(ctx, &o)
	if err != nil {
		return nil, err
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
	st = newState(&o, created, bins)
	if err := st.update(func(*State) {}); err != nil {
		return nil, err
	}
	defer func() { err = removeFailed(err, st, &o) }()
	family := ""
	if o.DualStack {
		family = ", dual-stack IPv4/IPv6"
	}
	o.progress("lab %s in %s: %d nodes (%s, runc) on %d subnet(s)%s", o.Name, o.Dir, o.Nodes, runtimeName(o.Runtime), o.Subnets, family)
	images, tabbyImage, err := buildLabImages(ctx, st, &o, start)
	if err != nil {
		return st, err
	}
	if err := buildNetwork(st, l, &o); err != nil {
		return st, err
	}
	ca, err := newLabCA(st.pkiDir())
	if err != nil {
		return st, err
	}
	cp, err := startControlPlane(ctx, st, l, &o, ca, tabbyImage)
	if err != nil {
		return st, err
	}
	rctx, cancel := context.WithTimeout(ctx, o.ReadyTimeout)
	defer cancel()
	if err := startNodes(rctx, st, ca, cp.cs, images); err != nil {
		return st, err
	}
	o.progress("nodes: containerd and kubelet running on %d nodes, images imported, Nodes registered [%.1fs]", o.Nodes, time.Since(start).Seconds())
	if err := waitDaemonSets(rctx, cp.cs, o.Nodes); err != nil {
		return st, err
	}
	o.progress("tabby-node ready on every node, kube-proxy too [%.1fs]", time.Since(start).Seconds())
	if st.PodCIDR == "" {
		return st, upWithoutPool(rctx, st, &o, start)
	}
	if err := crossSubnetIPv6Pool(rctx, st, &o); err != nil {
		return st, err
	}
	if err := waitNodesReady(rctx, cp.cs, st); err != nil {
		return st, err
	}
	if err := waitScheduling(rctx, cp.cs, st); err != nil {
		return st, err
	}
	o.progress("CoreDNS ready behind kube-dns (%s); %s passes every node", ClusterDNS, ExtenderName)
	if err := st.update(func(s *State) { s.Ready = true }); err != nil {
		return st, err
	}
	o.progress("lab %s is up in %.1fs: %d nodes Ready; kubeconfig: %s",
		o.Name, time.Since(start).Seconds(), o.Nodes, st.Kubeconfig)
	return st, nil
}

// checkUp checks that a lab can come up with o (defaulting it) and returns
// its layout.
func checkUp(o *Options) (Layout, error) {
	if os.Geteuid() != 0 {
		return Layout{}, errors.New("the lab needs root (network namespaces, mounts, cgroups, a control plane): run it with sudo")
	}
	if err := o.defaults(); err != nil {
		return Layout{}, err
	}
	l := Layout{Name: o.Name, Nodes: o.Nodes, Subnets: o.Subnets}
	if left := listNetNS(l.Prefix()); len(left) > 0 {
		return Layout{}, fmt.Errorf("a lab named %s is already up (namespaces %v): remove it with tabbyctl lab down (with its --dir), or pick another --name", o.Name, left)
	}
	if err := preflight(o); err != nil {
		return Layout{}, err
	}
	return l, nil
}

// newState is the state of a lab about to come up.
func newState(o *Options, createdDir bool, bins Binaries) *State {
	return &State{
		Version:    stateVersion,
		Name:       o.Name,
		Dir:        o.Dir,
		Created:    time.Now().UTC().Truncate(time.Second),
		Subnets:    o.Subnets,
		PodCIDR:    o.PodCIDR,
		CreatedDir: createdDir,
		DualStack:  o.DualStack,
		// Only in a dual-stack lab (dualStackDefaults).
		IPv6PodCIDR: o.IPv6PodCIDR,
		Binaries:    bins,
	}
}

// removeFailed removes the half-made lab when Up failed with err (unless
// o.KeepOnFailure), and says in the error what became of it.
func removeFailed(err error, st *State, o *Options) error {
	if err == nil || o.KeepOnFailure {
		return err
	}
	if derr := down(context.Background(), st, o.Name, o.Dir, io.Discard); derr != nil {
		return fmt.Errorf("%w\n(removing the half-made lab failed too: %v; run tabbyctl lab down --dir %s)", err, derr, o.Dir)
	}
	return fmt.Errorf("%w\n(the half-made lab is removed; --keep-on-failure keeps it and its logs to look at)", err)
}

// buildLabImages builds (or finds in the cache) the images the nodes
// import, and records them in the state.
func buildLabImages(ctx context.Context, st *State, o *Options, start time.Time) (images []string, tabbyImage string, err error) {
	images, tabbyImage, err = buildImages(ctx, st, o)
	if err != nil {
		return nil, "", err
	}
	if err := st.update(func(s *State) { s.Images, s.TabbyImage = images, tabbyImage }); err != nil {
		return nil, "", err
	}
	o.progress("images: %d built or found in the cache (tabby's is %s) [%.1fs]", len(images), tabbyImage, time.Since(start).Seconds())
	return images, tabbyImage, nil
}

// buildNetwork makes the underlay and the node namespaces.
func buildNetwork(st *State, l Layout, o *Options) error {
	if err := buildUnderlay(st, l); err != nil {
		return err
	}
	for i := 1; i <= o.Nodes; i++ {
		if err := buildNode(st, l, i, o.Runtime); err != nil {
			return err
		}
	}
	o.progress("underlay: %s with bridges %v, router %s (no route out), node namespaces %s..%s",
		l.UnderlayNS(), bridges(o.Subnets), l.RouterNS(), l.NodeNS(1), l.NodeNS(o.Nodes))
	return nil
}

// startNodes starts every node's containerd and kubelet, a few at a time.
func startNodes(ctx context.Context, st *State, ca *labCA, cs kubernetes.Interface, images []string) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for i := range st.Nodes {
		g.Go(func() error { return startNode(gctx, st, &st.Nodes[i], ca, cs, images) })
	}
	return g.Wait()
}

// waitDaemonSets waits for kube-proxy and tabby-node on every node.
func waitDaemonSets(ctx context.Context, cs kubernetes.Interface, nodes int) error {
	if err := waitDaemonSet(ctx, cs, "kube-system", "kube-proxy", nodes); err != nil {
		return fmt.Errorf("waiting for kube-proxy: %w", err)
	}
	if err := waitDaemonSet(ctx, cs, tabbyNamespace, "tabby-node", nodes); err != nil {
		return fmt.Errorf("waiting for tabby (see kubectl -n %s logs ds/tabby-node): %w", tabbyNamespace, err)
	}
	return nil
}

// upWithoutPool finishes a lab with no IPPool.
func upWithoutPool(ctx context.Context, st *State, o *Options, start time.Time) error {
	// Without a pool tabby's CNI STATUS fails ("no usable IP pool"),
	// so the nodes stay NotReady and CoreDNS Pending: the lab is up
	// as far as it can be.
	if err := waitExtenderAccepts(ctx, st); err != nil {
		return fmt.Errorf("waiting for %s to pass every node: %w", ExtenderName, err)
	}
	o.progress("no IPPool (--pod-cidr \"\"): the nodes stay NotReady and CoreDNS Pending until you create one (kubectl apply an IPPool)")
	if err := st.update(func(s *State) { s.Ready = true }); err != nil {
		return err
	}
	o.progress("lab %s is up in %.1fs: %d nodes; kubeconfig: %s", o.Name, time.Since(start).Seconds(), o.Nodes, st.Kubeconfig)
	return nil
}

// DefaultIPv6PoolName is the IPPool tabbyd makes from
// --default-ipv6-pool-cidr.
const DefaultIPv6PoolName = "default-ipv6"

// crossSubnetIPv6Pool sets the default IPv6 pool of a dual-stack lab on 2
// subnets to VXLAN CrossSubnet, as the IPv4 one is made (tabbyd makes it
// routed natively, which the router between the subnets cannot carry),
// with kubectl patch as a user would.
func crossSubnetIPv6Pool(ctx context.Context, st *State, o *Options) error {
	if !st.DualStack || st.Subnets < 2 {
		return nil
	}
	patch := `{"spec":{"vxlanMode":"CrossSubnet"}}`
	err := poll(ctx, 200*time.Millisecond, func() error {
		_, err := st.kubectl(ctx, nil, "patch", "ippools.tabby.io", DefaultIPv6PoolName, "--type", "merge", "-p", patch)
		return err
	})
	if err != nil {
		return fmt.Errorf("setting the IPPool %s to VXLAN CrossSubnet: %w", DefaultIPv6PoolName, err)
	}
	o.progress("IPPool %s: VXLAN CrossSubnet, as the nodes are on 2 subnets", DefaultIPv6PoolName)
	return nil
}

// waitNodesReady waits for every Node to be Ready.
func waitNodesReady(ctx context.Context, cs kubernetes.Interface, st *State) error {
	for i := range st.Nodes {
		n := &st.Nodes[i]
		err := poll(ctx, 100*time.Millisecond, func() error {
			node, err := cs.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			return nodeReady(node)
		})
		if err != nil {
			return fmt.Errorf("waiting for %s to be Ready: %w", n.Name, err)
		}
	}
	return nil
}

// waitScheduling waits until pods can be scheduled and resolve names: the
// extender passes every node and CoreDNS is ready.
func waitScheduling(ctx context.Context, cs kubernetes.Interface, st *State) error {
	// kube-scheduler leaves a pod Pending when the extender filters out
	// every node, and asks again only on some later change: wait until the
	// extender has every node and its tabbyd's heartbeat Lease.
	if err := waitExtenderAccepts(ctx, st); err != nil {
		return fmt.Errorf("waiting for %s to pass every node: %w (its log: %s)", ExtenderName, err,
			filepath.Join(st.ControlPlane.Dir, ExtenderName+".log"))
	}
	if err := waitDeployment(ctx, cs, "kube-system", "coredns"); err != nil {
		return fmt.Errorf("waiting for CoreDNS: %w", err)
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
