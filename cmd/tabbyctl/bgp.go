package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/bgp/graph"
	"github.com/tabbynet/tabby/contract"
)

func init() { subcommands = append(subcommands, newBGPCommand) }

func newBGPCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bgp",
		Short: "the cluster's BGP: who peers with whom",
	}
	cmd.AddCommand(bgpGraphCommand())
	return cmd
}

func bgpGraphCommand() *cobra.Command {
	var format, namespace string
	var kube kubeFlags
	var noStatus bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "graph",
		Short: "print the cluster's BGP topology as Graphviz DOT or Mermaid",
		Long: `graph prints who peers with whom in the cluster: the node-to-node full
mesh, or the route reflectors (tabby.io/route-reflector=true) and their
clients, and the external speakers BGPPeers name, from the Nodes, the
BGPConfiguration and the BGPPeers, by the same rules tabbyd peers by.

Unless --no-status, it also asks every node's tabbyd for its status (by
exec of "tabbyctl node status -o json" in the node's tabby-node pod, as
kubectl exec does; tabbyd serves it on the node's loopback only): each
session is drawn with its state (green Established, red any other) and
the routes each end accepted, each node with its routes learned and
advertised. Sessions no status reports, and all of them with
--no-status, are drawn dashed as "configured". Nodes whose status could
not be read (exec forbidden, tabbyd down) are named on stderr.

Mesh sessions are lines; a reflector's sessions are arrows to its clients.

  tabbyctl bgp graph | dot -Tsvg > bgp.svg
  tabbyctl bgp graph --format mermaid   # paste into a ` + "```mermaid" + ` block`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			render, err := graphRenderer(format)
			if err != nil {
				return err
			}
			cfg, ds, err := kube.client()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			in, err := graph.Load(ctx, ds)
			if err != nil {
				return err
			}
			if !noStatus {
				src := graph.DefaultStatusSource(cfg)
				src.Namespace = namespace
				if err := graph.Statuses(ctx, ds, src, &in); err != nil {
					return err
				}
			}
			m := graph.Build(in)
			for _, p := range m.Problems {
				fmt.Fprintln(cmd.ErrOrStderr(), "tabbyctl: warning:", p)
			}
			_, err = fmt.Fprint(cmd.OutOrStdout(), render(m))
			return err
		},
	}
	addKubeFlags(cmd, &kube)
	cmd.Flags().StringVar(&format, "format", "dot", "dot (Graphviz) or mermaid")
	cmd.Flags().StringVar(&namespace, "namespace", contract.DefaultNamespace, "namespace of the tabby-node pods, whose tabbyd is asked for its status")
	cmd.Flags().BoolVar(&noStatus, "no-status", false, "draw the configured topology only: ask no tabbyd (no pods/exec needed)")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "how long to wait for the API server and the nodes")
	_ = cmd.RegisterFlagCompletionFunc("format", cobra.FixedCompletions([]string{"dot", "mermaid"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

func graphRenderer(format string) (func(graph.Model) string, error) {
	switch format {
	case "dot", "":
		return graph.DOT, nil
	case "mermaid":
		return graph.Mermaid, nil
	}
	return nil, fmt.Errorf("--format must be dot or mermaid, not %q", format)
}
