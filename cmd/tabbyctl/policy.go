package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/daemon/netpol"
)

func init() { subcommands = append(subcommands, newPolicyCommand) }

func newPolicyCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "NetworkPolicy as tabbyd enforces it: why can (or can't) A reach B, and what it denied",
	}
	cmd.AddCommand(policyTraceCommand(), policyDeniedCommand())
	return cmd
}

func policyTraceCommand() *cobra.Command {
	var kube kubeFlags
	var output outputFormat
	var timeout time.Duration
	var family int
	var explain bool
	cmd := &cobra.Command{
		Use:   "trace SRC DST[:PORT[/PROTO]]",
		Short: "show which policy allows or denies a connection, step by step; exit 0 if allowed, 1 if denied",
		Long: `trace compiles each node's rules from the API server's pods, namespaces,
NetworkPolicies and IPAM blocks, exactly as tabbyd does, and runs the first
packet of a new connection from SRC to DST through them: the rules of the
source pod's node (its egress) and of the destination pod's node (its
ingress). It prints, for each direction, which policies select the pod,
which one allowed the packet and by which rule, or that none did, and the
verdict. It exits 0 if the connection is allowed, 1 if it is denied, 2 on
errors.

SRC and DST are pods (namespace/name) or addresses (a pod's address names
that pod). PORT defaults to none: the packet is then an ICMP echo (ping),
which only rules without ports allow. PROTO is tcp (default), udp or sctp.
IPv6 addresses with a port take brackets: [fd00::5]:80/udp.

  tabbyctl policy trace default/client default/web:80
  tabbyctl policy trace default/client 10.96.0.10:53/udp --explain
  tabbyctl policy trace 192.168.1.7 prod/db:5432 -o json

--explain adds the NetworkPolicies of each pod's namespace and why each
does or does not select it. -o wide adds every rule the packet matched on
each node. The trace assumes tabbyd's default policy flags
(--policy-deny-unlisted=true).`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			dstRef, proto, port, err := parseTraceDst(args[1])
			if err != nil {
				return err
			}
			if family != 0 && family != 4 && family != 6 {
				return fmt.Errorf("--family %d: give 4 or 6 (or leave it out: IPv4 when both ends have it)", family)
			}
			rc, err := kube.restConfig()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			w, err := netpol.LoadWorld(ctx, rc)
			if err != nil {
				return err
			}
			r, err := traceOf(w, args[0], dstRef, family, proto, port, explain)
			if err != nil {
				return err
			}
			if err := printOutput(cmd.OutOrStdout(), output, r, r.Write); err != nil {
				return err
			}
			if !r.Allowed {
				return problemError{fmt.Errorf("denied")}
			}
			return nil
		},
	}
	addKubeFlags(cmd, &kube)
	addOutputFlag(cmd, &output, false, true)
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "how long to wait for the API server")
	cmd.Flags().IntVar(&family, "family", 0, "4 or 6: the address family to trace (default IPv4 when both ends have it)")
	cmd.Flags().BoolVar(&explain, "explain", false, "list the NetworkPolicies of each pod's namespace and why each selects the pod or not")
	return cmd
}

// traceOf resolves both ends and traces the connection.
func traceOf(w *netpol.World, srcRef, dstRef string, family int, proto string, port int, explain bool) (*netpol.TraceReport, error) {
	src, err := w.Resolve(srcRef)
	if err != nil {
		return nil, fmt.Errorf("source: %w", err)
	}
	dst, err := w.Resolve(dstRef)
	if err != nil {
		return nil, fmt.Errorf("destination: %w", err)
	}
	fam, err := netpol.Family(src, dst, family)
	if err != nil {
		return nil, err
	}
	ct, err := w.Trace(src, dst, fam, proto, port)
	if err != nil {
		return nil, err
	}
	r := &netpol.TraceReport{Src: src, Dst: dst, Family: fam, Protocol: proto, Port: port, ConnectionTrace: ct}
	if explain {
		r.SrcPolicies, r.DstPolicies = w.Explain(src), w.Explain(dst)
	}
	return r, nil
}

// parseTraceDst splits DST[:PORT[/PROTO]].
func parseTraceDst(s string) (ref, proto string, port int, err error) {
	bad := func(why string) (string, string, int, error) {
		return "", "", 0, fmt.Errorf("destination %q: %s (give namespace/name or an address, then optionally :PORT and /tcp, /udp or /sctp, e.g. default/web:80/tcp or [fd00::5]:53/udp)", s, why)
	}
	if _, err := netip.ParseAddr(s); err == nil {
		return s, "icmp", 0, nil
	}
	host, rest, found := s, "", false
	if strings.HasPrefix(s, "[") {
		h, p, err := net.SplitHostPort(strings.SplitN(s, "/", 2)[0])
		if err != nil {
			return bad("an IPv6 address in brackets needs a port")
		}
		host, rest, found = h, p, true
		if i := strings.Index(s, "/"); i >= 0 {
			rest += s[i:]
		}
	} else if i := strings.LastIndex(s, ":"); i >= 0 {
		host, rest, found = s[:i], s[i+1:], true
	}
	if !found {
		return s, "icmp", 0, nil
	}
	portStr, proto, hasProto := strings.Cut(rest, "/")
	if !hasProto {
		proto = "tcp"
	}
	proto = strings.ToLower(proto)
	if proto != "tcp" && proto != "udp" && proto != "sctp" {
		return bad("protocol " + strconv.Quote(proto) + " is not tcp, udp or sctp")
	}
	port, err = strconv.Atoi(portStr)
	if err != nil || port < 1 || port > 65535 {
		return bad("port " + strconv.Quote(portStr) + " is not a number from 1 to 65535")
	}
	if host == "" {
		return bad("no pod or address before the port")
	}
	return host, proto, port, nil
}
