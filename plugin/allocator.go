package plugin

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// Allocator is what the plugins need of tabby's IPAM and datastore. The
// real one is the ipam package over the Kubernetes API; tests may pass
// another through Deps.
type Allocator interface {
	Assign(ctx context.Context, req ipam.Request) ([]ipam.Assigned, error)
	ReleaseHandle(ctx context.Context, handleID, node string) error
	HandleIPs(ctx context.Context, handleID string) ([]net.IP, error)
	NodeHandles(ctx context.Context, node string) ([]string, error)
	UsablePools(ctx context.Context, node string) ([]*tabbyv1.IPPool, error)
	PodRequest(ctx context.Context, namespace, pod string) (ipam.PodAnnotations, error)
	Ping(ctx context.Context) error
}

// Deps are what the commands need from outside the config.
type Deps struct {
	// NewAllocator connects to IPAM; nil means the datastore the config's
	// kubeconfig names.
	NewAllocator func(ctx context.Context, c *Config, log *slog.Logger) (Allocator, error)
	// Logger; nil means the one the config's logLevel asks for.
	Logger *slog.Logger
}

func (d Deps) allocator(ctx context.Context, c *Config, log *slog.Logger) (Allocator, error) {
	if d.NewAllocator != nil {
		return d.NewAllocator(ctx, c, log)
	}
	return NewDatastoreAllocator(c, log)
}

// datastoreAllocator is the ipam package over the Kubernetes API.
type datastoreAllocator struct {
	ds *datastore.Client
	*ipam.IPAM
}

// NewDatastoreAllocator connects to the API server named by the config's
// kubeconfig; every request is bounded by the config's timeout.
func NewDatastoreAllocator(c *Config, log *slog.Logger) (Allocator, error) {
	rc, err := datastore.LoadConfig(c.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("tabby: %w", err)
	}
	rc.Timeout = c.Timeout
	ds, err := datastore.New(rc)
	if err != nil {
		return nil, fmt.Errorf("tabby: connecting to the datastore: %w", err)
	}
	return &datastoreAllocator{ds: ds, IPAM: ipam.New(ds, ipam.WithLogger(log), ipam.WithPoolListReuse(time.Second))}, nil
}

func (a *datastoreAllocator) PodRequest(ctx context.Context, namespace, pod string) (ipam.PodAnnotations, error) {
	return ipam.PodRequest(ctx, a.ds, namespace, pod)
}

func (a *datastoreAllocator) Ping(ctx context.Context) error { return a.ds.Ping(ctx) }
