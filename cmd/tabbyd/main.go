// TCP MD5 (BGP passwords) needs plain TCP listeners: see bgp.ErrMPTCPListeners.
//
//go:debug multipathtcp=0

// Command tabbyd is tabby's node daemon.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/tabbynet/tabby/contract/agentapi"
	"github.com/tabbynet/tabby/daemon"
	"github.com/tabbynet/tabby/daemon/cnitoken"
	"github.com/tabbynet/tabby/daemon/netpol"
	"github.com/tabbynet/tabby/internal/buildinfo"
	"github.com/tabbynet/tabby/internal/iptbackend"
	"github.com/tabbynet/tabby/internal/logging"
	"github.com/tabbynet/tabby/ipam/gc"
	"github.com/tabbynet/tabby/policy"
	"github.com/tabbynet/tabby/policy/apply"
)

func main() {
	var cfg daemon.Config
	var nodeIP, iptMode, poolCIDR, poolEncap, pool6CIDR string
	var logFlags *logging.Flags
	var poolBlockSize, pool6BlockSize int
	var deniedLog bool
	var denied policy.DeniedLog
	cmd := &cobra.Command{
		Use:     "tabbyd",
		Short:   "tabby's node daemon: BGP, routes and NetworkPolicy for one node",
		Version: buildinfo.Version,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if cfg.Log, err = logFlags.Logger(os.Stderr); err != nil {
				return err
			}
			if cfg.NodeIPs, err = daemon.ParseNodeIPs(nodeIP); err != nil {
				return err
			}
			if cfg.IPAMGCGrace <= 0 || cfg.IPAMGCInterval <= 0 {
				return fmt.Errorf("--ipam-gc-grace (%v) and --ipam-gc-interval (%v) must be positive; turn the collector off with --ipam-gc=false", cfg.IPAMGCGrace, cfg.IPAMGCInterval)
			}
			if cfg.IPTablesBackend, err = iptbackend.ParseMode(iptMode); err != nil {
				return fmt.Errorf("--iptables-backend: %w", err)
			}
			if cfg.CNISpares < 0 || cfg.CNISpares > 64 {
				return fmt.Errorf("--cni-spare-addresses (%d) must be from 0 to 64", cfg.CNISpares)
			}
			if cfg.PolicyResync <= 0 {
				return fmt.Errorf("--policy-resync (%v) must be positive", cfg.PolicyResync)
			}
			for _, l := range []struct {
				flag     string
				val, max int
			}{
				{policy.FlagMaxSetMembers, cfg.PolicyLimits.SetMembers, apply.MaxElem},
				{policy.FlagMaxPolicySets, cfg.PolicyLimits.Sets, 1 << 16},
				{policy.FlagMaxRules, cfg.PolicyLimits.Rules, 1 << 20},
			} {
				if l.val < 1 || l.val > l.max {
					return fmt.Errorf("--%s (%d) must be from 1 to %d", l.flag, l.val, l.max)
				}
			}
			if deniedLog {
				if err := checkDeniedLog(denied, cfg.DeniedLogBuffer); err != nil {
					return err
				}
				cfg.DeniedLog = &denied
			}
			if cfg.NodeName == "" {
				cfg.NodeName, _ = os.Hostname()
			}
			if poolCIDR != "" {
				if cfg.DefaultIPv4Pool, err = daemon.DefaultPoolSpec(poolCIDR, poolBlockSize, poolEncap); err != nil {
					return fmt.Errorf("the default IPv4 pool (--default-ipv4-pool-*): %w", err)
				}
			}
			if pool6CIDR != "" {
				if cfg.DefaultIPv6Pool, err = daemon.DefaultIPv6PoolSpec(pool6CIDR, pool6BlockSize); err != nil {
					return fmt.Errorf("the default IPv6 pool (--default-ipv6-pool-*): %w", err)
				}
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return daemon.Run(ctx, cfg)
		},
		SilenceUsage: true,
		// exitError prints the error: in the log's format once there is a log.
		SilenceErrors: true,
	}
	f := cmd.Flags()
	f.StringVar(&cfg.NodeName, "nodename", "", "name of this node (default: the host name)")
	f.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig of the API server (default: in-cluster, then $KUBECONFIG)")
	f.StringVar(&nodeIP, "node-ip", "", "this node's addresses for BGP and routes: one address, or an IPv4 and an IPv6 address separated by a comma (as kubelet's --node-ip); a family not given is detected (the default route's interface, then the source towards the API server, then for IPv6 a global address of the IPv4 address's interface)")
	f.StringVar(&cfg.HealthListen, "health-listen", daemon.DefaultHealthListen, "address serving /healthz, /readyz, /status and /metrics, unauthenticated: keep it on the loopback (the DaemonSet's probes and tabbyctl node status ask 127.0.0.1:9099)")
	f.BoolVar(&cfg.Profiling, "profiling", false, "also serve Go's CPU, heap and goroutine profiles at /debug/pprof/ on --health-listen (go tool pprof http://127.0.0.1:9099/debug/pprof/heap)")
	f.StringVar(&cfg.MetricsListen, "metrics-listen", daemon.DefaultMetricsListen, "address serving /metrics alone, unauthenticated, for Prometheus to scrape from elsewhere (e.g. :9091); \"\" serves it only on --health-listen")
	f.StringVar(&cfg.CNISocket, "cni-socket", agentapi.DefaultSocket, "unix socket serving the CNI plugins' IPAM (the CNI config's agentSocket); \"\" turns it off")
	f.IntVar(&cfg.CNISpares, "cni-spare-addresses", 2, "addresses the CNI agent allocates ahead in the node's blocks, so that a pod's ADD is answered without waiting for an API write; 0 holds none (and releases those held)")
	f.StringVar(&cfg.Namespace, "namespace", daemon.DefaultNamespace, "the namespace tabbyd runs in: BGP passwords are read from its Secrets, and the CNI plugin's service account is there")
	f.StringVar(&cfg.CNIKubeconfig, "cni-kubeconfig", "", "the CNI plugin's kubeconfig (the host's file as mounted here): tabbyd mints the plugin's short-lived token and writes it there well before it expires; \"\" turns that off")
	f.StringVar(&cfg.CNIServiceAccount, "cni-service-account", cnitoken.DefaultServiceAccount, "the CNI plugin's service account (in --namespace) whose token goes into --cni-kubeconfig")
	f.DurationVar(&cfg.CNITokenLifetime, "cni-token-lifetime", cnitoken.DefaultLifetime, "lifetime of the CNI plugin's token (at least 10m); it is replaced once a quarter of it has passed, so the plugin keeps working this long times 3/4 while tabbyd is down")
	f.DurationVar(&cfg.Resync, "resync", daemon.DefaultResync, "how often routes and BGP sessions are reconciled without a change")
	f.DurationVar(&cfg.StartupHold, "startup-hold", daemon.DefaultStartupHold, "after a restart, how long the previous run's routes are kept at most while BGP converges")
	f.BoolVar(&cfg.IPAMGC, "ipam-gc", true, "take part in electing the cluster's one IPAM garbage collector (a Lease in --namespace) and run it while elected")
	f.DurationVar(&cfg.IPAMGCGrace, "ipam-gc-grace", gc.DefaultGrace, "how long an address, block or IPAM record must look leaked (checked every pass) before the garbage collector frees it; longer than a kubelet takes to report a pod's addresses")
	f.DurationVar(&cfg.IPAMGCInterval, "ipam-gc-interval", gc.DefaultInterval, "time between the IPAM garbage collector's passes")
	f.BoolVar(&cfg.NetworkPolicy, "network-policy", true, "enforce NetworkPolicy (networking.k8s.io/v1) for this node's pods; false removes the rules an earlier run left")
	f.DurationVar(&cfg.PolicyResync, "policy-resync", netpol.DefaultResync, "how often NetworkPolicy is synced without a change")
	f.BoolVar(&cfg.PolicyDenyUnlisted, "policy-deny-unlisted", true, "drop the traffic of pod veths whose pod tabbyd does not know yet (a pod wired while tabbyd was down), until its policies are programmed")
	f.IntVar(&cfg.PolicyLimits.SetMembers, policy.FlagMaxSetMembers, policy.DefaultMaxSetMembers,
		"most members of one ipset a NetworkPolicy's rules may name (its ipBlocks take one per CIDR, pod peers one per address); a policy over a limit allows nothing to the pods it selects and is reported with an Event")
	f.IntVar(&cfg.PolicyLimits.Sets, policy.FlagMaxPolicySets, policy.DefaultMaxPolicySets, "most ipsets one NetworkPolicy's rules may name (both families)")
	f.IntVar(&cfg.PolicyLimits.Rules, policy.FlagMaxRules, policy.DefaultMaxPolicyRules, "most iptables rules one NetworkPolicy may make (per family)")
	f.BoolVar(&deniedLog, "denied-log", false, "log the packets NetworkPolicy drops (NFLOG from tabby's chains, rate-limited in the kernel): tabbyctl policy denied reads them, /metrics counts them by namespace and policy")
	f.Uint16Var(&denied.Group, "denied-log-group", policy.DefaultDeniedLogGroup, "NFLOG group of the denied-packet log (1-65535; no other program of the node may read it)")
	f.IntVar(&denied.PerSource, "denied-log-rate", policy.DefaultDeniedLogPerSource, "most denied packets logged per second from one source address (the kernel drops the rest unlogged)")
	f.IntVar(&denied.PerNode, "denied-log-node-rate", policy.DefaultDeniedLogPerNode, "most denied packets logged per second on the node in all")
	f.IntVar(&denied.Burst, "denied-log-burst", policy.DefaultDeniedLogBurst, "how many denied packets may be logged at once above the rates")
	f.IntVar(&cfg.DeniedLogBuffer, "denied-log-buffer", netpol.DefaultDeniedBuffer, "how many denied packets tabbyd keeps for tabbyctl policy denied")
	f.StringVar(&cfg.DeniedLogFile, "denied-log-file", "", "also write each denied packet as a JSON line to this file, for a log shipper (rotated at 100 MiB, 3 kept); \"\" writes none")
	f.StringVar(&iptMode, "iptables-backend", "", "iptables backend for NAT outgoing and NetworkPolicy: legacy or nft (default: the one the node's rules are in, as kube-proxy's wrapper detects it)")
	f.StringVar(&poolCIDR, "default-ipv4-pool-cidr", "", "create the IPPool "+daemon.DefaultPoolName+" with this CIDR when the cluster has no IPv4 IPPool (as calico-node's CALICO_IPV4POOL_CIDR); \"\" never creates one")
	f.IntVar(&poolBlockSize, "default-ipv4-pool-block-size", 0, "block size of the default IPv4 pool (0: 26)")
	f.StringVar(&poolEncap, "default-ipv4-pool-encapsulation", "None", "encapsulation of the default IPv4 pool: "+strings.Join(daemon.Encapsulations, ", "))
	f.StringVar(&pool6CIDR, "default-ipv6-pool-cidr", "", "create the IPPool "+daemon.DefaultIPv6PoolName+" (routed natively, no NAT outgoing) with this CIDR when the cluster has no IPv6 IPPool (as calico-node's CALICO_IPV6POOL_CIDR); \"\" never creates one")
	f.IntVar(&pool6BlockSize, "default-ipv6-pool-block-size", 0, "block size of the default IPv6 pool (0: 122)")
	logFlags = logging.AddFlags(f)
	if err := cmd.Execute(); err != nil {
		exitError(cfg.Log, err)
	}
}

// exitError reports the error that ends the program, as a log line when
// the log is set up (so a JSON log ends with JSON), and exits 1.
func exitError(log *slog.Logger, err error) {
	if log != nil {
		log.Error("tabbyd stopped", "error", err)
	} else {
		fmt.Fprintln(os.Stderr, "Error:", err)
	}
	os.Exit(1)
}

// checkDeniedLog checks the --denied-log-* flags.
func checkDeniedLog(d policy.DeniedLog, buffer int) error {
	if d.Group == 0 {
		return fmt.Errorf("--denied-log-group must be from 1 to 65535")
	}
	for _, l := range []struct {
		flag     string
		val, max int
	}{
		{"denied-log-rate", d.PerSource, 10000},
		{"denied-log-node-rate", d.PerNode, 100000},
		{"denied-log-burst", d.Burst, 10000},
		{"denied-log-buffer", buffer, 1000000},
	} {
		if l.val < 1 || l.val > l.max {
			return fmt.Errorf("--%s (%d) must be from 1 to %d", l.flag, l.val, l.max)
		}
	}
	return nil
}
