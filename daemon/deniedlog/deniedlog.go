// Package deniedlog is what tabbyd's GET /policy/denied answers: the
// packets NetworkPolicy dropped on this node (as far as the kernel's rate
// limits logged them), as JSON lines, oldest first; with follow=true the
// answer goes on with each new one. `tabbyctl policy denied` reads it with
// Read and prints it with WriteTable. It carries no netlink code, so its
// readers stay small.
package deniedlog

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Path is where tabbyd serves the log (on --health-listen).
const Path = "/policy/denied"

// Query parameters of Path.
const (
	// ParamPod keeps the records whose source or destination is the pod
	// "namespace/name".
	ParamPod = "pod"
	// ParamFollow ("true") keeps the answer open, adding records as they come.
	ParamFollow = "follow"
)

// Record is one denied packet.
type Record struct {
	Time time.Time `json:"time"`
	Node string    `json:"node"`
	// Direction is "ingress" (to a local pod) or "egress" (from one).
	Direction string `json:"direction"`
	// Protocol is TCP, UDP, SCTP, ICMP, ICMPv6 or the IP protocol number.
	Protocol string   `json:"protocol"`
	Src      Endpoint `json:"src"`
	Dst      Endpoint `json:"dst"`
	// Policies are the policies ("namespace/name") that select the local
	// pod in Direction, none of which allows the packet; Reason says so
	// in words ("default deny of policy shop/default-deny …").
	Policies []string `json:"policies,omitempty"`
	Reason   string   `json:"reason"`
	// Chain is the per-pod chain that dropped it.
	Chain string `json:"chain,omitempty"`
}

// Endpoint is one end of a packet.
type Endpoint struct {
	IP   string `json:"ip"`
	Port uint16 `json:"port,omitempty"`
	// Pod is "namespace/name" when the address is a pod's tabbyd knows.
	Pod string `json:"pod,omitempty"`
}

// String is "namespace/name (ip:port)" or "ip:port".
func (e Endpoint) String() string {
	a := e.IP
	if e.Port != 0 {
		if strings.Contains(a, ":") {
			a = "[" + a + "]"
		}
		a += ":" + strconv.Itoa(int(e.Port))
	}
	if e.Pod == "" {
		return a
	}
	return e.Pod + " (" + a + ")"
}

// Involves says whether pod ("namespace/name") is the record's source or
// destination.
func (r Record) Involves(pod string) bool { return r.Src.Pod == pod || r.Dst.Pod == pod }

// ValidPod checks a "namespace/name" filter.
func ValidPod(pod string) error {
	ns, name, ok := strings.Cut(pod, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return fmt.Errorf("%q is not a pod: write it as NAMESPACE/NAME", pod)
	}
	return nil
}

// Read asks tabbyd at endpoint (host:port of its --health-listen) for its
// records, calling fn with each, until the answer ends (with follow, when
// ctx ends: then it returns nil). pod, when not "", keeps those of one
// pod.
func Read(ctx context.Context, client *http.Client, endpoint, pod string, follow bool, fn func(Record) error) error {
	if client == nil {
		client = http.DefaultClient
	}
	q := url.Values{}
	if pod != "" {
		q.Set(ParamPod, pod)
	}
	if follow {
		q.Set(ParamFollow, "true")
	}
	u := "http://" + endpoint + Path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("asking tabbyd at %s for its denied packets: %w (is tabbyd running there, with --denied-log?)", endpoint, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("tabbyd at %s: %s: %s", endpoint, resp.Status, strings.TrimSpace(string(b)))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return fmt.Errorf("tabbyd at %s sent a line that is not a record: %w", endpoint, err)
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && !(follow && ctx.Err() != nil) {
		return fmt.Errorf("reading tabbyd's denied packets: %w", err)
	}
	return nil
}

// Table prints records as aligned columns, the header first.
type Table struct {
	tw     *tabwriter.Writer
	header bool
}

// NewTable prints to w.
func NewTable(w io.Writer) *Table { return &Table{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)} }

// Write prints one record (and the header before the first); Flush shows
// what was written.
func (t *Table) Write(r Record) {
	if !t.header {
		fmt.Fprintln(t.tw, "TIME\tNODE\tDIRECTION\tPROTO\tSOURCE\tDESTINATION\tREASON")
		t.header = true
	}
	fmt.Fprintf(t.tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Time.Local().Format("15:04:05.000"), r.Node, r.Direction, r.Protocol,
		r.Src, r.Dst, r.Reason)
}

// Flush writes out what Write buffered.
func (t *Table) Flush() error { return t.tw.Flush() }
