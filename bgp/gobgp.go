package bgp

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/apiutil"
	gbgp "github.com/osrg/gobgp/v3/pkg/packet/bgp"
)

// Conversions between this package's types and GoBGP's API.

var (
	familyV4 = &api.Family{Afi: api.Family_AFI_IP, Safi: api.Family_SAFI_UNICAST}
	familyV6 = &api.Family{Afi: api.Family_AFI_IP6, Safi: api.Family_SAFI_UNICAST}
)

func familyFor(a netip.Addr) *api.Family {
	if a.Is4() {
		return familyV4
	}
	return familyV6
}

// seconds converts a duration to whole seconds, at least 1, at most limit.
func seconds(d time.Duration, limit uint64) uint64 {
	s := uint64((d + time.Second/2) / time.Second)
	return min(max(s, 1), limit)
}

// maxRestartTime is the largest graceful-restart time the capability can
// carry (12 bits).
const maxRestartTime = 4095

// apiPeer is a session's GoBGP configuration: the session's address family
// only, graceful restart with RFC 8538 notifications (a NOTIFICATION other
// than Hard Reset keeps routes like a restart), long-lived graceful restart
// off.
func apiPeer(p Peer, cfg Config, restarting bool) *api.Peer {
	hold := seconds(cfg.HoldTime, 65535)
	ap := &api.Peer{
		Conf: &api.PeerConf{
			NeighborAddress: p.Address.String(),
			PeerAsn:         p.AS,
			AuthPassword:    p.Password,
			Description:     p.Reason(),
		},
		Transport: &api.Transport{PassiveMode: p.Passive, RemotePort: uint32(p.Port)},
		Timers: &api.Timers{Config: &api.TimersConfig{
			ConnectRetry:      seconds(cfg.ConnectRetry, 65535),
			HoldTime:          hold,
			KeepaliveInterval: max(hold/3, 1),
		}},
		GracefulRestart: &api.GracefulRestart{
			Enabled:             true,
			RestartTime:         uint32(seconds(p.RestartTime, maxRestartTime)),
			NotificationEnabled: true,
			DeferralTime:        uint32(seconds(cfg.DeferralTime, 65535)),
			LocalRestarting:     restarting,
		},
		AfiSafis: []*api.AfiSafi{{
			Config:            &api.AfiSafiConfig{Family: familyFor(p.Address), Enabled: true},
			MpGracefulRestart: &api.MpGracefulRestart{Config: &api.MpGracefulRestartConfig{Enabled: true}},
			// A warning at 80%, then the session is closed (Cease,
			// maximum number of prefixes reached).
			PrefixLimits: &api.PrefixLimit{Family: familyFor(p.Address), MaxPrefixes: p.maxPrefixes(), ShutdownThresholdPct: 80},
		}},
	}
	if p.LocalAddress.IsValid() {
		ap.Transport.LocalAddress = p.LocalAddress.String()
	}
	if p.RRClient {
		ap.RouteReflector = &api.RouteReflector{RouteReflectorClient: true, RouteReflectorClusterId: p.ClusterID}
	}
	return ap
}

// apiPath is a route this node originates, as GoBGP's AddPath and
// DeletePath take it.
func apiPath(r Route) (*api.Path, error) {
	addr, nh := net.IP(r.Prefix.Addr().AsSlice()), net.IP(r.NextHop.AsSlice())
	origin := gbgp.NewPathAttributeOrigin(gbgp.BGP_ORIGIN_ATTR_TYPE_IGP)
	if r.Prefix.Addr().Is4() != r.NextHop.Is4() {
		return nil, fmt.Errorf("route %s has next hop %s of the other address family", r.Prefix, r.NextHop)
	}
	if r.Prefix.Addr().Is4() {
		nlri := gbgp.NewIPAddrPrefix(uint8(r.Prefix.Bits()), addr.String())
		return apiutil.NewPath(nlri, false, []gbgp.PathAttributeInterface{origin, gbgp.NewPathAttributeNextHop(nh.String())}, time.Now())
	}
	nlri := gbgp.NewIPv6AddrPrefix(uint8(r.Prefix.Bits()), addr.String())
	return apiutil.NewPath(nlri, false, []gbgp.PathAttributeInterface{origin, gbgp.NewPathAttributeMpReachNLRI(nh.String(), []gbgp.AddrPrefixInterface{nlri})}, time.Now())
}

// nextHopOf reads a path's next hop.
func nextHopOf(p *api.Path) (netip.Addr, error) {
	attrs, err := apiutil.GetNativePathAttributes(p)
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range attrs {
		var ip net.IP
		switch a := a.(type) {
		case *gbgp.PathAttributeNextHop:
			ip = a.Value
		case *gbgp.PathAttributeMpReachNLRI:
			ip = a.Nexthop
		default:
			continue
		}
		if addr, ok := netip.AddrFromSlice(ip); ok {
			return addr.Unmap(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("path has no next hop")
}

// sessionStates maps GoBGP's session states to ours.
var sessionStates = map[api.PeerState_SessionState]SessionState{
	api.PeerState_IDLE:        StateIdle,
	api.PeerState_CONNECT:     StateConnect,
	api.PeerState_ACTIVE:      StateActive,
	api.PeerState_OPENSENT:    StateOpenSent,
	api.PeerState_OPENCONFIRM: StateOpenConfirm,
	api.PeerState_ESTABLISHED: StateEstablished,
}
