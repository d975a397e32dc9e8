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
	"net/http"
	"sync"
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
	if log.Enabled(context.Background(), slog.LevelDebug) {
		rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return &logRequests{next: rt, log: log, start: time.Now()}
		})
	}
	ds, err := datastore.New(rc)
	if err != nil {
		return nil, fmt.Errorf("tabby: connecting to the datastore: %w", err)
	}
	// The pools are read for the MTU and again to assign: one list serves both.
	m := ipam.New(ds, ipam.WithLogger(log), ipam.WithPoolListReuse(time.Second))
	return &allocator{ops: &ipamops.Ops{DS: ds, IPAM: m}, lockFile: c.LockFile, timeout: c.Timeout, log: log, pending: map[string]chan struct{}{}}, nil
}

// logRequests logs, at debug level, each request to the API server with
// when it started (since the client was made) and how long it took: where
// an ADD without tabbyd spends its time.
type logRequests struct {
	next  http.RoundTripper
	log   *slog.Logger
	start time.Time
}

func (l *logRequests) RoundTrip(req *http.Request) (*http.Response, error) {
	t := time.Now()
	resp, err := l.next.RoundTrip(req)
	status := 0
	if resp != nil {
		status = resp.StatusCode
	}
	l.log.Debug("API request", "method", req.Method, "path", req.URL.Path, "query", req.URL.RawQuery, "status", status,
		"at", t.Sub(l.start).Round(10*time.Microsecond), "took", time.Since(t).Round(10*time.Microsecond), "error", err)
	return resp, err
}

// WrappedRoundTripper lets client-go's wrappers see through.
func (l *logRequests) WrappedRoundTripper() http.RoundTripper { return l.next }

// allocator runs ipamops under the node's lock file; its errors are
// *agentapi.Error, as the agent's are.
type allocator struct {
	ops      *ipamops.Ops
	lockFile string
	timeout  time.Duration
	log      *slog.Logger

	// pending are the handle writes (IPAMHandle) under way, by handle:
	// each channel is closed once its write is done.
	mu      sync.Mutex
	pending map[string]chan struct{}
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
	as, record, err := a.ops.IPAM.AssignDeferred(ctx, req)
	if err != nil {
		return nil, classify(err)
	}
	if record != nil {
		a.recordLater(r.HandleID, record)
	}
	return ipamops.Addresses(as), nil
}

// recordLater writes the handle of an assignment from the node's own
// blocks while the plugin wires the pod, as tabbyd's agent does
// (ipam.AssignDeferred): the blocks carry the handle meanwhile, so a
// process that dies before the write leaks nothing. Flush waits for it
// before the plugin exits.
func (a *allocator) recordLater(handleID string, record func(context.Context) error) {
	done := make(chan struct{})
	a.mu.Lock()
	a.pending[handleID] = done
	a.mu.Unlock()
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
		defer cancel()
		if err := record(ctx); err != nil {
			a.log.Warn("recording an IPAM handle (its addresses stay findable through the node's blocks)", "handle", handleID, "error", err)
		}
	}()
}

// await waits for the pending handle write of handleID, if any.
func (a *allocator) await(ctx context.Context, handleID string) {
	a.mu.Lock()
	done := a.pending[handleID]
	a.mu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-ctx.Done():
		}
	}
}

// Flush waits for every pending handle write (plugin.Flusher).
func (a *allocator) Flush(ctx context.Context) {
	a.mu.Lock()
	handles := make([]string, 0, len(a.pending))
	for h := range a.pending {
		handles = append(handles, h)
	}
	a.mu.Unlock()
	for _, h := range handles {
		a.await(ctx, h)
	}
}

func (a *allocator) ReleaseHandle(ctx context.Context, handleID, node string) error {
	a.await(ctx, handleID)
	lock, err := plugin.LockNode(ctx, a.lockFile)
	if err != nil {
		return err
	}
	defer lock.Unlock()
	return classify(a.ops.ReleaseHandle(ctx, handleID, node))
}

func (a *allocator) HandleIPs(ctx context.Context, handleID, node string) ([]net.IP, error) {
	a.await(ctx, handleID)
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
