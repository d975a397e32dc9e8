package plugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/tabbynet/tabby/contract"
	"github.com/tabbynet/tabby/contract/agentapi"
)

// ErrPluginNotAvailable is the CNI 1.1 error code STATUS returns when the
// plugin cannot serve ADD (spec "well-known error codes", 50).
const ErrPluginNotAvailable uint = 50

// ipamAdd assigns the addresses of one attachment: the pod's annotations
// (or its namespace's) pick pools and addresses, the config's lists apply
// otherwise; the allocator serialises the node's assignments. On failure
// nothing stays allocated under the handle.
func ipamAdd(ctx context.Context, c *Config, containerID string, pod contract.PodID, alloc Allocator, log *slog.Logger) ([]*current.IPConfig, error) {
	req := agentapi.AssignRequest{
		HandleID:  c.HandleID(containerID),
		Node:      c.NodeName,
		IPv4:      c.IPv4,
		IPv6:      c.IPv6,
		IPv4Pools: c.IPv4Pools,
		IPv6Pools: c.IPv6Pools,
	}
	if pod.Known() {
		req.Namespace, req.Pod, req.PodUID = pod.Namespace, pod.Name, pod.UID
	}
	assigned, err := alloc.Assign(ctx, req)
	if err != nil {
		// The allocator undoes what it did, but a timeout may leave its
		// last write unknown: release the handle to be sure.
		cctx, cancel := cleanupContext(ctx, c)
		if rerr := alloc.ReleaseHandle(cctx, req.HandleID, c.NodeName); rerr != nil {
			log.Warn("releasing the handle after a failed assignment", "handle", req.HandleID, "error", rerr)
		}
		cancel()
		return nil, datastoreError(fmt.Errorf("tabby: assigning addresses to %s on node %s: %w", describe(pod, containerID), c.NodeName, err))
	}
	if len(assigned) == 0 {
		_ = ipamRelease(ctx, c, req.HandleID, alloc)
		return nil, fmt.Errorf("tabby: IPAM assigned no address to %s", describe(pod, containerID))
	}
	ips := make([]*current.IPConfig, 0, len(assigned))
	for _, a := range assigned {
		ips = append(ips, &current.IPConfig{Address: hostPrefix(a.IP), Gateway: gatewayFor(a.IP)})
		log.Info("assigned", "handle", req.HandleID, "ip", a.IP.String(), "pool", a.Pool)
	}
	return ips, nil
}

// ipamRelease frees everything a handle holds.
func ipamRelease(ctx context.Context, c *Config, handleID string, alloc Allocator) error {
	if err := alloc.ReleaseHandle(ctx, handleID, c.NodeName); err != nil {
		return datastoreError(fmt.Errorf("tabby: releasing the addresses of %s: %w", handleID, err))
	}
	return nil
}

// ipamCheck verifies that the handle still holds every address in ips.
func ipamCheck(ctx context.Context, c *Config, handleID string, ips []net.IP, alloc Allocator) error {
	held, err := alloc.HandleIPs(ctx, handleID, c.NodeName)
	if err != nil {
		return datastoreError(fmt.Errorf("tabby: reading the addresses of %s: %w", handleID, err))
	}
	if len(ips) == 0 && len(held) == 0 {
		return fmt.Errorf("tabby: IPAM holds no address for %s: delete and re-create the pod", handleID)
	}
	for _, ip := range ips {
		found := false
		for _, h := range held {
			if h.Equal(ip) {
				found = true
			}
		}
		if !found {
			return fmt.Errorf("tabby: IPAM no longer holds %s for %s (it was released, e.g. by GC or `tabbyctl ipam release`, and may be handed to another pod): delete and re-create the pod", ip, handleID)
		}
	}
	return nil
}

// ipamGC releases the handles of this network on this node whose container
// is not among the valid attachments.
func ipamGC(ctx context.Context, c *Config, alloc Allocator, log *slog.Logger) error {
	valid := map[string]bool{}
	for _, a := range c.ValidAttachments {
		valid[a.ContainerID] = true
	}
	handles, err := alloc.NodeHandles(ctx, c.NodeName)
	if err != nil {
		return datastoreError(fmt.Errorf("tabby: listing the IPAM handles of node %s: %w", c.NodeName, err))
	}
	prefix := c.Name + "."
	var errs []error
	for _, h := range handles {
		cid, ok := strings.CutPrefix(h, prefix)
		if !ok || cid == "" || valid[cid] {
			continue
		}
		log.Info("gc: releasing", "handle", h)
		if err := ipamRelease(ctx, c, h, alloc); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ipamStatus fails when the datastore cannot be reached or no usable pool
// serves this node for the configured families.
func ipamStatus(ctx context.Context, c *Config, alloc Allocator) error {
	if err := alloc.Ping(ctx); err != nil {
		return types.NewError(ErrPluginNotAvailable, fmt.Sprintf("tabby: %v", err), "pods cannot get addresses until the API server is reachable")
	}
	pools, err := alloc.UsablePools(ctx, c.NodeName)
	if err != nil {
		return types.NewError(ErrPluginNotAvailable, fmt.Sprintf("tabby: listing the IP pools usable on node %s: %v", c.NodeName, err), "")
	}
	var v4, v6 bool
	for _, p := range pools {
		_, n, err := net.ParseCIDR(p.CIDR)
		if err != nil {
			continue
		}
		if n.IP.To4() != nil {
			v4 = true
		} else {
			v6 = true
		}
	}
	switch {
	case len(pools) == 0:
		return types.NewError(ErrPluginNotAvailable, fmt.Sprintf("tabby: no usable IP pool for node %s: create an IPPool (kubectl apply) whose nodeSelector matches this node, or enable a disabled one", c.NodeName), "")
	case c.IPv4 && !v4:
		return types.NewError(ErrPluginNotAvailable, fmt.Sprintf("tabby: no usable IPv4 pool for node %s and ipam.assignIPv4 is true: create an IPv4 IPPool for this node, or set assignIPv4 to false", c.NodeName), "")
	case c.IPv6 && !v6:
		return types.NewError(ErrPluginNotAvailable, fmt.Sprintf("tabby: no usable IPv6 pool for node %s and ipam.assignIPv6 is true: create an IPv6 IPPool for this node, or set assignIPv6 to false", c.NodeName), "")
	}
	return nil
}

// datastoreError marks errors of an unreachable datastore, and of a tabbyd
// that went away in the middle of a request, as "try again later" (CNI code
// 11); other errors pass through.
func datastoreError(err error) error {
	if err == nil {
		return nil
	}
	var ae *agentapi.Error
	if errors.As(err, &ae) && ae.Unreachable {
		return types.NewError(types.ErrTryAgainLater, err.Error(), "the Kubernetes API server could not be reached; the runtime should retry")
	}
	if errors.Is(err, agentapi.ErrConnectionLost) || errors.Is(err, agentapi.ErrUnavailable) {
		return types.NewError(types.ErrTryAgainLater, err.Error(), "tabbyd stopped while serving the request; the runtime should retry")
	}
	return err
}

// cleanupContext gives undo work its own deadline, so that it still runs
// when the command's context has expired.
func cleanupContext(ctx context.Context, c *Config) (context.Context, context.CancelFunc) {
	if ctx.Err() == nil {
		return ctx, func() {}
	}
	return context.WithTimeout(context.WithoutCancel(ctx), c.Timeout)
}

func describe(pod contract.PodID, containerID string) string {
	if pod.Known() {
		return "pod " + pod.String() + " (container " + containerID + ")"
	}
	return "container " + containerID
}
