package bgp

import (
	"fmt"
	"net/netip"
	"sort"
	"time"
)

// SessionState is the state of a BGP session (RFC 4271's FSM).
type SessionState string

// The session states.
const (
	StateIdle        SessionState = "Idle"
	StateConnect     SessionState = "Connect"
	StateActive      SessionState = "Active"
	StateOpenSent    SessionState = "OpenSent"
	StateOpenConfirm SessionState = "OpenConfirm"
	StateEstablished SessionState = "Established"
)

// PeerState is a running session: the settings it runs with and how it is
// doing. Speaker.PeerStates returns them; Transition reads them.
type PeerState struct {
	Peer
	// State of the session and when it entered it (for a session that never
	// came up, when it was configured).
	State SessionState
	Since time.Time
	// Synced: the peer has sent all its routes (End-of-RIB) since the session
	// came up.
	Synced bool
	// Received and Accepted count the routes the peer sent us; Advertised
	// the routes this node originates, which an established session
	// carries to the peer.
	Received, Accepted, Advertised int
	// Rejected counts the routes the peer sent that the route filters
	// reject (see Filters); RejectedPrefixes are some of them.
	Rejected         int
	RejectedPrefixes []netip.Prefix
	// LimitTrips counts the times the session was closed because the peer
	// sent more than MaxPrefixes.
	LimitTrips int
	// Prefixes are the prefixes the peer currently gives us (retained stale
	// routes of a restarting peer excluded).
	Prefixes []netip.Prefix
	// Detail says why a session is not Established (the last error seen).
	Detail string
	// HeldSince is when Transition first held the session back (it is no
	// longer desired, or its settings changed); zero when it is not held.
	// HeldFor says what it waits for.
	HeldSince time.Time
	HeldFor   string
	// CoveredSince is when Transition first saw every prefix of a session
	// that is no longer desired arrive over desired sessions too; zero when
	// it has not (or no longer does).
	CoveredSince time.Time
}

// Established says whether the session is up.
func (s PeerState) Established() bool { return s.State == StateEstablished }

// TransitionOptions tune Transition; zero fields take the defaults.
type TransitionOptions struct {
	// Timeout bounds how long a session that is no longer desired waits for
	// its replacements (default 90 s), so a broken new session cannot keep
	// an old one forever.
	Timeout time.Duration
	// ChangeDelay is how long a session whose settings changed keeps
	// running with the old ones before it is re-created (default 15 s).
	// Re-creating resets the session, and what the remote got over it under
	// the old settings (a reflector's reflected routes) must first arrive
	// over the remote's new sessions, which are not visible from here.
	ChangeDelay time.Duration
	// Settle is how long a session that is no longer desired stays after
	// everything it gives us arrived over other sessions (default 2 s).
	// Removing a session drops it at both ends, and the remote end may not
	// have our prefixes over its new sessions yet: a reflector passes them
	// on a moment after it passed us the remote's.
	Settle time.Duration
}

// Defaults of TransitionOptions.
const (
	DefaultTransitionTimeout = 90 * time.Second
	DefaultChangeDelay       = 15 * time.Second
	DefaultSettle            = 2 * time.Second
)

func (o TransitionOptions) withDefaults() TransitionOptions {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTransitionTimeout
	}
	if o.ChangeDelay <= 0 {
		o.ChangeDelay = DefaultChangeDelay
	}
	if o.Settle <= 0 {
		o.Settle = DefaultSettle
	}
	return o
}

// Plan is what Transition decides for one reconcile.
type Plan struct {
	// Add are desired sessions that do not run yet: start them now.
	Add []Peer
	// Change are running sessions whose settings changed: re-create them now.
	Change []Peer
	// Remove are running sessions, by Peer.Key, that are no longer desired
	// and may go now.
	Remove []string
	// Held are running sessions kept for now, and why.
	Held []Hold
}

// Hold is a session Transition keeps for now.
type Hold struct {
	Key   string
	Since time.Time
	For   string
	// CoveredSince is PeerState.CoveredSince to record, zero when the
	// session's prefixes are not all covered.
	CoveredSince time.Time
}

// Transition is make-before-break for BGP sessions. current are the running
// sessions by Peer.Key, desired what DesiredPeers wants, now the time.
//
//   - A desired session that does not run is added at once.
//   - A session no longer desired is removed once nothing would be lost:
//     every prefix it gives us also comes over a desired, established
//     session. It is removed at once when it is not established, when no
//     desired session relays other speakers' routes (nothing could replace
//     it: a node that left, a mesh shrinking), or after opt.Timeout. When
//     it is covered, it still stays opt.Settle, so that the remote end gets
//     our prefixes over its new sessions before this one drops at both ends.
//     A session with another tabby node that gives us nothing but carries
//     our prefixes is left to the remote to remove (it runs this same rule
//     and sees when ours reach it over its new sessions), up to opt.Timeout:
//     removing a session drops it at both ends, and with nothing of its own
//     to wait for, this end cannot know when the remote may lose it (a new
//     reflector re-creates its sessions only after opt.ChangeDelay).
//   - A session whose settings changed (which needs a reset) is re-created
//     at once when it is not established, otherwise opt.ChangeDelay after
//     the change was first seen.
//
// The caller records each Hold's Since as the session's HeldSince and
// calls Transition again on every reconcile; it is a pure function.
func Transition(now time.Time, current map[string]PeerState, desired []Peer, opt TransitionOptions) Plan {
	opt = opt.withDefaults()
	var plan Plan
	want := map[string]bool{}
	covered := map[netip.Prefix]bool{}
	relays := false
	for _, p := range desired {
		want[p.Key()] = true
		relays = relays || p.Relays
		cur, ok := current[p.Key()]
		switch {
		case !ok:
			plan.Add = append(plan.Add, p)
		case cur.Established():
			for _, pfx := range cur.Prefixes {
				covered[pfx] = true
			}
		}
	}
	// hold keeps cur for now unless it has been held for limit already.
	hold := func(cur PeerState, limit time.Duration, format string, args ...any) bool {
		since := cur.HeldSince
		if since.IsZero() {
			since = now
		}
		if now.Sub(since) >= limit {
			return false
		}
		plan.Held = append(plan.Held, Hold{Key: cur.Key(), Since: since, For: fmt.Sprintf(format, args...)})
		return true
	}
	for _, p := range desired {
		cur, ok := current[p.Key()]
		if !ok || !needsReset(cur.Peer, p) {
			continue
		}
		if !cur.Established() || !hold(cur, opt.ChangeDelay, "its settings changed: re-created %s after the change", opt.ChangeDelay) {
			plan.Change = append(plan.Change, p)
		}
	}
	for _, key := range sortedKeys(current) {
		cur := current[key]
		if want[key] {
			continue
		}
		var lost []netip.Prefix
		if cur.Established() {
			for _, pfx := range cur.Prefixes {
				if !covered[pfx] {
					lost = append(lost, pfx)
				}
			}
		}
		switch {
		case !cur.Established() || !relays:
			plan.Remove = append(plan.Remove, key)
		case len(cur.Prefixes) == 0 && cur.Advertised > 0 && cur.Node != "":
			if !hold(cur, opt.Timeout, "no longer desired: it carries our %d prefixes to %s, which removes it once they arrive over its new sessions", cur.Advertised, cur.Node) {
				plan.Remove = append(plan.Remove, key)
			}
		case len(lost) > 0:
			if !hold(cur, opt.Timeout, "no longer desired: waiting for %d of its prefixes (%s first) to arrive over other sessions", len(lost), lost[0]) {
				plan.Remove = append(plan.Remove, key)
			}
		default:
			coveredSince := cur.CoveredSince
			if coveredSince.IsZero() {
				coveredSince = now
			}
			if now.Sub(coveredSince) >= opt.Settle || !hold(cur, opt.Timeout, "no longer desired: its prefixes arrive over other sessions; it goes %s after they did", opt.Settle) {
				plan.Remove = append(plan.Remove, key)
				continue
			}
			plan.Held[len(plan.Held)-1].CoveredSince = coveredSince
		}
	}
	sort.Slice(plan.Held, func(i, j int) bool { return plan.Held[i].Key < plan.Held[j].Key })
	return plan
}

// needsReset says whether a running session must be re-created to run with
// the settings of p. Kind, BGPPeer, Node and Relays only describe a session;
// KeepOriginalNextHop is applied by policy without a reset.
func needsReset(running, p Peer) bool {
	return running.Address != p.Address || running.Port != p.Port || running.AS != p.AS ||
		running.LocalAddress != p.LocalAddress || running.Passive != p.Passive ||
		running.RRClient != p.RRClient || running.ClusterID != p.ClusterID ||
		running.Password != p.Password || running.RestartTime != p.RestartTime ||
		running.maxPrefixes() != p.maxPrefixes()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
