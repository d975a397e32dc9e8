package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/lab"
)

func labDemoCommand(dir *string) *cobra.Command {
	o := lab.Options{}
	var repo string
	var perNode int
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "the lab's main job: a lab of 3 nodes, pods on each, a connectivity matrix, a NetworkPolicy and the BGP peers (make lab)",
		Long: `demo starts a lab as lab up does (unless one is up in --dir already; then
it uses that one), creates web pods on every node (web1-a, web1-b, ...:
agnhost serve-hostname) in the default IPPool, prints their addresses and
nodes, how kube-scheduler placed them through tabby-scheduler-extender (and
one more pod, near-<last>, placed by required pod affinity), a matrix of real
probes from every pod to every pod (a TCP connection answered by the target's
server and a ping, both from inside the source pod), a ClusterIP Service in
front of the last pod reached by its DNS name from inside the first pod's
container, the matrix again under a NetworkPolicy that lets only the first
pod reach the last one on TCP (deny cells marked), deletes that policy again
and checks every pair is open, prints each node's BGP peers, then says how
to use the lab. The lab stays up: tabbyctl lab down
removes it. It exits with status 1 when a probe or a placement was not as
expected.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signalContext(cmd.Context())
			defer stop()
			out := cmd.OutOrStdout()
			var st *lab.State
			if _, err := os.Stat(filepath.Join(*dir, lab.StateFile)); err == nil {
				if st, err = lab.Load(*dir); err != nil {
					return err
				}
				if !st.Ready {
					return fmt.Errorf("the lab in %s did not finish coming up: remove it with tabbyctl lab down --dir %s", *dir, *dir)
				}
				fmt.Fprintf(out, "lab %s is up already in %s (%d nodes): running the demo in it\n", st.Name, st.Dir, len(st.Nodes))
			} else {
				if err := completeUpOptions(&o, repo, *dir, out); err != nil {
					return err
				}
				if st, err = lab.Up(ctx, o); err != nil {
					return err
				}
			}
			// The lab is up: what goes wrong now is what the demo found.
			if err := lab.Demo(ctx, st, lab.DemoOptions{PodsPerNode: perNode, Out: out}); err != nil && ctx.Err() == nil {
				return problemError{err}
			} else if err != nil {
				return err
			}
			return nil
		},
	}
	addUpFlags(cmd, &o, &repo)
	cmd.Flags().IntVar(&perNode, "pods-per-node", 2, "web pods on each node")
	return cmd
}
