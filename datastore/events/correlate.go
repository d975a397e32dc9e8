package events

import (
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/utils/clock"
	"k8s.io/utils/lru"
)

// cacheSize bounds how many series and how many objects' rate limits the
// correlator remembers, as client-go's recorder does (the least recently
// seen go first).
const cacheSize = 4096

// maxNameLength is the longest object name the API server takes (a DNS
// subdomain).
const maxNameLength = 253

// reference is the involvedObject of an Event about obj: its kind and
// apiVersion (the object's own, or what scheme knows the Go type as),
// name, namespace, uid and resourceVersion, as client-go's
// reference.GetReference makes it.
func reference(scheme *runtime.Scheme, obj runtime.Object) (corev1.ObjectReference, error) {
	if obj == nil {
		return corev1.ObjectReference{}, fmt.Errorf("no object")
	}
	if ref, ok := obj.(*corev1.ObjectReference); ok {
		return *ref, nil
	}
	gvk := obj.GetObjectKind().GroupVersionKind()
	if gvk.Empty() {
		gvks, _, err := scheme.ObjectKinds(obj)
		if err != nil {
			return corev1.ObjectReference{}, err
		}
		gvk = gvks[0]
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return corev1.ObjectReference{}, err
	}
	apiVersion, kind := gvk.ToAPIVersionAndKind()
	return corev1.ObjectReference{
		Kind:            kind,
		APIVersion:      apiVersion,
		Name:            m.GetName(),
		Namespace:       m.GetNamespace(),
		UID:             m.GetUID(),
		ResourceVersion: m.GetResourceVersion(),
	}, nil
}

// makeEvent is the Event a recorder of source writes at t about ref, as
// client-go's recorder makes it: in the object's namespace (default for a
// cluster-scoped object), named after the object and the time, count 1.
func makeEvent(ref corev1.ObjectReference, source corev1.EventSource, t metav1.Time, eventtype, reason, message string) *corev1.Event {
	namespace := ref.Namespace
	if namespace == "" {
		namespace = metav1.NamespaceDefault
	}
	return &corev1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: eventName(ref.Name, t.UnixNano()), Namespace: namespace},
		InvolvedObject:      ref,
		Reason:              reason,
		Message:             message,
		FirstTimestamp:      t,
		LastTimestamp:       t,
		Count:               1,
		Type:                eventtype,
		Source:              source,
		ReportingController: source.Component,
		ReportingInstance:   source.Host,
	}
}

// eventName is "<object name>.<time in hex>", client-go's name for an
// Event; the object's name is cut short where the whole would be longer
// than a name may be (client-go takes a random name then).
func eventName(object string, unixNano int64) string {
	suffix := fmt.Sprintf(".%x", unixNano)
	if len(object)+len(suffix) > maxNameLength {
		object = strings.TrimRight(object[:maxNameLength-len(suffix)], ".-")
	}
	return object + suffix
}

// seriesKey says which Events are one series, counted in one stored
// Event: those of the same source about the same object, with the same
// type, reason and message (client-go's getEventKey).
func seriesKey(e *corev1.Event) string {
	return strings.Join([]string{e.Source.Component, e.Source.Host,
		e.InvolvedObject.Kind, e.InvolvedObject.Namespace, e.InvolvedObject.Name, e.InvolvedObject.FieldPath,
		string(e.InvolvedObject.UID), e.InvolvedObject.APIVersion, e.Type, e.Reason, e.Message}, "\x00")
}

// spamKey says which Events share a rate limit: those of the same source
// about the same object, of one type (client-go's getSpamKey).
func spamKey(e *corev1.Event) string {
	return strings.Join([]string{e.Source.Component, e.Source.Host,
		e.InvolvedObject.Kind, e.InvolvedObject.Namespace, e.InvolvedObject.Name,
		string(e.InvolvedObject.UID), e.InvolvedObject.APIVersion, e.Type}, "\x00")
}

// series is what the correlator knows of a series: its stored Event's
// name, count and first time.
type series struct {
	name  string
	count int32
	first metav1.Time
}

// correlator decides, for each new Event, what to write: a new Event, a
// patch of the series' stored one (count and lastTimestamp), or nothing
// when the object is over its rate limit. It is client-go's
// EventCorrelator without the aggregation of similar messages.
type correlator struct {
	clock  clock.PassiveClock
	qps    float32
	burst  int
	series *lru.Cache // seriesKey → series
	limits *lru.Cache // spamKey → flowcontrol.PassiveRateLimiter
}

func newCorrelator(c clock.PassiveClock, qps float32, burst int) *correlator {
	return &correlator{clock: c, qps: qps, burst: burst, series: lru.New(cacheSize), limits: lru.New(cacheSize)}
}

// decision is what to do with an Event: write e, as a merge patch of the
// stored Event e.Name when patch is set (and create e if that one is
// gone), or skip it.
type decision struct {
	e     *corev1.Event
	patch []byte
	skip  bool
}

// observe counts e in its series and decides what to write. A repeat takes
// the stored Event's name and first time and the next count (counted even
// when the rate limit then skips it, so that the next write carries every
// repeat).
func (c *correlator) observe(e *corev1.Event) decision {
	e = e.DeepCopy()
	var d decision
	key := seriesKey(e)
	if v, ok := c.series.Get(key); ok {
		s := v.(series)
		e.Name = s.name
		e.FirstTimestamp = s.first
		e.Count = s.count + 1
		d.patch = mergePatch(e)
	}
	c.series.Add(key, series{name: e.Name, count: e.Count, first: e.FirstTimestamp})
	d.e = e

	skey := spamKey(e)
	var rl flowcontrol.PassiveRateLimiter
	if v, ok := c.limits.Get(skey); ok {
		rl = v.(flowcontrol.PassiveRateLimiter)
	} else {
		rl = flowcontrol.NewTokenBucketPassiveRateLimiterWithClock(c.qps, c.burst, c.clock)
		c.limits.Add(skey, rl)
	}
	d.skip = !rl.TryAccept()
	return d
}

// stored learns the Event as the API server stored it: the series goes on
// from its name and count.
func (c *correlator) stored(e *corev1.Event) {
	c.series.Add(seriesKey(e), series{name: e.Name, count: e.Count, first: e.FirstTimestamp})
}

// mergePatch is the JSON merge patch that makes a series' stored Event
// e: its count, last time and message.
func mergePatch(e *corev1.Event) []byte {
	p, err := json.Marshal(struct {
		Count         int32       `json:"count"`
		LastTimestamp metav1.Time `json:"lastTimestamp"`
		Message       string      `json:"message"`
	}{e.Count, e.LastTimestamp, e.Message})
	if err != nil {
		panic(err) // three plain fields always marshal
	}
	return p
}
