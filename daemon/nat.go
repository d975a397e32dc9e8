package daemon

import (
	"context"
	"log/slog"
	"reflect"
	"sync"
	"time"

	"github.com/tabbynet/tabby/daemon/routing"
	"github.com/tabbynet/tabby/internal/iptbackend"
	"github.com/tabbynet/tabby/internal/loop"
)

// natWorker programs NAT outgoing (ipsets, a chain and its jump) for the
// routing loop, on a loop of its own. Checking it spawns ipset and
// iptables several times, which on a busy node takes hundreds of
// milliseconds; run inside the routing pass, the periodic heal held every
// route BGP learned meanwhile. NAT depends on the pools alone, so it
// rarely changes: the routing pass hands the worker what it wants and
// goes on, the worker applies it when it changes and heals it every
// resync, and tells the routing loop when its result changes (programmed,
// failed, recovered) so that readiness and problems follow.
type natWorker struct {
	applier *routing.Applier
	loop    *loop.Loop
	metrics *routingMetrics
	// changed asks the routing loop for a pass.
	changed func()

	mu   sync.Mutex
	want *routing.NAT
	// programmed: a pass has gone through; err is the last pass's error.
	programmed bool
	err        error
}

func newNATWorker(log *slog.Logger, metrics *routingMetrics, resync time.Duration, changed func()) *natWorker {
	w := &natWorker{
		applier: routing.NewApplier(routing.Options{Log: log}),
		metrics: metrics,
		changed: changed,
	}
	w.loop = loop.New(loop.Config{
		Pass:    w.pass,
		MinGap:  minReconcileGap,
		Burst:   reconcileBurst,
		Resync:  resync,
		Backoff: loop.Backoff{Min: retryAfter, Max: retryAfter},
	})
	return w
}

// setIPTablesBackend: see routing.Applier.SetIPTablesBackend.
func (w *natWorker) setIPTablesBackend(b iptbackend.Backend) { w.applier.SetIPTablesBackend(b) }

// run applies until ctx ends.
func (w *natWorker) run(ctx context.Context) { _ = w.loop.Run(ctx) }

// set hands the worker the NAT the routing pass wants; a change asks for
// a pass of the worker's own (and says so).
func (w *natWorker) set(n routing.NAT) bool {
	w.mu.Lock()
	same := w.want != nil && reflect.DeepEqual(*w.want, n)
	if !same {
		w.want = &n
	}
	w.mu.Unlock()
	if !same {
		w.loop.Trigger()
	}
	return !same
}

// state says whether NAT outgoing has ever been programmed, and what the
// last attempt failed with.
func (w *natWorker) state() (programmed bool, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.programmed, w.err
}

func (w *natWorker) pass(context.Context) error {
	w.mu.Lock()
	want := w.want
	w.mu.Unlock()
	if want == nil {
		return nil // the routing loop has not worked it out yet
	}
	st, err := w.applier.ApplyNAT(*want)
	w.metrics.observeApply(st, err)
	w.mu.Lock()
	first := err == nil && !w.programmed
	news := errText(err) != errText(w.err)
	w.err = err
	w.programmed = w.programmed || err == nil
	w.mu.Unlock()
	if first || news {
		w.changed()
	}
	return err
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
