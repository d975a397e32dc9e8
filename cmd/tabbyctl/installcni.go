package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/daemon/cnitoken"
	"github.com/tabbynet/tabby/installcni"
	"github.com/tabbynet/tabby/internal/logging"
)

func init() { subcommands = append(subcommands, newInstallCNICommand) }

// runtimeCNIVersionEnv is the environment variable behind
// --runtime-cni-version (the DaemonSet sets it; deploy/gen -runtime-cni-version).
const runtimeCNIVersionEnv = "CNI_RUNTIME_MAX_VERSION"

func newInstallCNICommand() *cobra.Command {
	o := installcni.Options{}
	var logFlags *logging.Flags
	cmd := &cobra.Command{
		Use:   "install-cni",
		Short: "install tabby's CNI plugins, conflist and kubeconfig on this node (the DaemonSet's init container)",
		Long: `install-cni copies the tabby and tabby-ipam binaries into the host's CNI bin
dir and writes the network config list and a kubeconfig into the host's
CNI config dir, both mode 0600. The kubeconfig carries a short-lived token
of the CNI plugin's service account (--cni-service-account), minted with the
TokenRequest API as this pod's own service account (tabby-node); tabbyd
--cni-kubeconfig replaces it long before it expires. Each file is replaced
atomically and only when its content changed; it prints what it did.

The reference plugins the node needs (--reference-plugins: loopback, which
the container runtime runs for every pod, and portmap, which the conflist
chains) go in from the image too, unless the node has one of the same
version or newer, or one whose version cannot be read: that one stays.

The conflist's cniVersion is the newest that tabby, the container runtime
and every chained plugin speak. The runtime's limit comes from
--runtime-cni-version ($CNI_RUNTIME_MAX_VERSION), else from the Node's
status.nodeInfo.containerRuntimeVersion (containerd 1.6 and 1.7 speak CNI
up to 1.0.0, containerd 2 up to 1.1.0), else it is taken to be 1.0.0.

In the tabby-node DaemonSet the host's /opt/cni/bin and /etc/cni/net.d are
mounted under /host, kubelet mounts tabby-node's token where a pod's
service-account credentials are, and NODE_NAME, KUBERNETES_SERVICE_HOST,
KUBERNETES_SERVICE_PORT and CNI_RUNTIME_MAX_VERSION come from the pod.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Warnings, and client-go's messages while it asks the API
			// server, go to stderr in --log-format (a DaemonSet's logs are
			// shipped); stdout lists the files as before.
			log, err := logFlags.Logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return logFinal(log, logFlags.Format, installCNI(cmd, o, log))
		},
	}
	addInstallCNIFlags(cmd, &o)
	logFlags = logging.AddFlags(cmd.Flags())
	return cmd
}

// installCNI is install-cni once its log is set up.
func installCNI(cmd *cobra.Command, o installcni.Options, log *slog.Logger) error {
	if o.BinSource == "" {
		dir, err := executableDir()
		if err != nil {
			return fmt.Errorf("finding the folder of tabbyctl to copy the plugins from: %w (pass --bin-source)", err)
		}
		o.BinSource = dir
	}
	if o.NodeName == "" {
		o.NodeName = os.Getenv("NODE_NAME")
	}
	if o.RuntimeCNIVersion == "" {
		o.RuntimeCNIVersion = os.Getenv(runtimeCNIVersionEnv)
	}
	if o.APIServer == "" {
		host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
		if host != "" && port != "" {
			o.APIServer = "https://" + net.JoinHostPort(host, port)
		}
	}
	res, err := installcni.Install(o)
	if res != nil {
		for _, f := range res.Files {
			fmt.Fprintln(cmd.OutOrStdout(), f)
		}
		for _, n := range res.Notes {
			fmt.Fprintln(cmd.OutOrStdout(), "install-cni:", n)
		}
		for _, w := range res.Warnings {
			log.Warn(w)
		}
	}
	if err != nil {
		return fmt.Errorf("install-cni: %w", err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "install-cni: %d of %d files changed\n", len(res.Changed()), len(res.Files))
	return nil
}

func addInstallCNIFlags(cmd *cobra.Command, o *installcni.Options) {
	f := cmd.Flags()
	f.StringVar(&o.BinSource, "bin-source", "", "folder holding the plugin binaries to install (default: the folder of this tabbyctl)")
	f.StringVar(&o.CNIBinDir, "cni-bin-dir", "/host"+installcni.DefaultCNIBinDir, "the host's CNI bin dir, as mounted here")
	f.StringVar(&o.CNIConfDir, "cni-conf-dir", "/host"+installcni.DefaultCNIConfDir, "the host's CNI config dir, as mounted here")
	f.StringVar(&o.HostCNIConfDir, "host-cni-conf-dir", installcni.DefaultCNIConfDir, "the CNI config dir as the host's container runtime sees it (named in the conflist)")
	f.StringVar(&o.ConfName, "conf-name", installcni.DefaultConfName, "file name of the conflist")
	f.StringVar(&o.NodeName, "nodename", "", "this node's name (default: $NODE_NAME)")
	f.IntVar(&o.MTU, "mtu", 0, "MTU of pod interfaces (0: the plugin detects it)")
	f.BoolVar(&o.Portmap, "portmap", true, "chain the portmap plugin (hostPort support) after tabby")
	f.StringSliceVar(&o.ReferencePlugins, "reference-plugins", installcni.DefaultReferencePlugins,
		"reference CNI plugins installed from the --bin-source folder when the node has none or an older one (portmap only with --portmap)")
	f.StringSliceVar(&o.ReferencePlugins, "optional-plugins", installcni.DefaultReferencePlugins, "")
	_ = f.MarkDeprecated("optional-plugins", "use --reference-plugins")
	f.StringVar(&o.RuntimeCNIVersion, "runtime-cni-version", "",
		"the newest CNI version the node's container runtime speaks, such as 1.0.0 (default: $"+runtimeCNIVersionEnv+", else told by the Node's containerRuntimeVersion)")
	f.StringVar(&o.ContainerRuntime, "container-runtime", "",
		"the node's container runtime as its Node reports it, such as containerd://1.6.20 (default: read from the Node)")
	f.StringVar(&o.CNILogLevel, "cni-log-level", "", "the plugin's logLevel in the conflist: debug, info, warn, error (default: silent)")
	f.StringVar(&o.CNILogFormat, "cni-log-format", "", "the plugin's logFormat in the conflist: text or json (default: the plugin's, text)")
	f.BoolVar(&o.AssignIPv6, "assign-ipv6", false, "pods get an IPv6 address too (the conflist's ipam.assignIPv6, for dual-stack clusters; the cluster needs an IPv6 IPPool)")
	f.StringVar(&o.AgentSocket, "agent-socket", "", "the plugin's agentSocket in the conflist: where tabbyd serves IPAM (default: the plugin's, /var/run/tabby/cni.sock)")
	f.StringVar(&o.APIServer, "apiserver", "", "the API server's URL as the node reaches it (default: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT)")
	f.StringVar(&o.TokenFile, "token-file", installcni.DefaultTokenFile, "this pod's service-account token, which mints the CNI plugin's (or, with --cni-service-account=\"\", is the plugin's own)")
	f.StringVar(&o.CNIServiceAccount, "cni-service-account", cnitoken.DefaultNamespace+"/"+cnitoken.DefaultServiceAccount,
		"NAMESPACE/NAME of the CNI plugin's service account, whose short-lived token the kubeconfig carries; \"\": put the --token-file token in the kubeconfig as it is")
	f.DurationVar(&o.TokenLifetime, "cni-token-lifetime", cnitoken.DefaultLifetime, "lifetime of the CNI plugin's token (at least 10m; tabbyd --cni-token-lifetime decides the ones after the first)")
	f.StringVar(&o.CAFile, "ca-file", installcni.DefaultCAFile, "the cluster's CA bundle")
}

// executableDir is the folder of the running binary, symlinks resolved.
func executableDir() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	if resolved, err := filepath.EvalSymlinks(exe); err == nil {
		exe = resolved
	}
	return filepath.Dir(exe), nil
}
