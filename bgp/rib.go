package bgp

import (
	"context"
	"fmt"
	"net/netip"

	api "github.com/osrg/gobgp/v3/api"
)

// rib is one read of GoBGP's table.
type rib struct {
	// best are the best paths learned from peers, by prefix (locally
	// originated ones are left out).
	best map[netip.Prefix]LearnedRoute
	// byPeer are all current (not stale) paths, by the peer they came from.
	byPeer map[netip.Addr][]LearnedRoute
	// kept counts every path the table keeps, stale ones included, by the
	// peer it came from: what the import policy let in.
	kept map[netip.Addr]int
}

// scanRIB reads GoBGP's global table for both address families.
func (s *Speaker) scanRIB(ctx context.Context) (rib, error) {
	r := rib{best: map[netip.Prefix]LearnedRoute{}, byPeer: map[netip.Addr][]LearnedRoute{}, kept: map[netip.Addr]int{}}
	var bad error
	for _, fam := range []*api.Family{familyV4, familyV6} {
		err := s.srv.ListPath(ctx, &api.ListPathRequest{TableType: api.TableType_GLOBAL, Family: fam}, func(d *api.Destination) {
			pfx, err := netip.ParsePrefix(d.Prefix)
			if err != nil {
				bad = fmt.Errorf("GoBGP returned prefix %q: %w", d.Prefix, err)
				return
			}
			// GoBGP lists a prefix's paths best first. A stale path of a
			// peer closed for its prefix limit is not taken: with graceful
			// restart GoBGP retains what a flooding peer sent for its
			// restart time, which must not reach the kernel; the next
			// path, if any, is the best then.
			bestSkipped := false
			for _, p := range d.Paths {
				peer, err := netip.ParseAddr(p.NeighborIp)
				if err != nil || peer.IsUnspecified() || p.IsWithdraw {
					continue // originated here
				}
				r.kept[peer.Unmap()]++
				if p.Stale && s.glog.overLimit(p.NeighborIp) {
					bestSkipped = bestSkipped || p.Best
					continue
				}
				nh, err := nextHopOf(p)
				if err != nil {
					bad = fmt.Errorf("route %s from %s: %w", pfx, peer, err)
					continue
				}
				lr := LearnedRoute{Route: Route{Prefix: pfx, NextHop: nh}, Peer: peer.Unmap(), Stale: p.Stale}
				if _, ok := r.best[pfx]; !ok && (p.Best || bestSkipped) {
					r.best[pfx] = lr
				}
				if !p.Stale {
					r.byPeer[lr.Peer] = append(r.byPeer[lr.Peer], lr)
				}
			}
		})
		if err != nil {
			return rib{}, fmt.Errorf("reading the BGP table: %w", err)
		}
	}
	if bad != nil {
		s.log.Warn("BGP: skipped a route GoBGP returned", "err", bad)
	}
	return r, nil
}
