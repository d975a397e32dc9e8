package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/lab"
	"github.com/tabbynet/tabby/lab/labimage"
)

func init() { subcommands = append(subcommands, newLabCommand) }

// envLabDir names the default lab folder.
const envLabDir = "TABBY_LAB_DIR"

func newLabCommand() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "a Kubernetes cluster of network namespaces on this machine, running tabby (needs root)",
		Long: `The lab is a real Kubernetes cluster on this machine, as kind is on
machines with Docker: a real control plane (etcd, kube-apiserver,
kube-scheduler with tabby-scheduler-extender, kube-controller-manager) and N
nodes, each a network namespace with a mount namespace of its own running the
real kubelet and containerd with runc. kube-proxy, CoreDNS and tabby itself
(deploy/tabby.yaml, with tabby's image built here without Docker) are
installed with kubectl as on any cluster. Everything lives in namespaces,
cgroups and the folder the lab creates; the host gets only a loopback port
forward to the API server.

  tabbyctl lab up --nodes 3            start it (about a minute once built)
  tabbyctl lab status                  nodes, processes, tabbyd readiness, pods
  kubectl --kubeconfig $(tabbyctl lab kubeconfig) get nodes -o wide
  tabbyctl lab exec default/web -- ip addr
  tabbyctl lab load my-image.tar       import an image into every node
  tabbyctl lab down                    remove everything (also after a crash)`,
	}
	def := os.Getenv(envLabDir)
	if def == "" {
		def = lab.DefaultDir
	}
	cmd.PersistentFlags().StringVar(&dir, "dir", def, "the lab's folder ($"+envLabDir+" changes the default)")
	cmd.AddCommand(labUpCommand(&dir), labDownCommand(&dir), labStatusCommand(&dir), labKubeconfigCommand(&dir),
		labExecCommand(&dir), labRestartCommand(&dir), labDemoCommand(&dir), labLoadCommand(&dir),
		labNodeRootCommand(&dir), labForwardCommand(&dir), labProbeCommand())
	return cmd
}

// withLab is a RunE that loads the lab in *dir and hands it to f.
func withLab(dir *string, f func(cmd *cobra.Command, args []string, st *lab.State) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		st, err := lab.Load(*dir)
		if err != nil {
			return err
		}
		return f(cmd, args, st)
	}
}

// signalContext ends on SIGINT or SIGTERM.
func signalContext(parent context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
}

// findRepo is the tabby repository: above the working directory, else
// above tabbyctl's own folder (bin/ of a checkout).
func findRepo(exeDir string) (string, error) {
	if root, err := controlplane.FindRepoRoot(); err == nil {
		return root, nil
	}
	for d := exeDir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "test", "controlplane", "build.sh")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", errors.New("no tabby repository above the working directory or tabbyctl's folder: run from the repository or pass --repo")
		}
	}
}

func labUpCommand(dir *string) *cobra.Command {
	o := lab.Options{}
	var repo string
	cmd := &cobra.Command{
		Use:   "up",
		Short: "start a lab: control plane, underlay, nodes with kubelet and containerd, kube-proxy, CoreDNS and tabby",
		Long: `up builds the images the nodes run (tabby's from --bin-dir, agnhost, pause,
kube-proxy, CoreDNS; cached), the underlay (a bridge per subnet and a router
without a route out) and the control plane in its own namespace. It applies
deploy/tabby.yaml rendered with the lab's image and pod CIDR, kube-proxy and
CoreDNS with kubectl, starts tabby-scheduler-extender on that namespace's
loopback (port 8888) and kube-scheduler with
deploy/scheduler/kube-scheduler-config.yaml pointed at it, and per node
containerd (v2, or Debian's 1.6 with --runtime containerd1.6) and the
kubelet. It returns when every node is Ready with tabby-node, kube-proxy and
CoreDNS running and the extender passes every node; the processes keep
running. Node i is nodei, at 10.77.0.(10+i) (with --subnets 2, even nodes
are on 10.78.0.0/24 behind the router); with --dual-stack also at
fd00:10:77::(10+i) (fd00:10:78::/64 behind the router), with Services in
10.96.0.0/16 and fd00:10:96::/108 and pods in --pod-cidr and
--ipv6-pod-cidr.

The Kubernetes programs come from --controlplane-dir ($` + controlplane.EnvControlPlaneDir + `),
containerd and CoreDNS from --runtime-dir; else test/controlplane/build.sh and
test/runtime/build.sh build them (minutes, the first time).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := completeUpOptions(&o, repo, *dir, cmd.OutOrStdout()); err != nil {
				return err
			}
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			_, err := lab.Up(ctx, o)
			return err
		},
	}
	addUpFlags(cmd, &o, &repo)
	return cmd
}

// completeUpOptions fills in what lab up finds by itself: tabbyctl's own
// path, the folder of the other binaries, the control plane's and the
// repository.
func completeUpOptions(o *lab.Options, repo, dir string, out io.Writer) error {
	exe, err := os.Executable()
	if err == nil {
		exe, err = filepath.EvalSymlinks(exe)
	}
	if err != nil {
		return fmt.Errorf("finding tabbyctl's own path: %w", err)
	}
	o.Tabbyctl = exe
	exeDir := filepath.Dir(exe)
	if o.BinDir == "" {
		o.BinDir = exeDir
	}
	if o.ControlPlaneDir == "" {
		o.ControlPlaneDir = os.Getenv(controlplane.EnvControlPlaneDir)
	}
	if o.RuntimeDir == "" {
		o.RuntimeDir = os.Getenv(lab.EnvRuntimeDir)
	}
	if o.RepoRoot = repo; repo == "" {
		if o.RepoRoot, err = findRepo(exeDir); err != nil {
			return err
		}
	}
	if o.CacheDir == "" {
		if o.CacheDir, err = labimage.DefaultCacheDir(os.Getenv); err != nil {
			return err
		}
	}
	o.Dir = dir
	o.Log = out
	return nil
}

// addUpFlags adds lab up's flags to cmd (lab up, lab demo).
func addUpFlags(cmd *cobra.Command, o *lab.Options, repo *string) {
	f := cmd.Flags()
	f.IntVar(&o.Nodes, "nodes", lab.DefaultNodes, "number of nodes (1 to 200)")
	f.IntVar(&o.Subnets, "subnets", 1, "1: one bridge; 2: two bridges joined by a router (CrossSubnet is real)")
	f.StringVar(&o.Name, "name", lab.DefaultName, "the lab's name: its namespaces are tabby-NAME-* (labs with other names and --dir run side by side)")
	f.StringVar(&o.Runtime, "runtime", lab.RuntimeContainerd, "the nodes' container runtime: "+strings.Join(lab.Runtimes, " (v2, built from the module proxy) or ")+" (Debian's)")
	f.StringVar(&o.PodCIDR, "pod-cidr", lab.DefaultPodCIDR, `the default IPPool's range ("" for no pool)`)
	f.BoolVar(&o.DualStack, "dual-stack", false, "IPv4/IPv6 dual-stack: nodes, Services and pods get an address of each family (IPv4 primary; no IPv6-only lab)")
	f.StringVar(&o.IPv6PodCIDR, "ipv6-pod-cidr", "", "the default IPv6 IPPool's range, with --dual-stack (default "+lab.DefaultIPv6PodCIDR+")")
	f.StringVar(&o.BinDir, "bin-dir", "", "folder holding tabby's programs, loopback and portmap, which tabby's image is built from (default: tabbyctl's own folder)")
	f.StringVar(&o.ControlPlaneDir, "controlplane-dir", "", "folder holding etcd, kube-apiserver, ..., kubelet, kube-proxy, agnhost, pause (default $"+controlplane.EnvControlPlaneDir+", else built)")
	f.StringVar(&o.RuntimeDir, "runtime-dir", "", "folder holding containerd, containerd-shim-runc-v2, ctr and coredns (default $"+lab.EnvRuntimeDir+", else built by test/runtime/build.sh)")
	f.StringVar(&o.CacheDir, "cache-dir", "", "where built images and Debian packages are cached (default $"+labimage.EnvCacheDir+", else ~/.cache/tabby)")
	f.StringVar(repo, "repo", "", "the tabby repository (deploy/ is applied and kube-scheduler configured from it; default: found above the working directory or tabbyctl)")
	f.IntVar(&o.APIPort, "api-port", 0, "host loopback port of the API server forward (default: a free one)")
	f.StringArrayVar(&o.TabbydArgs, "tabbyd-arg", nil, "a flag added to the tabbyd container's in the DaemonSet (repeat it)")
	f.DurationVar(&o.ReadyTimeout, "timeout", 3*time.Minute, "how long to wait for the nodes, tabby and CoreDNS to be ready")
	f.BoolVar(&o.KeepOnFailure, "keep-on-failure", false, "leave a lab that failed to come up as it is, to look at (remove it with lab down)")
}

func labDownCommand(dir *string) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "down",
		Short: "remove the lab: processes, namespaces (with their links), files; also after a crash",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return lab.Down(cmd.Context(), lab.DownOptions{Dir: *dir, Name: name, Log: cmd.OutOrStdout()})
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "the lab's name, when its state file is lost (default: lab for the default --dir)")
	return cmd
}

func labStatusCommand(dir *string) *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use:   "status",
		Short: "the lab's nodes, addresses, processes, scheduler extender, tabbyd readiness and pods",
		Long: `status prints the lab's processes, its nodes (namespace, address, containerd,
kubelet, tabby-node pod, readiness), each node's BGP peers and the pods.
-o wide adds each node's subnet and runtime and the peers' wide columns of
tabbyctl node status; -o json and -o yaml print the whole report.`,
		Args: cobra.NoArgs,
		RunE: withLab(dir, func(cmd *cobra.Command, _ []string, st *lab.State) error {
			r := lab.Inspect(cmd.Context(), st)
			return printOutput(cmd.OutOrStdout(), output, r, func(w io.Writer, wide bool) error {
				r.Write(w, wide)
				return nil
			})
		}),
	}
	addOutputFlag(cmd, &output, false, true)
	return cmd
}

func labKubeconfigCommand(dir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "kubeconfig",
		Short: "print the path of an admin kubeconfig that works from the host",
		Args:  cobra.NoArgs,
		RunE: withLab(dir, func(cmd *cobra.Command, _ []string, st *lab.State) error {
			if st.Kubeconfig == "" {
				return fmt.Errorf("the lab in %s has no kubeconfig yet (lab up did not get that far)", *dir)
			}
			fmt.Fprintln(cmd.OutOrStdout(), st.Kubeconfig)
			return nil
		}),
	}
}

func labExecCommand(dir *string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "exec NAMESPACE/POD -- COMMAND [ARGS...]",
		Short: "run a command in a pod's network namespace (stdin, stdout, stderr and exit status pass through)",
		Args:  cobra.MinimumNArgs(2),
		RunE: withLab(dir, func(cmd *cobra.Command, args []string, st *lab.State) error {
			ref, argv := args[0], args[1:]
			if argv[0] == "--" {
				argv = argv[1:]
			}
			return lab.Exec(cmd.Context(), st, ref, argv)
		}),
	}
	// Everything after the pod is the command's, flags included.
	cmd.Flags().SetInterspersed(false)
	return cmd
}

func labRestartCommand(dir *string) *cobra.Command {
	var grace, timeout time.Duration
	cmd := &cobra.Command{
		Use:   "restart NODE " + strings.Join(lab.Components, "|"),
		Short: "restart a node's kubelet or containerd (pods keep running), or its tabbyd (deletes its tabby-node pod)",
		Args:  cobra.ExactArgs(2),
		RunE: withLab(dir, func(cmd *cobra.Command, args []string, st *lab.State) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), grace+timeout)
			defer cancel()
			if err := lab.Restart(ctx, st, args[0], args[1], grace); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s of %s restarted\n", args[1], args[0])
			return nil
		}),
	}
	cmd.Flags().DurationVar(&grace, "grace", 10*time.Second, "how long to wait after SIGTERM before SIGKILL (tabbyd: the pod's grace period)")
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Minute, "how long to wait, after the grace period, for the component to be back (tabbyd: its new pod ready)")
	return cmd
}

func labNodeRootCommand(dir *string) *cobra.Command {
	var node string
	var hostMountNS uint64
	cmd := &cobra.Command{
		Use:    "node-root --node NODE",
		Short:  "make a node's private mounts and hold its mount namespace (lab up starts it under unshare --mount)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: withLab(dir, func(cmd *cobra.Command, _ []string, st *lab.State) error {
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			return lab.RunNodeRoot(ctx, st, node, hostMountNS)
		}),
	}
	cmd.Flags().StringVar(&node, "node", "", "the node's name")
	cmd.Flags().Uint64Var(&hostMountNS, "host-mount-ns", 0, "inode of the mount namespace this one must not be (lab up's)")
	_ = cmd.MarkFlagRequired("node")
	return cmd
}

func labLoadCommand(dir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "load IMAGE.tar...",
		Short: "import images (docker-archive or OCI tarballs, as docker save writes) into every node, as kind load image-archive does",
		Long: `load imports each tarball into the containerd of every node (namespace
k8s.io, where kubelet finds images). The lab's nodes cannot pull: a pod whose
image is neither preloaded nor loaded fails with ErrImagePull naming the
image. Give the pod a tag other than latest (or imagePullPolicy: IfNotPresent)
so that kubelet uses the loaded image.`,
		Args: cobra.MinimumNArgs(1),
		RunE: withLab(dir, func(cmd *cobra.Command, args []string, st *lab.State) error {
			return lab.LoadImages(cmd.Context(), st, args, cmd.OutOrStdout())
		}),
	}
}

func labForwardCommand(dir *string) *cobra.Command {
	return &cobra.Command{
		Use:    "forward",
		Short:  "relay the listening socket on fd 3 to the lab's API server (lab up starts it)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: withLab(dir, func(cmd *cobra.Command, _ []string, st *lab.State) error {
			ln, err := net.FileListener(os.NewFile(3, "listener"))
			if err != nil {
				return fmt.Errorf("the forward expects its listening socket as fd 3 (lab up hands it over): %w", err)
			}
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			return lab.RunForward(ctx, st, ln)
		}),
	}
}

func labProbeCommand() *cobra.Command {
	var tcp, udp, expect string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:    "probe --tcp HOST:PORT | --udp HOST:PORT",
		Short:  "a workload client: exit status 0 when the server answers (prints the answer)",
		Hidden: true,
		Args:   cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			network, addr := "tcp", tcp
			if udp != "" {
				network, addr = "udp", udp
			}
			if (tcp == "") == (udp == "") {
				fmt.Fprintln(os.Stderr, "probe: pass exactly one of --tcp HOST:PORT and --udp HOST:PORT")
				os.Exit(2)
			}
			reply, err := lab.Probe(cmd.Context(), network, addr, timeout)
			if err == nil && expect != "" && reply != expect {
				err = fmt.Errorf("answer %s, want %s", strconv.Quote(reply), strconv.Quote(expect))
			}
			if err != nil {
				fmt.Fprintf(os.Stderr, "probe %s %s: %v\n", network, addr, err)
				os.Exit(1)
			}
			fmt.Fprintln(cmd.OutOrStdout(), reply)
		},
	}
	cmd.Flags().StringVar(&tcp, "tcp", "", "HOST:PORT to connect to")
	cmd.Flags().StringVar(&udp, "udp", "", "HOST:PORT to send a datagram to")
	cmd.Flags().StringVar(&expect, "expect", "", "fail unless the answer is this")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Second, "how long to wait")
	return cmd
}
