package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"

	"gopkg.in/natefinch/lumberjack.v2"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/tabbynet/tabby/daemon/deniedlog"
	"github.com/tabbynet/tabby/daemon/netpol"
	"github.com/tabbynet/tabby/daemon/nflog"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/iptbackend"
	"github.com/tabbynet/tabby/policy"
	"github.com/tabbynet/tabby/policy/apply"
)

// startPolicy starts the NetworkPolicy loop (package netpol) until ctx
// ends; the rules stay in the kernel when tabbyd stops, so pods stay
// protected across restarts. With cfg.NetworkPolicy off it removes instead
// what an earlier run programmed, and returns a nil controller.
func startPolicy(gs *goroutines, cfg Config, rc *rest.Config, ds *datastore.Client, infs *datastore.Informers, backend *iptbackend.Backend, met *Metrics, mux *http.ServeMux) (*netpol.Controller, error) {
	log := cfg.Log.With("loop", "policy")
	denied, err := startDeniedLog(gs, cfg, met, mux)
	if err != nil {
		return nil, err
	}
	if !cfg.NetworkPolicy {
		gs.Go("policy cleanup", func(ctx context.Context) error { cleanupPolicy(ctx, backend, log); return nil })
		return nil, nil
	}
	// The loop reads the kernel back every resync between syncs (Audit);
	// the applier's own period is only a backstop, longer, so that the
	// read never falls on the sync of a change first.
	resync := cfg.PolicyResync
	if resync <= 0 {
		resync = netpol.DefaultResync
	}
	a, err := apply.New(apply.Options{Backend: backend, Logger: log, ResyncPeriod: 2 * resync})
	if err != nil {
		return nil, fmt.Errorf("NetworkPolicy: %w (or run tabbyd with --network-policy=false)", err)
	}
	pc, err := netpol.NewPolicyClient(rc, metav1.NamespaceAll)
	if err != nil {
		return nil, err
	}
	cpc, err := netpol.NewClusterPolicyClient(rc)
	if err != nil {
		return nil, err
	}
	rec, stopEvents := netpol.NewRecorder(ds, cfg.NodeName, log)
	c, err := netpol.New(netpol.Config{
		Node:      cfg.NodeName,
		DS:        ds,
		Informers: infs,
		Policies:  pc,
		// ClusterNetworkPolicy is always on: without its CRD the
		// client lists none.
		ClusterPolicies: cpc,
		Compile:         policy.NewIncremental().Compile, // a change recompiles what it touches
		Applier:         a,
		DenyUnlisted:    cfg.PolicyDenyUnlisted,
		Limits:          cfg.PolicyLimits,
		DeniedLog:       cfg.DeniedLog,
		Denied:          denied,
		Recorder:        rec,
		Resync:          cfg.PolicyResync,
		Log:             cfg.Log,
		Metrics:         met.policy,
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

// startDeniedLog starts reading the NFLOG group of the denied-packet log
// and serves its records on deniedlog.Path; with cfg.DeniedLog unset (or
// NetworkPolicy off) that path says how to turn it on, and the log is nil.
func startDeniedLog(gs *goroutines, cfg Config, met *Metrics, mux *http.ServeMux) (*netpol.Denied, error) {
	if cfg.DeniedLog == nil || !cfg.NetworkPolicy {
		mux.HandleFunc("GET "+deniedlog.Path, func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "the log of denied packets is off on node "+cfg.NodeName+": start tabbyd with --denied-log (and --network-policy)", http.StatusNotFound)
		})
		return nil, nil
	}
	group := cfg.DeniedLog.Group
	if group == 0 {
		group = policy.DefaultDeniedLogGroup
	}
	conn, err := nflog.Open(nflog.Config{Group: group})
	if err != nil {
		return nil, fmt.Errorf("the log of denied packets (--denied-log): %w (--denied-log-group picks another group)", err)
	}
	var file io.Writer
	if cfg.DeniedLogFile != "" {
		if err := os.MkdirAll(filepath.Dir(cfg.DeniedLogFile), 0o755); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("--denied-log-file %s: %w", cfg.DeniedLogFile, err)
		}
		file = &lumberjack.Logger{Filename: cfg.DeniedLogFile, MaxSize: 100, MaxBackups: 3, LocalTime: true}
	}
	d := netpol.NewDenied(netpol.DeniedConfig{Node: cfg.NodeName, Buffer: cfg.DeniedLogBuffer, File: file, Metrics: met.policy})
	mux.Handle("GET "+deniedlog.Path, d)
	gs.Go("denied log", func(ctx context.Context) error {
		stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
		defer stop()
		err := conn.Read(d.Packet, d.Lost)
		_ = conn.Close()
		if c, ok := file.(io.Closer); ok {
			_ = c.Close()
		}
		if err != nil {
			cfg.Log.Error("the log of denied packets stopped", "error", err)
		}
		return err
	})
	cfg.Log.Info("logging denied packets", "nflogGroup", group, "file", cfg.DeniedLogFile)
	return d, nil
}
