package bgp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/server"
)

// Config is what a Speaker starts with.
type Config struct {
	// RouterID is the BGP identifier, an IPv4 address (see RouterID).
	RouterID netip.Addr
	// AS is this node's AS number.
	AS uint32
	// ListenAddresses to accept sessions on; none means all.
	ListenAddresses []netip.Addr
	// ListenPort to accept sessions on (0: 179).
	ListenPort uint16

	// Restarting says this speaker restarts with its forwarding state
	// preserved: the node kept the routes of the previous run. Sessions
	// configured within DeferralTime of Start then announce a restart
	// (graceful-restart R and F bits), so peers keep this node's routes
	// until it has re-sent them, and this speaker sends its routes once
	// every established peer has sent End-of-RIB, or DeferralTime after
	// each session came up, whichever is first.
	//
	// Without it, routes go out as soon as each session is up, and peers
	// that check the F bit (BIRD; GoBGP does not) drop this node's routes
	// at reconnect and add them again a millisecond later. With it, GoBGP
	// clears the bits of sessions that come up after the first peer's
	// End-of-RIB (GoBGP #3431), so the same happens to those.
	Restarting bool
	// DeferralTime bounds how long a restarting speaker holds its routes
	// back (default 5 s; GoBGP's own default is 360 s, the six minutes of
	// kube-router #1323).
	DeferralTime time.Duration
	// ConnectRetry is the interval between attempts to connect to a peer
	// (default 3 s; GoBGP's default is 120 s).
	ConnectRetry time.Duration
	// HoldTime of sessions (default 90 s).
	HoldTime time.Duration
	// Transition tunes make-before-break (see Transition).
	Transition TransitionOptions
	// Log receives the speaker's and GoBGP's logs (default slog.Default()).
	Log *slog.Logger
	// OnPrefixLimit, when set, is called each time a session is closed
	// because its peer sent more prefixes than Peer.MaxPrefixes (from
	// GoBGP's goroutines: it must not call the speaker).
	OnPrefixLimit func(peer netip.Addr, family string) `json:"-"`
}

// Defaults of Config.
const (
	DefaultDeferralTime = 5 * time.Second
	DefaultConnectRetry = 3 * time.Second
	DefaultHoldTime     = 90 * time.Second
)

func (c Config) withDefaults() Config {
	if c.ListenPort == 0 {
		c.ListenPort = DefaultListenPort
	}
	if c.DeferralTime <= 0 {
		c.DeferralTime = DefaultDeferralTime
	}
	if c.ConnectRetry <= 0 {
		c.ConnectRetry = DefaultConnectRetry
	}
	if c.HoldTime <= 0 {
		c.HoldTime = DefaultHoldTime
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return c
}

// Speaker is this node's BGP speaker: GoBGP embedded, converged to the
// desired sessions and advertisements on every SetPeers and
// SetAdvertisements. Its methods may be called from any goroutine.
type Speaker struct {
	cfg  Config
	srv  *server.BgpServer
	glog *gobgpLogger
	log  *slog.Logger

	mu       sync.Mutex
	started  time.Time
	desired  []Peer
	sessions map[string]*session         // running sessions by Peer.Key
	adverts  map[netip.Prefix]advertised // routes handed to GoBGP
	held     map[string]heldRoutes       // routes of sessions this speaker reset, by Peer.Key
	filters  *Filters                    // see SetFilters
	policy   *api.SetPoliciesRequest     // the GoBGP policies in force
	// policySynced: the last syncPolicies applied filters to every
	// session without an error.
	policySynced bool
	lastErr      error // of the last converge
	// converged: the last converge for desired succeeded; SetPeers with
	// the same desired and nothing pending has nothing to do.
	converged bool
	// changed counts the times the speaker had sessions re-evaluate
	// what they received, failed to replace its policies, or changed its
	// sessions (see LearnedVersion).
	changed atomic.Uint64
	// ribGen counts GoBGP's events that can change what Learned returns:
	// a best path changing, an End-of-RIB, a session going up or down.
	// learned is the table Learned read last, at learnedTime, with ribGen
	// and changed as they were before it read.
	ribGen                atomic.Uint64
	learned               *rib
	learnedGen, learnedAt uint64
	learnedTime           time.Time
	// scans counts Learned's reads of GoBGP's table, resets the soft
	// resets in (for the tests).
	scans, resets atomic.Uint64
	// lastRead is the table the last Learned read, while no
	// RecentPeerStates has used it; lastReadAt the changed count
	// when it was read.
	lastRead   *rib
	lastReadAt uint64
	// statesGen counts what can change a session's state as PeerStates
	// gives it, but its route counts: GoBGP's peer events (a session
	// going up or down) and converges. recent are the states the last
	// RecentPeerStates read, at recentAt with statesGen recentGen.
	statesGen atomic.Uint64
	recent    []PeerState
	recentAt  time.Time
	recentGen uint64

	kick    chan struct{}
	changes chan struct{}
	stop    context.CancelFunc
	done    chan struct{}
}

// session is a running session as the speaker configured it.
type session struct {
	peer      Peer
	added     time.Time
	heldSince time.Time
	heldFor   string
	// coveredSince is the Hold's CoveredSince (see PeerState).
	coveredSince time.Time
}

// Start starts a speaker. It listens at once; sessions come with SetPeers.
func Start(ctx context.Context, cfg Config) (*Speaker, error) {
	cfg = cfg.withDefaults()
	if !cfg.RouterID.Is4() {
		return nil, fmt.Errorf("BGP router ID %q is not an IPv4 address: pass the node's IPv4 address or bgp.RouterID(node)", cfg.RouterID)
	}
	if cfg.AS == 0 {
		return nil, errors.New("BGP AS number is 0: pass the node's AS number (BGPConfiguration asNumber, default 64512)")
	}
	s := &Speaker{
		cfg:      cfg,
		glog:     newGobgpLogger(cfg.Log),
		log:      cfg.Log,
		started:  time.Now(),
		sessions: map[string]*session{},
		adverts:  map[netip.Prefix]advertised{},
		held:     map[string]heldRoutes{},
		filters:  &Filters{},
		kick:     make(chan struct{}, 1),
		changes:  make(chan struct{}, 1),
		done:     make(chan struct{}),
	}
	s.glog.onLimit = s.prefixLimitReached
	s.srv = server.NewBgpServer(server.LoggerOption(s.glog))
	go s.srv.Serve()
	global := &api.Global{Asn: cfg.AS, RouterId: cfg.RouterID.String(), ListenPort: int32(cfg.ListenPort)}
	for _, a := range cfg.ListenAddresses {
		global.ListenAddresses = append(global.ListenAddresses, a.String())
	}
	if err := s.srv.StartBgp(ctx, &api.StartBgpRequest{Global: global}); err != nil {
		s.srv.Stop()
		return nil, fmt.Errorf("starting BGP (AS %d, router ID %s, port %d): %w; is another BGP speaker listening on the port?", cfg.AS, cfg.RouterID, cfg.ListenPort, err)
	}
	if err := s.installPolicies(ctx); err != nil {
		s.srv.Stop()
		return nil, err
	}
	watchCtx, stop := context.WithCancel(context.Background())
	s.stop = stop
	err := s.srv.WatchEvent(watchCtx, &api.WatchEventRequest{
		Peer: &api.WatchEventRequest_Peer{},
		Table: &api.WatchEventRequest_Table{Filters: []*api.WatchEventRequest_Table_Filter{
			{Type: api.WatchEventRequest_Table_Filter_BEST},
			{Type: api.WatchEventRequest_Table_Filter_EOR},
		}},
	}, s.onEvent)
	if err != nil {
		stop()
		s.srv.Stop()
		return nil, fmt.Errorf("watching GoBGP events: %w", err)
	}
	go s.run(watchCtx)
	return s, nil
}

// Stop ends every session and stops the speaker. GoBGP ends them with a
// Cease NOTIFICATION (a Hard Reset where RFC 8538 was negotiated), so peers
// drop this node's routes at once: call it when the node leaves. A daemon
// that restarts should just exit instead: peers see the connections close,
// keep its routes for its restart time and take them back when it returns.
func (s *Speaker) Stop(ctx context.Context) error {
	s.stop()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv.StopBgp(ctx, &api.StopBgpRequest{})
}

// SetPeers sets the sessions the speaker should have and converges towards
// them with Transition: new sessions start now, sessions that go away or
// change wait for their replacements (the speaker keeps re-evaluating them
// by itself). Call it on every reconcile; it is idempotent.
func (s *Speaker) SetPeers(ctx context.Context, desired []Peer) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.converged && !s.pending() && reflect.DeepEqual(desired, s.desired) {
		// Nothing to do, and finding that out reads GoBGP's whole table
		// and every session: the daemon calls this on every reconcile.
		return nil
	}
	s.desired = append([]Peer(nil), desired...)
	err := s.converge(ctx)
	s.converged, s.lastErr = err == nil, err
	return err
}

// SetFilters sets the route filters (see Filters) and applies them to
// every session: routes already received are evaluated again. Call it on
// every reconcile, before SetPeers; it is idempotent. Until it is first
// called, sessions with nodes accept nothing and external peers
// everything but the default route.
func (s *Speaker) SetFilters(ctx context.Context, f *Filters) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f == s.filters && s.policySynced {
		// The filters in force, applied: compiling and comparing the
		// policies again would find nothing to do. (A change of
		// sessions re-applies them in converge.)
		return nil
	}
	s.filters = f
	return s.syncPolicies(ctx)
}

// prefixLimitReached is told by GoBGP's log that a session was closed for
// sending too many prefixes.
func (s *Speaker) prefixLimitReached(key, family string) {
	addr, err := netip.ParseAddr(key)
	if err != nil {
		return
	}
	s.log.Warn("BGP peer sent more prefixes than its limit: the session is closed (Cease, maximum number of prefixes reached) and will be again each time it comes back with as many; find out why it sends so many, or raise BGPPeer maxPrefixes (BGPConfiguration nodeMeshMaxPrefixes for sessions between nodes)",
		"peer", key, "family", family)
	if s.cfg.OnPrefixLimit != nil {
		s.cfg.OnPrefixLimit(addr.Unmap(), family)
	}
}

// LearnedVersion changes whenever what Learned returns may have changed:
// on GoBGP's events (a best path, an End-of-RIB, a session's state), and
// when the speaker had sessions re-evaluate what they received under new
// route filters, or added, changed or removed sessions (a route may then
// change without a message from a peer). A caller that read Learned after
// the version need not read it again while the version stays the same.
func (s *Speaker) LearnedVersion() uint64 { return s.ribGen.Load() + s.changed.Load() }

// Changes is signalled (coalesced, never blocking the speaker) when what
// Learned or PeerStates return may have changed.
func (s *Speaker) Changes() <-chan struct{} { return s.changes }

// onEvent signals GoBGP's events but table events without paths: GoBGP
// sends one for every path it re-evaluates whose best path stayed the same
// (a soft reset in sends one per path received), and each would cost the
// daemon a reconcile that finds nothing to do.
func (s *Speaker) onEvent(ev *api.WatchEventResponse) {
	if t := ev.GetTable(); t != nil && len(t.GetPaths()) == 0 {
		return
	}
	if ev.GetPeer() != nil {
		s.statesGen.Add(1)
	}
	s.ribGen.Add(1)
	s.signal()
}

// signal tells the daemon and the background loop that something happened.
func (s *Speaker) signal() {
	select {
	case s.changes <- struct{}{}:
	default:
	}
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// run re-evaluates held sessions and routes when something happens and
// once a second while anything is held, until ctx ends.
func (s *Speaker) run(ctx context.Context) {
	defer close(s.done)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		case <-tick.C:
		}
		s.mu.Lock()
		if s.pending() {
			err := s.converge(ctx)
			if err != nil && ctx.Err() == nil && (s.lastErr == nil || s.lastErr.Error() != err.Error()) {
				s.log.Warn("BGP: converging sessions failed; retrying every second", "err", err)
			}
			s.lastErr, s.converged = err, err == nil
		}
		s.mu.Unlock()
	}
}

// pending says whether the background loop has work: held sessions, held
// routes, or a failed converge to retry.
func (s *Speaker) pending() bool {
	if s.lastErr != nil || len(s.held) > 0 {
		return true
	}
	for _, ss := range s.sessions {
		if !ss.heldSince.IsZero() {
			return true
		}
	}
	return false
}

// converge applies one Transition plan. Called with s.mu held.
func (s *Speaker) converge(ctx context.Context) error {
	defer s.statesGen.Add(1)
	now := time.Now()
	rib, err := s.scanRIB(ctx)
	if err != nil {
		return err
	}
	states, err := s.peerStates(ctx, rib)
	if err != nil {
		return err
	}
	current := map[string]PeerState{}
	for _, st := range states {
		current[st.Key()] = st
	}
	plan := Transition(now, current, s.desired, s.cfg.Transition)
	var errs []error
	for _, key := range plan.Remove {
		errs = append(errs, s.deletePeer(ctx, key))
		delete(s.held, key)
	}
	for _, p := range plan.Change {
		s.held[p.Key()] = heldRoutes{routes: rib.byPeer[p.Address], since: now, until: now.Add(p.RestartTime)}
		errs = append(errs, s.recreatePeer(ctx, p, now))
	}
	for _, p := range plan.Add {
		errs = append(errs, s.addPeer(ctx, p, now))
	}
	for _, p := range s.desired {
		if ss, ok := s.sessions[p.Key()]; ok && !needsReset(ss.peer, p) {
			ss.peer, ss.heldSince, ss.heldFor, ss.coveredSince = p, time.Time{}, "", time.Time{}
		}
	}
	for _, h := range plan.Held {
		if ss, ok := s.sessions[h.Key]; ok {
			ss.heldSince, ss.heldFor, ss.coveredSince = h.Since, h.For, h.CoveredSince
		}
	}
	s.releaseHeldRoutes(now, current)
	errs = append(errs, s.syncPolicies(ctx))
	if len(plan.Add)+len(plan.Change)+len(plan.Remove) > 0 {
		s.changed.Add(1)
		s.log.Info("BGP sessions converged", "added", len(plan.Add), "changed", len(plan.Change), "removed", len(plan.Remove), "held", len(plan.Held))
		s.signal()
	}
	return errors.Join(errs...)
}

// addPeer configures a session in GoBGP.
func (s *Speaker) addPeer(ctx context.Context, p Peer, now time.Time) error {
	if p.Password != "" && listenersUseMPTCP() {
		return fmt.Errorf("BGP peer %s (%s): %w", p.Address, p.Reason(), ErrMPTCPListeners)
	}
	restarting := s.cfg.Restarting && now.Sub(s.started) < s.cfg.DeferralTime
	if err := s.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: apiPeer(p, s.cfg, restarting)}); err != nil {
		return fmt.Errorf("adding BGP peer %s (%s): %w", p.Address, p.Reason(), err)
	}
	s.sessions[p.Key()] = &session{peer: p, added: now}
	return nil
}

// deletePeer removes a session from GoBGP.
func (s *Speaker) deletePeer(ctx context.Context, key string) error {
	delete(s.sessions, key)
	if err := s.srv.DeletePeer(ctx, &api.DeletePeerRequest{Address: key}); err != nil {
		return fmt.Errorf("removing BGP peer %s: %w", key, err)
	}
	return nil
}

// recreatePeer re-creates a session with new settings. GoBGP cannot change
// most settings of a running session, and deleting one sends a Hard Reset
// that makes the remote drop our routes at once; so the session is first
// reset administratively, which a remote that negotiated RFC 8538 treats
// as a graceful restart, keeping our routes until we send them again.
func (s *Speaker) recreatePeer(ctx context.Context, p Peer, now time.Time) error {
	key := p.Key()
	if err := s.srv.ResetPeer(ctx, &api.ResetPeerRequest{Address: key, Communication: "tabby: session settings changed"}); err != nil {
		return fmt.Errorf("resetting BGP peer %s to change its settings: %w", key, err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) && s.established(ctx, key) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := s.deletePeer(ctx, key); err != nil {
		return err
	}
	return s.addPeer(ctx, p, now)
}

// established says whether GoBGP has the session with key up.
func (s *Speaker) established(ctx context.Context, key string) bool {
	up := false
	_ = s.srv.ListPeer(ctx, &api.ListPeerRequest{Address: key}, func(p *api.Peer) {
		up = p.GetState().GetSessionState() == api.PeerState_ESTABLISHED
	})
	return up
}

// establishedKeys says which of the sessions keys GoBGP has up: in one
// read of every session when keys are all of them, else one read per key
// (GoBGP converts only the sessions a read asks for). Called with s.mu
// held.
func (s *Speaker) establishedKeys(ctx context.Context, keys []string) (map[string]bool, error) {
	up := map[string]bool{}
	mark := func(p *api.Peer) {
		if p.GetState().GetSessionState() == api.PeerState_ESTABLISHED {
			up[p.GetConf().GetNeighborAddress()] = true
		}
	}
	if len(keys) == len(s.sessions) {
		return up, s.srv.ListPeer(ctx, &api.ListPeerRequest{}, mark)
	}
	for _, key := range keys {
		if err := s.srv.ListPeer(ctx, &api.ListPeerRequest{Address: key}, mark); err != nil {
			return up, err
		}
	}
	return up, nil
}
