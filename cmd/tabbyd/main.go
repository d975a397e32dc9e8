// TCP MD5 (BGP passwords) needs plain TCP listeners: see bgp.ErrMPTCPListeners.
//
//go:debug multipathtcp=0

// Command tabbyd is tabby's node daemon.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/daemon"
	"github.com/tabbynet/tabby/daemon/cniagent/agentapi"
	"github.com/tabbynet/tabby/internal/buildinfo"
)

func main() {
	var cfg daemon.Config
	var nodeIP, logLevel string
	cmd := &cobra.Command{
		Use:     "tabbyd",
		Short:   "tabby's node daemon: BGP, routes and NetworkPolicy for one node",
		Version: buildinfo.Version,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
			if nodeIP != "" {
				if cfg.NodeIP = net.ParseIP(nodeIP); cfg.NodeIP == nil {
					return fmt.Errorf("--node-ip %q is not an IP address", nodeIP)
				}
			}
			if cfg.NodeName == "" {
				cfg.NodeName, _ = os.Hostname()
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return daemon.Run(ctx, cfg)
		},
		SilenceUsage: true,
	}
	f := cmd.Flags()
	f.StringVar(&cfg.NodeName, "nodename", "", "name of this node (default: the host name)")
	f.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig of the API server (default: in-cluster, then $KUBECONFIG)")
	f.StringVar(&nodeIP, "node-ip", "", "this node's address for BGP and routes (default: detected)")
	f.StringVar(&cfg.HealthListen, "health-listen", ":9099", "address serving /healthz, /readyz and /metrics")
	f.StringVar(&cfg.CNISocket, "cni-socket", agentapi.DefaultSocket, "unix socket serving the CNI plugins' IPAM (the CNI config's agentSocket); \"\" turns it off")
	f.StringVar(&cfg.Namespace, "namespace", daemon.DefaultNamespace, "the namespace tabbyd runs in: BGP passwords are read from its Secrets")
	f.DurationVar(&cfg.Resync, "resync", daemon.DefaultResync, "how often routes and BGP sessions are reconciled without a change")
	f.DurationVar(&cfg.StartupHold, "startup-hold", daemon.DefaultStartupHold, "after a restart, how long the previous run's routes are kept at most while BGP converges")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	if err := cmd.Execute(); err != nil {
		os.Exit(1)
	}
}
