package events

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
)

func testScheme(t *testing.T) *runtime.Scheme {
	s := runtime.NewScheme()
	if err := corev1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := networkingv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestReference(t *testing.T) {
	cnp := &unstructured.Unstructured{}
	cnp.SetAPIVersion("policy.networking.k8s.io/v1beta1")
	cnp.SetKind("ClusterNetworkPolicy")
	cnp.SetName("cnp")
	cnp.SetUID("u3")
	for _, c := range []struct {
		name string
		obj  runtime.Object
		want corev1.ObjectReference
		err  bool
	}{
		{"a node, kind from the scheme", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", UID: "u1", ResourceVersion: "7"}},
			corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: "n1", UID: "u1", ResourceVersion: "7"}, false},
		{"a NetworkPolicy, of its group", &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u2", ResourceVersion: "9"}},
			corev1.ObjectReference{Kind: "NetworkPolicy", APIVersion: "networking.k8s.io/v1", Name: "p", Namespace: "ns", UID: "u2", ResourceVersion: "9"}, false},
		{"an unstructured object says its own kind", cnp,
			corev1.ObjectReference{Kind: "ClusterNetworkPolicy", APIVersion: "policy.networking.k8s.io/v1beta1", Name: "cnp", UID: "u3"}, false},
		{"a reference is itself", &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Name: "x", Namespace: "y"},
			corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Name: "x", Namespace: "y"}, false},
		{"a type the scheme does not know", &metav1.Status{}, corev1.ObjectReference{}, true},
		{"no object", nil, corev1.ObjectReference{}, true},
	} {
		got, err := reference(testScheme(t), c.obj)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("%s: %+v, %v; want %+v, error %v", c.name, got, err, c.want, c.err)
		}
	}
}

func TestMakeEvent(t *testing.T) {
	at := metav1.NewTime(time.Unix(1700000000, 5))
	src := corev1.EventSource{Component: "tabbyd", Host: "node-a"}
	for _, c := range []struct {
		name      string
		ref       corev1.ObjectReference
		namespace string
		evName    string
	}{
		{"namespaced: the object's namespace", corev1.ObjectReference{Kind: "NetworkPolicy", Name: "p", Namespace: "ns"}, "ns", "p.17979cfe362a0005"},
		{"cluster-scoped: default", corev1.ObjectReference{Kind: "Node", Name: "node-a"}, "default", "node-a.17979cfe362a0005"},
		{"a name too long is cut", corev1.ObjectReference{Kind: "Node", Name: strings.Repeat("a", 240) + ".b"}, "default", strings.Repeat("a", 236) + ".17979cfe362a0005"},
	} {
		e := makeEvent(c.ref, src, at, corev1.EventTypeWarning, "R", "m")
		want := corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: c.evName, Namespace: c.namespace},
			InvolvedObject: c.ref, Reason: "R", Message: "m", FirstTimestamp: at, LastTimestamp: at, Count: 1,
			Type: corev1.EventTypeWarning, Source: src, ReportingController: "tabbyd", ReportingInstance: "node-a",
		}
		if g, w := mustJSON(t, e), mustJSON(t, want); g != w {
			t.Errorf("%s:\n got %s\nwant %s", c.name, g, w)
		}
		if len(e.Name) > maxNameLength {
			t.Errorf("%s: name of %d characters", c.name, len(e.Name))
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestCorrelate sends a sequence of Events through a correlator and checks
// each decision: a repeat patches the first Event of its series, another
// message or object starts its own, and an object past its burst is
// skipped until its rate gives it another.
func TestCorrelate(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1700000000, 0))
	c := newCorrelator(clk, 1./300, 3)
	src := corev1.EventSource{Component: "tabbyd", Host: "n"}
	ev := func(obj, typ, msg string) *corev1.Event {
		return makeEvent(corev1.ObjectReference{Kind: "NetworkPolicy", APIVersion: "networking.k8s.io/v1", Namespace: "ns", Name: obj, UID: types.UID("uid-" + obj)},
			src, metav1.NewTime(clk.Now()), typ, "R", msg)
	}
	type want struct {
		name  string // the Event written (its first's name); "" when skipped
		count int32
		patch bool
	}
	first := ev("p", "Warning", "a").Name
	steps := []struct {
		what          string
		obj, typ, msg string
		step          time.Duration // the clock moves on this much first
		want          want
	}{
		{"the first Event is created", "p", "Warning", "a", 0, want{first, 1, false}},
		{"its repeat patches it", "p", "Warning", "a", time.Minute, want{first, 2, true}},
		{"another message is a new series", "p", "Warning", "b", time.Second, want{"", 1, false}},
		{"the object's burst (3) is spent: skipped", "p", "Warning", "c", time.Second, want{"", 0, false}},
		{"another type of the same object has its own limit", "p", "Normal", "a", 0, want{"", 1, false}},
		{"another object has its own limit", "q", "Warning", "a", 0, want{"", 1, false}},
		{"a skipped repeat still counts", "p", "Warning", "a", 0, want{"", 0, false}},
		{"after 5 minutes the object may send one more: the count carries the skipped one", "p", "Warning", "a", 5 * time.Minute, want{first, 4, true}},
		{"and no second", "p", "Warning", "a", 0, want{"", 0, false}},
	}
	for _, s := range steps {
		clk.Step(s.step)
		e := ev(s.obj, s.typ, s.msg)
		d := c.observe(e)
		if s.want.count == 0 {
			if !d.skip {
				t.Errorf("%s: written (%s count %d), want skipped", s.what, d.e.Name, d.e.Count)
			}
			continue
		}
		if d.skip {
			t.Errorf("%s: skipped", s.what)
			continue
		}
		wantName := s.want.name
		if wantName == "" {
			wantName = e.Name
		}
		if d.e.Name != wantName || d.e.Count != s.want.count || (d.patch != nil) != s.want.patch {
			t.Errorf("%s: %s count %d patch %s; want %s count %d patch %v", s.what, d.e.Name, d.e.Count, d.patch, wantName, s.want.count, s.want.patch)
		}
		if !d.e.LastTimestamp.Equal(&metav1.Time{Time: clk.Now()}) {
			t.Errorf("%s: lastTimestamp %v, want now", s.what, d.e.LastTimestamp)
		}
		if d.patch != nil {
			if d.e.FirstTimestamp.Time != time.Unix(1700000000, 0) {
				t.Errorf("%s: firstTimestamp %v, want the first Event's", s.what, d.e.FirstTimestamp)
			}
			if want := mustJSON(t, map[string]any{"count": d.e.Count, "lastTimestamp": d.e.LastTimestamp, "message": d.e.Message}); string(d.patch) != want {
				t.Errorf("%s: patch %s, want %s", s.what, d.patch, want)
			}
		}
		c.stored(d.e)
	}
}

func fmtHex(n int64) string { return fmt.Sprintf("%x", n) }
