package extender

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// DefaultMaxRequestBytes bounds a request body. kube-scheduler sends full
// Node objects unless the extender is nodeCacheCapable, and a Node with its
// image list is often 5-10 KB, so 5,000 nodes need tens of MiB.
const DefaultMaxRequestBytes = 64 << 20

// ReasonNoNodeCache is the FailedNodes reason for every node when
// kube-scheduler sends only node names.
const ReasonNoNodeCache = "tabby-scheduler-extender runs without a node cache; configure nodeCacheCapable: false for this extender"

// NodeCache resolves node names to Nodes when kube-scheduler is configured
// with nodeCacheCapable: true. Nil means there is none.
type NodeCache interface {
	Node(name string) (*v1.Node, bool)
}

// Handler serves POST /filter and POST /prioritize.
type Handler struct {
	Scheduler       Scheduler
	Nodes           NodeCache // nil: NodeNames-only requests fail every node
	MaxRequestBytes int64     // 0: DefaultMaxRequestBytes
	Metrics         *Metrics  // nil: none
}

// Metrics counts and times the extender's requests per verb.
type Metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewMetrics registers the extender's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_scheduler_extender_requests_total",
			Help: "Requests from kube-scheduler by verb (filter, prioritize) and HTTP status code.",
		}, []string{"verb", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tabby_scheduler_extender_request_duration_seconds",
			Help:    "Time to answer a request from kube-scheduler, by verb, including decoding and encoding.",
			Buckets: prometheus.ExponentialBuckets(0.00025, 2, 16),
		}, []string{"verb"}),
	}
	reg.MustRegister(m.requests, m.duration)
	return m
}

func (m *Metrics) observe(verb string, code int, d time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(verb, strconv.Itoa(code)).Inc()
	m.duration.WithLabelValues(verb).Observe(d.Seconds())
}

// Register adds the two verbs to mux.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.HandleFunc("POST /filter", h.ServeFilter)
	mux.HandleFunc("POST /prioritize", h.ServePrioritize)
}

// statusWriter remembers the status code for the metrics.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// instrument runs f with a writer that records the status code; f gets the
// original writer too, for http.MaxBytesReader (which closes the connection
// after an oversized body only when given the server's own writer).
func (h *Handler) instrument(verb string, w http.ResponseWriter, f func(sw *statusWriter, orig http.ResponseWriter)) {
	start := time.Now()
	sw := &statusWriter{ResponseWriter: w}
	f(sw, w)
	if sw.code == 0 {
		sw.code = http.StatusOK
	}
	h.Metrics.observe(verb, sw.code, time.Since(start))
}

// requestError is a client mistake: its code is 4xx.
type requestError struct {
	code int
	msg  string
}

func (e *requestError) Error() string { return e.msg }

// decodeArgs reads an ExtenderArgs from r, or says why it cannot.
func (h *Handler) decodeArgs(w http.ResponseWriter, r *http.Request) (*extenderv1.ExtenderArgs, error) {
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return nil, &requestError{http.StatusUnsupportedMediaType, fmt.Sprintf("Content-Type is %q; want application/json", ct)}
	}
	limit := h.MaxRequestBytes
	if limit <= 0 {
		limit = DefaultMaxRequestBytes
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit))
	var args extenderv1.ExtenderArgs
	if err := dec.Decode(&args); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &requestError{http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is larger than %d bytes (see --max-request-bytes)", limit)}
		}
		return nil, &requestError{http.StatusBadRequest, "decoding ExtenderArgs: " + err.Error()}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &requestError{http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is larger than %d bytes (see --max-request-bytes)", limit)}
		}
		return nil, &requestError{http.StatusBadRequest, "decoding ExtenderArgs: data after the JSON object"}
	}
	if args.Pod == nil {
		return nil, &requestError{http.StatusBadRequest, "ExtenderArgs has no Pod"}
	}
	if args.Nodes == nil && args.NodeNames == nil {
		return nil, &requestError{http.StatusBadRequest, "ExtenderArgs has neither Nodes nor NodeNames"}
	}
	return &args, nil
}

func writeRequestError(w http.ResponseWriter, err error) {
	var re *requestError
	if errors.As(err, &re) {
		http.Error(w, re.msg, re.code)
		return
	}
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encoding the answer: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// resolve returns the Nodes the request is about, and the names it could not
// resolve with the reason. Full Nodes win when both are present.
func (h *Handler) resolve(args *extenderv1.ExtenderArgs) (nodes []*v1.Node, unresolved map[string]string) {
	if args.Nodes != nil {
		nodes = make([]*v1.Node, len(args.Nodes.Items))
		for i := range args.Nodes.Items {
			nodes[i] = &args.Nodes.Items[i]
		}
		return nodes, nil
	}
	unresolved = map[string]string{}
	for _, name := range *args.NodeNames {
		if h.Nodes == nil {
			unresolved[name] = ReasonNoNodeCache
			continue
		}
		n, ok := h.Nodes.Node(name)
		if !ok {
			unresolved[name] = "node " + name + " is not in tabby-scheduler-extender's node cache yet"
			continue
		}
		nodes = append(nodes, n)
	}
	return nodes, unresolved
}

// ServeFilter answers POST /filter with an ExtenderFilterResult: passing
// nodes as Nodes, or as NodeNames when the request carried NodeNames.
func (h *Handler) ServeFilter(w http.ResponseWriter, r *http.Request) {
	h.instrument("filter", w, func(w *statusWriter, orig http.ResponseWriter) {
		args, err := h.decodeArgs(orig, r)
		if err != nil {
			writeRequestError(w, err)
			return
		}
		nodes, unresolved := h.resolve(args)
		res := h.Scheduler.Filter(r.Context(), args.Pod, nodes)
		out := extenderv1.ExtenderFilterResult{
			FailedNodes:                extenderv1.FailedNodesMap{},
			FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{},
		}
		for name, why := range unresolved {
			out.FailedNodes[name] = why
		}
		for name, why := range res.Failed {
			out.FailedNodes[name] = why
		}
		for name, why := range res.Unresolvable {
			out.FailedAndUnresolvableNodes[name] = why
		}
		if args.Nodes != nil {
			list := &v1.NodeList{Items: make([]v1.Node, 0, len(res.Passing))}
			for _, n := range res.Passing {
				list.Items = append(list.Items, *n)
			}
			out.Nodes = list
		} else {
			names := make([]string, 0, len(res.Passing))
			for _, n := range res.Passing {
				names = append(names, n.Name)
			}
			out.NodeNames = &names
		}
		writeJSON(w, &out)
	})
}

// ServePrioritize answers POST /prioritize with a HostPriorityList, every
// score within 0..10.
func (h *Handler) ServePrioritize(w http.ResponseWriter, r *http.Request) {
	h.instrument("prioritize", w, func(w *statusWriter, orig http.ResponseWriter) {
		args, err := h.decodeArgs(orig, r)
		if err != nil {
			writeRequestError(w, err)
			return
		}
		nodes, unresolved := h.resolve(args)
		if len(unresolved) > 0 {
			// Scoring without the Nodes would be a guess; kube-scheduler
			// logs the error and ignores this extender's scores.
			for _, name := range *args.NodeNames {
				if why, ok := unresolved[name]; ok {
					http.Error(w, fmt.Sprintf("cannot score %d of %d nodes, among them %s: %s", len(unresolved), len(*args.NodeNames), name, why), http.StatusUnprocessableEntity)
					return
				}
			}
		}
		scores, err := h.Scheduler.Prioritize(r.Context(), args.Pod, nodes)
		if err != nil {
			http.Error(w, "cannot score pod: "+err.Error(), http.StatusUnprocessableEntity)
			return
		}
		for i := range scores {
			scores[i].Score = min(max(scores[i].Score, extenderv1.MinExtenderPriority), extenderv1.MaxExtenderPriority)
		}
		if scores == nil {
			scores = extenderv1.HostPriorityList{}
		}
		writeJSON(w, scores)
	})
}
