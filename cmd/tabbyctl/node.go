package main

import (
	"context"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/daemon/nodestatus"
)

func init() { subcommands = append(subcommands, newNodeCommand) }

func newNodeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "this node's tabbyd: BGP peers and routes",
	}
	cmd.AddCommand(nodeStatusCommand())
	return cmd
}

func nodeStatusCommand() *cobra.Command {
	var endpoint string
	var output outputFormat
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "status",
		Short: "print this node's BGP peers, their state, since when and routes received (like calicoctl node status)",
		Long: `status asks the node's tabbyd (GET /status on its --health-listen address)
for its BGP sessions and routes, and prints a table of the peers: address,
why the session exists (node-mesh, route-reflector, route-reflector-client,
bgppeer/NAME), AS, state, since when, and routes received and accepted.
It exits with status 1 when tabbyd is not ready (a session is not
Established, or programming the kernel failed), 2 when tabbyd cannot be
asked. -o wide adds whether each peer sent End-of-RIB, its prefix limit,
the last programming of the kernel and any warnings; -o json and -o yaml
print tabbyd's whole status.

In the lab, run it inside a node:
  ip netns exec tabby-lab-node1 tabbyctl node status`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			st, err := nodestatus.Fetch(ctx, nil, endpoint)
			if err != nil {
				return err
			}
			err = printOutput(cmd.OutOrStdout(), output, st, func(w io.Writer, wide bool) error {
				st.Write(w, wide)
				return nil
			})
			if err != nil {
				return err
			}
			if !st.Ready {
				return problem("tabbyd on %s is not ready", st.Node)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&endpoint, "endpoint", "127.0.0.1:9099", "tabbyd's health and status address (its --health-listen)")
	addOutputFlag(cmd, &output, false, true)
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for tabbyd")
	return cmd
}
