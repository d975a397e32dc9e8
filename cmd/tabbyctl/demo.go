package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/internal/demo"
)

func init() { subcommands = append(subcommands, demoCommand) }

func demoCommand() *cobra.Command {
	var pluginDir string
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "wire three pods on one node with the tabby CNI plugin and ping between them (needs root)",
		Long: `demo starts a real etcd and kube-apiserver on loopback, installs tabby's CRDs,
makes a network namespace standing for a node and an IPPool (` + demo.PoolCIDR + `),
creates three Pods and wires each through libcni with the tabby plugin, as a
container runtime would. It prints each pod's address and host veth and a
ping matrix between the pods and the node, then removes everything it made
(also on Ctrl-C or an error).

The control-plane binaries come from $` + controlplane.EnvControlPlaneDir + ` (make lab sets it),
else test/controlplane/build.sh builds them; run it from the repository.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if pluginDir == "" {
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("finding tabbyctl's folder (pass --plugin-dir): %w", err)
				}
				pluginDir = filepath.Dir(exe)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return demo.Run(ctx, demo.Options{
				PluginDir:       pluginDir,
				ControlPlaneDir: os.Getenv(controlplane.EnvControlPlaneDir),
				Out:             cmd.OutOrStdout(),
			})
		},
	}
	cmd.Flags().StringVar(&pluginDir, "plugin-dir", "", "folder of the tabby and tabby-ipam plugins (default: tabbyctl's own folder)")
	return cmd
}
