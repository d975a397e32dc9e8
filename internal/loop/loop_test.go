package loop

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	heartbeat := Backoff{Min: time.Second, Max: 10 * time.Second, Factor: 2, Jitter: 0.2}
	policy := Backoff{Min: time.Second, Max: 30 * time.Second, Factor: 2}
	routing := Backoff{Min: 2 * time.Second, Max: 2 * time.Second}
	for _, c := range []struct {
		name     string
		b        Backoff
		failures int
		r        float64
		want     time.Duration
	}{
		{"first", heartbeat, 1, 0, time.Second},
		{"doubles", heartbeat, 2, 0, 2 * time.Second},
		{"doubles again", heartbeat, 4, 0, 8 * time.Second},
		{"capped", heartbeat, 5, 0, 10 * time.Second},
		{"capped far out", heartbeat, 1000, 0, 10 * time.Second},
		{"jitter up", heartbeat, 1, 1, 1200 * time.Millisecond},
		{"jitter down", heartbeat, 1, -1, 800 * time.Millisecond},
		{"jitter on the cap", heartbeat, 9, 1, 12 * time.Second},
		{"policy 5th", policy, 5, 0, 16 * time.Second},
		{"policy capped", policy, 6, 0, 30 * time.Second},
		{"no jitter ignores r", policy, 1, 1, time.Second},
		{"constant", routing, 1, 0, 2 * time.Second},
		{"constant stays", routing, 50, 0, 2 * time.Second},
	} {
		if got := c.b.Delay(c.failures, c.r); got != c.want {
			t.Errorf("%s: Delay(%d, %v) = %v, want %v", c.name, c.failures, c.r, got, c.want)
		}
	}
}

// passes records when passes ran.
type passes struct {
	mu    sync.Mutex
	times []time.Time
}

func (p *passes) add() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.times = append(p.times, time.Now())
	return len(p.times)
}

func (p *passes) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.times)
}

func (p *passes) gaps() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var g []time.Duration
	for i := 1; i < len(p.times); i++ {
		g = append(g, p.times[i].Sub(p.times[i-1]))
	}
	return g
}

// start runs l until the test ends, and fails the test if Run does not
// return once its context is cancelled.
func start(t *testing.T, l *Loop) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { wait(t, cancel, done) }) }
	t.Cleanup(stop)
	return stop
}

func wait(t *testing.T, cancel func(), done chan error) {
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run returned %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// TestCoalescing: a thousand triggers while a pass runs make one more
// pass, not a thousand.
func TestCoalescing(t *testing.T) {
	var p passes
	inPass, release := make(chan struct{}), make(chan struct{})
	l := New(Config{Pass: func(context.Context) error {
		if p.add() == 1 {
			close(inPass)
			<-release
		}
		return nil
	}, MinGap: 5 * time.Millisecond})
	start(t, l)
	<-inPass
	for range 1000 {
		l.Trigger()
	}
	close(release)
	time.Sleep(200 * time.Millisecond)
	if n := p.count(); n != 2 {
		t.Fatalf("%d passes, want 2 (the first, and one for all 1000 triggers)", n)
	}
	// MinGap spaced them.
	if g := p.gaps()[0]; g < 5*time.Millisecond {
		t.Errorf("the coalesced pass ran %v after the first, want at least MinGap", g)
	}
}

// TestBackoffGrowsAndResets: failed passes are retried after a delay that
// doubles up to Max; a success resets it, so the next failure waits Min
// again. No trigger and no resync: every pass after the first is a retry.
func TestBackoffGrowsAndResets(t *testing.T) {
	const unit = 40 * time.Millisecond
	var p passes
	// Passes 1-4 fail, 5 succeeds, 6 is triggered and fails, 7 succeeds.
	fail := map[int]bool{1: true, 2: true, 3: true, 4: true, 6: true}
	var failures []int
	var l *Loop
	l = New(Config{Pass: func(context.Context) error {
		n := p.add()
		p.mu.Lock()
		failures = append(failures, l.Failures())
		p.mu.Unlock()
		if fail[n] {
			return errors.New("boom")
		}
		return nil
	}, Backoff: Backoff{Min: unit, Max: 4 * unit, Factor: 2, Jitter: 0.5}})
	l.jitter = func() float64 { return 0 }
	start(t, l)
	waitFor(t, func() bool { return p.count() == 5 })
	time.Sleep(6 * unit)
	if n := p.count(); n != 5 {
		t.Fatalf("%d passes after a success, want 5: a success must stop the retries", n)
	}
	l.Trigger()
	waitFor(t, func() bool { return p.count() == 7 })
	g := p.gaps()
	want := []time.Duration{unit, 2 * unit, 4 * unit, 4 * unit}
	for i, w := range want {
		if g[i] < w || g[i] > w+3*unit/2 {
			t.Errorf("retry %d ran %v after the failure, want about %v", i+1, g[i], w)
		}
	}
	if g[5] < unit || g[5] > unit+3*unit/2 {
		t.Errorf("the retry after a reset ran %v after the failure, want about %v (Min again)", g[5], unit)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if want := []int{0, 1, 2, 3, 4, 0, 1}; !slices.Equal(failures, want) {
		t.Errorf("failures in a row seen by the passes: %v, want %v", failures, want)
	}
}

// TestJitterSpreads: with jitter the retries of two loops fall apart.
func TestJitterSpreads(t *testing.T) {
	b := Backoff{Min: time.Second, Max: 10 * time.Second, Factor: 2, Jitter: 0.2}
	l := New(Config{Backoff: b})
	seen := map[time.Duration]bool{}
	for range 50 {
		d := b.Delay(3, l.jitter())
		if d < 3200*time.Millisecond || d > 4800*time.Millisecond {
			t.Fatalf("delay %v outside 4s ± 20%%", d)
		}
		seen[d] = true
	}
	if len(seen) < 10 {
		t.Errorf("50 jittered delays took only %d values", len(seen))
	}
}

// TestResync: without triggers, passes come every Resync.
func TestResync(t *testing.T) {
	var p passes
	l := New(Config{Pass: func(context.Context) error { p.add(); return nil }, Resync: 20 * time.Millisecond})
	start(t, l)
	waitFor(t, func() bool { return p.count() >= 4 })
}

// TestTaskRunsWithoutPass: the task runs on its period, and does not
// cause passes.
func TestTaskRunsWithoutPass(t *testing.T) {
	var p passes
	var ticks atomic.Int32
	l := New(Config{Pass: func(context.Context) error { p.add(); return nil },
		Task: Task{Every: 10 * time.Millisecond, Do: func(context.Context) { ticks.Add(1) }}})
	start(t, l)
	waitFor(t, func() bool { return ticks.Load() >= 5 })
	if n := p.count(); n != 1 {
		t.Errorf("%d passes, want 1: the task must not trigger passes", n)
	}
}

// TestTriggerPreemptsTask: a trigger while the task runs cancels the
// task's context and the pass runs; the task cut short runs again after
// the pass, without waiting for its period (an hour here).
func TestTriggerPreemptsTask(t *testing.T) {
	var p passes
	var calls atomic.Int32
	running := make(chan struct{})
	var firstCut, secondCut atomic.Bool
	l := New(Config{Pass: func(context.Context) error { p.add(); return nil },
		Task: Task{Every: time.Hour, Do: func(ctx context.Context) {
			switch calls.Add(1) {
			case 1:
				close(running)
				<-ctx.Done() // a check that would otherwise hold the loop
				firstCut.Store(true)
			default:
				secondCut.Store(ctx.Err() != nil)
			}
		}}})
	l.taskDue = true // as after a task cut short, without waiting an hour
	start(t, l)
	<-running
	if n := p.count(); n != 1 {
		t.Fatalf("%d passes before the task, want 1: the pending pass goes first", n)
	}
	l.Trigger()
	waitFor(t, func() bool { return p.count() == 2 && calls.Load() == 2 })
	if !firstCut.Load() {
		t.Error("the trigger did not cancel the running task's context")
	}
	if secondCut.Load() {
		t.Error("the task's second run had a cancelled context")
	}
}

// TestWake: a receive on the Wake channel triggers a pass, and Wake is
// asked again each time (the channel may be replaced).
func TestWake(t *testing.T) {
	var p passes
	var mu sync.Mutex
	ch := make(chan struct{}, 1)
	l := New(Config{Pass: func(context.Context) error { p.add(); return nil },
		Wake: func() <-chan struct{} { mu.Lock(); defer mu.Unlock(); return ch }})
	start(t, l)
	waitFor(t, func() bool { return p.count() == 1 })
	mu.Lock()
	ch = make(chan struct{}, 1)
	ch <- struct{}{}
	mu.Unlock()
	l.Trigger() // makes the loop ask Wake again
	waitFor(t, func() bool { return p.count() == 3 })
}

// TestStop: Run returns when its context ends, in a pass (once the pass
// returns), in the MinGap wait and in the back-off wait; no pass runs
// after it returned, and a pending retry does not fire one.
func TestStop(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
		in   string // where the loop is when stopped
	}{
		{"in a pass", Config{}, "pass"},
		{"waiting for a trigger", Config{}, "wait"},
		{"in the MinGap wait", Config{MinGap: time.Hour}, "gap"},
		{"with a retry pending", Config{Backoff: Backoff{Min: 50 * time.Millisecond}}, "retry"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var p passes
			inPass, release := make(chan struct{}, 1), make(chan struct{})
			cfg := c.cfg
			cfg.Pass = func(ctx context.Context) error {
				p.add()
				inPass <- struct{}{}
				if c.in == "pass" {
					<-ctx.Done()
					<-release
				}
				if c.in == "retry" {
					return errors.New("boom")
				}
				return nil
			}
			l := New(cfg)
			stop := start(t, l)
			<-inPass
			if c.in == "gap" {
				l.Trigger()
			}
			if c.in == "pass" {
				go func() { time.Sleep(50 * time.Millisecond); close(release) }()
			}
			time.Sleep(10 * time.Millisecond)
			stop()
			n := p.count()
			l.Trigger()
			time.Sleep(150 * time.Millisecond)
			if p.count() != n || n != 1 {
				t.Errorf("%d passes, %d after Run returned; want 1 and none", n, p.count())
			}
		})
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestGapBucket: after a quiet spell Burst passes start at once, then one
// every MinGap; tokens come back with time, never more than Burst; Burst 1
// is a pass at most every MinGap counted from the last start; no MinGap
// never waits.
func TestGapBucket(t *testing.T) {
	ms := func(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name  string
		burst int
		every time.Duration
		at    []float64 // pass triggers, ms after t0
		want  []float64 // waits, ms
	}{
		{"burst of three, then spaced", 3, ms(10), []float64{0, 1, 2, 3, 4}, []float64{0, 0, 0, 7, 16}},
		{"tokens come back", 3, ms(10), []float64{0, 1, 2, 50, 51, 52, 53}, []float64{0, 0, 0, 0, 0, 0, 7}},
		{"never above the burst", 2, ms(10), []float64{0, 1000, 1001, 1002}, []float64{0, 0, 0, 8}},
		{"burst one: MinGap from the last start", 1, ms(10), []float64{0, 3, 30, 31}, []float64{0, 7, 0, 9}},
		{"no MinGap", 3, 0, []float64{0, 0, 0, 0, 0}, []float64{0, 0, 0, 0, 0}},
	} {
		g := newGapBucket(tc.burst, tc.every)
		var got []float64
		for _, at := range tc.at {
			got = append(got, float64(g.take(t0.Add(ms(at))))/float64(time.Millisecond))
		}
		for i := range got {
			if d := got[i] - tc.want[i]; d > 0.001 || d < -0.001 {
				t.Errorf("%s: waits %v, want %v", tc.name, got, tc.want)
				break
			}
		}
	}
}
