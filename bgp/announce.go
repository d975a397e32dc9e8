package bgp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	api "github.com/osrg/gobgp/v3/api"
)

// advertised is a route handed to GoBGP and the handle to withdraw it.
type advertised struct {
	nextHop netip.Addr
	uuid    []byte
}

// SetAdvertisements makes the routes this node originates exactly routes:
// missing ones are announced, changed ones replaced, stale ones withdrawn.
// Call it on every reconcile; it is idempotent. A route that fails stays
// as it was and is reported; the others are still converged.
func (s *Speaker) SetAdvertisements(ctx context.Context, routes []Route) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	want := map[netip.Prefix]netip.Addr{}
	for _, r := range routes {
		want[r.Prefix.Masked()] = r.NextHop
	}
	var errs []error
	for pfx, a := range s.adverts {
		if nh, ok := want[pfx]; ok && nh == a.nextHop {
			continue
		}
		if err := s.srv.DeletePath(ctx, &api.DeletePathRequest{TableType: api.TableType_GLOBAL, Family: familyFor(pfx.Addr()), Uuid: a.uuid}); err != nil {
			errs = append(errs, fmt.Errorf("withdrawing %s: %w", pfx, err))
			continue
		}
		delete(s.adverts, pfx)
	}
	for pfx, nh := range want {
		if _, ok := s.adverts[pfx]; ok {
			continue
		}
		path, err := apiPath(Route{Prefix: pfx, NextHop: nh})
		if err == nil {
			var resp *api.AddPathResponse
			resp, err = s.srv.AddPath(ctx, &api.AddPathRequest{TableType: api.TableType_GLOBAL, Path: path})
			if err == nil {
				s.adverts[pfx] = advertised{nextHop: nh, uuid: resp.Uuid}
				continue
			}
		}
		errs = append(errs, fmt.Errorf("announcing %s via %s: %w", pfx, nh, err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("converging BGP advertisements: %w", err)
	}
	return nil
}
