package cniagent

// Spares: addresses the agent allocates ahead (ipam.AssignSpare), so that a
// pod's ADD is answered from memory, with no write before the answer. The
// IPAMBlock write of an ADD was most of the agent's share of it.
//
// The life of a spare:
//   - assigned: allocated in one of the node's blocks under a spare handle
//     ("_spare.<node>.<id>"); the block is its only record.
//   - handed: a plain ADD (no pools named, no exact address, the spare's
//     families, a pool the pod may get) takes it. Before the answer goes
//     out the handover is written to the journal (JournalPath) and the NetworkPolicy loop is told the address is the pod's
//     (ipam.AddressClaim), so policy-wait returns as it does for an address
//     the block records.
//   - transferred: recordDelay after the answer, one compare-and-swap of
//     the block moves the address to the pod's handle (and allocates the
//     next spare there, when the stock is short), then the pod's
//     IPAMHandle is written (ipam.TransferSpare), and the journal entry goes.
//     A release, CHECK or handle lookup of the pod waits for it, as for any
//     deferred record; a transfer that fails for a reason that may pass (the
//     API server is unreachable) is retried until it succeeds.
//   - returned: a DEL of the pod before its transfer started puts the
//     address back among the spares, with no write at all.
//
// A tabbyd that restarts reads the journal first: each handover in it is
// transferred (the block may show it done already: the transfer is
// idempotent), and the spares found in the node's blocks that no handover
// names are held again. After a reboot the journal (in /var/run) is gone
// with the pods, and every spare is free. A journal that cannot be read
// leaves the spares it might name untouched (neither held nor released):
// tabbyctl ipam check shows them.
//
// The IPAM garbage collector keeps a spare while its node exists, and
// frees it once the node is deleted; CNI GC never takes a spare handle for
// a pod's (ipam.SpareHandlePrefix).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
)

// JournalPath is where the agent serving socket keeps its spares journal:
// next to the socket, named after it (/var/run/tabby/cni-spares.json for
// the default socket), so that two tabbyds never share one.
func JournalPath(socket string) string {
	return strings.TrimSuffix(socket, filepath.Ext(socket)) + "-spares.json"
}

// spares is the agent's stock of spares and the handovers not yet
// transferred.
type spares struct {
	want int
	path string

	mu        sync.Mutex
	free      []ipam.Spare
	handed    map[string]handover // by the pod's handle ID
	refilling bool
	fails     int
	retryAt   time.Time
	// v4, v6: the families of the last plain request; refills are of them.
	v4, v6 bool
}

// handover is a spare answered to a pod and not yet transferred.
type handover struct {
	spare  ipam.Spare
	req    ipam.Request
	claims []ipam.AddressClaim
}

// journal is the file's content.
type journal struct {
	Node      string         `json:"node"`
	Handovers []journalEntry `json:"handovers"`
}

type journalEntry struct {
	Spare     string        `json:"spare"`
	Handle    string        `json:"handle"`
	Namespace string        `json:"namespace,omitempty"`
	Pod       string        `json:"pod,omitempty"`
	Addresses []journalAddr `json:"addresses"`
}

type journalAddr struct {
	IP    string `json:"ip"`
	Block string `json:"block"`
}

// writeLocked replaces the journal with the handovers of s (write, then
// rename: a reader sees the old journal or the new one).
func (s *spares) writeLocked(node string) error {
	j := journal{Node: node, Handovers: []journalEntry{}}
	for _, h := range s.handed {
		e := journalEntry{Spare: h.spare.Handle, Handle: h.req.HandleID, Namespace: h.req.Namespace, Pod: h.req.Pod}
		for _, a := range h.spare.Addresses {
			e.Addresses = append(e.Addresses, journalAddr{IP: a.IP.String(), Block: a.Block.String()})
		}
		j.Handovers = append(j.Handovers, e)
	}
	slices.SortFunc(j.Handovers, func(a, b journalEntry) int { return compareStrings(a.Handle, b.Handle) })
	data, err := json.Marshal(j)
	if err != nil {
		return err
	}
	tmp := s.path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("writing the spares journal: %w", err)
	}
	if err := os.Rename(tmp, s.path); err != nil {
		return fmt.Errorf("writing the spares journal: %w", err)
	}
	return nil
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// readJournal reads the handovers of node's journal at path; none when
// there is no journal.
func readJournal(path, node string) ([]handover, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var j journal
	if err := json.Unmarshal(data, &j); err != nil {
		return nil, fmt.Errorf("%s is not a spares journal: %w", path, err)
	}
	if j.Node != node {
		return nil, fmt.Errorf("%s is node %q's spares journal, not node %q's", path, j.Node, node)
	}
	var out []handover
	for _, e := range j.Handovers {
		if !ipam.IsSpareHandle(e.Spare) || e.Handle == "" || len(e.Addresses) == 0 {
			return nil, fmt.Errorf("%s: a handover without a spare handle, a pod handle or addresses: %+v", path, e)
		}
		sp := ipam.Spare{Handle: e.Spare}
		for _, a := range e.Addresses {
			ip := net.ParseIP(a.IP)
			_, block, err := net.ParseCIDR(a.Block)
			if ip == nil || err != nil || !block.Contains(ip) {
				return nil, fmt.Errorf("%s: a handover of %q with address %q in block %q", path, e.Handle, a.IP, a.Block)
			}
			sp.Addresses = append(sp.Addresses, ipam.Assigned{IP: ip, Block: block})
		}
		req := ipam.Request{HandleID: e.Handle, Node: node, Namespace: e.Namespace, Pod: e.Pod, Use: tabbyv1.UseWorkload}
		req.IPv4, req.IPv6 = sp.Families()
		out = append(out, handover{spare: sp, req: req, claims: sp.Claims(req)})
	}
	return out, nil
}

// plainRequest says whether a spare may answer req at all: any address of
// one or both families, for a workload.
func plainRequest(req ipam.Request) bool {
	return len(req.IPs) == 0 && len(req.IPv4Pools) == 0 && len(req.IPv6Pools) == 0 &&
		(req.IPv4 || req.IPv6) && (req.Use == "" || req.Use == tabbyv1.UseWorkload)
}

func sameFamilies(sp ipam.Spare, v4, v6 bool) bool {
	a, b := sp.Families()
	return a == v4 && b == v6
}

// countLocked counts the free spares of the families.
func (s *spares) countLocked(v4, v6 bool) int {
	n := 0
	for _, sp := range s.free {
		if sameFamilies(sp, v4, v6) {
			n++
		}
	}
	return n
}

// failLocked counts a failed refill (or spares dropped): the next refill
// waits 1 s, doubling up to a minute while they keep failing.
func (s *spares) failLocked() {
	s.fails++
	s.retryAt = time.Now().Add(min(time.Second<<min(s.fails-1, 6), time.Minute))
}

// keepLocked adds sp to the stock unless the stock of its families is
// full already (a spare returned by a DEL, or made by a transfer, while a
// refill ran), and says whether it did: the stock never exceeds want.
func (s *spares) keepLocked(sp ipam.Spare) bool {
	v4, v6 := sp.Families()
	if s.countLocked(v4, v6) >= s.want {
		return false
	}
	s.free = append(s.free, sp)
	return true
}

// handOut answers req from a spare if one fits: the handover is journaled
// and the policy loop told before it returns.
func (a *Agent) handOut(ctx context.Context, req ipam.Request) ([]ipam.Assigned, bool) {
	s := a.spares
	if s == nil || s.want == 0 || !plainRequest(req) {
		return nil, false
	}
	s.mu.Lock()
	s.v4, s.v6 = req.IPv4, req.IPv6
	i := slices.IndexFunc(s.free, func(sp ipam.Spare) bool { return sameFamilies(sp, req.IPv4, req.IPv6) })
	if i < 0 {
		s.mu.Unlock()
		a.met.spares.WithLabelValues("missed").Inc()
		return nil, false
	}
	sp := s.free[i]
	s.free = slices.Delete(s.free, i, i+1)
	s.mu.Unlock()
	if !a.ipam.SpareFits(ctx, sp, req) {
		// Its pool was disabled, or no longer selects the node.
		a.met.spares.WithLabelValues("missed").Inc()
		a.releaseSpares([]ipam.Spare{sp})
		return nil, false
	}
	h := handover{spare: sp, req: req, claims: sp.Claims(req)}
	s.mu.Lock()
	s.handed[req.HandleID] = h
	if err := s.writeLocked(a.cfg.NodeName); err != nil {
		delete(s.handed, req.HandleID)
		s.free = append(s.free, sp)
		s.mu.Unlock()
		a.log.Warn("not answering from a spare address: its handover cannot be journaled", "error", err)
		return nil, false
	}
	s.mu.Unlock()
	if a.cfg.Policy != nil {
		a.cfg.Policy.ObserveClaims(h.claims)
	}
	a.met.spares.WithLabelValues("handed").Inc()
	a.transferLater(h, a.writeDelay)
	return sp.Addresses, true
}

// transferLater transfers a handover after delay (at once when a release
// or CHECK of the pod asks, or tabbyd stops), retrying while it fails for
// a reason that may pass; then refills. A release before it starts returns
// the spare instead (cancelRecord).
func (a *Agent) transferLater(h handover, delay time.Duration) {
	s := a.spares
	a.recordAfter(h.req.HandleID, delay, func(context.Context) error {
		err := a.transfer(h)
		a.refill()
		return err
	}, func() {
		s.mu.Lock()
		delete(s.handed, h.req.HandleID)
		err := s.writeLocked(a.cfg.NodeName)
		keep := err == nil && s.keepLocked(h.spare)
		s.mu.Unlock()
		if err == nil && !keep {
			a.releaseSpares([]ipam.Spare{h.spare})
		}
		if a.cfg.Policy != nil {
			a.cfg.Policy.ForgetClaims(h.claims)
		}
		if err != nil {
			// The journal still names the handover: a restart
			// transfers it to the deleted pod, and the IPAM GC frees
			// it. Not held again meanwhile.
			a.log.Warn("a deleted pod's spare address is not held again: the journal cannot be written", "error", err)
			return
		}
		a.met.spares.WithLabelValues("returned").Inc()
	})
}

// transfer runs ipam.TransferSpare until it succeeds or fails for good,
// each attempt with its own deadline; when tabbyd stops first, the journal
// keeps the handover for the restart.
func (a *Agent) transfer(h handover) error {
	s := a.spares
	// The next spare, in the same write when the stock is short of one of
	// these families (and the spare came from this run: its pool known).
	next := ""
	if v4, v6 := h.spare.Families(); len(h.spare.Addresses) == 1 && h.spare.Addresses[0].Pool != nil {
		s.mu.Lock()
		if s.countLocked(v4, v6) < s.want {
			next = ipam.SpareHandle(a.cfg.NodeName, newSpareID())
		}
		s.mu.Unlock()
	}
	backoff := 100 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), datastore.Timeout)
		// With the node's assignments (mu): a burst's batched write
		// waits for this one instead of conflicting with it.
		a.mu.Lock()
		if next != "" && !a.spareWanted(h.spare.Families()) {
			next = ""
		}
		made, err := a.ipam.TransferSpare(ctx, h.spare, h.req, next)
		a.mu.Unlock()
		cancel()
		if len(made.Addresses) > 0 {
			// Taken once: a retry (the pod's handle failed to be
			// written) must not find it in the block again.
			next = ""
			a.met.spares.WithLabelValues("assigned").Inc()
			s.mu.Lock()
			keep := s.keepLocked(made)
			s.mu.Unlock()
			if !keep {
				a.releaseSpares([]ipam.Spare{made})
			}
		}
		if err != nil && !errors.Is(err, ipam.ErrSpareLost) {
			if a.stoppingCtx().Err() != nil {
				return err
			}
			a.log.Warn("handing a spare address to its pod; retrying", "handle", h.req.HandleID, "spare", h.spare.Handle, "error", err)
			select {
			case <-time.After(backoff):
				backoff = min(2*backoff, 5*time.Second)
				continue
			case <-a.stoppingCtx().Done():
				return err
			}
		}
		s.mu.Lock()
		delete(s.handed, h.req.HandleID)
		jerr := s.writeLocked(a.cfg.NodeName)
		s.mu.Unlock()
		if jerr != nil {
			a.log.Warn("the spares journal names a handover done already (a restart transfers it again, which changes nothing)", "error", jerr)
		}
		if a.cfg.Policy != nil {
			// The block's new version went to the policy loop first
			// (ObserveBlock): the claims add nothing now.
			a.cfg.Policy.ForgetClaims(h.claims)
		}
		if err != nil {
			a.met.spares.WithLabelValues("error").Inc()
			return err
		}
		a.met.spares.WithLabelValues("transferred").Inc()
		return nil
	}
}

// withHandovers adds to handle IDs those of the handovers not transferred
// yet, sorted and without repeats.
func (a *Agent) withHandovers(hs []string) []string {
	if s := a.spares; s != nil {
		s.mu.Lock()
		for h := range s.handed {
			hs = append(hs, h)
		}
		s.mu.Unlock()
	}
	slices.Sort(hs)
	return slices.Compact(hs)
}

// stoppingCtx is the agent's shutdown context (Background before Run).
func (a *Agent) stoppingCtx() context.Context {
	if a.stopping == nil {
		return context.Background()
	}
	return a.stopping
}

// refill allocates spares up to the number wanted, of the families of the
// last plain request, in the background; after a failure (no room, the API
// server unreachable) it waits, longer each time, before it tries again.
func (a *Agent) refill() {
	s := a.spares
	if s == nil || a.stoppingCtx().Err() != nil {
		return
	}
	s.mu.Lock()
	v4, v6 := s.v4, s.v6
	if s.refilling || (!v4 && !v6) || s.countLocked(v4, v6) >= s.want || time.Now().Before(s.retryAt) {
		s.mu.Unlock()
		return
	}
	s.refilling = true
	s.mu.Unlock()
	a.records.Add(1)
	go func() {
		defer a.records.Done()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), datastore.Timeout)
			a.mu.Lock() // with the node's assignments, as a transfer
			sp, err := a.ipam.AssignSpare(ctx, a.cfg.NodeName, ipam.SpareHandle(a.cfg.NodeName, newSpareID()), v4, v6)
			a.mu.Unlock()
			cancel()
			s.mu.Lock()
			if err != nil {
				s.failLocked()
				s.refilling = false
				first := s.fails == 1
				s.mu.Unlock()
				if first {
					a.log.Info("cannot hold an address ahead; ADDs assign theirs as they come", "error", err)
				}
				return
			}
			s.fails = 0
			kept := s.keepLocked(sp)
			full := s.countLocked(v4, v6) >= s.want
			if full || a.stoppingCtx().Err() != nil {
				s.refilling = false
			}
			s.mu.Unlock()
			a.met.spares.WithLabelValues("assigned").Inc()
			if !kept {
				a.releaseSpares([]ipam.Spare{sp})
			}
			if full || a.stoppingCtx().Err() != nil {
				return
			}
		}
	}()
}

// spareWanted says, with mu held, whether a transfer may still make the
// next spare it planned: the stock is short of one, and no ADD found the
// pools exhausted since (dropSpares; the refills wait too). Otherwise the
// transfers of a burst, each planning a spare when it started, take the
// addresses an ADD has just freed by dropping the spares, and it fails.
func (a *Agent) spareWanted(v4, v6 bool) bool {
	s := a.spares
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.countLocked(v4, v6) < s.want && !time.Now().Before(s.retryAt)
}

func newSpareID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// releaseSpares gives spares back, in the background.
func (a *Agent) releaseSpares(sps []ipam.Spare) {
	if len(sps) == 0 {
		return
	}
	a.records.Add(1)
	go func() {
		defer a.records.Done()
		ctx, cancel := context.WithTimeout(context.Background(), datastore.Timeout)
		defer cancel()
		a.releaseNow(ctx, sps)
	}()
}

// releaseNow gives spares back, and logs those it could not.
func (a *Agent) releaseNow(ctx context.Context, sps []ipam.Spare) {
	for _, sp := range sps {
		if err := a.ipam.ReleaseHandle(ctx, sp.Handle, a.cfg.NodeName); err != nil {
			a.log.Warn("releasing a spare address (tabbyctl ipam check shows it)", "spare", sp.Handle, "error", err)
			continue
		}
		a.met.spares.WithLabelValues("released").Inc()
	}
}

// dropSpares releases every free spare now: an assignment found no
// address, and the spares may be what the pools lack. The next refill
// waits as after a failure.
func (a *Agent) dropSpares(ctx context.Context) bool {
	s := a.spares
	if s == nil {
		return false
	}
	s.mu.Lock()
	sps := s.free
	s.free = nil
	s.failLocked()
	s.mu.Unlock()
	a.releaseNow(ctx, sps)
	return len(sps) > 0
}

// recoverSpares runs before the agent serves: the journal's handovers are
// transferred (in the background, as after an answer; a release or CHECK
// of their pods waits for them), the node's other spares are held again,
// or released when spares are off.
func (a *Agent) recoverSpares(ctx context.Context) error {
	path := JournalPath(a.cfg.Socket)
	hs, jerr := readJournal(path, a.cfg.NodeName)
	found, err := a.ipam.NodeSpares(ctx, a.cfg.NodeName, true)
	if err != nil {
		return fmt.Errorf("cniagent: reading the node's spare addresses: %w", err)
	}
	if jerr != nil {
		// Which spares were handed out is unknown: none is held or
		// released. The journal is kept aside for whoever looks.
		a.log.Error("the spares journal cannot be read: the node's spare addresses are left as they are (tabbyctl ipam check shows them)", "error", jerr, "spares", len(found))
		_ = os.Rename(path, path+".unreadable")
		found = nil
	}
	s := a.spares
	named := map[string]bool{}
	if s != nil || len(hs) > 0 {
		if s == nil {
			// Spares are off now, but handovers from before wait for
			// their transfer.
			s = &spares{path: path, handed: map[string]handover{}}
			a.spares = s
		}
		s.mu.Lock()
		for _, h := range hs {
			named[h.spare.Handle] = true
			s.handed[h.req.HandleID] = h
		}
		s.mu.Unlock()
	}
	for _, h := range hs {
		if a.cfg.Policy != nil {
			a.cfg.Policy.ObserveClaims(h.claims)
		}
		a.transferLater(h, 0)
	}
	var keep, drop []ipam.Spare
	for _, sp := range found {
		switch {
		case named[sp.Handle]:
		case s != nil && s.want > 0:
			keep = append(keep, sp)
		default:
			drop = append(drop, sp)
		}
	}
	if s != nil {
		s.mu.Lock()
		s.free = append(s.free, keep...)
		s.mu.Unlock()
	}
	a.releaseSpares(drop)
	if len(hs) > 0 || len(found) > 0 {
		a.log.Info("spare addresses after the restart", "handovers", len(hs), "held", len(keep), "released", len(drop))
	}
	return nil
}
