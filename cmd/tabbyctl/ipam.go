package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam/inspect"
)

func init() { subcommands = append(subcommands, newIPAMCommand) }

// ipamFlags are the flags every ipam command shares.
type ipamFlags struct {
	kube    kubeFlags
	output  outputFormat
	timeout time.Duration
	grace   time.Duration
}

func (f *ipamFlags) options() inspect.Options {
	g := f.grace
	if g == 0 {
		g = -1 // --grace 0 means none
	}
	return inspect.Options{Grace: g}
}

// load reads the snapshot from the API server --kubeconfig and --context
// name (as kubectl finds it).
func (f *ipamFlags) load(cmd *cobra.Command) (context.Context, context.CancelFunc, *datastore.Client, *inspect.Snapshot, error) {
	_, ds, err := f.kube.client()
	if err != nil {
		return nil, nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
	s, err := inspect.Load(ctx, ds)
	if err != nil {
		cancel()
		return nil, nil, nil, nil, err
	}
	return ctx, cancel, ds, s, nil
}

func parseIP(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("--ip %q is not an IP address (give one address, such as 10.244.1.5 or fd00::5)", s)
	}
	return a.Unmap(), nil
}

func newIPAMCommand() *cobra.Command {
	f := &ipamFlags{}
	cmd := &cobra.Command{
		Use:   "ipam",
		Short: "show, check and repair IP address management: pools, blocks, who holds an address",
		Long: `ipam reads tabby's IPAM objects (IPPools, IPAMBlocks, BlockAffinities,
IPAMHandles) with the Pods and Nodes from the API server, as one consistent
snapshot, and

  tabbyctl ipam show                 pools and blocks: nodes, addresses used and free
  tabbyctl ipam show --ip 10.244.1.5 who holds an address, and whether that pod has it
  tabbyctl ipam check                leaked and double-booked addresses, stale handles,
                                     blocks and affinities that disagree; exits 1 on problems
  tabbyctl ipam release --ip X       free a leaked address (refuses one a live pod holds)

-o wide adds columns; -o json and -o yaml print the whole report for
scripts. The API server comes from --kubeconfig and --context as kubectl
finds it: --kubeconfig, else $KUBECONFIG, else ~/.kube/config, else the
in-cluster service account.`,
	}
	addKubeFlags(cmd, &f.kube)
	addOutputFlag(cmd, &f.output, true, false)
	cmd.PersistentFlags().DurationVar(&f.timeout, "timeout", 60*time.Second, "bound on the whole command's work with the API server")
	cmd.PersistentFlags().DurationVar(&f.grace, "grace", inspect.DefaultGrace,
		"an allocation this young whose live pod shows other addresses is pending (a sandbox being replaced), not leaked; 0 for none")
	cmd.AddCommand(ipamShowCommand(f), ipamCheckCommand(f), ipamReleaseCommand(f))
	return cmd
}

func ipamShowCommand(f *ipamFlags) *cobra.Command {
	var ipFlag string
	cmd := &cobra.Command{
		Use:   "show [--ip ADDRESS]",
		Short: "per pool: its blocks, their nodes, addresses used and free; --ip: who holds an address",
		Long: `show prints every IPPool (CIDR, block size, blocks claimed, addresses used and
free), then every block (pool, node it is affine to, the state of its
BlockAffinity, addresses used, free and borrowed by other nodes), then the
totals.

With --ip it prints who holds one address: its pool and block, the handle,
pod and node it was allocated for and when, whether that pod is live and
really has the address in its status (state running, pending, recent,
other-addresses, finished, missing, node, replaced or node-gone), the live
pods whose status lists it, and what tabbyctl ipam check says about it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var ip netip.Addr
			var err error
			if ipFlag != "" {
				if ip, err = parseIP(ipFlag); err != nil {
					return err
				}
			}
			_, cancel, _, s, err := f.load(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			out := cmd.OutOrStdout()
			if ipFlag != "" {
				r := inspect.ShowIP(s, ip, f.options())
				return printOutput(out, f.output, r, r.Write)
			}
			r := inspect.Show(s)
			return printOutput(out, f.output, r, r.Write)
		},
	}
	cmd.Flags().StringVar(&ipFlag, "ip", "", "show who holds this address")
	return cmd
}

func ipamCheckCommand(f *ipamFlags) *cobra.Command {
	var confirm time.Duration
	cmd := &cobra.Command{
		Use:   "check",
		Short: "find leaked and double-booked addresses and inconsistent IPAM objects; exit 1 when something is wrong",
		Long: `check compares the blocks' allocations with the Pods and Nodes, the
IPAMHandles and the BlockAffinities, and reports every problem with what
to do about it:

  double-booked           an address in the status of two live pods (or allocated twice)
  misattributed           a live pod uses an address IPAM records for someone else
  unallocated-in-use      a live pod uses an address IPAM has free
  leaked                  an allocation whose pod is gone, finished, or has other addresses now
  deleted-node            an allocation or block of a node that no longer exists
  handle-mismatch         an IPAMHandle disagrees with what the blocks hold for it
  block-without-affinity  a block without its BlockAffinity, or of no node
  affinity-without-block  a BlockAffinity whose block does not exist
  affinity-mismatch       a BlockAffinity naming another node than its block
  block-outside-pool      a block in no IPPool, or of another size than its pool's blocks
  overlapping-blocks      two blocks sharing addresses
  corrupted-block         a block whose arrays are inconsistent

Notes (pending: a live pod whose allocation is not in its status yet, as
between CNI ADD and the kubelet's status update, or a claim in progress;
handle-missing) do not count as problems. When the first look finds a
problem, check looks again after --confirm and reports only the problems
found both times (an ADD or DEL caught half way is not one). It exits 0
when there is no problem, 1 when there is one, 2 when the check could not
run (the API server unreachable, for one).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel, ds, s, err := f.load(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			r := inspect.Check(s, f.options())
			if !r.OK && confirm > 0 {
				// Look again: report only what is still wrong, not an
				// ADD or DEL caught half way.
				select {
				case <-time.After(confirm):
				case <-ctx.Done():
					return fmt.Errorf("waiting to look again: %w", ctx.Err())
				}
				s, err := inspect.Load(ctx, ds)
				if err != nil {
					return err
				}
				r = inspect.Confirm(r, inspect.Check(s, f.options()))
			}
			if err := printOutput(cmd.OutOrStdout(), f.output, r, r.Write); err != nil {
				return err
			}
			if !r.OK {
				if r.Problems == 1 {
					return problem("ipam check found 1 problem")
				}
				return problem("ipam check found %d problems", r.Problems)
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&confirm, "confirm", 2*time.Second,
		"when problems are found, look again after this long and report only those still there (0: look once)")
	return cmd
}

func ipamReleaseCommand(f *ipamFlags) *cobra.Command {
	var ips []string
	var force bool
	cmd := &cobra.Command{
		Use:   "release --ip ADDRESS [--ip ADDRESS...] [--force]",
		Short: "free leaked addresses (refuses an address a live pod holds unless --force)",
		Long: `release frees addresses, as tabbyctl ipam check suggests for leaked ones.
It refuses an address that a live pod's status lists, that a live pod is
about to get (its status shows no address yet, or other addresses and the
allocation is younger than --grace), or that is a live node's tunnel
address, unless --force is given.

The release is a compare-and-swap on the address's block naming the
allocation it saw (handle and sequence number): if the address was freed
and handed out again meanwhile, it is left alone and release fails. The
address is taken off its IPAMHandle too. An address that is free already
is reported and counts as success. It exits 1 when any address was
refused or could not be released. -o json and -o yaml print a result per
address; table and wide print a line per address.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			structured := f.output == "json" || f.output == "yaml"
			if len(ips) == 0 {
				return errors.New("name the address to release with --ip (tabbyctl ipam check lists leaked ones)")
			}
			addrs := make([]netip.Addr, len(ips))
			for i, s := range ips {
				var err error
				if addrs[i], err = parseIP(s); err != nil {
					return err
				}
			}
			ctx, cancel, ds, s, err := f.load(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			out := cmd.OutOrStdout()
			var results []inspect.ReleaseResult
			failed := 0
			for _, ip := range addrs {
				r := releaseOne(ctx, ds, s, ip, force, f.options())
				if r.Error != "" {
					failed++
				}
				results = append(results, r)
				switch {
				case structured:
				case r.Error != "" && len(addrs) > 1:
					fmt.Fprintf(cmd.ErrOrStderr(), "tabbyctl: %s\n", r.Error)
				case r.Error == "":
					printRelease(out, r)
				}
			}
			if structured {
				if err := printOutput(out, f.output, results, nil); err != nil {
					return err
				}
			}
			if failed > 0 {
				if len(addrs) == 1 {
					return problem("%s", results[0].Error)
				}
				return problem("%d of %d addresses were not released", failed, len(addrs))
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&ips, "ip", nil, "address to release (repeat for more)")
	cmd.Flags().BoolVar(&force, "force", false, "release even an address that looks in use (a live pod holds it)")
	return cmd
}

func releaseOne(ctx context.Context, ds *datastore.Client, s *inspect.Snapshot, ip netip.Addr, force bool, o inspect.Options) inspect.ReleaseResult {
	r := inspect.ReleaseResult{IP: ip.String()}
	plan, err := inspect.PlanRelease(s, ip, o)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.Allocated = plan.Allocated
	if !plan.Allocated {
		return r
	}
	h := plan.Holder
	r.Holder, r.Refusal = &h, plan.Refusal
	if plan.Refusal != "" && !force {
		r.Error = fmt.Sprintf("refusing to release %s: %s; if you are sure nothing uses it, pass --force", ip, plan.Refusal)
		return r
	}
	if err := inspect.Release(ctx, ds, plan); err != nil {
		r.Error = err.Error()
		return r
	}
	r.Released, r.Forced = true, plan.Refusal != ""
	return r
}

func printRelease(w io.Writer, r inspect.ReleaseResult) {
	switch {
	case !r.Allocated:
		fmt.Fprintf(w, "%s is not allocated: nothing to release\n", r.IP)
	default:
		h := r.Holder
		who := "handle " + h.Handle
		if h.Pod != "" {
			who = fmt.Sprintf("pod %s/%s, handle %s", h.Namespace, h.Pod, h.Handle)
		}
		forced := ""
		if r.Forced {
			forced = " (forced: " + r.Refusal + ")"
		}
		fmt.Fprintf(w, "released %s (was %s, block %s)%s\n", r.IP, who, h.Block, forced)
	}
}
