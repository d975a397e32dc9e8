package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/tabbynet/tabby/contract"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/loop"
)

// Heartbeat timing: tabbyd renews its Lease as soon as it is ready and then
// every HeartbeatInterval while it stays ready; readers take it as lapsed
// HeartbeatDuration after the last renewal (the scheduler extender then
// keeps new pods off the node). A failed renewal is retried after
// HeartbeatRetryMin, doubling up to HeartbeatInterval (with jitter), so a
// cluster of tabbyds does not hammer an API server that is struggling.
const (
	HeartbeatInterval = 10 * time.Second
	HeartbeatDuration = 40 * time.Second
	HeartbeatRetryMin = time.Second
)

// heartbeatBackoff is how long the heartbeat waits after failures in a
// row: HeartbeatRetryMin doubled per failure, capped at HeartbeatInterval,
// then spread by up to 20% either way.
var heartbeatBackoff = loop.Backoff{Min: HeartbeatRetryMin, Max: HeartbeatInterval, Factor: 2, Jitter: 0.2}

// retryDelay is the wait after the failures-th failure in a row
// (failures >= 1), jitter in [-1, 1].
func retryDelay(failures int, jitter float64) time.Duration {
	return heartbeatBackoff.Delay(failures, jitter)
}

// heartbeat renews the node's heartbeat Lease while tabbyd is ready, and
// remembers how the API server answered: /readyz reads that instead of
// asking the API server itself.
type heartbeat struct {
	ready func() error                    // whether tabbyd is ready
	renew func(ctx context.Context) error // one renewal of the Lease
	what  string                          // the Lease, for messages
	log   *slog.Logger
	// onRenewed, when set, is called after each successful renewal.
	onRenewed func()

	mu           sync.Mutex
	renewed      time.Time // the last successful renewal (zero: none since ready)
	failures     int       // failed renewals in a row
	lastErr      error     // the last renewal's error (nil: it succeeded, or none yet)
	failingSince time.Time // the first of the failures in a row
	retryAt      time.Time // no renewal before then (after a failure)
}

// tick is one step of the heartbeat at now: it renews the Lease when
// tabbyd is ready and a renewal is due (the first one since ready, or
// HeartbeatInterval after the last), unless a failure's backoff holds it.
// It reports whether it asked the API server.
func (h *heartbeat) tick(ctx context.Context, now time.Time) bool {
	if err := h.ready(); err != nil {
		h.mu.Lock()
		h.renewed = time.Time{} // not ready: let the Lease lapse
		h.mu.Unlock()
		return false
	}
	h.mu.Lock()
	due := (h.renewed.IsZero() || now.Sub(h.renewed) >= HeartbeatInterval) && !now.Before(h.retryAt)
	h.mu.Unlock()
	if !due {
		return false
	}
	err := h.renew(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		if h.lastErr != nil {
			h.log.Info("heartbeat: the Lease is renewed again", "lease", h.what, "failures", h.failures)
		}
		h.renewed, h.failures, h.lastErr, h.failingSince, h.retryAt = now, 0, nil, time.Time{}, time.Time{}
		if h.onRenewed != nil {
			h.onRenewed()
		}
		return true
	}
	if h.failures == 0 {
		h.failingSince = now
	}
	h.failures++
	delay := retryDelay(h.failures, 2*rand.Float64()-1)
	h.retryAt = now.Add(delay)
	if h.lastErr == nil || h.lastErr.Error() != err.Error() {
		h.log.Warn("heartbeat: renewing the Lease failed; retrying with backoff", "lease", h.what, "retryIn", delay.Round(time.Millisecond), "err", err)
	}
	h.lastErr = err
	return true
}

// apiError says why tabbyd is not ready as far as the API server goes:
// the last renewal of the Lease failed (the API server cannot be reached,
// or refuses the renewal). Nil when it succeeded, or none was tried yet
// (tabbyd was not ready to).
func (h *heartbeat) apiError() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.lastErr == nil {
		return nil
	}
	return fmt.Errorf("renewing tabbyd's heartbeat Lease %s has failed since %s (%d tries; the scheduler extender keeps new pods off this node once it lapses): %w", h.what, h.failingSince.Format(time.RFC3339), h.failures, h.lastErr)
}

// newHeartbeat makes the heartbeat of node's Lease in namespace.
func newHeartbeat(rc *rest.Config, namespace, node string, ready func() error, log *slog.Logger) (*heartbeat, error) {
	leases, err := newLeaseClient(rc, namespace)
	if err != nil {
		return nil, fmt.Errorf("heartbeat: %w", err)
	}
	name := contract.HeartbeatLeaseName(node)
	return &heartbeat{
		ready: ready,
		renew: func(ctx context.Context) error { return renewLease(ctx, leases, name, node) },
		what:  namespace + "/" + name,
		log:   log,
	}, nil
}

// run ticks until ctx ends. Readiness is checked every second, so the
// first heartbeat goes out the moment tabbyd is ready (the extender places
// no pod on the node before it); checking it costs no API call. The
// back-off after a failed renewal is tick's own (retryAt): the loop's
// retry would not hold back the readiness checks, which renew when due.
func (h *heartbeat) run(ctx context.Context) error {
	return loop.New(loop.Config{
		Pass:   func(ctx context.Context) error { h.tick(ctx, time.Now()); return nil },
		Resync: time.Second,
	}).Run(ctx)
}

func renewLease(ctx context.Context, leases *leaseClient, name, node string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	now := metav1.NewMicroTime(time.Now())
	spec := coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To(int32(HeartbeatDuration / time.Second)), RenewTime: &now}
	l, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app.kubernetes.io/name": "tabbyd"}}, Spec: spec}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec = spec
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}

// leaseScheme knows the Leases (coordination.k8s.io/v1) tabbyd writes: its
// heartbeat and the IPAM garbage collector's election.
var leaseScheme = runtime.NewScheme()

func init() { utilruntime.Must(coordinationv1.AddToScheme(leaseScheme)) }

// leaseClient reaches the Leases of one namespace.
type leaseClient = datastore.Resource[*coordinationv1.Lease, *coordinationv1.LeaseList]

// newLeaseClient is the Lease client of namespace on the API server of rc:
// a datastore.Resource over a scheme of Leases alone, as the
// datastore's clients are, not client-go's typed clientset (whose scheme
// registers every API group of Kubernetes, a large part of tabbyd's
// resident memory).
func newLeaseClient(rc *rest.Config, namespace string) (*leaseClient, error) {
	r, err := datastore.GroupREST(rc, coordinationv1.SchemeGroupVersion, leaseScheme)
	if err != nil {
		return nil, err
	}
	return datastore.NewResource[*coordinationv1.Lease, *coordinationv1.LeaseList]("leases", r,
		runtime.NewParameterCodec(leaseScheme), namespace,
		func() *coordinationv1.Lease { return &coordinationv1.Lease{} },
		func() *coordinationv1.LeaseList { return &coordinationv1.LeaseList{} }), nil
}
