package bgp

import (
	"context"
	"net/netip"
	"sort"
	"time"
)

// LearnedRoute is a route learned from a peer.
type LearnedRoute struct {
	Route
	// Peer is the session it came over.
	Peer netip.Addr
	// Stale: the route is kept while its session restarts (the peer's
	// graceful restart, or a reset this speaker made to change the
	// session's settings); the peer is expected to send it again.
	Stale bool
}

// Learned returns the best route to every prefix learned from peers,
// ordered by prefix. Routes of sessions this speaker is resetting itself
// (to change their settings) are kept, Stale, until the session has sent
// them again or its restart time passed, as the remote keeps ours.
func (s *Speaker) Learned(ctx context.Context) ([]LearnedRoute, error) {
	return s.learnedRoutes(ctx, false)
}

// LearnedFresh is Learned from a new read of GoBGP's table: for a caller
// that must see at least what GoBGP had when it called, such as one that
// has just read the sessions' states, whose End-of-RIBs may be ahead of
// the events of the routes sent before them.
func (s *Speaker) LearnedFresh(ctx context.Context) ([]LearnedRoute, error) {
	return s.learnedRoutes(ctx, true)
}

func (s *Speaker) learnedRoutes(ctx context.Context, fresh bool) ([]LearnedRoute, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// The table read last is still GoBGP's when no event that changes a
	// best path, or a session's state, came since, and the speaker had no
	// session re-evaluate what it received and changed none (see
	// LearnedVersion): a routing pass that finds nothing new (most of a
	// claim's passes on most nodes) then reads nothing. A change whose
	// event is still on its way is read by the pass the event triggers.
	// What changes with no event at all (a session's routes marked stale
	// in the moment around its going down) is read within learnedMaxAge.
	gen, at := s.ribGen.Load(), s.changed.Load()
	r := s.learned
	if fresh || r == nil || gen != s.learnedGen || at != s.learnedAt || time.Since(s.learnedTime) >= learnedMaxAge {
		s.scans.Add(1)
		read, err := s.scanRIB(ctx)
		if err != nil {
			s.lastRead, s.learned = nil, nil
			return nil, err
		}
		r = &read
		s.learned, s.learnedGen, s.learnedAt, s.learnedTime = r, gen, at, time.Now()
		s.lastRead, s.lastReadAt = r, at
	}
	out := make([]LearnedRoute, 0, len(r.best))
	for _, lr := range r.best {
		out = append(out, lr)
	}
	held := map[netip.Prefix]bool{}
	for _, h := range s.held {
		for _, lr := range h.routes {
			if _, ok := r.best[lr.Prefix]; !ok && !held[lr.Prefix] {
				held[lr.Prefix] = true
				lr.Stale = true
				out = append(out, lr)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return prefixLess(out[i].Prefix, out[j].Prefix) })
	return out, nil
}

// learnedMaxAge bounds how long Learned answers from its last read.
const learnedMaxAge = 10 * time.Second

// heldRoutes are the routes a session brought before this speaker reset it.
type heldRoutes struct {
	routes []LearnedRoute
	since  time.Time // of the reset
	until  time.Time
}

// releaseHeldRoutes forgets held routes once their session is back and
// synced, gone, or past its restart time. Called with s.mu held.
func (s *Speaker) releaseHeldRoutes(now time.Time, current map[string]PeerState) {
	for key, h := range s.held {
		st, ok := current[key]
		_, running := s.sessions[key]
		back := ok && st.Established() && st.Synced && !st.Since.Before(h.since.Truncate(time.Second)) // GoBGP keeps uptime in whole seconds
		if !running || now.After(h.until) || back {
			delete(s.held, key)
			s.signal()
		}
	}
}
