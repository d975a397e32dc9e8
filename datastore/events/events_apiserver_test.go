package events

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
)

func TestMain(m *testing.M) { clustertest.Main(m, nil) }

// world is a namespace of its own on the package's API server, with a
// ConfigMap and a Node to record Events about; the test's end deletes
// them and their Events.
type world struct {
	ds    *datastore.Client
	ns    string
	cm    *corev1.ConfigMap
	node  *corev1.Node
	clock *clocktesting.FakeClock
}

func newWorld(t *testing.T, name string) *world {
	t.Helper()
	ds := clustertest.Client(t)
	ctx := context.Background()
	w := &world{ds: ds, ns: name, clock: clocktesting.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))}
	if _, err := ds.Namespaces.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ds.Namespaces.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	cms := datastore.NewResource("configmaps", ds.CoreREST(), datastore.ParameterCodec, name,
		func() *corev1.ConfigMap { return &corev1.ConfigMap{} }, func() *corev1.ConfigMapList { return &corev1.ConfigMapList{} })
	var err error
	if w.cm, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if w.node, err = ds.Nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name + "-node"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = ds.Nodes.Delete(ctx, w.node.Name, metav1.DeleteOptions{})
		_ = Client(ds, metav1.NamespaceDefault).DeleteCollection(ctx, metav1.DeleteOptions{},
			metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("involvedObject.name", w.node.Name).String()})
	})
	return w
}

// writer is a Writer of the world's clock that does not run: flush writes
// what it queued.
func (w *world) writer(t *testing.T, opts Options) *Writer {
	opts.DS, opts.Scheme, opts.Clock = w.ds, testScheme(t), w.clock
	opts.Source = corev1.EventSource{Component: "tabbyd", Host: "node-a"}
	opts.Log = slog.New(slog.DiscardHandler)
	return newWriter(opts)
}

// flush writes the Events wr queued, as its goroutine would.
func flush(wr *Writer) {
	for {
		select {
		case e := <-wr.queue:
			wr.record(context.Background(), e, 1)
		default:
			return
		}
	}
}

// events lists the Events of namespace about the object name, oldest first
// (their names end in their first time, in hex of one length).
func (w *world) events(t *testing.T, namespace, name string) []corev1.Event {
	t.Helper()
	l, err := Client(w.ds, namespace).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.name", name).String()})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(l.Items, func(a, b corev1.Event) int { return strings.Compare(a.Name, b.Name) })
	return l.Items
}

// TestRecordAPIServer: one Event makes one Event object, as client-go's
// recorder makes it; its repeat counts in it; another message makes
// another; a repeat of a deleted Event makes it again; an Event about a
// cluster-scoped object goes to the default namespace.
func TestRecordAPIServer(t *testing.T) {
	w := newWorld(t, "events-record")
	wr := w.writer(t, Options{})
	t0 := w.clock.Now()
	wr.Event(w.cm, corev1.EventTypeWarning, "Broken", "it is broken")
	flush(wr)
	got := w.events(t, w.ns, "cm")
	if len(got) != 1 {
		t.Fatalf("%d Events after one, want 1: %+v", len(got), got)
	}
	e := got[0]
	wantRef := corev1.ObjectReference{Kind: "ConfigMap", APIVersion: "v1", Name: "cm", Namespace: w.ns, UID: w.cm.UID, ResourceVersion: w.cm.ResourceVersion}
	if e.InvolvedObject != wantRef {
		t.Errorf("involvedObject %+v, want %+v", e.InvolvedObject, wantRef)
	}
	if want := "cm." + fmtHex(t0.UnixNano()); e.Name != want || e.Namespace != w.ns {
		t.Errorf("Event %s/%s, want %s/%s", e.Namespace, e.Name, w.ns, want)
	}
	if e.Type != corev1.EventTypeWarning || e.Reason != "Broken" || e.Message != "it is broken" || e.Count != 1 ||
		e.Source != (corev1.EventSource{Component: "tabbyd", Host: "node-a"}) || e.ReportingController != "tabbyd" || e.ReportingInstance != "node-a" ||
		!e.FirstTimestamp.Time.Equal(t0) || !e.LastTimestamp.Time.Equal(t0) {
		t.Errorf("Event %+v", e)
	}

	// The same again, later: the same Event, counted.
	w.clock.Step(time.Minute)
	wr.Event(w.cm, corev1.EventTypeWarning, "Broken", "it is broken")
	flush(wr)
	got = w.events(t, w.ns, "cm")
	if len(got) != 1 || got[0].Name != e.Name || got[0].Count != 2 || !got[0].FirstTimestamp.Time.Equal(t0) || !got[0].LastTimestamp.Time.Equal(w.clock.Now()) {
		t.Fatalf("after a repeat: %+v; want %s count 2, last %v", got, e.Name, w.clock.Now())
	}

	// Another message: another Event.
	w.clock.Step(time.Second)
	wr.Event(w.cm, corev1.EventTypeWarning, "Broken", "it is broken otherwise")
	flush(wr)
	got = w.events(t, w.ns, "cm")
	if len(got) != 2 || got[0].Count != 2 || got[1].Message != "it is broken otherwise" || got[1].Count != 1 || got[1].Name == e.Name {
		t.Fatalf("after another message: %+v", got)
	}

	// The first is deleted: its repeat makes it again, counted on.
	if err := Client(w.ds, w.ns).Delete(context.Background(), e.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	w.clock.Step(time.Second)
	wr.Event(w.cm, corev1.EventTypeWarning, "Broken", "it is broken")
	flush(wr)
	got = w.events(t, w.ns, "cm")
	if len(got) != 2 || got[0].Name != e.Name || got[0].Message != "it is broken" || got[0].Count != 3 {
		t.Fatalf("after the repeat of a deleted Event: %+v", got)
	}

	// A cluster-scoped object: the default namespace.
	wr.Event(w.node, corev1.EventTypeNormal, "Hello", "node event")
	flush(wr)
	got = w.events(t, metav1.NamespaceDefault, w.node.Name)
	if len(got) != 1 || got[0].InvolvedObject.Kind != "Node" || got[0].InvolvedObject.Namespace != "" || got[0].InvolvedObject.UID != w.node.UID || got[0].Type != corev1.EventTypeNormal {
		t.Fatalf("Events about the node: %+v", got)
	}

	// An unknown type is not recorded.
	wr.Event(w.cm, "Odd", "Broken", "odd")
	if len(wr.queue) != 0 {
		t.Errorf("an Event of type Odd was queued")
	}
}

// TestRateLimitAPIServer: one object gets its burst of Events written and
// then one per 5 minutes; another object has its own.
func TestRateLimitAPIServer(t *testing.T) {
	w := newWorld(t, "events-limit")
	wr := w.writer(t, Options{})
	for i := range DefaultBurst + 5 {
		wr.Event(w.cm, corev1.EventTypeWarning, "Broken", "problem "+fmtHex(int64(i)))
		w.clock.Step(time.Millisecond) // names of their own
	}
	wr.Event(w.node, corev1.EventTypeWarning, "Broken", "another object")
	flush(wr)
	if got := w.events(t, w.ns, "cm"); len(got) != DefaultBurst {
		t.Fatalf("%d Events about one object after %d, want its burst, %d", len(got), DefaultBurst+5, DefaultBurst)
	}
	if got := w.events(t, metav1.NamespaceDefault, w.node.Name); len(got) != 1 {
		t.Fatalf("%d Events about another object, want 1", len(got))
	}
	w.clock.Step(5 * time.Minute)
	wr.Event(w.cm, corev1.EventTypeWarning, "Broken", "after 5 minutes")
	wr.Event(w.cm, corev1.EventTypeWarning, "Broken", "and one more")
	flush(wr)
	got := w.events(t, w.ns, "cm")
	var msgs []string
	for _, e := range got[DefaultBurst:] {
		msgs = append(msgs, e.Message)
	}
	if !slices.Equal(msgs, []string{"after 5 minutes"}) {
		t.Fatalf("5 minutes later: %q written, want only the first", msgs)
	}
}

// TestStopAPIServer: Stop writes what is queued and ends the writer's
// goroutine; Event then does nothing. Event never waits for the writer:
// with the queue full, it drops the Event.
func TestStopAPIServer(t *testing.T) {
	w := newWorld(t, "events-stop")
	opts := Options{DS: w.ds, Scheme: testScheme(t), Source: corev1.EventSource{Component: "tabbyd", Host: "node-a"}, Log: slog.New(slog.NewTextHandler(testWriter{t}, nil))}
	wr := New(opts)
	for i := range 5 {
		wr.Event(w.cm, corev1.EventTypeWarning, "Broken", "problem "+fmtHex(int64(i)))
	}
	wr.Stop()
	select {
	case <-wr.done:
	default:
		t.Fatal("Stop returned before the writer ended")
	}
	if got := w.events(t, w.ns, "cm"); len(got) != 5 {
		t.Errorf("%d Events written by Stop, want the 5 queued", len(got))
	}
	wr.Event(w.cm, corev1.EventTypeWarning, "Broken", "after Stop")
	if len(wr.queue) != 0 {
		t.Errorf("an Event after Stop was queued")
	}
	wr.Stop() // a second Stop returns too

	// Events still queued when Stop comes are written.
	drained := newWriter(opts)
	for i := range 3 {
		drained.Event(w.cm, corev1.EventTypeWarning, "Drained", "problem "+fmtHex(int64(i)))
	}
	drained.stopOnce.Do(func() { close(drained.stop) }) // Stop before the writer takes any
	go drained.run()
	drained.Stop()
	n := 0
	for _, e := range w.events(t, w.ns, "cm") {
		if e.Reason == "Drained" {
			n++
		}
	}
	if n != 3 {
		t.Errorf("%d Events written after Stop, want the 3 queued", n)
	}

	// A full queue: the Event is dropped and counted, the caller goes on.
	opts.Queue = 1
	full := newWriter(opts)
	full.Event(w.cm, corev1.EventTypeWarning, "Broken", "fits")
	full.Event(w.cm, corev1.EventTypeWarning, "Broken", "dropped")
	if len(full.queue) != 1 || full.dropped.Load() != 1 {
		t.Errorf("queue of 1 after 2 Events: %d queued, %d dropped; want 1 and 1", len(full.queue), full.dropped.Load())
	}
	if e := <-full.queue; e.Message != "fits" {
		t.Errorf("queued %q, want the first", e.Message)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }
