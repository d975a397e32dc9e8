// Package direct is the CNI plugins' IPAM without tabbyd: the plugin
// process reaches the API server itself with the kubeconfig of the CNI
// config, and serialises the node's assignments and releases with the
// node's lock file. The tabby plugin uses it (through the tabby-ipam
// binary) when tabbyd's CNI agent does not accept a connection.
package direct

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/tabbynet/tabby/contract/agentapi"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/ipam/ipamops"
	"github.com/tabbynet/tabby/plugin"
)

// New connects to the API server named by the config's kubeconfig; every
// request is bounded by the config's timeout. It fits plugin.Deps.Direct.
func New(_ context.Context, c *plugin.Config, log *slog.Logger) (plugin.Allocator, error) {
	rc, err := datastore.LoadConfig(c.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("tabby: %w", err)
	}
	rc.Timeout = c.Timeout
	ds, err := datastore.New(rc)
	if err != nil {
		return nil, fmt.Errorf("tabby: connecting to the datastore: %w", err)
	}
	// The pools are read for the MTU and again to assign: one list serves both.
	m := ipam.New(ds, ipam.WithLogger(log), ipam.WithPoolListReuse(time.Second))
	return &allocator{ops: &ipamops.Ops{DS: ds, IPAM: m}, lockFile: c.LockFile}, nil
}

// allocator runs ipamops under the node's lock file; its errors are
// *agentapi.Error, as the agent's are.
type allocator struct {
	ops      *ipamops.Ops
	lockFile string
}

func (a *allocator) Assign(ctx context.Context, r agentapi.AssignRequest) ([]agentapi.Address, error) {
	// The annotations are read before the lock is taken: only the
	// assignment itself is serialised.
	req, err := a.ops.Request(ctx, r)
	if err != nil {
		return nil, classify(err)
	}
	lock, err := plugin.LockNode(ctx, a.lockFile)
	if err != nil {
		return nil, err
	}
	defer lock.Unlock()
	as, err := a.ops.IPAM.Assign(ctx, req)
	if err != nil {
		return nil, classify(err)
	}
	return ipamops.Addresses(as), nil
}

func (a *allocator) ReleaseHandle(ctx context.Context, handleID, node string) error {
	lock, err := plugin.LockNode(ctx, a.lockFile)
	if err != nil {
		return err
	}
	defer lock.Unlock()
	return classify(a.ops.ReleaseHandle(ctx, handleID, node))
}

func (a *allocator) HandleIPs(ctx context.Context, handleID, node string) ([]net.IP, error) {
	ips, err := a.ops.HandleIPs(ctx, handleID, node)
	return ips, classify(err)
}

func (a *allocator) NodeHandles(ctx context.Context, node string) ([]string, error) {
	hs, err := a.ops.NodeHandles(ctx, node)
	return hs, classify(err)
}

func (a *allocator) UsablePools(ctx context.Context, node string) ([]agentapi.Pool, error) {
	ps, err := a.ops.UsablePools(ctx, node)
	return ps, classify(err)
}

func (a *allocator) Ping(ctx context.Context) error { return classify(a.ops.Ping(ctx)) }

// classify keeps a nil error an untyped nil.
func classify(err error) error {
	if err == nil {
		return nil
	}
	return ipamops.Classify(err)
}
