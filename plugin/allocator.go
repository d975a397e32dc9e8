package plugin

import (
	"context"
	"errors"
	"log/slog"
	"net"

	"github.com/tabbynet/tabby/contract/agentapi"
)

// Allocator is what the plugins need of tabby's IPAM. There are two: tabbyd's
// CNI agent on its unix socket (an *agentapi.Client), which keeps warm
// connections and informer caches and serialises the node's assignments
// itself, and the datastore reached directly from the plugin process
// (package plugin/direct), which serialises them with the node's lock file.
// Tests may pass others through Deps.
type Allocator interface {
	// Assign hands out the addresses of one attachment. For a pod
	// (Namespace and Pod set), its IPAM annotations, or its namespace's,
	// override the pools and families of the request. On error nothing
	// stays assigned, as far as the allocator knows.
	Assign(ctx context.Context, req agentapi.AssignRequest) ([]agentapi.Address, error)
	// ReleaseHandle frees everything a handle holds; nothing held is fine.
	ReleaseHandle(ctx context.Context, handleID, node string) error
	// HandleIPs returns the addresses a handle holds on the node.
	HandleIPs(ctx context.Context, handleID, node string) ([]net.IP, error)
	// NodeHandles lists the handles holding addresses on the node.
	NodeHandles(ctx context.Context, node string) ([]string, error)
	// UsablePools lists the enabled pools the node may use.
	UsablePools(ctx context.Context, node string) ([]agentapi.Pool, error)
	// Ping fails when the datastore cannot be reached.
	Ping(ctx context.Context) error
}

// A Flusher is an Allocator that may leave writes under way when a call
// returns (plugin/direct writes a handle while the pod is wired); run
// waits for them once the command's result is out, before the process
// exits.
type Flusher interface {
	Flush(ctx context.Context)
}

// Deps are what the commands need from outside the config.
type Deps struct {
	// NewAllocator, when set, is the allocator (tests); the choice below is
	// skipped.
	NewAllocator func(ctx context.Context, c *Config, log *slog.Logger) (Allocator, error)
	// Direct connects to the datastore from this process (plugin/direct.New).
	// It is used when tabbyd's agent does not accept a connection. Nil in a
	// binary built without a datastore client (cmd/tabby): the command then
	// runs in the tabby-ipam binary instead (see ReexecDirect).
	Direct func(ctx context.Context, c *Config, log *slog.Logger) (Allocator, error)
	// NoAgent skips tabbyd's agent (the command was handed over because it
	// did not answer).
	NoAgent bool
	// Logger; nil means the one the config's logLevel asks for.
	Logger *slog.Logger
}

// errDirectNeeded: the agent is not there and this binary cannot reach the
// datastore itself.
var errDirectNeeded = errors.New("tabby: tabbyd's CNI agent is not available and this binary has no datastore client")

// resolve picks the allocator of one command: tabbyd's agent when its
// socket accepts a connection, else the datastore directly. Only a
// connection that cannot be made falls back; once connected, the agent's
// answers (errors included) are final.
func (d Deps) resolve(ctx context.Context, c *Config, log *slog.Logger) (Allocator, error) {
	if d.NewAllocator != nil {
		return d.NewAllocator(ctx, c, log)
	}
	if c.AgentSocket != "" && !d.NoAgent {
		cl, err := agentapi.Dial(ctx, c.AgentSocket)
		if err == nil {
			log.Debug("using tabbyd's CNI agent", "socket", c.AgentSocket)
			return cl, nil
		}
		log.Debug("tabbyd's CNI agent is not available; using the API server directly", "socket", c.AgentSocket, "error", err)
	}
	if d.Direct == nil {
		return nil, errDirectNeeded
	}
	return d.Direct(ctx, c, log)
}

// allocator is the allocator the command's wrapper resolved (see run).
func (d Deps) allocator(ctx context.Context, c *Config, log *slog.Logger) (Allocator, error) {
	return d.resolve(ctx, c, log)
}
