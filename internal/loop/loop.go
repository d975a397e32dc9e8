// Package loop is the one shape of tabbyd's level-triggered loops (routing,
// NetworkPolicy, IPAM garbage collection, the heartbeat): triggers mark the
// loop dirty, many triggers coalesce into one pass, a failed pass is
// retried after a back-off, and a periodic resync heals what no event
// reported. The pass recomputes everything, so a missed or merged trigger
// loses nothing.
package loop

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Backoff is how long a loop waits before retrying after failures in a
// row: Min, multiplied by Factor per further failure, capped at Max, then
// spread by up to Jitter (a fraction) either way. A zero Backoff retries
// never: the next trigger or resync does.
type Backoff struct {
	Min, Max time.Duration
	// Factor is the growth per failure; below 1 it counts as 1 (a
	// constant delay).
	Factor float64
	// Jitter spreads a delay d over [d-Jitter*d, d+Jitter*d], so a
	// cluster of nodes does not retry in step.
	Jitter float64
}

// Delay is the wait after the failures-th failure in a row (failures >= 1),
// with r in [-1, 1] choosing where in the jitter band it falls.
func (b Backoff) Delay(failures int, r float64) time.Duration {
	d := b.Min
	for i := 1; i < failures && (b.Max <= 0 || d < b.Max) && b.Factor > 1; i++ {
		d = time.Duration(float64(d) * b.Factor)
	}
	if b.Max > 0 {
		d = min(d, b.Max)
	}
	return d + time.Duration(float64(d)*b.Jitter*r)
}

// Task is work a loop runs every Every on its own goroutine, between
// passes, without a pass (the policy loop's check of its jumps must run on the thread
// that programs the kernel).
//
// A pass goes first: Do's context is cancelled when a trigger arrives while
// it runs, and Do should then return soon. A task so cut short runs again
// once the loop has nothing pending, rather than a whole period later.
type Task struct {
	Every time.Duration
	Do    func(ctx context.Context)
}

// Config shapes a loop.
type Config struct {
	// Pass does one full pass; an error retries it after Backoff.
	Pass func(ctx context.Context) error
	// MinGap spaces passes under a storm of triggers: what arrives
	// meanwhile is coalesced into the next pass. Burst passes may run
	// back to back after a quiet spell, then one every MinGap (a token
	// bucket, as kube-proxy's BoundedFrequencyRunner): the event that
	// follows another by a millisecond (a pod's address right after the
	// pod, a route right after its block) is not held for MinGap, while
	// a storm runs no more passes than MinGap allows. Burst 0 counts
	// as 1: a pass at most every MinGap.
	MinGap time.Duration
	Burst  int
	// Resync runs a pass this often without a trigger (0: never).
	Resync  time.Duration
	Backoff Backoff
	// Wake, when set, is asked before each wait for one more channel
	// whose receive triggers a pass (the routing loop's BGP speaker,
	// which it replaces when its identity changes).
	Wake func() <-chan struct{}
	// Task, when its Every is set, runs between passes.
	Task Task
}

// Loop runs Config.Pass; Trigger asks it for a pass.
type Loop struct {
	cfg      Config
	dirty    chan struct{}
	failures int
	retry    *time.Timer
	// taskDue: the last task was cut short by a trigger.
	taskDue bool
	// mu guards preempt, which cancels the running task's context.
	mu      sync.Mutex
	preempt context.CancelFunc
	// jitter draws where in its band a delay falls (tests fix it).
	jitter func() float64
}

// New makes a loop that has one pass pending: Run starts with it.
func New(cfg Config) *Loop {
	l := &Loop{cfg: cfg, dirty: make(chan struct{}, 1), jitter: func() float64 { return 2*rand.Float64() - 1 }}
	l.Trigger()
	return l
}

// Trigger marks the loop dirty. It never blocks: triggers that arrive
// before the pass starts are one. A task running meanwhile is told to
// stop, so that the pass starts soon.
func (l *Loop) Trigger() {
	select {
	case l.dirty <- struct{}{}:
	default:
	}
	l.mu.Lock()
	if l.preempt != nil {
		l.preempt()
	}
	l.mu.Unlock()
}

// TriggerAfter triggers a pass after d (a deadline the pass itself set,
// such as the GC's next due candidate).
func (l *Loop) TriggerAfter(d time.Duration) *time.Timer {
	return time.AfterFunc(d, l.Trigger)
}

// Failures is the number of failed passes in a row.
func (l *Loop) Failures() int { return l.failures }

// Run runs passes until ctx ends, and returns nil then: a failed pass is
// retried, never fatal.
func (l *Loop) Run(ctx context.Context) error {
	resync, stopResync := ticker(l.cfg.Resync)
	defer stopResync()
	task, stopTask := ticker(l.cfg.Task.Every)
	defer stopTask()
	defer l.stopRetry()
	gap := newGapBucket(l.cfg.Burst, l.cfg.MinGap)
	for {
		if !l.wait(ctx, resync, task) {
			return nil
		}
		if !sleep(ctx, gap.take(time.Now())) {
			return nil
		}
		// Drain what arrived meanwhile: this pass covers it.
		select {
		case <-l.dirty:
		default:
		}
		err := l.cfg.Pass(ctx)
		if ctx.Err() != nil {
			return nil
		}
		l.settle(err)
	}
}

// wait blocks until a pass is due, running the task meanwhile; false
// when ctx ended.
func (l *Loop) wait(ctx context.Context, resync, task <-chan time.Time) bool {
	for {
		var wake <-chan struct{}
		if l.cfg.Wake != nil {
			wake = l.cfg.Wake()
		}
		if l.taskDue {
			select {
			case <-l.dirty:
				return true
			default:
			}
			l.runTask(ctx)
			continue
		}
		select {
		case <-ctx.Done():
			return false
		case <-l.dirty:
			return true
		case <-wake:
			return true
		case <-resync:
			return true
		case <-task:
			l.runTask(ctx)
		}
	}
}

// runTask runs the task with a context that a trigger cancels, and
// notes whether the task was cut short.
func (l *Loop) runTask(ctx context.Context) {
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	l.mu.Lock()
	l.preempt = cancel
	l.mu.Unlock()
	if len(l.dirty) > 0 {
		cancel() // a trigger came before preempt was set
	}
	l.cfg.Task.Do(tctx)
	l.mu.Lock()
	l.preempt = nil
	l.mu.Unlock()
	l.taskDue = tctx.Err() != nil && ctx.Err() == nil
}

// settle counts a pass's outcome: a failure schedules a retry after the
// back-off, a success resets it.
func (l *Loop) settle(err error) {
	if err == nil {
		l.failures = 0
		return
	}
	l.failures++
	if l.cfg.Backoff.Min <= 0 {
		return
	}
	l.stopRetry()
	l.retry = time.AfterFunc(l.cfg.Backoff.Delay(l.failures, l.jitter()), l.Trigger)
}

func (l *Loop) stopRetry() {
	if l.retry != nil {
		l.retry.Stop()
	}
}

// gapBucket spaces passes: burst at once, then one every every (a token
// bucket: golang.org/x/time/rate's Limiter).
type gapBucket struct{ lim *rate.Limiter }

func newGapBucket(burst int, every time.Duration) gapBucket {
	limit := rate.Inf
	if every > 0 {
		limit = rate.Every(every)
	}
	return gapBucket{lim: rate.NewLimiter(limit, max(burst, 1))}
}

// take takes a token for a pass starting at now, or after the wait it
// returns.
func (g gapBucket) take(now time.Time) time.Duration {
	return g.lim.ReserveN(now, 1).DelayFrom(now)
}

// ticker is a ticker's channel, nil (never ready) for a zero period; stop
// stops it.
func ticker(every time.Duration) (c <-chan time.Time, stop func()) {
	if every <= 0 {
		return nil, func() {}
	}
	t := time.NewTicker(every)
	return t.C, t.Stop
}

// sleep waits d (nothing when d <= 0); false when ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
