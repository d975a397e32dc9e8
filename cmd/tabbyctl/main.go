// Command tabbyctl is tabby's command line: IPAM inspection, node status, the
// CNI installer the DaemonSet runs, and the local lab. Installed as
// kubectl-tabby it is the kubectl plugin `kubectl tabby`.
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/internal/buildinfo"
)

// pluginName is the name kubectl finds a plugin for `kubectl tabby` by.
const pluginName = "kubectl-tabby"

func main() {
	root := newRootCommand(filepath.Base(os.Args[0]))
	err := root.Execute()
	var logged loggedError
	if err != nil && !errors.As(err, &logged) {
		fmt.Fprintf(os.Stderr, "%s: %v\n", root.DisplayName(), err)
	}
	os.Exit(exitCode(err))
}

// newRootCommand is tabbyctl, named as kubectl names its plugins when the
// binary was invoked as kubectl-tabby.
func newRootCommand(argv0 string) *cobra.Command {
	root := &cobra.Command{
		Use:   "tabbyctl",
		Short: "tabby's command line: IPAM, node status, install-cni and the local lab",
		Long: `tabbyctl is tabby's command line: IPAM, node status, install-cni and the
local lab. Installed as kubectl-tabby on the PATH it is also the kubectl
plugin ` + "`kubectl tabby`" + `, taking kubectl's --kubeconfig and --context.

` + exitCodesHelp,
		Version:       buildinfo.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	// A bad flag or -o value says where the usage is (exit 2, as any error
	// that is not a problem found).
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return fmt.Errorf("%w (see %s --help)", err, c.CommandPath())
	})
	if strings.TrimSuffix(argv0, ".exe") == pluginName {
		root.Annotations = map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl tabby"}
	}
	root.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "print tabbyctl's version",
		Args:  cobra.NoArgs,
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), buildinfo.Version) },
	})
	for _, add := range subcommands {
		root.AddCommand(add())
	}
	return root
}

// subcommands are registered by the files of this package.
var subcommands []func() *cobra.Command
