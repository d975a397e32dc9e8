package daemon

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/tabbynet/tabby/daemon/netpol"
	"github.com/tabbynet/tabby/daemon/nodestatus"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/iptbackend"
)

// startRouting starts the routing loop of cfg's node (until ctx ends) and
// serves its status as JSON on GET /status of mux. /readyz asks its Ready.
func startRouting(gs *goroutines, cfg Config, ds *datastore.Client, infs *datastore.Informers, backend *iptbackend.Backend, met *Metrics, mux *http.ServeMux) *router {
	rec, stopEvents := netpol.NewRecorder(ds, cfg.NodeName, cfg.Log.With("loop", "routing"))
	r := newRouter(routerConfig{
		Node:        cfg.NodeName,
		NodeIPs:     cfg.NodeIPs,
		Namespace:   cfg.Namespace,
		Resync:      cfg.Resync,
		StartupHold: cfg.StartupHold,
		DS:          ds,
		Informers:   infs,
		Log:         cfg.Log,
		Metrics:     met.routing,
		Recorder:    rec,
	})
	if backend != nil {
		r.nat.setIPTablesBackend(*backend)
	}
	mux.HandleFunc("GET "+nodestatus.Path, func(w http.ResponseWriter, req *http.Request) {
		c, cancel := context.WithTimeout(req.Context(), 5*time.Second)
		defer cancel()
		st := r.Status(c)
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(st)
	})
	gs.Go("routing", func(ctx context.Context) error {
		defer stopEvents()
		r.run(ctx)
		return nil
	})
	return r
}
