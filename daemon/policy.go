package daemon

import (
	"context"
	"fmt"
	"log/slog"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/tabbynet/tabby/daemon/netpol"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/iptbackend"
	"github.com/tabbynet/tabby/policy"
	"github.com/tabbynet/tabby/policy/apply"
)

// startPolicy starts the NetworkPolicy loop (package netpol) until ctx
// ends; the rules stay in the kernel when tabbyd stops, so pods stay
// protected across restarts. With cfg.NetworkPolicy off it removes instead
// what an earlier run programmed, and returns a nil controller.
func startPolicy(gs *goroutines, cfg Config, rc *rest.Config, ds *datastore.Client, backend *iptbackend.Backend, met *Metrics) (*netpol.Controller, error) {
	log := cfg.Log.With("loop", "policy")
	if !cfg.NetworkPolicy {
		gs.Go("policy cleanup", func(ctx context.Context) error { cleanupPolicy(ctx, backend, log); return nil })
		return nil, nil
	}
	a, err := apply.New(apply.Options{Backend: backend, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("NetworkPolicy: %w (or run tabbyd with --network-policy=false)", err)
	}
	pc, err := netpol.NewPolicyClient(rc, metav1.NamespaceAll)
	if err != nil {
		return nil, err
	}
	rec, stopEvents := netpol.NewRecorder(ds, cfg.NodeName)
	c, err := netpol.New(netpol.Config{
		Node:         cfg.NodeName,
		DS:           ds,
		Policies:     pc,
		Compile:      policy.Compile,
		Applier:      a,
		DenyUnlisted: cfg.PolicyDenyUnlisted,
		Limits:       cfg.PolicyLimits,
		Recorder:     rec,
		Resync:       cfg.PolicyResync,
		Log:          cfg.Log,
		Metrics:      met.policy,
	})
	if err != nil {
		stopEvents()
		return nil, err
	}
	gs.Go("policy", func(ctx context.Context) error {
		defer stopEvents()
		err := c.Run(ctx)
		if err != nil {
			log.Error("the NetworkPolicy loop stopped", "error", err)
		}
		return err
	})
	return c, nil
}

// cleanupPolicy removes the chains, jumps and ipsets of tabby's
// NetworkPolicy (tabbyd --network-policy=false), leaving everything else.
func cleanupPolicy(ctx context.Context, backend *iptbackend.Backend, log *slog.Logger) {
	a, err := apply.New(apply.Options{Backend: backend, Logger: log})
	if err != nil {
		log.Warn("NetworkPolicy is off; cannot check for rules an earlier run left", "error", err)
		return
	}
	st, err := a.Cleanup(ctx)
	if err != nil {
		log.Error("NetworkPolicy is off; removing the rules an earlier run left failed", "error", err)
		return
	}
	if st.Changed() > 0 {
		log.Info("NetworkPolicy is off: removed the rules an earlier run left", "chains", st.ChainsDeleted, "jumps", st.JumpsDeleted, "sets", st.SetsDeleted)
	}
}
