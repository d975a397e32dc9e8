package extender

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/tabbynet/tabby/scheduler-extender/cache"
)

// kube-scheduler binds a pod in a goroutine after its scheduling cycle and
// goes on to the next pod at once, so the next pod's filter request can
// reach the extender before the previous pod's binding is known to it. As
// the extender's view decides pod (anti-)affinity and spread alone, it
// closes that gap itself: every filter and prioritize request first waits
// (at most PlacementWait) for the placements kube-scheduler may be making,
// and POST /bind (kube-scheduler's bindVerb) counts the pod on its node
// before the Binding is created. See package cache, assume.go.

// PlacementWait bounds how long a request waits for kube-scheduler's
// placement of a pod the extender passed nodes for. kube-scheduler sends
// the bind request, or the watch shows the binding, within milliseconds;
// the wait runs out only when the pod's cycle failed after the extender's
// filter (a Reserve or Permit plugin refused it) or its binding waits on
// PreBind (volumes being provisioned).
const PlacementWait = time.Second

// bindTimeout bounds the Binding's creation (kube-scheduler's httpTimeout
// for the whole request is 10 s in deploy/scheduler's configuration).
const bindTimeout = 8 * time.Second

// maxBindBytes bounds a bind request: ExtenderBindingArgs holds a pod's
// namespace, name and UID and a node name.
const maxBindBytes = 16 << 10

// Placements is what the extender knows of kube-scheduler's placements in
// flight and the pods it binds; *cache.Cache is it.
type Placements interface {
	Placing(pod *v1.Pod, passing bool)
	AwaitPlacements(ctx context.Context, pod *v1.Pod, max time.Duration) (cache.AwaitResult, error)
	AssumePod(namespace, name string, uid types.UID, node string) (bool, error)
	FinishBinding(uid types.UID)
	ForgetPod(uid types.UID, node string)
}

var _ Placements = (*cache.Cache)(nil)

// BindFunc creates a Binding through the API server.
type BindFunc func(ctx context.Context, b *v1.Binding) error

// placementMetrics count the waits for placements in flight.
type placementMetrics struct {
	waits   *prometheus.CounterVec
	waiting prometheus.Histogram
}

func newPlacementMetrics(reg prometheus.Registerer) *placementMetrics {
	m := &placementMetrics{
		waits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_scheduler_extender_placement_waits_total",
			Help: "Placements in flight (pods kube-scheduler may be placing) that a filter or prioritize request waited for, by outcome: known (bound, assumed, refiltered or deleted) or overdue (unknown after 1 s; the request went on without it).",
		}, []string{"outcome"}),
		waiting: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tabby_scheduler_extender_placement_wait_seconds",
			Help:    "Time a filter or prioritize request waited for placements in flight, when there were any.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16),
		}),
	}
	reg.MustRegister(m.waits, m.waiting)
	return m
}

// awaitPlacements waits for the placements in flight before pod's request
// is decided.
func (h *Handler) awaitPlacements(ctx context.Context, pod *v1.Pod) {
	if h.Placements == nil {
		return
	}
	start := time.Now()
	res, err := h.Placements.AwaitPlacements(ctx, pod, PlacementWait)
	if res.Waited == 0 {
		return
	}
	if h.placementMetrics != nil {
		h.placementMetrics.waits.WithLabelValues("overdue").Add(float64(len(res.Overdue)))
		h.placementMetrics.waits.WithLabelValues("known").Add(float64(res.Waited - len(res.Overdue)))
		h.placementMetrics.waiting.Observe(time.Since(start).Seconds())
	}
	if len(res.Overdue) > 0 {
		h.log().Warn("placements still unknown after the wait; deciding without them",
			"pod", pod.Namespace+"/"+pod.Name, "overdue", res.Overdue, "wait", PlacementWait)
	}
	if err != nil {
		h.log().Debug("request ended while waiting for placements", "pod", pod.Namespace+"/"+pod.Name, "err", err)
	}
}

func (h *Handler) log() *slog.Logger {
	if h.Log == nil {
		return slog.Default()
	}
	return h.Log
}

// ServeBind answers POST /bind (kube-scheduler's bindVerb) with an
// ExtenderBindingResult: it counts the pod on the node, creates its Binding
// and forgets the pod again when that fails, saying why in Error (so
// kube-scheduler forgets it too and retries).
func (h *Handler) ServeBind(w http.ResponseWriter, r *http.Request) {
	h.instrument("bind", w, func(w *statusWriter, orig http.ResponseWriter) {
		args, err := readBindingArgs(orig, r)
		if err != nil {
			writeRequestError(w, err)
			return
		}
		var res extenderv1.ExtenderBindingResult
		if err := h.bind(r.Context(), args); err != nil {
			h.log().Info("binding failed", "pod", args.PodNamespace+"/"+args.PodName, "uid", args.PodUID, "node", args.Node, "err", err)
			res.Error = err.Error()
		}
		writeJSON(w, &res)
	})
}

// bind assumes the pod on its node and creates the Binding.
func (h *Handler) bind(ctx context.Context, args *extenderv1.ExtenderBindingArgs) error {
	assumed := false
	if h.Placements != nil {
		var err error
		if assumed, err = h.Placements.AssumePod(args.PodNamespace, args.PodName, args.PodUID, args.Node); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, bindTimeout)
	defer cancel()
	// The UID makes the API server refuse the Binding when the pod was
	// deleted and created again under its name.
	err := h.Bind(ctx, &v1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: args.PodNamespace, Name: args.PodName, UID: args.PodUID},
		Target:     v1.ObjectReference{Kind: "Node", Name: args.Node},
	})
	if err != nil {
		if assumed {
			h.Placements.ForgetPod(args.PodUID, args.Node)
		}
		return fmt.Errorf("binding pod %s/%s (UID %s) to node %s: %w", args.PodNamespace, args.PodName, args.PodUID, args.Node, err)
	}
	if assumed {
		h.Placements.FinishBinding(args.PodUID)
	}
	return nil
}

// readBindingArgs reads and checks an ExtenderBindingArgs.
func readBindingArgs(w http.ResponseWriter, r *http.Request) (*extenderv1.ExtenderBindingArgs, error) {
	if err := checkJSON(r); err != nil {
		return nil, err
	}
	buf := getBuffer()
	defer putBuffer(buf) // json.Unmarshal copies what it keeps
	data, err := readBody(buf, http.MaxBytesReader(w, r.Body, maxBindBytes), r.ContentLength)
	if err != nil {
		if errors.As(err, new(*http.MaxBytesError)) {
			return nil, &requestError{http.StatusRequestEntityTooLarge, fmt.Sprintf("a bind request is at most %d bytes", maxBindBytes)}
		}
		return nil, &requestError{http.StatusBadRequest, "reading the request body: " + err.Error()}
	}
	var args extenderv1.ExtenderBindingArgs
	if err := json.Unmarshal(data, &args); err != nil {
		return nil, &requestError{http.StatusBadRequest, "decoding ExtenderBindingArgs (the JSON of k8s.io/kube-scheduler/extender/v1): " + err.Error()}
	}
	for _, f := range []struct{ name, v string }{
		{"PodNamespace", args.PodNamespace}, {"PodName", args.PodName}, {"PodUID", string(args.PodUID)}, {"Node", args.Node},
	} {
		if f.v == "" {
			return nil, &requestError{http.StatusBadRequest, "ExtenderBindingArgs has no " + f.name}
		}
	}
	return &args, nil
}
