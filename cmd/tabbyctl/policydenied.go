package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/contract"
	"github.com/tabbynet/tabby/daemon/deniedlog"
	"github.com/tabbynet/tabby/internal/podexec"
)

func policyDeniedCommand() *cobra.Command {
	var o deniedOptions
	var kube kubeFlags
	cmd := &cobra.Command{
		Use:   "denied",
		Short: "print the packets NetworkPolicy dropped on a node, and why (tabbyd --denied-log)",
		Long: `denied prints what NetworkPolicy dropped on a node, as far as the kernel's
rate limits logged it (tabbyd --denied-log): when, the direction (ingress
to or egress from the node's pod), protocol, source and destination
(pod namespace/name when tabbyd knows the address, and address:port), and
the policies that isolate the pod without allowing the packet. tabbyd
keeps the last --denied-log-buffer packets; -f goes on printing new ones
until interrupted. -o json prints one JSON object a line.

Without --node it asks the tabbyd of this node (GET /policy/denied on
--endpoint, its --health-listen); with --node it asks that node's tabbyd
through the API server, by exec in its tabby-node pod (as kubectl exec).

  tabbyctl policy denied --node node1 --pod shop/db -f
  ip netns exec tabby-lab-node1 tabbyctl policy denied     # in the lab`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.pod != "" {
				if err := deniedlog.ValidPod(o.pod); err != nil {
					return fmt.Errorf("--pod: %w", err)
				}
			}
			if o.output != "" && o.output != "table" && o.output != "json" {
				return fmt.Errorf("-o must be table or json, not %q", o.output)
			}
			ctx := cmd.Context()
			if !o.follow {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, o.timeout)
				defer cancel()
			}
			p := newDeniedPrinter(cmd.OutOrStdout(), o.output == "json", o.follow)
			if o.node == "" {
				return p.done(deniedlog.Read(ctx, nil, o.endpoint, o.pod, o.follow, p.print), cmd.ErrOrStderr())
			}
			return p.done(o.viaNode(ctx, &kube, p), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.endpoint, "endpoint", "127.0.0.1:9099", "this node's tabbyd (its --health-listen), asked without --node")
	f.StringVar(&o.node, "node", "", "ask the tabbyd of this node, through the API server (exec in its tabby-node pod)")
	f.StringVar(&o.namespace, "namespace", contract.DefaultNamespace, "namespace of the tabby-node pods (with --node)")
	f.StringVar(&o.pod, "pod", "", "only packets from or to this pod (NAMESPACE/NAME)")
	f.BoolVarP(&o.follow, "follow", "f", false, "go on printing packets as they are dropped, until interrupted")
	f.StringVarP(&o.output, "output", "o", "table", "table, or json (one object a line)")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "how long to wait for tabbyd (without -f)")
	addKubeFlags(cmd, &kube)
	return cmd
}

type deniedOptions struct {
	endpoint, node, namespace, pod, output string
	follow                                 bool
	timeout                                time.Duration
}

// viaNode runs "tabbyctl policy denied -o json" in the node's tabby-node
// pod and prints what it prints.
func (o *deniedOptions) viaNode(ctx context.Context, kube *kubeFlags, p *deniedPrinter) error {
	cfg, ds, err := kube.client()
	if err != nil {
		return err
	}
	pods, err := ds.Pods(o.namespace).List(ctx, metav1.ListOptions{LabelSelector: contract.NodePodSelector, FieldSelector: "spec.nodeName=" + o.node})
	if err != nil {
		return fmt.Errorf("listing the tabby-node pods of namespace %s: %w (use --namespace where tabby runs)", o.namespace, err)
	}
	if len(pods.Items) == 0 {
		return fmt.Errorf("no tabby-node pod in namespace %s runs on node %q (is the node's name right? is tabby's namespace %s?)", o.namespace, o.node, o.namespace)
	}
	pod := &pods.Items[0]
	command := []string{"tabbyctl", "policy", "denied", "-o", "json"}
	if ep := podexec.HealthListen(pod, contract.NodeContainer); ep != "" {
		command = append(command, "--endpoint="+ep)
	}
	if o.pod != "" {
		command = append(command, "--pod="+o.pod)
	}
	if o.follow {
		command = append(command, "-f")
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- readRecords(pr, p.print) }()
	var errOut bytes.Buffer
	runErr := podexec.Exec(ctx, cfg, ds, pod, contract.NodeContainer, command, pw, &errOut)
	_ = pw.Close()
	readErr := <-done
	if runErr != nil && !(o.follow && ctx.Err() != nil) {
		return fmt.Errorf("%s in pod %s/%s on node %s: %w: %s", strings.Join(command, " "), pod.Namespace, pod.Name, o.node, runErr, strings.TrimSpace(errOut.String()))
	}
	return readErr
}

// readRecords decodes JSON lines of records from r.
func readRecords(r io.Reader, fn func(deniedlog.Record) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var rec deniedlog.Record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return fmt.Errorf("the node's tabbyctl printed a line that is not a record (%q): %w", sc.Text(), err)
		}
		if err := fn(rec); err != nil {
			return err
		}
	}
	return sc.Err()
}

// deniedPrinter prints records as a table, or as JSON lines; following,
// each one as it comes.
type deniedPrinter struct {
	table  *deniedlog.Table
	enc    *json.Encoder
	follow bool
	n      int
}

func newDeniedPrinter(w io.Writer, asJSON, follow bool) *deniedPrinter {
	if asJSON {
		return &deniedPrinter{enc: json.NewEncoder(w)}
	}
	return &deniedPrinter{table: deniedlog.NewTable(w), follow: follow}
}

func (p *deniedPrinter) print(r deniedlog.Record) error {
	p.n++
	if p.enc != nil {
		return p.enc.Encode(r)
	}
	p.table.Write(r)
	if p.follow {
		return p.table.Flush()
	}
	return nil
}

// done flushes the table and says so when nothing was denied.
func (p *deniedPrinter) done(err error, stderr io.Writer) error {
	if p.table != nil {
		_ = p.table.Flush()
		if p.n == 0 && err == nil {
			fmt.Fprintln(stderr, "no denied packets logged")
		}
	}
	return err
}
