// Command tabbyctl is tabby's command line: IPAM inspection, node status, the
// CNI installer the DaemonSet runs, and the local lab.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/internal/buildinfo"
)

func main() {
	root := &cobra.Command{
		Use:           "tabbyctl",
		Short:         "tabby's command line: IPAM, node status, install-cni and the local lab",
		Version:       buildinfo.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().String("kubeconfig", "", "kubeconfig of the API server (default: in-cluster, then $KUBECONFIG)")
	root.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "print tabbyctl's version",
		Args:  cobra.NoArgs,
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), buildinfo.Version) },
	})
	for _, add := range subcommands {
		root.AddCommand(add())
	}
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "tabbyctl:", err)
		os.Exit(1)
	}
}

// subcommands are registered by the files of this package.
var subcommands []func() *cobra.Command
