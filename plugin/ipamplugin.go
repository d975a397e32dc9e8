package plugin

import (
	"context"
	"log/slog"
	"net"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// IPAMFuncs are the commands of the standalone tabby-ipam plugin for skel.
// It serves any network plugin that takes an IPAM result (ptp, bridge):
// ADD returns /32 and /128 addresses with the link-local gateways and a
// default route per family, DEL releases the handle, CHECK verifies the
// handle still holds the addresses, GC releases this node's handles of the
// network that are not listed, STATUS checks the datastore and pools.
func IPAMFuncs(d Deps) skel.CNIFuncs {
	return skel.CNIFuncs{
		Add:    run(d, "tabby-ipam", "", IPAMAdd, always),
		Check:  run(d, "tabby-ipam", "", IPAMCheck, always),
		Del:    run(d, "tabby-ipam", "", IPAMDel, always),
		GC:     run(d, "tabby-ipam", "", IPAMGC, always),
		Status: run(d, "tabby-ipam", "", IPAMStatus, always),
	}
}

// IPAMAdd assigns the addresses of one attachment.
func IPAMAdd(ctx context.Context, args *skel.CmdArgs, c *Config, d Deps, log *slog.Logger) (types.Result, error) {
	pod, err := ParseArgs(args.Args)
	if err != nil {
		return nil, err
	}
	alloc, err := d.allocator(ctx, c, log)
	if err != nil {
		return nil, err
	}
	ips, err := ipamAdd(ctx, c, args.ContainerID, pod, alloc, log)
	if err != nil {
		return nil, err
	}
	result := &current.Result{CNIVersion: current.ImplementedSpecVersion, IPs: ips, Routes: podRoutes(0, 0, addresses(ips)).result()}
	if dnsSet(c.DNS) {
		result.DNS = c.DNS
	}
	return result, nil
}

// IPAMDel releases everything the attachment holds; nothing held is fine.
func IPAMDel(ctx context.Context, args *skel.CmdArgs, c *Config, d Deps, log *slog.Logger) (types.Result, error) {
	alloc, err := d.allocator(ctx, c, log)
	if err != nil {
		return nil, err
	}
	return nil, ipamRelease(ctx, c, c.HandleID(args.ContainerID), alloc)
}

// IPAMCheck verifies that the handle holds the addresses of prevResult (or
// at least one address when there is no prevResult).
func IPAMCheck(ctx context.Context, args *skel.CmdArgs, c *Config, d Deps, log *slog.Logger) (types.Result, error) {
	var ips []net.IP
	if c.PrevResult != nil {
		prev, err := current.NewResultFromResult(c.PrevResult)
		if err != nil {
			return nil, err
		}
		for _, ipc := range prev.IPs {
			ips = append(ips, ipc.Address.IP)
		}
	}
	alloc, err := d.allocator(ctx, c, log)
	if err != nil {
		return nil, err
	}
	return nil, ipamCheck(ctx, c, c.HandleID(args.ContainerID), ips, alloc)
}

// IPAMGC releases this node's handles of the network whose container is
// not among the valid attachments.
func IPAMGC(ctx context.Context, args *skel.CmdArgs, c *Config, d Deps, log *slog.Logger) (types.Result, error) {
	alloc, err := d.allocator(ctx, c, log)
	if err != nil {
		return nil, err
	}
	return nil, ipamGC(ctx, c, alloc, log)
}

// IPAMStatus fails when the datastore is unreachable or no pool serves the node.
func IPAMStatus(ctx context.Context, args *skel.CmdArgs, c *Config, d Deps, log *slog.Logger) (types.Result, error) {
	alloc, err := d.allocator(ctx, c, log)
	if err != nil {
		return nil, types.NewError(ErrPluginNotAvailable, err.Error(), "")
	}
	return nil, ipamStatus(ctx, c, alloc)
}

func always(*Config) bool { return true }
