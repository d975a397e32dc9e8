package netpol

import (
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tabbynet/tabby/daemon/deniedlog"
	"github.com/tabbynet/tabby/daemon/nflog"
	"github.com/tabbynet/tabby/policy"
)

// Defaults of the denied-packet log.
const (
	// DefaultDeniedBuffer is how many records the ring buffer keeps.
	DefaultDeniedBuffer = 1000
	// maxDeniedSeries bounds the label sets of the denied counter; the
	// rest count as policy "_other".
	maxDeniedSeries = 500
	// followQueue is how many records a follower may lag behind before
	// it misses some (a slow reader never slows the log).
	followQueue = 256
)

// Denied is the log of what NetworkPolicy dropped on this node: it turns
// packets of the NFLOG group (the per-pod chains log before their DROP,
// policy.DeniedLog) into records — the pods they came from and went to,
// and the policies that denied them, from the last sync's Ruleset and
// input — keeps the last ones in a ring buffer served on
// deniedlog.Path, counts them by namespace and policies, and writes
// them as JSON lines to a file when asked.
type Denied struct {
	node string
	met  *deniedMetrics

	mu      sync.Mutex
	denials map[string]policy.Denial // by NFLOG prefix
	pods    map[netip.Addr]string    // every pod's address -> namespace/name
	ring    []deniedlog.Record
	next    int  // where the next record goes
	full    bool // ring has wrapped
	follow  map[chan deniedlog.Record]struct{}
	file    *json.Encoder
	series  map[[2]string]bool
}

// DeniedConfig configures a Denied.
type DeniedConfig struct {
	Node string
	// Buffer is the ring buffer's size (DefaultDeniedBuffer when 0).
	Buffer int
	// File, when not nil, gets every record as a JSON line.
	File io.Writer
	// Metrics holds the counters (NewMetrics); nil: they are not exported.
	Metrics *Metrics
}

// NewDenied makes an empty log; Update gives it the policies, Packet the
// packets.
func NewDenied(cfg DeniedConfig) *Denied {
	if cfg.Buffer <= 0 {
		cfg.Buffer = DefaultDeniedBuffer
	}
	d := &Denied{node: cfg.Node, met: newDeniedMetrics(), ring: make([]deniedlog.Record, cfg.Buffer),
		follow: map[chan deniedlog.Record]struct{}{}, series: map[[2]string]bool{}}
	if cfg.File != nil {
		d.file = json.NewEncoder(cfg.File)
	}
	if cfg.Metrics != nil {
		d.met = cfg.Metrics.denied
	}
	return d
}

// Update takes what a sync programs: the meaning of each log prefix and
// every pod's addresses. Called with merge before the sync applies its
// ruleset, it keeps what it knew as well, for the rules still in the
// kernel until the new ones replace them; called without, after, it
// forgets the rest.
func (d *Denied) Update(in *policy.Input, rs *policy.Ruleset, merge bool) {
	denials := make(map[string]policy.Denial, len(rs.Denials))
	pods := make(map[netip.Addr]string, len(in.Endpoints))
	d.mu.Lock()
	defer d.mu.Unlock()
	if merge {
		maps.Copy(denials, d.denials)
		maps.Copy(pods, d.pods)
	}
	for _, x := range rs.Denials {
		denials[x.Prefix] = x
	}
	for _, e := range in.Endpoints {
		for _, ip := range e.IPs {
			pods[ip] = e.Pod.Namespace + "/" + e.Pod.Name
		}
	}
	d.denials, d.pods = denials, pods
}

// Lost counts packets the kernel could not hand over (the socket's buffer
// was full).
func (d *Denied) Lost() { d.met.lost.Inc() }

// Packet records one logged packet; packets of other prefixes (another
// program's rules in the same group) are ignored.
func (d *Denied) Packet(p nflog.Packet) {
	if !strings.HasPrefix(p.Prefix, policy.DeniedLogPrefix) {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	den, known := d.denials[p.Prefix]
	if !known {
		// Logged before this has seen a Ruleset, perhaps by an unlisted
		// interface's drop, which every Ruleset names the same.
		for _, u := range policy.UnlistedDenials() {
			if u.Prefix == p.Prefix {
				den, known = u, true
			}
		}
	}
	r := deniedlog.Record{
		Time: p.Time, Node: d.node, Protocol: protoName(p.Proto),
		Src:      deniedlog.Endpoint{IP: p.Src.String(), Port: p.SrcPort, Pod: d.pods[p.Src]},
		Dst:      deniedlog.Endpoint{IP: p.Dst.String(), Port: p.DstPort, Pod: d.pods[p.Dst]},
		Policies: den.Policies, Direction: den.Direction, Chain: den.Chain, Reason: den.Reason(),
	}
	if !known {
		// Logged by rules of a sync whose Ruleset this has not seen yet,
		// or of an earlier tabbyd.
		r.Chain = policy.PolicyChainPrefix + strings.TrimPrefix(p.Prefix, policy.DeniedLogPrefix)
		r.Reason = "dropped by " + r.Chain + ", which the current policies no longer make"
		if strings.HasPrefix(p.Prefix, policy.DeniedLogPrefix+"E-") {
			r.Direction = "egress"
		} else {
			r.Direction = "ingress"
		}
	}
	d.ring[d.next] = r
	d.next = (d.next + 1) % len(d.ring)
	d.full = d.full || d.next == 0
	d.count(r)
	if d.file != nil {
		if err := d.file.Encode(r); err != nil {
			d.met.fileErrors.Inc()
		}
	}
	for ch := range d.follow {
		select {
		case ch <- r:
		default:
			d.met.dropped.Inc()
		}
	}
}

// count adds the record to the counter of its local pod's namespace and
// policies, within maxDeniedSeries label sets.
func (d *Denied) count(r deniedlog.Record) {
	local := r.Dst.Pod
	if r.Direction == "egress" {
		local = r.Src.Pod
	}
	ns, _, _ := strings.Cut(local, "/")
	names := make([]string, len(r.Policies))
	for i, p := range r.Policies {
		_, names[i], _ = strings.Cut(p, "/")
	}
	k := [2]string{ns, strings.Join(names, ",")}
	if !d.series[k] {
		if len(d.series) >= maxDeniedSeries {
			k[1] = "_other"
		} else {
			d.series[k] = true
		}
	}
	d.met.packets.WithLabelValues(k[0], k[1], r.Direction).Inc()
}

// records are the ring's records, oldest first, of pod (all when "").
func (d *Denied) records(pod string) []deniedlog.Record {
	var out []deniedlog.Record
	add := func(rs []deniedlog.Record) {
		for _, r := range rs {
			if pod == "" || r.Involves(pod) {
				out = append(out, r)
			}
		}
	}
	if d.full {
		add(d.ring[d.next:])
	}
	add(d.ring[:d.next])
	return out
}

// ServeHTTP answers GET deniedlog.Path: the ring buffer as JSON lines,
// and with follow=true every record after them until the client goes.
func (d *Denied) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	pod := req.URL.Query().Get(deniedlog.ParamPod)
	if pod != "" {
		if err := deniedlog.ValidPod(pod); err != nil {
			http.Error(w, "pod: "+err.Error(), http.StatusBadRequest)
			return
		}
	}
	follow, err := parseBool(req.URL.Query().Get(deniedlog.ParamFollow))
	if err != nil {
		http.Error(w, "follow: "+err.Error(), http.StatusBadRequest)
		return
	}
	var ch chan deniedlog.Record
	d.mu.Lock()
	recs := d.records(pod)
	if follow {
		ch = make(chan deniedlog.Record, followQueue)
		d.follow[ch] = struct{}{}
	}
	d.mu.Unlock()
	w.Header().Set("Content-Type", "application/jsonl")
	enc := json.NewEncoder(w)
	for _, r := range recs {
		_ = enc.Encode(r)
	}
	if !follow {
		return
	}
	defer func() {
		d.mu.Lock()
		delete(d.follow, ch)
		d.mu.Unlock()
	}()
	// A follower stays as long as it likes: lift the server's write
	// timeout for this answer.
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{})
	_ = rc.Flush()
	for {
		select {
		case r := <-ch:
			if pod != "" && !r.Involves(pod) {
				continue
			}
			if enc.Encode(r) != nil || rc.Flush() != nil {
				return
			}
		case <-req.Context().Done():
			return
		}
	}
}

func parseBool(s string) (bool, error) {
	if s == "" {
		return false, nil
	}
	return strconv.ParseBool(s)
}

func protoName(p uint8) string {
	switch p {
	case nflog.ProtoTCP:
		return "TCP"
	case nflog.ProtoUDP:
		return "UDP"
	case nflog.ProtoSCTP:
		return "SCTP"
	case nflog.ProtoICMP:
		return "ICMP"
	case nflog.ProtoICMPv6:
		return "ICMPv6"
	}
	return strconv.Itoa(int(p))
}

type deniedMetrics struct {
	packets                   *prometheus.CounterVec
	lost, dropped, fileErrors prometheus.Counter
}

func newDeniedMetrics() *deniedMetrics {
	return &deniedMetrics{
		packets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tabby_policy_denied_packets_logged_total",
			Help: "Packets NetworkPolicy dropped that the kernel logged (rate-limited per source and per node: a sample of the drops, not all of them), by the local pod's namespace, the policies isolating it (names joined by commas; \"_other\" past 500 label sets) and direction.",
		}, []string{"namespace", "policy", "direction"}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tabby_policy_denied_lost_total",
			Help: "Times the kernel could not hand logged packets to tabbyd (its socket's buffer was full): some records are missing.",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tabby_policy_denied_follow_dropped_total",
			Help: "Records a slow follower of /policy/denied (tabbyctl policy denied -f) missed.",
		}),
		fileErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tabby_policy_denied_file_errors_total",
			Help: "Records that could not be written to --denied-log-file.",
		}),
	}
}

func (m *deniedMetrics) register(reg prometheus.Registerer) error {
	return errors.Join(reg.Register(m.packets), reg.Register(m.lost), reg.Register(m.dropped), reg.Register(m.fileErrors))
}
