package bgp

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/tabbynet/tabby/api/v1"
)

// Two speakers in this process, on loopback addresses with ports of their
// own: the speaker's API without namespaces or root. Real multi-node
// sessions are in the namespace tests (lab_test.go).

// loopSpeaker starts a speaker on 127.0.0.<i>, port 20000+i.
func loopSpeaker(t *testing.T, i int, cfg Config) *Speaker {
	t.Helper()
	addr := netip.AddrFrom4([4]byte{127, 0, 0, byte(i)})
	cfg.RouterID, cfg.ListenAddresses, cfg.ListenPort = addr, []netip.Addr{addr}, uint16(20000+i)
	if cfg.AS == 0 {
		cfg.AS = 64512
	}
	cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("speaker", i)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
	return s
}

// loopPeer is the session from speaker i to speaker j.
func loopPeer(i, j int) Peer {
	local, remote := netip.AddrFrom4([4]byte{127, 0, 0, byte(i)}), netip.AddrFrom4([4]byte{127, 0, 0, byte(j)})
	return Peer{Address: remote, Port: uint16(20000 + j), AS: 64512, LocalAddress: local, Passive: remote.Less(local),
		RestartTime: 2 * time.Minute, Kind: KindMesh}
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; last state: %s", what, timeout, state)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func learnedString(t *testing.T, s *Speaker) string {
	t.Helper()
	routes, err := s.Learned(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := ""
	for _, r := range routes {
		out += fmt.Sprintf("%s via %s from %s stale=%v; ", r.Prefix, r.NextHop, r.Peer, r.Stale)
	}
	return out
}

// setLoopFilters gives speakers the filters of a cluster of nodes a
// (192.168.0.1), b (192.168.0.2) and c (192.168.0.9) with the pool
// 10.244.0.0/16: 10.244.1.0/26 belongs to owner, 10.244.2.0/26 to b.
func setLoopFilters(t *testing.T, owner string, speakers ...*Speaker) {
	t.Helper()
	f, problems := NewFilters(FilterInputs{Pools: []v1.IPPool{sizedPool("10.244.0.0/16", 26)},
		Nodes: []Node{{Name: "a", IPv4: netip.MustParsePrefix("192.168.0.1/24")}, {Name: "b", IPv4: netip.MustParsePrefix("192.168.0.2/24")},
			{Name: "c", IPv4: netip.MustParsePrefix("192.168.0.9/24")}},
		Blocks: []v1.IPAMBlock{block("10.244.1.0/26", "host:"+owner, nil), block("10.244.2.0/26", "host:b", nil)},
		Config: v1.BGPConfigurationSpec{ServiceClusterIPs: []v1.ServiceIPBlock{{CIDR: "10.96.0.0/12"}}}})
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	for _, s := range speakers {
		if err := s.SetFilters(context.Background(), f); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSpeakerOnLoopback(t *testing.T) {
	if testing.Short() {
		t.Skip("starts BGP sessions")
	}
	ctx := context.Background()
	a, b := loopSpeaker(t, 1, Config{}), loopSpeaker(t, 2, Config{})
	setLoopFilters(t, "a", a, b)
	if err := a.SetPeers(ctx, []Peer{loopPeer(1, 2)}); err != nil {
		t.Fatal(err)
	}
	if err := b.SetPeers(ctx, []Peer{loopPeer(2, 1)}); err != nil {
		t.Fatal(err)
	}
	blockA := Route{Prefix: netip.MustParsePrefix("10.244.1.0/26"), NextHop: netip.MustParseAddr("192.168.0.1")}
	svc := Route{Prefix: netip.MustParsePrefix("10.96.0.0/12"), NextHop: netip.MustParseAddr("192.168.0.1")}
	if err := a.SetAdvertisements(ctx, []Route{blockA, svc}); err != nil {
		t.Fatal(err)
	}
	// Service CIDRs are not for nodes: a does not send it.
	eventually(t, 20*time.Second, "b learns a's block with a's next hop", func() (bool, string) {
		got := learnedString(t, b)
		return got == "10.244.1.0/26 via 192.168.0.1 from 127.0.0.1 stale=false; ", got
	})
	if got := learnedString(t, a); got != "" {
		t.Errorf("a learned its own routes back: %s", got)
	}
	states, err := b.PeerStates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(states) != 1 || !states[0].Established() || !states[0].Synced || states[0].Received != 1 || len(states[0].Prefixes) != 1 || states[0].Reason() != "node-mesh" {
		t.Errorf("b's peer states: %+v", states)
	}
	// b originates nothing, so it carries nothing to a (graceful restart's
	// End-of-RIB is not a route: Transition would otherwise hold a session
	// between two nodes without blocks until its timeout); a carries two.
	if len(states) == 1 && states[0].Advertised != 0 {
		t.Errorf("b, which originates nothing, counts %d routes advertised to a", states[0].Advertised)
	}
	if st, err := a.PeerStates(ctx); err != nil || len(st) != 1 || st[0].Advertised != 2 {
		t.Errorf("a's peer states (want 2 advertised): %+v %v", st, err)
	}

	// Withdraw one route, move the other to a new next hop: the block now
	// belongs to node c, 192.168.0.9.
	setLoopFilters(t, "c", a, b)
	moved := blockA
	moved.NextHop = netip.MustParseAddr("192.168.0.9")
	if err := a.SetAdvertisements(ctx, []Route{moved}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "b sees the withdrawal and the new next hop", func() (bool, string) {
		got := learnedString(t, b)
		return got == "10.244.1.0/26 via 192.168.0.9 from 127.0.0.1 stale=false; ", got
	})
	select {
	case <-b.Changes():
	default:
		t.Error("b's Changes was not signalled")
	}

	// No peers: the session goes (nothing relays, so at once) and so do its
	// routes, on both sides (removing a peer is a Hard Reset, no graceful
	// restart).
	if err := b.SetAdvertisements(ctx, []Route{{Prefix: netip.MustParsePrefix("10.244.2.0/26"), NextHop: netip.MustParseAddr("192.168.0.2")}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "a learns b's route", func() (bool, string) {
		got := learnedString(t, a)
		return got == "10.244.2.0/26 via 192.168.0.2 from 127.0.0.2 stale=false; ", got
	})
	if err := b.SetPeers(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if got := learnedString(t, b); got != "" {
		t.Errorf("b still has routes after dropping its only peer: %s", got)
	}
	eventually(t, 10*time.Second, "a's session goes down and b's route with it", func() (bool, string) {
		st, _ := a.PeerStates(ctx)
		got := learnedString(t, a)
		return len(st) == 1 && !st[0].Established() && st[0].Detail != "" && got == "", fmt.Sprintf("%+v %s", st, got)
	})
}

// TestLoopbackLearnedAndResets: Learned reads GoBGP's table again only
// after an event or a re-evaluation; a filter change re-evaluates only
// sessions that received a route it can judge otherwise, and one that did
// (a route that came before the claim of its block) is re-evaluated, so
// the route is learned.
func TestLoopbackLearnedAndResets(t *testing.T) {
	if testing.Short() {
		t.Skip("starts BGP sessions")
	}
	ctx := context.Background()
	a, b := loopSpeaker(t, 4, Config{}), loopSpeaker(t, 5, Config{})
	filters := func(blocks ...v1.IPAMBlock) {
		t.Helper()
		f, problems := NewFilters(FilterInputs{Pools: []v1.IPPool{sizedPool("10.244.0.0/16", 26)},
			Nodes:  []Node{{Name: "a", IPv4: netip.MustParsePrefix("192.168.0.1/24")}, {Name: "b", IPv4: netip.MustParsePrefix("192.168.0.2/24")}, {Name: "c", IPv4: netip.MustParsePrefix("192.168.0.9/24")}},
			Blocks: append([]v1.IPAMBlock{block("10.244.1.0/26", "host:a", nil)}, blocks...)})
		if len(problems) > 0 {
			t.Fatal(problems)
		}
		for _, s := range []*Speaker{a, b} {
			mustNil(t, s.SetFilters(ctx, f))
		}
	}
	filters()
	toA := loopPeer(5, 4)
	toA.Node = "a"
	mustNil(t, a.SetPeers(ctx, []Peer{loopPeer(4, 5)}))
	mustNil(t, b.SetPeers(ctx, []Peer{toA}))
	nh := netip.MustParseAddr("192.168.0.1")
	blockA := Route{Prefix: netip.MustParsePrefix("10.244.1.0/26"), NextHop: nh}
	mustNil(t, a.SetAdvertisements(ctx, []Route{blockA}))
	const one = "10.244.1.0/26 via 192.168.0.1 from 127.0.0.4 stale=false; "
	eventually(t, 20*time.Second, "b learns a's block", func() (bool, string) {
		got := learnedString(t, b)
		return got == one, got
	})

	// Nothing happened: no read.
	scans := b.scans.Load()
	if got := learnedString(t, b); got != one || b.scans.Load() != scans {
		t.Errorf("Learned with nothing new: %q, %d reads of the table; want the same routes and none", got, b.scans.Load()-scans)
	}
	// LearnedFresh reads all the same.
	if fresh, err := b.LearnedFresh(ctx); err != nil || len(fresh) != 1 || b.scans.Load() != scans+1 {
		t.Errorf("LearnedFresh: %v, %v, %d reads; want a's block and one read", fresh, err, b.scans.Load()-scans)
	}
	scans = b.scans.Load()
	// c claims a block nobody announces: no session has a route of it,
	// so none is re-evaluated, and what b learned stands unread.
	resets := b.resets.Load()
	filters(block("10.244.5.0/26", "host:c", nil))
	if n := b.resets.Load() - resets; n != 0 {
		t.Errorf("a claim of a block no session brought: %d soft resets, want none", n)
	}
	if got := learnedString(t, b); got != one || b.scans.Load() != scans {
		t.Errorf("Learned after a filter change that re-evaluated nothing: %q, %d reads; want the same routes and none", got, b.scans.Load()-scans)
	}
	// a announces a block before its claim reaches b's filters: b rejects
	// it, then, once the claim comes, re-evaluates a's session and has it.
	early := Route{Prefix: netip.MustParsePrefix("10.244.6.0/26"), NextHop: nh}
	mustNil(t, a.SetAdvertisements(ctx, []Route{blockA, early}))
	eventually(t, 20*time.Second, "b receives (and rejects) the early route", func() (bool, string) {
		st, err := b.PeerStates(ctx)
		return err == nil && len(st) == 1 && st[0].Received == 2 && st[0].Rejected == 1, statesString(st)
	})
	if n := b.scans.Load() - scans; n != 0 {
		t.Errorf("a rejected route made Learned read the table %d times, want none", n)
	}
	filters(block("10.244.5.0/26", "host:c", nil), block("10.244.6.0/26", "host:a", nil))
	if n := b.resets.Load() - resets; n != 1 {
		t.Errorf("the claim of a block a session brought already: %d soft resets, want 1", n)
	}
	want := one + "10.244.6.0/26 via 192.168.0.1 from 127.0.0.4 stale=false; "
	if got := learnedString(t, b); got != want {
		t.Errorf("after the claim, b learned %q, want %q", got, want)
	}
}

// liarFilters let a speaker send anything over its sessions with the
// BGPPeer "victim" (a filter that exports everything): it stands for a
// tabby node that lies, or is compromised.
func liarFilters(t *testing.T, s *Speaker) {
	t.Helper()
	f, problems := NewFilters(FilterInputs{
		BGPPeers: []v1.BGPPeer{{ObjectMeta: metav1.ObjectMeta{Name: "victim"}, Spec: v1.BGPPeerSpec{Filters: []string{"anything"}}}},
		BGPFilters: []v1.BGPFilter{{ObjectMeta: metav1.ObjectMeta{Name: "anything"}, Spec: v1.BGPFilterSpec{
			ExportV4: []v1.BGPFilterRuleV4{{Action: v1.FilterAccept}}, ExportV6: []v1.BGPFilterRuleV6{{Action: v1.FilterAccept}}}}}})
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	if err := s.SetFilters(context.Background(), f); err != nil {
		t.Fatal(err)
	}
}

// TestLoopbackLyingNode: a node (speaker 3, node c's address 192.168.0.9
// as next hop) announces another node's block, a /32 inside it, a node's
// address, the whole pool, the default route and the service CIDR, next
// to its own block. The victim keeps only the legitimate routes, counts
// the rest as rejected per peer, and still learns a's block from a.
func TestLoopbackLyingNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts BGP sessions")
	}
	ctx := context.Background()
	a, victim, liar := loopSpeaker(t, 1, Config{}), loopSpeaker(t, 2, Config{}), loopSpeaker(t, 3, Config{})
	setLoopFilters(t, "a", a, victim)
	liarFilters(t, liar)
	liarPeer := loopPeer(2, 3)
	liarPeer.Node = "c"
	aPeer := loopPeer(2, 1)
	aPeer.Node = "a"
	mustNil(t, victim.SetPeers(ctx, []Peer{aPeer, liarPeer}))
	mustNil(t, a.SetPeers(ctx, []Peer{loopPeer(1, 2)}))
	toVictim := loopPeer(3, 2)
	toVictim.Kind, toVictim.BGPPeer = KindBGPPeer, "victim"
	mustNil(t, liar.SetPeers(ctx, []Peer{toVictim}))
	mustNil(t, a.SetAdvertisements(ctx, []Route{{Prefix: netip.MustParsePrefix("10.244.1.0/26"), NextHop: netip.MustParseAddr("192.168.0.1")}}))
	c := netip.MustParseAddr("192.168.0.9")
	var lies []Route
	for _, p := range []string{"10.244.1.0/26", "10.244.1.7/32", "192.168.0.1/32", "10.244.0.0/16", "0.0.0.0/0", "10.96.0.0/12", "10.244.2.0/26"} {
		lies = append(lies, Route{Prefix: netip.MustParsePrefix(p), NextHop: c})
	}
	// c owns no block in the victim's IPAM: give it one, so one of its
	// routes is legitimate.
	f, _ := NewFilters(FilterInputs{Pools: []v1.IPPool{sizedPool("10.244.0.0/16", 26)},
		Nodes:  []Node{{Name: "a", IPv4: netip.MustParsePrefix("192.168.0.1/24")}, {Name: "c", IPv4: netip.MustParsePrefix("192.168.0.9/24")}},
		Blocks: []v1.IPAMBlock{block("10.244.1.0/26", "host:a", nil), block("10.244.3.0/26", "host:c", nil)},
		Config: v1.BGPConfigurationSpec{ServiceClusterIPs: []v1.ServiceIPBlock{{CIDR: "10.96.0.0/12"}}}})
	mustNil(t, victim.SetFilters(ctx, f))
	lies = append(lies, Route{Prefix: netip.MustParsePrefix("10.244.3.0/26"), NextHop: c})
	mustNil(t, liar.SetAdvertisements(ctx, lies))
	eventually(t, 20*time.Second, "the victim keeps a's block from a and c's own block, and nothing else", func() (bool, string) {
		st, _ := victim.PeerStates(ctx)
		got := learnedString(t, victim)
		return got == "10.244.1.0/26 via 192.168.0.1 from 127.0.0.1 stale=false; 10.244.3.0/26 via 192.168.0.9 from 127.0.0.3 stale=false; " &&
			len(st) == 2 && st[1].Received == 8, fmt.Sprintf("%s %+v", got, st)
	})
	st, err := victim.PeerStates(ctx)
	mustNil(t, err)
	if st[1].Rejected != 7 || st[1].Accepted != 1 || st[0].Rejected != 0 || st[0].Accepted != 1 {
		t.Errorf("rejected/accepted: from a %d/%d, want 0/1; from the liar %d/%d, want 7/1", st[0].Rejected, st[0].Accepted, st[1].Rejected, st[1].Accepted)
	}
	if fmt.Sprint(st[1].RejectedPrefixes) != "[0.0.0.0/0 10.96.0.0/12 10.244.0.0/16 10.244.1.0/26 10.244.1.7/32 10.244.2.0/26 192.168.0.1/32]" {
		t.Errorf("rejected prefixes: %v", st[1].RejectedPrefixes)
	}

	// The states a routing pass reads after Learned, from the table
	// Learned read, are the same.
	_, err = victim.Learned(ctx)
	mustNil(t, err)
	after, until, err := victim.RecentPeerStates(ctx, time.Hour)
	mustNil(t, err)
	if got, want := statesString(after), statesString(st); got != want || !until.IsZero() {
		t.Errorf("RecentPeerStates (a fresh read: until %v):\n%s\nPeerStates:\n%s", until, got, want)
	}
	// A filter change after Learned read the table: a read within the
	// hour answers with the counts of the last read, and says until when;
	// a read that wants them newer reads the table again. a's block is
	// no longer a's, so its route is rejected now, which the table
	// Learned read (where it was kept) cannot show.
	_, err = victim.Learned(ctx)
	mustNil(t, err)
	f2, _ := NewFilters(FilterInputs{Pools: []v1.IPPool{sizedPool("10.244.0.0/16", 26)},
		Nodes:  []Node{{Name: "a", IPv4: netip.MustParsePrefix("192.168.0.1/24")}, {Name: "c", IPv4: netip.MustParsePrefix("192.168.0.9/24")}},
		Blocks: []v1.IPAMBlock{block("10.244.3.0/26", "host:c", nil)},
		Config: v1.BGPConfigurationSpec{ServiceClusterIPs: []v1.ServiceIPBlock{{CIDR: "10.96.0.0/12"}}}})
	mustNil(t, victim.SetFilters(ctx, f2))
	kept, until, err := victim.RecentPeerStates(ctx, time.Hour)
	mustNil(t, err)
	if got, want := statesString(kept), statesString(st); got != want || time.Until(until) < 50*time.Minute {
		t.Errorf("RecentPeerStates within the hour (until %v) read again:\n%s\nwant the last read:\n%s", until, got, want)
	}
	// (GoBGP re-evaluates what a session sent within SetFilters' soft
	// reset, so a new read of the table shows the rejection at once.)
	st, until, err = victim.RecentPeerStates(ctx, 0)
	mustNil(t, err)
	if st[0].Rejected != 1 || st[0].Accepted != 0 || !until.IsZero() {
		t.Errorf("after a filter change, RecentPeerStates counted in the table read before it (until %v):\n%s", until, statesString(st))
	}
	// A session going down is never answered from an earlier read.
	_, _, err = victim.RecentPeerStates(ctx, time.Hour)
	mustNil(t, err)
	mustNil(t, liar.Stop(ctx))
	eventually(t, 20*time.Second, "the victim's states show the liar's session down", func() (bool, string) {
		st, _, err := victim.RecentPeerStates(ctx, time.Hour)
		return err == nil && len(st) == 2 && st[0].Established() && !st[1].Established(), statesString(st)
	})
}

// statesString prints what PeerStates says of the sessions' routes.
func statesString(st []PeerState) string {
	var b strings.Builder
	for _, s := range st {
		fmt.Fprintf(&b, "%s %s received %d accepted %d rejected %d %v prefixes %v\n", s.Address, s.State, s.Received, s.Accepted, s.Rejected, s.RejectedPrefixes, s.Prefixes)
	}
	return b.String()
}

// TestLoopbackPrefixLimit: a peer that sends more than MaxPrefixes has its
// session closed, is counted and reported through OnPrefixLimit.
func TestLoopbackPrefixLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts BGP sessions")
	}
	ctx := context.Background()
	trips := make(chan string, 10)
	victim := loopSpeaker(t, 4, Config{OnPrefixLimit: func(peer netip.Addr, family string) { trips <- peer.String() + " " + family }})
	flood := loopSpeaker(t, 5, Config{})
	liarFilters(t, flood)
	p := loopPeer(4, 5)
	p.Kind, p.BGPPeer, p.MaxPrefixes = KindBGPPeer, "flood", 10
	mustNil(t, victim.SetPeers(ctx, []Peer{p}))
	back := loopPeer(5, 4)
	back.Kind, back.BGPPeer = KindBGPPeer, "victim"
	mustNil(t, flood.SetPeers(ctx, []Peer{back}))
	var routes []Route
	for i := range 30 {
		routes = append(routes, Route{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(i), 0}), 24), NextHop: netip.MustParseAddr("127.0.0.5")})
	}
	mustNil(t, flood.SetAdvertisements(ctx, routes))
	select {
	case got := <-trips:
		if got != "127.0.0.5 ipv4-unicast" {
			t.Errorf("OnPrefixLimit(%s)", got)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the session was not closed for sending 30 prefixes over a limit of 10")
	}
	eventually(t, 10*time.Second, "the session is down, counted, and its routes gone", func() (bool, string) {
		st, err := victim.PeerStates(ctx)
		got := learnedString(t, victim)
		return err == nil && len(st) == 1 && st[0].LimitTrips >= 1 && !st[0].Established() && got == "", fmt.Sprintf("%+v %v %s", st, err, got)
	})
}

func mustNil(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
