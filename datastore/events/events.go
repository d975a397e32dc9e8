// Package events records Kubernetes Events (core/v1) about API objects,
// the way client-go's tools/record does for what tabby needs of it:
// Event never blocks its caller, a repeat of an Event counts in the
// stored one instead of making another, and one object cannot flood the
// API server.
//
// It is not client-go's recorder, which links strategic merge patch and
// with it OpenAPI, gnostic, go-openapi and yaml: 31 packages, a large
// part of tabbyd's binary, whose pages are most of its memory.
package events

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/tabbynet/tabby/datastore"
)

// Recorder records an Event about an object; it never blocks.
type Recorder interface {
	// Event records an Event of eventtype (corev1.EventTypeNormal or
	// EventTypeWarning) about object.
	Event(object runtime.Object, eventtype, reason, message string)
}

// The defaults of Options, client-go's recorder's.
const (
	// DefaultQueue Events wait to be written at most; more are dropped.
	DefaultQueue = 1000
	// DefaultBurst Events about one object are written at once, and then
	// one every 1/DefaultQPS seconds.
	DefaultBurst = 25
	// DefaultQPS is one Event every 5 minutes per object past the burst.
	DefaultQPS = 1. / 300
	// tries is how many times a write that fails on the way is tried,
	// sleep apart (the first sleep shorter, at random).
	tries = 12
	sleep = 10 * time.Second
	// dropLog is how often the drops of a full queue are logged at most.
	dropLog = time.Minute
)

// Options configure a Writer.
type Options struct {
	// DS writes the Events.
	DS *datastore.Client
	// Scheme gives the kind and version of the objects Events are about.
	Scheme *runtime.Scheme
	// Source is the Events' source, and their reporting controller
	// (Component) and instance (Host).
	Source corev1.EventSource
	// Log takes the Events that cannot be written and the drops; nil:
	// slog.Default().
	Log *slog.Logger
	// Clock times the Events and the rate limits; nil: the real one.
	Clock clock.Clock
	// Queue, Burst and QPS: see DefaultQueue, DefaultBurst, DefaultQPS (0
	// means the default).
	Queue int
	Burst int
	QPS   float32
}

// Writer is a Recorder writing its Events to the API server from one
// goroutine, until Stop.
type Writer struct {
	opts  Options
	log   *slog.Logger
	clock clock.Clock
	queue chan *corev1.Event
	corr  *correlator
	// sleep is the time between tries of a write.
	sleep time.Duration

	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}

	dropped atomic.Int64 // Events dropped, in all
	// The last log of the drops: when (Unix nanoseconds), and dropped then.
	lastDropLog, droppedLogged atomic.Int64
}

var _ Recorder = (*Writer)(nil)

// New starts a Writer.
func New(opts Options) *Writer {
	w := newWriter(opts)
	go w.run()
	return w
}

// newWriter is a Writer that does not write yet (run does).
func newWriter(opts Options) *Writer {
	if opts.Queue <= 0 {
		opts.Queue = DefaultQueue
	}
	if opts.Burst <= 0 {
		opts.Burst = DefaultBurst
	}
	if opts.QPS <= 0 {
		opts.QPS = DefaultQPS
	}
	w := &Writer{opts: opts, log: opts.Log, clock: opts.Clock, queue: make(chan *corev1.Event, opts.Queue),
		sleep: sleep, stop: make(chan struct{}), done: make(chan struct{})}
	if w.log == nil {
		w.log = slog.Default()
	}
	if w.clock == nil {
		w.clock = clock.RealClock{}
	}
	w.corr = newCorrelator(w.clock, opts.QPS, opts.Burst)
	return w
}

// Event queues an Event about object, timed now; when the queue is full
// it drops it (and says so in the log, once in a while). After Stop it
// does nothing.
func (w *Writer) Event(object runtime.Object, eventtype, reason, message string) {
	if eventtype != corev1.EventTypeNormal && eventtype != corev1.EventTypeWarning {
		w.log.Error("an Event of an unknown type is not recorded", "type", eventtype, "reason", reason, "message", message)
		return
	}
	ref, err := reference(w.opts.Scheme, object)
	if err != nil {
		w.log.Error("an Event about an object without a reference is not recorded", "error", err, "reason", reason, "message", message)
		return
	}
	e := makeEvent(ref, w.opts.Source, metav1.NewTime(w.clock.Now()), eventtype, reason, message)
	if w.stopped() {
		return
	}
	select {
	case w.queue <- e:
		return
	default:
	}
	n := w.dropped.Add(1)
	now, last := w.clock.Now().UnixNano(), w.lastDropLog.Load()
	if now-last >= int64(dropLog) && w.lastDropLog.CompareAndSwap(last, now) {
		w.log.Warn("Events dropped: too many wait to be written", "dropped", n-w.droppedLogged.Swap(n), "queue", cap(w.queue))
	}
}

// Stop stops taking Events, writes those queued (trying each once, for
// datastore.Timeout in all; past that the rest are dropped), and returns
// when the writer has ended.
func (w *Writer) Stop() {
	w.stopOnce.Do(func() { close(w.stop) })
	<-w.done
}

// run writes the queued Events until Stop, then what is left.
func (w *Writer) run() {
	defer close(w.done)
	for {
		select {
		case e := <-w.queue:
			w.record(context.Background(), e, tries)
		case <-w.stop:
			dctx, dcancel := context.WithTimeout(context.Background(), datastore.Timeout)
			defer dcancel()
			for {
				select {
				case e := <-w.queue:
					if dctx.Err() != nil {
						w.log.Error("Events not written: the writer stopped", "events", len(w.queue)+1)
						return
					}
					w.record(dctx, e, 1)
				default:
					return
				}
			}
		}
	}
}

// record writes e as its correlation decides, trying up to n times while
// the write fails on the way (not when the API server refuses it), until
// ctx ends or Stop (which lets a write under way finish, but ends the
// sleep before the next try).
func (w *Writer) record(ctx context.Context, e *corev1.Event, n int) {
	d := w.corr.observe(e)
	if d.skip {
		return
	}
	for try := 1; ; try++ {
		stored, err := w.write(ctx, d)
		if err == nil {
			w.corr.stored(stored)
			return
		}
		var status apierrors.APIStatus
		var construct *rest.RequestConstructionError
		if errors.As(err, &status) || errors.As(err, &construct) {
			w.log.Error("the API server refused an Event (not retried)", "error", err, "object", objectName(d.e), "reason", d.e.Reason, "message", d.e.Message)
			return
		}
		if try >= n || ctx.Err() != nil || w.stopped() {
			w.log.Error("an Event could not be written", "error", err, "tries", try, "object", objectName(d.e), "reason", d.e.Reason, "message", d.e.Message)
			return
		}
		delay := w.sleep
		if try == 1 {
			delay = time.Duration(rand.Float64() * float64(delay))
		}
		select {
		case <-ctx.Done():
		case <-w.stop:
		case <-w.clock.After(delay):
		}
	}
}

// stopped says whether Stop was called.
func (w *Writer) stopped() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

// write makes the decision's Event: patches the stored one, or creates it
// when there is none (any more).
func (w *Writer) write(ctx context.Context, d decision) (*corev1.Event, error) {
	ctx, cancel := context.WithTimeout(ctx, datastore.Timeout)
	defer cancel()
	c := Client(w.opts.DS, d.e.Namespace)
	if d.patch != nil {
		stored, err := c.Patch(ctx, d.e.Name, types.MergePatchType, d.patch, metav1.PatchOptions{})
		if !apierrors.IsNotFound(err) {
			return stored, err
		}
	}
	e := d.e.DeepCopy()
	e.ResourceVersion = ""
	return c.Create(ctx, e, metav1.CreateOptions{})
}

// EventClient is a client of the Events of one namespace.
type EventClient = datastore.Resource[*corev1.Event, *corev1.EventList]

// Client is the client of the Events (core/v1) of namespace
// (metav1.NamespaceAll: of every namespace) of ds.
func Client(ds *datastore.Client, namespace string) *EventClient {
	return datastore.NewResource[*corev1.Event, *corev1.EventList]("events", ds.CoreREST(), datastore.ParameterCodec, namespace,
		func() *corev1.Event { return &corev1.Event{} }, func() *corev1.EventList { return &corev1.EventList{} })
}

// objectName is "kind namespace/name" of e's object, for the log.
func objectName(e *corev1.Event) string {
	o := e.InvolvedObject
	if o.Namespace == "" {
		return o.Kind + " " + o.Name
	}
	return o.Kind + " " + o.Namespace + "/" + o.Name
}
