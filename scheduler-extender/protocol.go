package extender

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// DefaultMaxRequestBytes bounds a request body. With nodeCacheCapable
// (deploy/scheduler's configuration) kube-scheduler sends the Pod and node
// names: a Pod is at most 1.5 MiB (etcd's default request limit), and
// 5,000 names of 253 bytes (the longest a Node's name may be) take 1.3 MB
// as JSON (5,000 typical 30-byte names: 165 KB), so the largest request a
// cluster at Kubernetes' 5,000-node limit can send is under 3 MiB. Full
// Nodes (nodeCacheCapable: false) are 5-10 KB each: such clusters need a
// larger --max-request-bytes.
const DefaultMaxRequestBytes = 4 << 20

// DefaultMaxRequestsInflight bounds the requests being decoded and decided
// at once. kube-scheduler schedules one pod at a time and asks an extender
// once per step, so one or two are in flight; the bound is what keeps
// memory at most this many times DefaultMaxRequestBytes' worth of decoding.
const DefaultMaxRequestsInflight = 8

// InflightWait is how long a request waits for a slot before it gets 503.
const InflightWait = time.Second

// ReasonNoNodeCache is the FailedNodes reason for every node when
// kube-scheduler sends only node names.
const ReasonNoNodeCache = "tabby-scheduler-extender runs without a node cache; configure nodeCacheCapable: false for this extender"

// NodeCache resolves node names to Nodes when kube-scheduler is configured
// with nodeCacheCapable: true. Nil means there is none.
type NodeCache interface {
	Node(name string) (*v1.Node, bool)
}

// NodesCache is a NodeCache that also resolves many names at once (the
// informer cache: under one lock rather than one per node).
type NodesCache interface {
	NodeCache
	// Nodes appends to out the Nodes of names it knows, in order, and
	// calls missing with each name it does not.
	Nodes(names []string, out []*v1.Node, missing func(name string)) []*v1.Node
}

// Handler serves POST /filter and POST /prioritize, and POST /bind when
// it has Bind.
type Handler struct {
	Scheduler       Scheduler
	Nodes           NodeCache // nil: NodeNames-only requests fail every node
	MaxRequestBytes int64     // 0: DefaultMaxRequestBytes
	Inflight        *Inflight // nil: no bound
	Metrics         *Metrics  // nil: none
	// Placements, when set, makes filter and prioritize wait for the
	// placements in flight and bind count the pod before it is bound.
	Placements Placements
	// Bind, when set, serves POST /bind with it.
	Bind BindFunc
	Log  *slog.Logger // nil: slog.Default()

	placementMetrics *placementMetrics // nil: none
}

// Inflight bounds the requests served at once.
type Inflight struct {
	slots chan struct{}
}

// NewInflight allows n requests at once (0: DefaultMaxRequestsInflight).
func NewInflight(n int) *Inflight {
	if n <= 0 {
		n = DefaultMaxRequestsInflight
	}
	return &Inflight{slots: make(chan struct{}, n)}
}

// acquire takes a slot, waiting up to InflightWait; release gives it back.
func (l *Inflight) acquire(ctx context.Context) (release func(), err error) {
	if l == nil {
		return func() {}, nil
	}
	t := time.NewTimer(InflightWait)
	defer t.Stop()
	select {
	case l.slots <- struct{}{}:
		return func() { <-l.slots }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		return nil, &requestError{http.StatusServiceUnavailable, fmt.Sprintf(
			"%d requests are being answered, the most --max-requests-inflight allows, and none finished within %s; retry", cap(l.slots), InflightWait)}
	}
}

// Metrics counts and times the extender's requests per verb.
type Metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	filtered *prometheus.CounterVec
	answers  *prometheus.CounterVec
}

// Label values of the filter metrics beyond the plugins' names.
const (
	// FilteredUnknownNode: a node name kube-scheduler sent that the
	// extender could not resolve (nodeCacheCapable without a cache, or a
	// node not in it yet).
	FilteredUnknownNode = "UnknownNode"
	// FilteredOther: a Scheduler that did not say which plugin failed a node.
	FilteredOther = "Other"
	// AnswerFits: some node passed; AnswerUnschedulable: none did.
	AnswerFits          = "fits"
	AnswerUnschedulable = "unschedulable"
)

// NewMetrics registers the extender's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_scheduler_extender_requests_total",
			Help: "Requests from kube-scheduler by verb (filter, prioritize, bind) and HTTP status code.",
		}, []string{"verb", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tabby_scheduler_extender_request_duration_seconds",
			Help:    "Time to answer a request from kube-scheduler, by verb, including decoding and encoding.",
			Buckets: prometheus.ExponentialBuckets(0.00025, 2, 16),
		}, []string{"verb"}),
		filtered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_scheduler_extender_filtered_nodes_total",
			Help: "Nodes the extender filtered out, by the plugin that failed them first (NodeName, TaintToleration, NodeAffinity, TabbyNetwork, PodTopologySpread, InterPodAffinity; UnknownNode for a node name it could not resolve).",
		}, []string{"plugin"}),
		answers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_scheduler_extender_filter_answers_total",
			Help: "Filter answers by verdict: fits (some node passed) or unschedulable (none did).",
		}, []string{"verdict"}),
	}
	m.answers.WithLabelValues(AnswerFits)
	m.answers.WithLabelValues(AnswerUnschedulable)
	reg.MustRegister(m.requests, m.duration, m.filtered, m.answers)
	return m
}

// verdict counts one filter answer and the nodes it filtered out.
func (m *Metrics) verdict(res FilterResult, unresolved map[string]string) {
	if m == nil {
		return
	}
	if len(unresolved) > 0 {
		m.filtered.WithLabelValues(FilteredUnknownNode).Add(float64(len(unresolved)))
	}
	other := len(res.Failed) + len(res.Unresolvable)
	for plugin, n := range res.FailedBy {
		m.filtered.WithLabelValues(plugin).Add(float64(n))
		other -= n
	}
	if other > 0 {
		m.filtered.WithLabelValues(FilteredOther).Add(float64(other))
	}
	if len(res.Passing) > 0 {
		m.answers.WithLabelValues(AnswerFits).Inc()
	} else {
		m.answers.WithLabelValues(AnswerUnschedulable).Inc()
	}
}

func (m *Metrics) observe(verb string, code int, d time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(verb, strconv.Itoa(code)).Inc()
	m.duration.WithLabelValues(verb).Observe(d.Seconds())
}

// Register adds the verbs to mux.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.HandleFunc("POST /filter", h.ServeFilter)
	mux.HandleFunc("POST /prioritize", h.ServePrioritize)
	if h.Bind != nil {
		mux.HandleFunc("POST /bind", h.ServeBind)
	}
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

// readArgs reads an ExtenderArgs from r once the request holds a slot of
// h.Inflight, or says why it cannot; release (non-nil without an error)
// gives the slot back once the answer is written.
func (h *Handler) readArgs(w http.ResponseWriter, r *http.Request) (args *extenderv1.ExtenderArgs, release func(), err error) {
	if err := checkJSON(r); err != nil {
		return nil, nil, err
	}
	// Wait for the body's first bytes before taking a slot: clients that
	// send headers and stall hold a goroutine until ReadTimeout, not a
	// slot that kube-scheduler's requests need.
	body := readers.Get().(*bufio.Reader)
	body.Reset(r.Body)
	defer func() {
		body.Reset(nil)
		readers.Put(body)
	}()
	if _, err := body.Peek(1); err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, &requestError{http.StatusRequestTimeout, "reading the request body: " + err.Error()}
	}
	release, err = h.Inflight.acquire(r.Context())
	if err != nil {
		return nil, nil, err
	}
	limit := h.MaxRequestBytes
	if limit <= 0 {
		limit = DefaultMaxRequestBytes
	}
	if r.ContentLength > limit {
		release()
		return nil, nil, tooLarge(limit)
	}
	buf := getBuffer()
	defer putBuffer(buf) // DecodeArgs copies what it keeps
	data, err := readBody(buf, http.MaxBytesReader(w, readCloser{body, r.Body}, limit), r.ContentLength)
	if err != nil {
		release()
		if errors.As(err, new(*http.MaxBytesError)) {
			return nil, nil, tooLarge(limit)
		}
		return nil, nil, &requestError{http.StatusBadRequest, "reading the request body: " + err.Error()}
	}
	args, err = DecodeArgs(data)
	if err != nil {
		release()
		return nil, nil, err
	}
	return args, release, nil
}

// checkJSON refuses a request whose body is not JSON.
func checkJSON(r *http.Request) error {
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return &requestError{http.StatusUnsupportedMediaType, fmt.Sprintf("Content-Type is %q; want application/json", ct)}
	}
	return nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

func tooLarge(limit int64) error {
	return &requestError{http.StatusRequestEntityTooLarge, fmt.Sprintf(
		"request body is larger than %d bytes, the most --max-request-bytes allows (with nodeCacheCapable: true kube-scheduler sends node names, not Nodes, and needs far less)", limit)}
}

// readBody reads r whole into one buffer of the announced length (-1:
// unknown, then it grows as bytes.Buffer does).
func readBody(buf *bytes.Buffer, r io.Reader, length int64) ([]byte, error) {
	if length > 0 {
		buf.Grow(int(length) + bytes.MinRead)
	}
	_, err := buf.ReadFrom(r)
	return buf.Bytes(), err
}

// buffers hold request bodies while they are decoded and answers while
// they are encoded: at 5,000 nodes each is hundreds of kilobytes, which a
// fresh buffer per request would allocate (and grow) every time.
var buffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// readers are the 4 KB readers readArgs peeks into, reused: a fresh one per
// request was the largest of a request's remaining garbage after the
// names.
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4096) }}

// maxPooled is the largest buffer kept for reuse; a rare huge request
// (full Node objects) does not pin its memory.
const maxPooled = 4 << 20

func getBuffer() *bytes.Buffer { return buffers.Get().(*bytes.Buffer) }

func putBuffer(b *bytes.Buffer) {
	if b.Cap() <= maxPooled {
		b.Reset()
		buffers.Put(b)
	}
}

// DecodeArgs decodes one ExtenderArgs from data and checks what every
// request needs: a Pod, and Nodes or NodeNames.
func DecodeArgs(data []byte) (*extenderv1.ExtenderArgs, error) {
	w, ok := decodeNamesArgs(data)
	if !ok {
		w = wireArgs{}
		if err := json.Unmarshal(data, &w); err != nil {
			return nil, &requestError{http.StatusBadRequest, "decoding ExtenderArgs (the JSON of k8s.io/kube-scheduler/extender/v1): " + err.Error()}
		}
	}
	args := extenderv1.ExtenderArgs{Nodes: w.Nodes, NodeNames: (*[]string)(w.NodeNames)}
	if w.Pod != nil {
		args.Pod = w.Pod.pod
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
		switch re.code {
		case http.StatusServiceUnavailable:
			w.Header().Set("Retry-After", "1")
		case http.StatusRequestEntityTooLarge:
			// The rest of the body is not read: the connection cannot
			// carry another request.
			w.Header().Set("Connection", "close")
		}
		http.Error(w, re.msg, re.code)
		return
	}
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

func writeJSON(w http.ResponseWriter, v any) {
	buf := getBuffer()
	defer putBuffer(buf)
	if !appendAnswer(buf, v) {
		if err := json.NewEncoder(buf).Encode(v); err != nil {
			http.Error(w, "encoding the answer: "+err.Error(), http.StatusInternalServerError)
			return
		}
	}
	// A Content-Length, and no newline after the value: kube-scheduler
	// decodes one JSON value and closes the body, which keeps the
	// connection only when that reached the end (a chunked answer never
	// does; TestKeepAlive).
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}

func notCached(name string) string {
	return "node " + name + " is not in tabby-scheduler-extender's node cache yet"
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
	nodes = getNodes(len(*args.NodeNames))
	if nc, ok := h.Nodes.(NodesCache); ok {
		nodes = nc.Nodes(*args.NodeNames, nodes, func(name string) {
			unresolved[name] = notCached(name)
		})
		return nodes, unresolved
	}
	for _, name := range *args.NodeNames {
		if h.Nodes == nil {
			unresolved[name] = ReasonNoNodeCache
			continue
		}
		n, ok := h.Nodes.Node(name)
		if !ok {
			unresolved[name] = notCached(name)
			continue
		}
		nodes = append(nodes, n)
	}
	return nodes, unresolved
}

// serveRequest instruments a filter or prioritize request, reads its
// arguments (answering the error when it cannot), waits for the pods placed
// before it, resolves its nodes (unresolved: the names that are no Node
// yet, with why) and hands them to f, holding the request's slot until f
// returns.
func (h *Handler) serveRequest(endpoint string, w http.ResponseWriter, r *http.Request,
	f func(w *statusWriter, args *extenderv1.ExtenderArgs, nodes []*v1.Node, unresolved map[string]string)) {
	h.instrument(endpoint, w, func(w *statusWriter, orig http.ResponseWriter) {
		args, release, err := h.readArgs(orig, r)
		if err != nil {
			writeRequestError(w, err)
			return
		}
		defer release()
		h.awaitPlacements(r.Context(), args.Pod)
		nodes, unresolved := h.resolve(args)
		f(w, args, nodes, unresolved)
		// The answer is written: the request's per-node slices are free.
		if args.Nodes == nil {
			putNodes(nodes)
		}
		if args.NodeNames != nil {
			putNames(*args.NodeNames)
		}
	})
}

// Pools of the per-node slices of requests (see framework's pools: at
// 5,000 nodes each is tens of kilobytes a request).
var (
	namePool = sync.Pool{New: func() any { return new([]string) }}
	nodePool = sync.Pool{New: func() any { return new([]*v1.Node) }}
)

// getNames is an empty slice with room for n names.
func getNames(n int) []string {
	p := namePool.Get().(*[]string)
	return slices.Grow((*p)[:0], n)
}

func putNames(l []string) {
	clear(l[:cap(l)])
	l = l[:0]
	namePool.Put(&l)
}

// getNodes is an empty slice with room for n Nodes.
func getNodes(n int) []*v1.Node {
	p := nodePool.Get().(*[]*v1.Node)
	return slices.Grow((*p)[:0], n)
}

func putNodes(l []*v1.Node) {
	clear(l[:cap(l)])
	l = l[:0]
	nodePool.Put(&l)
}

// ServeFilter answers POST /filter with an ExtenderFilterResult: passing
// nodes as Nodes, or as NodeNames when the request carried NodeNames.
func (h *Handler) ServeFilter(w http.ResponseWriter, r *http.Request) {
	h.serveRequest("filter", w, r, func(w *statusWriter, args *extenderv1.ExtenderArgs, nodes []*v1.Node, unresolved map[string]string) {
		res := h.Scheduler.Filter(r.Context(), args.Pod, nodes)
		h.Metrics.verdict(res, unresolved)
		if h.Placements != nil {
			// Recorded before the answer: kube-scheduler sends the next
			// pod's request only after reading it.
			h.Placements.Placing(args.Pod, len(res.Passing) > 0)
		}
		// The result's maps are the answer's: the Scheduler made them for
		// this request.
		out := extenderv1.ExtenderFilterResult{
			FailedNodes:                res.Failed,
			FailedAndUnresolvableNodes: res.Unresolvable,
		}
		if out.FailedNodes == nil {
			out.FailedNodes = extenderv1.FailedNodesMap{}
		}
		if out.FailedAndUnresolvableNodes == nil {
			out.FailedAndUnresolvableNodes = extenderv1.FailedNodesMap{}
		}
		for name, why := range unresolved {
			out.FailedNodes[name] = why
		}
		if args.Nodes != nil {
			list := &v1.NodeList{Items: make([]v1.Node, 0, len(res.Passing))}
			for _, n := range res.Passing {
				list.Items = append(list.Items, *n)
			}
			out.Nodes = list
		} else {
			names := getNames(len(res.Passing))
			for _, n := range res.Passing {
				names = append(names, n.Name)
			}
			out.NodeNames = &names
			defer putNames(names)
		}
		writeJSON(w, &out)
		if rc, ok := h.Scheduler.(Recycler); ok {
			rc.Recycle(res)
		}
	})
}

// ServePrioritize answers POST /prioritize with a HostPriorityList, every
// score within 0..10.
func (h *Handler) ServePrioritize(w http.ResponseWriter, r *http.Request) {
	h.serveRequest("prioritize", w, r, func(w *statusWriter, args *extenderv1.ExtenderArgs, nodes []*v1.Node, unresolved map[string]string) {
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
		if rc, ok := h.Scheduler.(Recycler); ok {
			rc.RecyclePriorities(scores)
		}
	})
}
