package bgp

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// blockOf is node i's block in these tests.
func blockOf(i int) netip.Prefix { return netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/26", i)) }

// running makes the state of a running session with the given settings,
// established and synced, giving the blocks of the nodes in gives.
func running(p Peer, since time.Time, gives ...int) PeerState {
	s := PeerState{Peer: p, State: StateEstablished, Since: since, Synced: true}
	for _, i := range gives {
		s.Prefixes = append(s.Prefixes, blockOf(i))
	}
	return s
}

// peersOf runs DesiredPeers for self among nodes and indexes the result by node number.
func peersOf(t *testing.T, self Node, others ...Node) map[int]Peer {
	t.Helper()
	peers, problems := DesiredPeers(Inputs{Self: self, Nodes: append([]Node{self}, others...)})
	if len(problems) != 0 {
		t.Fatal(problems)
	}
	m := map[int]Peer{}
	for _, p := range peers {
		m[int(p.Address.As4()[3])] = p
	}
	return m
}

func list(m map[int]Peer) []Peer {
	var out []Peer
	for i := 1; i <= 9; i++ {
		if p, ok := m[i]; ok {
			out = append(out, p)
		}
	}
	return out
}

// summary renders a plan as "add ...; change ...; remove ...; held ...".
func summary(p Plan) string {
	keys := func(peers []Peer) string {
		var ks []string
		for _, x := range peers {
			ks = append(ks, x.Key())
		}
		return strings.Join(ks, ",")
	}
	var held []string
	for _, h := range p.Held {
		held = append(held, h.Key)
	}
	return fmt.Sprintf("add %s; change %s; remove %s; held %s", keys(p.Add), keys(p.Change), strings.Join(p.Remove, ","), strings.Join(held, ","))
}

func TestTransition(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	later := func(d time.Duration) time.Time { return t0.Add(d) }
	n := []Node{{}, node(1), node(2), node(3), node(4)}
	r2, r3 := rr(2), rr(3)

	// Before: a full mesh, seen from n1 and from n2.
	meshAt1 := peersOf(t, n[1], n[2], n[3], n[4])
	meshAt2 := peersOf(t, n[2], n[1], n[3], n[4])
	// After labelling n2 a reflector.
	rrAt1 := peersOf(t, n[1], r2, n[3], n[4])
	rrAt2 := peersOf(t, r2, n[1], n[3], n[4])
	// After moving the label from n2 to n3.
	moved := peersOf(t, n[1], n[2], r3, n[4])

	meshCurrent := map[string]PeerState{
		meshAt1[2].Key(): running(meshAt1[2], t0, 2),
		meshAt1[3].Key(): running(meshAt1[3], t0, 3),
		meshAt1[4].Key(): running(meshAt1[4], t0, 4),
	}
	withRR := func(gives ...int) map[string]PeerState {
		m := map[string]PeerState{}
		for k, v := range meshCurrent {
			m[k] = v
		}
		m[rrAt1[2].Key()] = running(rrAt1[2], t0, gives...)
		return m
	}
	covered := func(m map[string]PeerState, since time.Time, keys ...string) map[string]PeerState {
		for _, k := range keys {
			s := m[k]
			s.HeldSince, s.CoveredSince = t0, since
			m[k] = s
		}
		return m
	}
	held := func(m map[string]PeerState, since time.Time, keys ...string) map[string]PeerState {
		for _, k := range keys {
			s := m[k]
			s.HeldSince = since
			m[k] = s
		}
		return m
	}

	tests := []struct {
		name    string
		now     time.Time
		current map[string]PeerState
		desired []Peer
		want    string
	}{
		{name: "steady mesh: nothing to do",
			now: later(time.Hour), current: meshCurrent, desired: list(meshAt1),
			want: "add ; change ; remove ; held "},
		{name: "mesh→RR at a client: old sessions stay until the reflector brings their routes",
			now: later(time.Second), current: withRR(2), desired: list(rrAt1),
			want: "add ; change ; remove ; held 10.0.0.3,10.0.0.4"},
		{name: "mesh→RR at a client: a session whose routes come via the reflector settles first",
			now: later(5 * time.Second), current: withRR(2, 3), desired: list(rrAt1),
			want: "add ; change ; remove ; held 10.0.0.3,10.0.0.4"},
		{name: "mesh→RR at a client: ...and goes after the settle time",
			now: later(5 * time.Second), current: covered(withRR(2, 3), later(5*time.Second-DefaultSettle), "10.0.0.3"), desired: list(rrAt1),
			want: "add ; change ; remove 10.0.0.3; held 10.0.0.4"},
		{name: "mesh→RR at a client: not yet settled",
			now: later(5 * time.Second), current: covered(withRR(2, 3), later(5*time.Second-DefaultSettle+time.Millisecond), "10.0.0.3"), desired: list(rrAt1),
			want: "add ; change ; remove ; held 10.0.0.3,10.0.0.4"},
		{name: "mesh→RR at a client: all covered and settled, all go",
			now: later(5 * time.Second), current: covered(withRR(2, 3, 4), later(time.Second), "10.0.0.3", "10.0.0.4"), desired: list(rrAt1),
			want: "add ; change ; remove 10.0.0.3,10.0.0.4; held "},
		{name: "a covered session still goes at the transition timeout",
			now: later(DefaultTransitionTimeout + time.Second), current: covered(withRR(2, 3, 4), later(DefaultTransitionTimeout), "10.0.0.3", "10.0.0.4"), desired: list(rrAt1),
			want: "add ; change ; remove 10.0.0.3,10.0.0.4; held "},
		{name: "mesh→RR at a client: a broken reflector keeps old sessions only until the timeout",
			now:     later(DefaultTransitionTimeout + 2*time.Second),
			current: held(withRR(2), later(time.Second), "10.0.0.3", "10.0.0.4"), desired: list(rrAt1),
			want: "add ; change ; remove 10.0.0.3,10.0.0.4; held "},
		{name: "mesh→RR at the reflector: sessions turn into client sessions after the change delay",
			now: later(time.Second), current: map[string]PeerState{
				"10.0.0.1": running(meshAt2[1], t0, 1), "10.0.0.3": running(meshAt2[3], t0, 3), "10.0.0.4": running(meshAt2[4], t0, 4)},
			desired: list(rrAt2),
			want:    "add ; change ; remove ; held 10.0.0.1,10.0.0.3,10.0.0.4"},
		{name: "mesh→RR at the reflector: ...and then they are re-created",
			now: later(DefaultChangeDelay + time.Second), current: held(map[string]PeerState{
				"10.0.0.1": running(meshAt2[1], t0, 1), "10.0.0.3": running(meshAt2[3], t0, 3), "10.0.0.4": running(meshAt2[4], t0, 4)},
				later(time.Second), "10.0.0.1", "10.0.0.3", "10.0.0.4"),
			desired: list(rrAt2),
			want:    "add ; change 10.0.0.1,10.0.0.3,10.0.0.4; remove ; held "},
		{name: "a changed session that is down is re-created at once",
			now: later(time.Second), current: map[string]PeerState{
				"10.0.0.1": {Peer: meshAt2[1], State: StateActive, Since: t0}, "10.0.0.3": running(meshAt2[3], t0, 3), "10.0.0.4": running(meshAt2[4], t0, 4)},
			desired: list(rrAt2),
			want:    "add ; change 10.0.0.1; remove ; held 10.0.0.3,10.0.0.4"},
		{name: "RR→mesh at a client: mesh sessions are added, the reflector stays",
			now: later(time.Second), current: map[string]PeerState{"10.0.0.2": running(rrAt1[2], t0, 2, 3, 4)}, desired: list(meshAt1),
			want: "add 10.0.0.3,10.0.0.4; change ; remove ; held "},
		{name: "RR→mesh at the old reflector: client sessions turn into mesh sessions after the change delay",
			now: later(DefaultChangeDelay + time.Second), current: held(map[string]PeerState{
				"10.0.0.1": running(rrAt2[1], t0, 1), "10.0.0.3": running(rrAt2[3], t0, 3)},
				later(time.Second), "10.0.0.1", "10.0.0.3"),
			desired: list(meshAt2),
			want:    "add 10.0.0.4; change 10.0.0.1,10.0.0.3; remove ; held "},
		{name: "reflector relabelled: the new one is added, the old one stays",
			now: later(time.Second), current: map[string]PeerState{"10.0.0.2": running(rrAt1[2], t0, 2, 3, 4)}, desired: list(moved),
			want: "add 10.0.0.3; change ; remove ; held 10.0.0.2"},
		{name: "reflector relabelled: the old one goes once the new one reflects everything, and it settled",
			now: later(9 * time.Second), current: covered(map[string]PeerState{
				"10.0.0.2": running(rrAt1[2], t0, 2, 3, 4), "10.0.0.3": running(moved[3], later(5*time.Second), 2, 3, 4)}, later(6*time.Second), "10.0.0.2"),
			desired: list(moved),
			want:    "add ; change ; remove 10.0.0.2; held "},
		{name: "mesh→RR at a client with a block: a mesh session that gives nothing but carries our block waits for the remote",
			now: later(5 * time.Second), current: func() map[string]PeerState {
				m := withRR(2)
				s := m["10.0.0.3"]
				s.Prefixes, s.Advertised = nil, 1
				m["10.0.0.3"] = s
				return m
			}(), desired: list(rrAt1),
			want: "add ; change ; remove ; held 10.0.0.3,10.0.0.4"},
		{name: "...and goes at the transition timeout if the remote never removes it",
			now: later(DefaultTransitionTimeout + 2*time.Second), current: func() map[string]PeerState {
				m := held(withRR(2), later(time.Second), "10.0.0.3")
				s := m["10.0.0.3"]
				s.Prefixes, s.Advertised = nil, 1
				m["10.0.0.3"] = s
				return m
			}(), desired: list(rrAt1),
			want: "add ; change ; remove 10.0.0.3; held 10.0.0.4"},
		{name: "a session that carries nothing either way goes after the settle time, as before",
			now: later(5 * time.Second), current: func() map[string]PeerState {
				m := covered(withRR(2), later(5*time.Second-DefaultSettle), "10.0.0.3")
				s := m["10.0.0.3"]
				s.Prefixes, s.Advertised = nil, 0
				m["10.0.0.3"] = s
				return m
			}(), desired: list(rrAt1),
			want: "add ; change ; remove 10.0.0.3; held 10.0.0.4"},
		{name: "peer gone with no replacement: removed at once",
			now: later(time.Second), current: meshCurrent, desired: []Peer{meshAt1[2], meshAt1[4]},
			want: "add ; change ; remove 10.0.0.3; held "},
		{name: "a session that is down has nothing to lose: removed at once",
			now: later(time.Second), current: func() map[string]PeerState {
				m := withRR(2)
				s := m["10.0.0.3"]
				s.State = StateIdle
				m["10.0.0.3"] = s
				return m
			}(), desired: list(rrAt1),
			want: "add ; change ; remove 10.0.0.3; held 10.0.0.4"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan := Transition(tc.now, tc.current, tc.desired, TransitionOptions{})
			if got := summary(plan); got != tc.want {
				t.Errorf("plan:\n got %s\nwant %s", got, tc.want)
			}
			for _, h := range plan.Held {
				if want := tc.current[h.Key].HeldSince; !want.IsZero() && !h.Since.Equal(want) {
					t.Errorf("hold of %s since %s, want the recorded %s", h.Key, h.Since, want)
				}
				if h.For == "" {
					t.Errorf("hold of %s says nothing", h.Key)
				}
				if want := tc.current[h.Key].CoveredSince; !want.IsZero() && !h.CoveredSince.Equal(want) {
					t.Errorf("hold of %s covered since %s, want the recorded %s", h.Key, h.CoveredSince, want)
				}
			}
		})
	}
}

func TestNeedsReset(t *testing.T) {
	base := peersOf(t, node(1), node(2))[2]
	same := base
	same.Kind, same.BGPPeer, same.Relays, same.KeepOriginalNextHop = KindBGPPeer, "x", true, true
	if needsReset(base, same) {
		t.Error("descriptive fields and KeepOriginalNextHop must not reset a session")
	}
	for name, change := range map[string]func(*Peer){
		"password": func(p *Peer) { p.Password = "x" }, "rr client": func(p *Peer) { p.RRClient = true },
		"restart time": func(p *Peer) { p.RestartTime = time.Second }, "as": func(p *Peer) { p.AS++ },
		"passive": func(p *Peer) { p.Passive = !p.Passive }, "port": func(p *Peer) { p.Port++ },
	} {
		c := base
		change(&c)
		if !needsReset(base, c) {
			t.Errorf("a %s change must reset the session", name)
		}
	}
}
