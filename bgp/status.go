package bgp

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"time"

	api "github.com/osrg/gobgp/v3/api"
)

// syncGrace: a peer that sends no End-of-RIB counts as having sent all its
// routes this long after its session came up.
const syncGrace = 10 * time.Second

// PeerStates returns every running session and how it is doing, ordered by
// address: what `tabbyctl node status` prints.
func (s *Speaker) PeerStates(ctx context.Context) ([]PeerState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peerStatesOf(ctx, nil)
}

// RecentPeerStates is PeerStates for a caller that has just called
// Learned, and needs the sessions' states up to date and their route
// counts only nearly so (the routing pass: readiness and metrics).
//
// A read counts the sessions' routes in the table Learned read, rather
// than in a new read of GoBGP's whole table, when the speaker has changed
// no filter and no session since (once: another call reads the table
// again). Each read of the table waits on GoBGP's one loop, which on a
// reflector is also the one passing routes on.
//
// It does not read at all, but answers with what it read less
// than maxAge ago while no session has gone up or down and no converge
// has run since; only the counts of routes can then be behind. until is
// when that answer stops being recent (the zero time after a fresh
// read): a caller that publishes the counts reads again then. Reading
// the states asks GoBGP to convert every session's configuration, and a
// claim anywhere in the cluster brings every node two routing passes.
func (s *Speaker) RecentPeerStates(ctx context.Context, maxAge time.Duration) (_ []PeerState, until time.Time, _ error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	gen := s.statesGen.Load()
	if s.recent != nil && gen == s.recentGen && time.Since(s.recentAt) < maxAge {
		s.lastRead = nil
		return slices.Clone(s.recent), s.recentAt.Add(maxAge), nil
	}
	r := s.lastRead
	if r != nil && s.lastReadAt != s.changed.Load() {
		r = nil
	}
	at := time.Now()
	states, err := s.peerStatesOf(ctx, r)
	if err != nil {
		s.recent = nil
		return nil, time.Time{}, err
	}
	s.recent, s.recentAt, s.recentGen = slices.Clone(states), at, gen
	return states, time.Time{}, nil
}

// peerStatesOf is PeerStates over the table r (nil: read it now). Called
// with s.mu held.
func (s *Speaker) peerStatesOf(ctx context.Context, read *rib) ([]PeerState, error) {
	s.lastRead = nil
	var r rib
	if read != nil {
		r = *read
	} else {
		var err error
		if r, err = s.scanRIB(ctx); err != nil {
			return nil, err
		}
	}
	states, err := s.peerStates(ctx, r)
	if err != nil {
		return nil, err
	}
	for i := range states {
		st := &states[i]
		st.LimitTrips = s.glog.limitTrips(st.Key())
		if st.Established() {
			if err := s.countRejected(ctx, st, r.kept[st.Address]); err != nil {
				return nil, err
			}
		}
	}
	return states, nil
}

// maxRejectedShown bounds PeerState.RejectedPrefixes.
const maxRejectedShown = 10

// countRejected counts the routes of a session the import policy rejects,
// given how many of its routes the table kept. GoBGP's count of what
// a session sent leaves out only routes with AS loops, so when the table
// kept as many, the import policy rejected none. Only otherwise is GoBGP
// asked for the session's routes marked by the policy (it keeps rejected
// ones in the session's Adj-RIB-In), for the count and some prefixes.
// That runs the import policy over every route the session sent, on
// GoBGP's one loop: on a route reflector, with every session's state read
// on every routing pass, asking each time held up the routes it was
// passing on.
func (s *Speaker) countRejected(ctx context.Context, st *PeerState, kept int) error {
	if st.Accepted <= kept {
		return nil
	}
	err := s.srv.ListPath(ctx, &api.ListPathRequest{TableType: api.TableType_ADJ_IN, Name: st.Key(),
		Family: familyFor(st.Address), EnableFiltered: true}, func(d *api.Destination) {
		for _, p := range d.Paths {
			if !p.Filtered || p.IsWithdraw {
				continue
			}
			st.Rejected++
			if pfx, err := netip.ParsePrefix(d.Prefix); err == nil && len(st.RejectedPrefixes) < maxRejectedShown {
				st.RejectedPrefixes = append(st.RejectedPrefixes, pfx)
			}
		}
	})
	if err != nil {
		return fmt.Errorf("reading what BGP peer %s sent: %w", st.Key(), err)
	}
	st.Accepted = max(st.Accepted-st.Rejected, 0)
	sort.Slice(st.RejectedPrefixes, func(i, j int) bool { return prefixLess(st.RejectedPrefixes[i], st.RejectedPrefixes[j]) })
	return nil
}

// peerStates joins the sessions the speaker configured with GoBGP's view
// of them. Called with s.mu held.
func (s *Speaker) peerStates(ctx context.Context, r rib) ([]PeerState, error) {
	gobgp := map[string]*api.Peer{}
	err := s.srv.ListPeer(ctx, &api.ListPeerRequest{}, func(p *api.Peer) {
		if p.GetConf() != nil {
			if a, err := netip.ParseAddr(p.Conf.NeighborAddress); err == nil {
				gobgp[a.Unmap().String()] = p
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("listing BGP peers: %w", err)
	}
	now := time.Now()
	out := make([]PeerState, 0, len(s.sessions))
	for key, ss := range s.sessions {
		st := PeerState{Peer: ss.peer, State: StateIdle, Since: ss.added, HeldSince: ss.heldSince, HeldFor: ss.heldFor, CoveredSince: ss.coveredSince}
		if gp, ok := gobgp[key]; ok {
			fillState(&st, gp, now)
		}
		if st.Established() {
			// What we originate goes to every established session. Not
			// GoBGP's advertised count: with graceful restart it counts an
			// End-of-RIB marker per family, so a node that originates
			// nothing would seem to carry something.
			st.Advertised = len(s.adverts)
			for _, lr := range r.byPeer[ss.peer.Address] {
				st.Prefixes = append(st.Prefixes, lr.Prefix)
			}
		} else {
			st.Detail = s.glog.detail(key)
		}
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Address.Less(out[j].Address) })
	return out, nil
}

// fillState copies GoBGP's view of a session into st.
func fillState(st *PeerState, gp *api.Peer, now time.Time) {
	if state, ok := sessionStates[gp.GetState().GetSessionState()]; ok {
		st.State = state
	}
	timers := gp.GetTimers().GetState()
	since := timers.GetDowntime()
	if st.Established() {
		since = timers.GetUptime()
	}
	if since != nil && since.AsTime().After(st.Since) {
		st.Since = since.AsTime()
	}
	eor := len(gp.AfiSafis) > 0
	for _, af := range gp.AfiSafis {
		st.Received += int(af.GetState().GetReceived())
		st.Accepted += int(af.GetState().GetAccepted())
		eor = eor && af.GetMpGracefulRestart().GetState().GetEndOfRibReceived()
	}
	st.Synced = st.Established() && (eor || now.Sub(st.Since) >= syncGrace)
}
