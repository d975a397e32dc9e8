package gc

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/tabbynet/tabby/internal/logging"
)

// Leader election defaults, as kube-controller-manager's.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// LeaseClient reaches the Leases (coordination.k8s.io/v1) of the
// election's namespace: client-go's typed LeaseInterface satisfies it, and
// so does datastore.Resource, which tabbyd uses to stay clear of the
// typed clientset's scheme of every API group.
type LeaseClient interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error)
	Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error)
	Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error)
}

// Election configures the Lease the collectors elect their active one with.
type Election struct {
	// Leases reaches the Leases of Namespace (required).
	Leases LeaseClient
	// Namespace and Name of the Lease (Name default DefaultLeaseName).
	Namespace, Name string
	// Identity of this candidate, e.g. its node name (required; unique).
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod, as client-go's
	// leaderelection has them (defaults DefaultLeaseDuration,
	// DefaultRenewDeadline, DefaultRetryPeriod): a candidate takes a Lease
	// over once its holder has not renewed it for the holder's
	// LeaseDuration (by this candidate's clock, from when it saw the
	// record change); the leader renews every RetryPeriod and stops
	// leading when no renewal succeeded for RenewDeadline.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// RunElected takes part in the election until ctx ends, and runs the
// collector (Run) while it holds the Lease. When it loses the Lease the
// passes stop, and it stands again. When ctx ends the passes stop first,
// then the Lease is released, so another candidate takes over at once.
//
// The election is client-go's leaderelection's, on a Lease, written here
// over LeaseClient: client-go's package needs the typed clientset, which
// links and registers every API group of Kubernetes into tabbyd.
func (g *GC) RunElected(ctx context.Context, e Election) error {
	e, err := e.withDefaults()
	if err != nil {
		return err
	}
	el := &elector{e: e, log: g.log.With("component", "leaderelection"), where: e.Namespace + "/" + e.Name}
	// client-go logs the calls made under ctx (the Lease's, the
	// collector's) into the collector's log, and a call that ctx's end
	// cuts short is no error.
	ctx = logging.ClientContext(ctx, g.log)
	for {
		if !el.acquire(ctx) {
			return nil // ctx ended
		}
		lctx, lost := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			g.lead(lctx, e)
		}()
		el.renew(lctx) // until a renewal fails for RenewDeadline, or ctx ends
		lost()
		<-done // the passes have stopped
		if ctx.Err() != nil {
			el.release()
			return nil
		}
		el.log.Info("lost the IPAM garbage collector's Lease", "lease", el.where, "identity", e.Identity)
	}
}

// withDefaults checks the required fields and fills in the defaults.
func (e Election) withDefaults() (Election, error) {
	if e.Leases == nil || e.Namespace == "" || e.Identity == "" {
		return e, errors.New("ipam gc: the election needs a Leases client, a namespace and an identity")
	}
	if e.Name == "" {
		e.Name = DefaultLeaseName
	}
	if e.LeaseDuration == 0 {
		e.LeaseDuration = DefaultLeaseDuration
	}
	if e.RenewDeadline == 0 {
		e.RenewDeadline = DefaultRenewDeadline
	}
	if e.RetryPeriod == 0 {
		e.RetryPeriod = DefaultRetryPeriod
	}
	return e, nil
}

// lead is one term: the collector runs until ctx ends (the Lease is lost
// or the election ends).
func (g *GC) lead(ctx context.Context, e Election) {
	if ctx.Err() != nil {
		return
	}
	g.startedLeading(e)
	defer g.stoppedLeading(e)
	g.runRestarting(ctx, e.RetryPeriod)
}

func (g *GC) startedLeading(e Election) {
	g.leading.Store(true)
	g.met.leader.Set(1)
	g.log.Info("leading the IPAM garbage collection", "lease", e.Namespace+"/"+e.Name, "identity", e.Identity)
}

func (g *GC) stoppedLeading(e Election) {
	g.leading.Store(false)
	g.met.leader.Set(0)
	g.met.candidates.Set(0) // the next leader counts them
	g.met.pools.set(nil)    // and exports the pools' usage
	g.log.Info("stopped leading the IPAM garbage collection", "identity", e.Identity)
}

// runRestarting runs the collector until ctx ends, starting it again
// retry after it fails.
func (g *GC) runRestarting(ctx context.Context, retry time.Duration) {
	for ctx.Err() == nil {
		err := g.Run(ctx)
		if err == nil || ctx.Err() != nil {
			return
		}
		g.log.Warn("the IPAM garbage collector stopped; starting it again", "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(retry):
		}
	}
}

// elector is one candidate's side of the election.
type elector struct {
	e     Election
	log   *slog.Logger
	where string // namespace/name, for messages

	// observed is the Lease as last read or written, and observedAt when
	// its record last changed (by this candidate's clock).
	observed   *coordinationv1.Lease
	observedAt time.Time
	leading    bool

	mu   sync.Mutex
	last string // the error last reported by note
}

// acquire tries for the Lease every RetryPeriod (jittered) until it has
// it (true) or ctx ends (false).
func (el *elector) acquire(ctx context.Context) bool {
	for {
		if el.tryAcquireOrRenew(ctx) {
			el.log.Info("acquired the IPAM garbage collector's Lease", "lease", el.where, "identity", el.e.Identity)
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait.Jitter(el.e.RetryPeriod, 1.2)):
		}
	}
}

// renew renews the Lease every RetryPeriod until ctx ends, or until no
// renewal succeeded for RenewDeadline (it then no longer leads).
func (el *elector) renew(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(el.e.RetryPeriod):
		}
		dctx, cancel := context.WithTimeout(ctx, el.e.RenewDeadline)
		err := wait.PollUntilContextCancel(dctx, el.e.RetryPeriod, true, func(ctx context.Context) (bool, error) {
			return el.tryAcquireOrRenew(ctx), nil
		})
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				el.leading = false // it gave up: the Lease is lost
			}
			return
		}
	}
}

// tryAcquireOrRenew makes one attempt at taking or renewing the Lease, and
// says whether this candidate holds it now.
func (el *elector) tryAcquireOrRenew(ctx context.Context) bool {
	now := time.Now()
	me := el.e.Identity
	// The leader first renews the Lease it last wrote: one call, which a
	// conflict sends down the long way.
	if el.leading && el.observed != nil {
		l := el.observed.DeepCopy()
		el.stamp(l, now)
		if u, err := el.e.Leases.Update(ctx, l, metav1.UpdateOptions{}); err == nil {
			el.observe(u, now)
			el.note(ctx, "update", nil)
			return true
		}
	}
	l, err := el.e.Leases.Get(ctx, el.e.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: el.e.Namespace, Name: el.e.Name}}
		el.stamp(l, now)
		c, err := el.e.Leases.Create(ctx, l, metav1.CreateOptions{})
		if err != nil {
			if apierrors.IsAlreadyExists(err) {
				el.log.Debug("lost the race to create the IPAM garbage collector's Lease", "lease", el.where, "error", err)
			} else {
				el.note(ctx, "create", err)
			}
			return false
		}
		el.note(ctx, "create", nil)
		el.observe(c, now)
		return true
	}
	el.note(ctx, "read", err)
	if err != nil {
		return false
	}
	if el.observed == nil || !sameRecord(el.observed.Spec, l.Spec) {
		el.observed, el.observedAt = l, now
	}
	holder := ptr.Deref(l.Spec.HolderIdentity, "")
	held := time.Duration(ptr.Deref(l.Spec.LeaseDurationSeconds, 0)) * time.Second
	if holder != "" && holder != me && el.observedAt.Add(held).After(now) {
		el.leading = false
		return false
	}
	l = l.DeepCopy()
	el.stamp(l, now)
	u, err := el.e.Leases.Update(ctx, l, metav1.UpdateOptions{})
	if err != nil {
		if apierrors.IsConflict(err) {
			el.log.Debug("lost the race to update the IPAM garbage collector's Lease", "lease", el.where, "error", err)
		} else {
			el.note(ctx, "update", err)
		}
		return false
	}
	el.note(ctx, "update", nil)
	el.observe(u, now)
	return true
}

// stamp makes l's record this candidate's, renewed at now. Taking over
// a Lease that exists (it has a resourceVersion) from another holder, or
// from none, counts a transition, as client-go's elector does; either way
// a new holder's acquire time is now.
func (el *elector) stamp(l *coordinationv1.Lease, now time.Time) {
	t := metav1.NewMicroTime(now)
	if ptr.Deref(l.Spec.HolderIdentity, "") != el.e.Identity {
		l.Spec.AcquireTime = &t
		if l.ResourceVersion != "" {
			l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
		}
	}
	if l.Spec.LeaseTransitions == nil {
		l.Spec.LeaseTransitions = ptr.To[int32](0)
	}
	l.Spec.HolderIdentity = ptr.To(el.e.Identity)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(el.e.LeaseDuration / time.Second))
	l.Spec.RenewTime = &t
}

// observe records the Lease this candidate just wrote: it leads.
func (el *elector) observe(l *coordinationv1.Lease, now time.Time) {
	el.observed, el.observedAt, el.leading = l, now, true
}

// release hands the Lease over when this candidate holds it: no holder,
// expired at once, so another candidate takes it on its next try.
func (el *elector) release() {
	if !el.leading || el.observed == nil {
		return
	}
	ctx, cancel := context.WithTimeout(logging.ClientContext(context.Background(), el.log), el.e.RenewDeadline)
	defer cancel()
	l := el.observed.DeepCopy()
	now := metav1.NewMicroTime(time.Now())
	l.Spec.HolderIdentity = ptr.To("")
	l.Spec.LeaseDurationSeconds = ptr.To[int32](1)
	l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
	if _, err := el.e.Leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		el.log.Info("could not release the IPAM garbage collector's Lease: another collector takes over once it expires", "lease", el.where, "error", err)
		return
	}
	el.leading = false
}

// sameRecord says whether two Leases carry the same election record.
func sameRecord(a, b coordinationv1.LeaseSpec) bool {
	return ptr.Deref(a.HolderIdentity, "") == ptr.Deref(b.HolderIdentity, "") &&
		ptr.Equal(a.LeaseDurationSeconds, b.LeaseDurationSeconds) &&
		ptr.Equal(a.LeaseTransitions, b.LeaseTransitions) &&
		microEqual(a.AcquireTime, b.AcquireTime) && microEqual(a.RenewTime, b.RenewTime)
}

func microEqual(a, b *metav1.MicroTime) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(b)
}

// note says once, in tabbyd's log, why the Lease cannot be had (a missing
// namespace, missing RBAC, an unreachable API server), and when it can
// again. A Lease not found, and the races candidates lose by design, are
// no failure and not noted.
func (el *elector) note(ctx context.Context, op string, err error) {
	if err != nil && ctx.Err() != nil {
		// The election is stopping (tabbyd shuts down, or the renewal
		// gave up): the call was cut short, the Lease is not at fault.
		return
	}
	el.mu.Lock()
	defer el.mu.Unlock()
	switch {
	case err == nil && el.last != "":
		el.last = ""
		el.log.Info("the IPAM garbage collector's Lease is reachable again", "lease", el.where)
	case err != nil && err.Error() != el.last:
		el.last = err.Error()
		el.log.Warn("cannot "+op+" the IPAM garbage collector's Lease: check that the namespace exists and that tabbyd may get, create and update leases there", "lease", el.where, "error", err)
	}
}
