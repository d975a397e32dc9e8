// Command tabby-scheduler-extender is tabby's kube-scheduler extender.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/internal/buildinfo"
	extender "github.com/tabbynet/tabby/scheduler-extender"
)

func main() {
	var cfg extender.Config
	cmd := &cobra.Command{
		Use:          "tabby-scheduler-extender",
		Short:        "kube-scheduler extender: places pods by scheduling rules and by what the network knows",
		Version:      buildinfo.Version,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(*cobra.Command, []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return extender.Run(ctx, cfg)
		},
	}
	cmd.Flags().StringVar(&cfg.Listen, "listen", ":8888", "address to serve POST /filter, POST /prioritize, GET /healthz and GET /metrics on")
	cmd.Flags().StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig of the API server (default: in-cluster, then $KUBECONFIG)")
	cmd.Flags().StringVar(&cfg.TLSCertFile, "tls-cert-file", "", "PEM certificate (with any intermediates) to serve HTTPS with, for kube-scheduler's enableHTTPS; needs --tls-key-file")
	cmd.Flags().StringVar(&cfg.TLSKeyFile, "tls-key-file", "", "PEM private key of --tls-cert-file")
	cmd.Flags().Int64Var(&cfg.MaxRequestBytes, "max-request-bytes", extender.DefaultMaxRequestBytes, "largest request body accepted; larger ones get 413 (full Nodes are sent unless nodeCacheCapable)")
	if err := cmd.Execute(); err != nil {
		os.Exit(1)
	}
}
