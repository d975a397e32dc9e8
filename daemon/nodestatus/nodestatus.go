// Package nodestatus is what tabbyd's GET /status answers: this node's BGP
// sessions and the routes it programs, as JSON. `tabbyctl node status` and
// `tabbyctl lab status` read it with Fetch and print it with Print. It
// carries no BGP or netlink code, so its readers stay small.
package nodestatus

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Path is where tabbyd serves the status (next to /healthz, /readyz and
// /metrics on --health-listen).
const Path = "/status"

// Status is one node's routing status.
type Status struct {
	// Node is the node's name.
	Node string `json:"node"`
	// Time is when tabbyd answered.
	Time time.Time `json:"time"`
	// IPv4 and IPv6 are the node's addresses with their subnet's prefix
	// length, as published in its Node annotations.
	IPv4 string `json:"ipv4,omitempty"`
	IPv6 string `json:"ipv6,omitempty"`
	// AS and RouterID of the node's BGP speaker (0 and "" before it runs).
	AS       uint32 `json:"as"`
	RouterID string `json:"routerID"`
	// Ready is what /readyz says; NotReady says why not.
	Ready    bool     `json:"ready"`
	NotReady []string `json:"notReady,omitempty"`
	// Peers are the BGP sessions, ordered by address.
	Peers []Peer `json:"peers"`
	// Routes are counts of routes, by what they are.
	Routes Routes `json:"routes"`
	// LastApply is the last time routes were programmed.
	LastApply Apply `json:"lastApply"`
	// Reconciles counts the reconciles since tabbyd started.
	Reconciles uint64 `json:"reconciles"`
	// Restart says how tabbyd started: "" for a fresh start, otherwise
	// what it did with the routes a previous run left in the kernel.
	Restart string `json:"restart,omitempty"`
	// Warnings are what the last reconcile could not do as asked.
	Warnings []string `json:"warnings,omitempty"`
	// Problems are what the node's configuration lacks for its pools,
	// each "Reason: message" as in the Event tabbyd records on the Node
	// (an address family its pods use and it has no address of).
	Problems []string `json:"problems,omitempty"`
}

// Peer is one BGP session.
type Peer struct {
	Address string `json:"address"`
	Port    uint16 `json:"port,omitempty"`
	AS      uint32 `json:"as"`
	// Type is why the session exists: node-mesh, route-reflector (the
	// remote reflects for this node), route-reflector-client (this node
	// reflects for the remote) or bgppeer/NAME.
	Type string `json:"type"`
	// Node is the remote node's name, for a session with a cluster node.
	Node string `json:"node,omitempty"`
	// State is the BGP FSM state (Established when up).
	State string `json:"state"`
	// Since is when the session entered State.
	Since time.Time `json:"since"`
	// Synced: the peer has sent all its routes (End-of-RIB).
	Synced bool `json:"synced"`
	// Received and Accepted count the routes the peer sent; Rejected
	// those the route filters turned away (RejectedPrefixes: some of
	// them).
	Received         int      `json:"received"`
	Accepted         int      `json:"accepted"`
	Rejected         int      `json:"rejected"`
	RejectedPrefixes []string `json:"rejectedPrefixes,omitempty"`
	// MaxPrefixes is the session's prefix limit; LimitTrips counts the
	// times the session was closed for going over it.
	MaxPrefixes uint32 `json:"maxPrefixes,omitempty"`
	LimitTrips  int    `json:"limitTrips,omitempty"`
	// Info says why a session is not up, or that it is being replaced.
	Info string `json:"info,omitempty"`
}

// Routes count this node's routes.
type Routes struct {
	// Programmed are the routes tabby programs into the kernel (with its
	// routing protocol number), blackholes of its own blocks included.
	Programmed int `json:"programmed"`
	// Blackholes are those of its own blocks.
	Blackholes int `json:"blackholes"`
	// Learned are the best BGP routes the speaker holds; Stale of them
	// are kept while their peer restarts.
	Learned int `json:"learned"`
	Stale   int `json:"stale"`
	// Advertised are the routes the node originates.
	Advertised int `json:"advertised"`
	// Kept are routes a previous run left in the kernel that are kept
	// until BGP has converged after a restart.
	Kept int `json:"kept,omitempty"`
}

// Apply is the outcome of one programming of the kernel.
type Apply struct {
	Time     time.Time     `json:"time"`
	Duration time.Duration `json:"duration"`
	// Changes is how many kernel objects it changed.
	Changes int `json:"changes"`
	// Error is "" when everything was programmed.
	Error string `json:"error,omitempty"`
}

// Established says whether the session is up.
func (p Peer) Established() bool { return p.State == "Established" }

// Fetch asks the tabbyd serving /status at endpoint (host:port, or a URL)
// for its status. hc may be nil.
func Fetch(ctx context.Context, hc *http.Client, endpoint string) (*Status, error) {
	if hc == nil {
		hc = &http.Client{Timeout: 5 * time.Second}
	}
	url := endpoint
	if !strings.Contains(url, "://") {
		url = "http://" + url
	}
	url = strings.TrimSuffix(url, "/") + Path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("asking tabbyd for its status at %s: %w (is tabbyd running on this node, and is --endpoint its --health-listen?)", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	s := &Status{}
	if err := json.Unmarshal(body, s); err != nil {
		return nil, fmt.Errorf("%s answered something that is not tabbyd's status: %w", url, err)
	}
	return s, nil
}

// Print writes the status for people, in the manner of calicoctl node
// status: a line about the node, then a table of its peers.
func (s *Status) Print(w io.Writer) { s.Write(w, false) }

// Write is Print, with wide the peer columns Print leaves out (see
// WritePeers) and the last apply's duration and changes.
func (s *Status) Write(w io.Writer, wide bool) {
	ready := "ready"
	if !s.Ready {
		ready = "NOT READY: " + strings.Join(s.NotReady, "; ")
	}
	fmt.Fprintf(w, "tabbyd on node %s is running, %s.\n", s.Node, ready)
	addrs := strings.TrimSpace(s.IPv4 + " " + s.IPv6)
	fmt.Fprintf(w, "Node address %s, AS %d, router ID %s.\n", orDash(addrs), s.AS, orDash(s.RouterID))
	r := s.Routes
	fmt.Fprintf(w, "Routes: %d programmed (%d of them blackholes for own blocks), %d learned over BGP", r.Programmed, r.Blackholes, r.Learned)
	if r.Stale > 0 {
		fmt.Fprintf(w, " (%d stale)", r.Stale)
	}
	fmt.Fprintf(w, ", %d advertised", r.Advertised)
	if r.Kept > 0 {
		fmt.Fprintf(w, ", %d kept from the previous run", r.Kept)
	}
	fmt.Fprintln(w, ".")
	for _, p := range s.Problems {
		fmt.Fprintf(w, "Problem: %s\n", p)
	}
	if s.LastApply.Error != "" {
		fmt.Fprintf(w, "Last apply (%s) failed: %s\n", s.LastApply.Time.Local().Format(time.TimeOnly), s.LastApply.Error)
	} else if wide && !s.LastApply.Time.IsZero() {
		fmt.Fprintf(w, "Last apply %s: %d changes in %v; %d reconciles since start.\n",
			s.LastApply.Time.Local().Format(time.RFC3339), s.LastApply.Changes, s.LastApply.Duration, s.Reconciles)
	}
	if wide {
		for _, warn := range s.Warnings {
			fmt.Fprintf(w, "Warning: %s\n", warn)
		}
	}
	if s.Restart != "" {
		fmt.Fprintf(w, "Restart: %s\n", s.Restart)
	}
	fmt.Fprintln(w)
	if len(s.Peers) == 0 {
		fmt.Fprintln(w, "No BGP peers.")
		return
	}
	fmt.Fprintln(w, "BGP peers")
	s.WritePeers(w, "", wide)
}

// PrintPeers writes the table of peers, each line starting with indent.
func (s *Status) PrintPeers(w io.Writer, indent string) { s.WritePeers(w, indent, false) }

// WritePeers is PrintPeers, with wide the columns it leaves out: whether
// the peer sent End-of-RIB, its prefix limit and trips, the date of SINCE,
// and INFO in full.
func (s *Status) WritePeers(w io.Writer, indent string, wide bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, indent+"PEER ADDRESS\tPEER TYPE\tAS\tNODE\tSTATE\tSINCE\tROUTES (RECEIVED/ACCEPTED/REJECTED)")
	if wide {
		fmt.Fprint(tw, "\tSYNCED\tMAX PREFIXES\tLIMIT TRIPS")
	}
	fmt.Fprintln(tw, "\tINFO")
	for _, p := range s.Peers {
		since, info := "-", oneLine(p.Info)
		if wide {
			info = strings.Join(strings.Fields(p.Info), " ")
		}
		if !p.Since.IsZero() && wide {
			since = p.Since.Local().Format(time.RFC3339)
		} else if !p.Since.IsZero() {
			since = p.Since.Local().Format(time.TimeOnly)
		}
		addr := p.Address
		if p.Port != 0 && p.Port != 179 {
			addr += ":" + strconv.Itoa(int(p.Port))
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%d\t%s\t%s\t%s\t%d/%d/%d", indent, addr, p.Type, p.AS, orDash(p.Node), p.State, since,
			p.Received, p.Accepted, p.Rejected)
		if wide {
			fmt.Fprintf(tw, "\t%v\t%s\t%d", p.Synced, maxPrefixes(p.MaxPrefixes), p.LimitTrips)
		}
		fmt.Fprintf(tw, "\t%s\n", info)
	}
	_ = tw.Flush()
	for _, p := range s.Peers {
		if p.Rejected > 0 {
			fmt.Fprintf(w, "%s%s: %d routes rejected by the route filters, such as %s\n", indent, p.Address, p.Rejected, strings.Join(p.RejectedPrefixes, ", "))
		}
		if p.LimitTrips > 0 {
			fmt.Fprintf(w, "%s%s: closed %d times for sending more than %d prefixes\n", indent, p.Address, p.LimitTrips, p.MaxPrefixes)
		}
	}
}

func maxPrefixes(n uint32) string {
	if n == 0 {
		return "none"
	}
	return strconv.FormatUint(uint64(n), 10)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 70 {
		s = s[:67] + "..."
	}
	return s
}
