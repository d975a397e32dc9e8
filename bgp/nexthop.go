package bgp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	api "github.com/osrg/gobgp/v3/api"
)

// KeepOriginalNextHop is a global export policy: routes sent to the
// neighbors in one neighbor set keep their next hop. GoBGP applies per-peer
// export policies only to route-server clients, so the policy is global and
// the set names the peers. A neighbor set with no entry matches every
// neighbor, so the set always holds a placeholder that matches none.
const (
	keepNextHopSet         = "tabby-keep-next-hop"
	keepNextHopPlaceholder = "0.0.0.0/32"
)

func (s *Speaker) installKeepNextHopPolicy(ctx context.Context) error {
	s.keepNH = []string{keepNextHopPlaceholder}
	if err := s.srv.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: &api.DefinedSet{
		DefinedType: api.DefinedType_NEIGHBOR, Name: keepNextHopSet, List: s.keepNH}}); err != nil {
		return fmt.Errorf("defining the keep-next-hop neighbor set: %w", err)
	}
	policy := &api.Policy{Name: keepNextHopSet, Statements: []*api.Statement{{
		Name:       keepNextHopSet,
		Conditions: &api.Conditions{NeighborSet: &api.MatchSet{Type: api.MatchSet_ANY, Name: keepNextHopSet}},
		Actions:    &api.Actions{Nexthop: &api.NexthopAction{Unchanged: true}},
	}}}
	if err := s.srv.AddPolicy(ctx, &api.AddPolicyRequest{Policy: policy}); err != nil {
		return fmt.Errorf("adding the keep-next-hop policy: %w", err)
	}
	if err := s.srv.AddPolicyAssignment(ctx, &api.AddPolicyAssignmentRequest{Assignment: &api.PolicyAssignment{
		Name: "global", Direction: api.PolicyDirection_EXPORT,
		Policies: []*api.Policy{{Name: keepNextHopSet}}, DefaultAction: api.RouteAction_ACCEPT}}); err != nil {
		return fmt.Errorf("assigning the keep-next-hop policy: %w", err)
	}
	return nil
}

// syncKeepNextHop puts the running sessions with KeepOriginalNextHop in the
// policy's neighbor set. Called with s.mu held.
func (s *Speaker) syncKeepNextHop(ctx context.Context) error {
	want := []string{keepNextHopPlaceholder}
	for _, ss := range s.sessions {
		if ss.peer.KeepOriginalNextHop {
			want = append(want, netip.PrefixFrom(ss.peer.Address, ss.peer.Address.BitLen()).String())
		}
	}
	var add, remove []string
	for _, a := range want {
		if !slices.Contains(s.keepNH, a) {
			add = append(add, a)
		}
	}
	for _, a := range s.keepNH {
		if !slices.Contains(want, a) {
			remove = append(remove, a)
		}
	}
	// Changed in place: replacing the set would leave the policy's
	// condition pointing at the old one.
	if len(add) > 0 {
		if err := s.srv.AddDefinedSet(ctx, &api.AddDefinedSetRequest{DefinedSet: &api.DefinedSet{
			DefinedType: api.DefinedType_NEIGHBOR, Name: keepNextHopSet, List: add}}); err != nil {
			return fmt.Errorf("updating the keep-next-hop neighbor set: %w", err)
		}
		s.keepNH = append(s.keepNH, add...)
	}
	if len(remove) > 0 {
		if err := s.srv.DeleteDefinedSet(ctx, &api.DeleteDefinedSetRequest{DefinedSet: &api.DefinedSet{
			DefinedType: api.DefinedType_NEIGHBOR, Name: keepNextHopSet, List: remove}}); err != nil {
			return fmt.Errorf("updating the keep-next-hop neighbor set: %w", err)
		}
		s.keepNH = slices.DeleteFunc(s.keepNH, func(a string) bool { return slices.Contains(remove, a) })
	}
	// Running sessions whose policy changed get their routes again.
	var errs []error
	for _, prefix := range append(add, remove...) {
		addr := strings.Split(prefix, "/")[0]
		if _, running := s.sessions[addr]; !running {
			continue
		}
		if err := s.srv.ResetPeer(ctx, &api.ResetPeerRequest{Address: addr, Soft: true, Direction: api.ResetPeerRequest_OUT}); err != nil {
			errs = append(errs, fmt.Errorf("re-sending routes to %s with its new next-hop policy: %w", addr, err))
		}
	}
	return errors.Join(errs...)
}
