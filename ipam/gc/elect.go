package gc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// Leader election defaults, as kube-controller-manager's.
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRenewDeadline = 10 * time.Second
	DefaultRetryPeriod   = 2 * time.Second
)

// Election configures the Lease the collectors elect their active one with.
type Election struct {
	// Leases reaches coordination.k8s.io (required).
	Leases coordinationv1client.LeasesGetter
	// Namespace and Name of the Lease (Name default DefaultLeaseName).
	Namespace, Name string
	// Identity of this candidate, e.g. its node name (required; unique).
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod: see client-go's
	// leaderelection (defaults DefaultLeaseDuration, DefaultRenewDeadline,
	// DefaultRetryPeriod).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// RunElected takes part in the election until ctx ends, and runs the
// collector (Run) while it holds the Lease. When it loses the Lease the
// passes stop, and it stands again. When ctx ends the passes stop first,
// then the Lease is released, so another candidate takes over at once.
func (g *GC) RunElected(ctx context.Context, e Election) error {
	e, err := e.withDefaults()
	if err != nil {
		return err
	}
	lock := &loggingLock{Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metaOf(e.Namespace, e.Name),
		Client:     e.Leases,
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.Identity},
	}, g: g, where: e.Namespace + "/" + e.Name}

	// The election runs on its own context, cancelled only once the passes
	// have stopped: the Lease is released after the last write. client-go's
	// elector logs with the logger the context carries (klog's global one
	// otherwise): this one puts its lines into the collector's log, at
	// levels fit for an election that has losers by design.
	electCtx, stopElection := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElection()
	electCtx = klog.NewContext(electCtx, electionLogger(g.log))
	terms := newTermCount()
	go func() {
		<-ctx.Done()
		terms.wait()
		stopElection()
	}()
	lead := func(lctx context.Context) {
		terms.begin()
		defer terms.end()
		g.lead(ctx, lctx, e)
	}
	for electCtx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   e.LeaseDuration,
			RenewDeadline:   e.RenewDeadline,
			RetryPeriod:     e.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            e.Name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: lead,
				OnStoppedLeading: func() {},
			},
		})
		if err != nil {
			return fmt.Errorf("ipam gc: leader election: %w", err)
		}
		le.Run(electCtx) // returns when the Lease is lost or the election ends
		terms.wait()
	}
	return nil
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

// termCount counts the terms whose passes are running, so that the
// election waits for them to stop.
type termCount struct {
	mu    sync.Mutex
	ended *sync.Cond
	n     int
}

func newTermCount() *termCount {
	t := &termCount{}
	t.ended = sync.NewCond(&t.mu)
	return t
}

func (t *termCount) begin() {
	t.mu.Lock()
	t.n++
	t.mu.Unlock()
}

func (t *termCount) end() {
	t.mu.Lock()
	t.n--
	t.ended.Broadcast()
	t.mu.Unlock()
}

// wait returns once no term's passes are running.
func (t *termCount) wait() {
	t.mu.Lock()
	for t.n > 0 {
		t.ended.Wait()
	}
	t.mu.Unlock()
}

// lead is one term: the collector runs until the Lease is lost (lctx
// ends) or ctx ends.
func (g *GC) lead(ctx, lctx context.Context, e Election) {
	wctx, cancel := context.WithCancel(lctx)
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	if wctx.Err() != nil {
		return
	}
	g.startedLeading(e)
	defer g.stoppedLeading(e)
	g.runRestarting(wctx, e.RetryPeriod)
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

func metaOf(namespace, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: namespace, Name: name}
}

// loggingLock says once, in tabbyd's log, why the Lease cannot be had (a
// missing namespace, missing RBAC, an unreachable API server), and when
// it can again; client-go's elector only retries.
type loggingLock struct {
	resourcelock.Interface
	g     *GC
	where string
	mu    sync.Mutex
	last  string
}

func (l *loggingLock) note(ctx context.Context, op string, err error) {
	if err != nil && ctx.Err() != nil {
		// The elector is stopping (tabbyd shuts down, or it gave up
		// leading): the call was cut short, the Lease is not at fault.
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case err == nil && l.last != "":
		l.last = ""
		l.g.log.Info("the IPAM garbage collector's Lease is reachable again", "lease", l.where)
	case err != nil && err.Error() != l.last:
		l.last = err.Error()
		l.g.log.Warn("cannot "+op+" the IPAM garbage collector's Lease: check that the namespace exists and that tabbyd may get, create and update leases there", "lease", l.where, "error", err)
	}
}

func (l *loggingLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r, b, err := l.Interface.Get(ctx)
	if err == nil || !apierrors.IsNotFound(err) {
		l.note(ctx, "read", err)
	}
	return r, b, err
}

func (l *loggingLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Create(ctx, ler)
	if !apierrors.IsAlreadyExists(err) {
		l.note(ctx, "create", err)
	}
	return err
}

func (l *loggingLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Update(ctx, ler)
	if !apierrors.IsConflict(err) {
		l.note(ctx, "update", err)
	}
	return err
}

// electionLogger is the logger client-go's elector gets (and the REST
// client under it): its lines go to log (tagged
// component=leaderelection), its info at level 0 as Info, at levels 1 to 4
// as Debug, and its errors as Debug too; its traces (level 5 and up, such
// as request and response bodies) nowhere. Every error
// the elector logs is the failure of a call on the Lease, and loggingLock
// has seen each one first: a lost race (AlreadyExists when two candidates
// create the Lease at once, Conflict when two update it) is the normal lot
// of a candidate that does not lead, and every other failure loggingLock
// reports once, as a warning saying what to check. At error level they
// would only repeat that every RetryPeriod, or cry wolf on the loser.
func electionLogger(log *slog.Logger) klog.Logger {
	return klog.New(&electionSink{log: log.With("component", "leaderelection")})
}

type electionSink struct {
	log    *slog.Logger
	values []any
}

func (s *electionSink) Init(klog.RuntimeInfo) {}

// maxElectionV is the most verbose level of client-go's that is logged.
const maxElectionV = 4

func electionLevel(v int) slog.Level {
	if v <= 0 {
		return slog.LevelInfo
	}
	return slog.LevelDebug
}

func (s *electionSink) Enabled(v int) bool {
	return v <= maxElectionV && s.log.Enabled(context.Background(), electionLevel(v))
}

func (s *electionSink) Info(v int, msg string, kv ...any) {
	if v > maxElectionV {
		return
	}
	s.log.Log(context.Background(), electionLevel(v), msg, append(slices.Clip(s.values), kv...)...)
}

func (s *electionSink) Error(err error, msg string, kv ...any) {
	s.log.Log(context.Background(), slog.LevelDebug, msg, append(append(slices.Clip(s.values), kv...), "error", err)...)
}

func (s *electionSink) WithValues(kv ...any) klog.LogSink {
	return &electionSink{log: s.log, values: append(slices.Clip(s.values), kv...)}
}

func (s *electionSink) WithName(name string) klog.LogSink {
	return &electionSink{log: s.log.With("logger", name), values: s.values}
}
