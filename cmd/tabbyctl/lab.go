package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/lab"
	"github.com/tabbynet/tabby/test/cluster"
)

func init() { subcommands = append(subcommands, newLabCommand) }

// envLabDir names the default lab folder.
const envLabDir = "TABBY_LAB_DIR"

func newLabCommand() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "lab",
		Short: "a Kubernetes cluster of network namespaces on this machine, running tabby (needs root)",
		Long: `The lab runs a real control plane (etcd, kube-apiserver, kube-scheduler
with tabby-scheduler-extender, kube-controller-manager) and N nodes on this
machine, each node a network
namespace with tabbyd and a small lab kubelet that runs pods as network
namespaces wired by tabby's CNI plugin. Everything lives in namespaces the
lab creates (tabby-<name>-*); the host gets only a loopback port forward to
the API server. Pods' containers run host programs given by absolute path.

  tabbyctl lab up --nodes 3            start it (about 20 seconds)
  tabbyctl lab status                  nodes, processes, tabbyd readiness, pods
  kubectl --kubeconfig $(tabbyctl lab kubeconfig) get nodes
  tabbyctl lab exec default/web -- ip addr
  tabbyctl lab down                    remove everything (also after a crash)`,
	}
	def := os.Getenv(envLabDir)
	if def == "" {
		def = lab.DefaultDir
	}
	cmd.PersistentFlags().StringVar(&dir, "dir", def, "the lab's folder ($"+envLabDir+" changes the default)")
	cmd.AddCommand(labUpCommand(&dir), labDownCommand(&dir), labStatusCommand(&dir), labKubeconfigCommand(&dir),
		labExecCommand(&dir), labRestartCommand(&dir), labDemoCommand(&dir),
		labKubeletCommand(&dir), labForwardCommand(&dir), labShimCommand(), labNetexecCommand(), labProbeCommand())
	return cmd
}

// signalContext ends on SIGINT or SIGTERM.
func signalContext(parent context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
}

// findRepo is the tabby repository: above the working directory, else
// above tabbyctl's own folder (bin/ of a checkout).
func findRepo(exeDir string) (string, error) {
	if root, err := cluster.FindRepoRoot(); err == nil {
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
		Short: "start a lab: control plane, underlay, nodes with tabbyd and the lab kubelet",
		Long: `up builds the underlay (a bridge per subnet and a router without a route out),
starts the control plane in its own namespace with tabby's CRDs, policies,
namespace and RBAC from deploy/ and a default IPPool, tabby-scheduler-extender
on that namespace's loopback (port 8888) and kube-scheduler with
deploy/scheduler/kube-scheduler-config.yaml pointed at it, and per node a
namespace with eth0 on the underlay, its CNI config written by tabbyctl
install-cni, tabbyd and the lab kubelet. It returns when every node is Ready,
its tabbyd answers /readyz and the extender passes it (it has seen the
node's tabbyd heartbeat Lease); the processes keep running. Node i is nodei, at 10.77.0.(10+i)
(with --subnets 2, even nodes are on 10.78.0.0/24 behind the router).

The control-plane binaries come from --controlplane-dir ($` + cluster.EnvControlPlaneDir + `),
else test/controlplane/build.sh builds them (minutes, the first time).`,
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
		o.ControlPlaneDir = os.Getenv(cluster.EnvControlPlaneDir)
	}
	if o.RepoRoot = repo; repo == "" {
		if o.RepoRoot, err = findRepo(exeDir); err != nil {
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
	f.StringVar(&o.PodCIDR, "pod-cidr", lab.DefaultPodCIDR, `the default IPPool's range ("" for no pool)`)
	f.StringVar(&o.BinDir, "bin-dir", "", "folder holding tabbyd, tabby, tabby-ipam and tabby-scheduler-extender (default: tabbyctl's own folder)")
	f.StringVar(&o.ControlPlaneDir, "controlplane-dir", "", "folder holding etcd, kube-apiserver, ... (default $"+cluster.EnvControlPlaneDir+", else built)")
	f.StringVar(repo, "repo", "", "the tabby repository (deploy/ is applied and kube-scheduler configured from it; default: found above the working directory or tabbyctl)")
	f.IntVar(&o.APIPort, "api-port", 0, "host loopback port of the API server forward (default: a free one)")
	f.StringArrayVar(&o.TabbydArgs, "tabbyd-arg", nil, "a flag added to every tabbyd's (repeat it)")
	f.BoolVar(&o.TabbydAdmin, "tabbyd-admin", false, "run tabbyd with the admin's token instead of the tabby-node service account's")
	f.DurationVar(&o.ReadyTimeout, "timeout", 2*time.Minute, "how long to wait for the nodes and tabbyd to be ready")
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
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "the lab's nodes, addresses, processes, scheduler extender, tabbyd readiness and pods",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := lab.Load(*dir)
			if err != nil {
				return err
			}
			r := lab.Inspect(cmd.Context(), st)
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(r)
			}
			r.Print(cmd.OutOrStdout())
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the status as JSON")
	return cmd
}

func labKubeconfigCommand(dir *string) *cobra.Command {
	return &cobra.Command{
		Use:   "kubeconfig",
		Short: "print the path of an admin kubeconfig that works from the host",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := lab.Load(*dir)
			if err != nil {
				return err
			}
			if st.Kubeconfig == "" {
				return fmt.Errorf("the lab in %s has no kubeconfig yet (lab up did not get that far)", *dir)
			}
			fmt.Fprintln(cmd.OutOrStdout(), st.Kubeconfig)
			return nil
		},
	}
}

func labExecCommand(dir *string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "exec NAMESPACE/POD -- COMMAND [ARGS...]",
		Short: "run a command in a pod's network namespace (stdin, stdout, stderr and exit status pass through)",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref, argv := args[0], args[1:]
			if argv[0] == "--" {
				argv = argv[1:]
			}
			st, err := lab.Load(*dir)
			if err != nil {
				return err
			}
			return lab.Exec(cmd.Context(), st, ref, argv)
		},
	}
	// Everything after the pod is the command's, flags included.
	cmd.Flags().SetInterspersed(false)
	return cmd
}

func labRestartCommand(dir *string) *cobra.Command {
	var grace time.Duration
	cmd := &cobra.Command{
		Use:   "restart NODE [tabbyd|kubelet]",
		Short: "restart a node's tabbyd or kubelet (default: both); a restarted kubelet adopts its pods",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := lab.Load(*dir)
			if err != nil {
				return err
			}
			components := []string{lab.ComponentKubelet, lab.ComponentTabbyd}
			if len(args) == 2 {
				components = args[1:]
			}
			for _, c := range components {
				if err := lab.Restart(st, args[0], c, grace); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s of %s restarted\n", c, args[0])
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&grace, "grace", 10*time.Second, "how long to wait after SIGTERM before SIGKILL")
	return cmd
}

func labKubeletCommand(dir *string) *cobra.Command {
	var node, logLevel string
	cmd := &cobra.Command{
		Use:    "kubelet --node NODE",
		Short:  "the lab kubelet of one node (lab up starts it inside the node's namespace)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			st, err := lab.Load(*dir)
			if err != nil {
				return err
			}
			cfg, err := lab.KubeletConfigFor(st, node)
			if err != nil {
				return err
			}
			cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			return lab.RunKubelet(ctx, cfg)
		},
	}
	cmd.Flags().StringVar(&node, "node", "", "the node's name")
	cmd.Flags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	_ = cmd.MarkFlagRequired("node")
	return cmd
}

func labForwardCommand(dir *string) *cobra.Command {
	return &cobra.Command{
		Use:    "forward",
		Short:  "relay the listening socket on fd 3 to the lab's API server (lab up starts it)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := lab.Load(*dir)
			if err != nil {
				return err
			}
			ln, err := net.FileListener(os.NewFile(3, "listener"))
			if err != nil {
				return fmt.Errorf("the forward expects its listening socket as fd 3 (lab up hands it over): %w", err)
			}
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			return lab.RunForward(ctx, st, ln)
		},
	}
}

func labShimCommand() *cobra.Command {
	var exitFile string
	cmd := &cobra.Command{
		Use:    "shim --exit-file FILE -- COMMAND [ARGS...]",
		Short:  "run a container's command and record how it ended (the lab kubelet starts it)",
		Hidden: true,
		Args:   cobra.MinimumNArgs(1),
		Run: func(_ *cobra.Command, args []string) {
			os.Exit(lab.RunShim(exitFile, args))
		},
	}
	cmd.Flags().StringVar(&exitFile, "exit-file", "", "where to record the exit status")
	_ = cmd.MarkFlagRequired("exit-file")
	return cmd
}

func labNetexecCommand() *cobra.Command {
	cfg := lab.NetexecConfig{}
	cmd := &cobra.Command{
		Use:    "netexec --tcp PORT --udp PORT",
		Short:  "a workload server: answers TCP connections and UDP datagrams with its name",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Name == "" {
				if cfg.Name = os.Getenv("HOSTNAME"); cfg.Name == "" {
					cfg.Name, _ = os.Hostname()
				}
			}
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			return lab.RunNetexec(ctx, cfg, func() {
				fmt.Fprintf(cmd.OutOrStdout(), "netexec %s: serving TCP %v, UDP %v\n", cfg.Name, cfg.TCP, cfg.UDP)
			})
		},
	}
	cmd.Flags().IntSliceVar(&cfg.TCP, "tcp", nil, "TCP ports to serve (repeat or comma-separate)")
	cmd.Flags().IntSliceVar(&cfg.UDP, "udp", nil, "UDP ports to serve")
	cmd.Flags().StringVar(&cfg.Name, "name", "", "the answer (default $HOSTNAME, the pod's name in the lab)")
	return cmd
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
