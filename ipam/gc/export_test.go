package gc

import (
	"context"

	"github.com/tabbynet/tabby/datastore"
)

// PassOn runs one pass on the snapshots snap gives instead of the API
// server's, for tests that make a collector see a stale world.
func (g *GC) PassOn(ctx context.Context, snap func(context.Context) (*Snapshot, error)) (PassResult, error) {
	return g.pass(ctx, readerFunc(snap))
}

type readerFunc func(context.Context) (*Snapshot, error)

func (f readerFunc) snapshot(ctx context.Context) (*Snapshot, error) { return f(ctx) }

// APISnapshot lists everything from the API server, as GC.Pass does.
func APISnapshot(ctx context.Context, ds *datastore.Client) (*Snapshot, error) {
	return apiReader{ds}.snapshot(ctx)
}
