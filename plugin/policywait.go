package plugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/tabbynet/tabby/contract"
	"github.com/tabbynet/tabby/contract/agentapi"
)

// policyWaitGrace is how much longer the plugin waits than it asks tabbyd
// to: tabbyd answers a wait that ran out with what is missing.
const policyWaitGrace = time.Second

// waitPolicy runs once the pod is wired, before ADD answers: it asks
// tabbyd's CNI agent (policy-wait) to answer once the pod's NetworkPolicy
// is in the kernel, so the pod's first packet already meets its policies.
// A wait that runs out (policyWaitTimeout) fails ADD, which undoes the
// wiring: the runtime tries again, and the pod never runs unenforced.
//
// There is nothing to wait for, and the pod starts at once, when
// policyWaitTimeout is 0, when the runtime did not name the pod, when
// another IPAM plugin hands out the addresses (tabbyd learns those only
// from the pod's status, after ADD), when tabbyd does not enforce policy
// (--network-policy=false) or is older than the plugin, and when no tabbyd
// answers on agentSocket (tabbyd's rules left in the kernel drop the
// traffic of a pod it does not know, --policy-deny-unlisted), unless
// policyWaitRequired is set: then ADD fails until tabbyd runs.
func waitPolicy(ctx context.Context, c *Config, alloc Allocator, pod contract.PodID, containerID string, ips []net.IPNet, log *slog.Logger) error {
	if c.PolicyWaitTimeout <= 0 || !pod.Known() {
		return nil
	}
	if !c.TabbyIPAM() {
		log.Debug("not waiting for NetworkPolicy: tabbyd learns addresses of another IPAM plugin from the pod's status only", "ipam", c.IPAMType)
		return nil
	}
	cl, _ := alloc.(*agentapi.Client)
	if cl == nil && c.AgentSocket != "" {
		// IPAM was done without the agent: it may have come up since.
		var err error
		if cl, err = agentapi.Dial(ctx, c.AgentSocket); err == nil {
			defer cl.Close()
		}
	}
	if cl == nil {
		if c.PolicyWaitRequired {
			return types.NewError(types.ErrTryAgainLater,
				fmt.Sprintf("tabby: %s: tabbyd's CNI agent at %q cannot be reached to wait for the pod's NetworkPolicy, and policyWaitRequired is set", describe(pod, containerID), c.AgentSocket),
				"the pod starts once tabbyd runs on this node; the runtime should retry")
		}
		log.Info("tabbyd is not running: not waiting for the pod's NetworkPolicy (tabbyd's rules drop the traffic of a pod it does not know until it programs it; set policyWaitRequired to fail ADD instead)", "pod", pod.String())
		return nil
	}
	req := agentapi.PolicyWaitRequest{Namespace: pod.Namespace, Pod: pod.Name, PodUID: pod.UID, TimeoutMillis: c.PolicyWaitTimeout.Milliseconds()}
	for _, ip := range ips {
		req.IPs = append(req.IPs, ip.IP)
	}
	wctx, cancel := context.WithTimeout(ctx, c.PolicyWaitTimeout+policyWaitGrace)
	defer cancel()
	start := time.Now()
	resp, err := cl.PolicyWait(wctx, req)
	switch {
	case err == nil:
		log.Debug("NetworkPolicy programmed", "pod", pod.String(), "enforced", resp.Enforced, "sync", resp.Generation, "waited", time.Since(start).String())
		return nil
	case errors.Is(err, agentapi.ErrUnknownEndpoint):
		log.Warn("tabbyd is older than the plugin and cannot say when a pod's NetworkPolicy is programmed: not waiting", "error", err)
		return nil
	}
	return types.NewError(types.ErrTryAgainLater,
		fmt.Sprintf("tabby: %s: waiting for tabbyd to program the pod's NetworkPolicy: %v", describe(pod, containerID), err),
		"the pod is not started before its NetworkPolicy is enforced; see tabbyd's log, or raise policyWaitTimeout in the CNI config")
}
