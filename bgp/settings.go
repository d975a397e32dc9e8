package bgp

import (
	"crypto/sha256"
	"fmt"
	"net/netip"
	"strconv"
	"time"

	v1 "github.com/tabbynet/tabby/api/v1"
)

// Defaults of the BGPConfiguration fields tabby reads (as in Calico).
const (
	DefaultListenPort      = 179
	DefaultClusterID       = "244.0.0.1"
	DefaultMaxRestartTime  = 120 * time.Second
	DefaultExternalBGPPort = 179
	// DefaultMaxPrefixes bounds the prefixes one session may send per
	// address family: room for the blocks and borrowed addresses of a
	// cluster of several thousand nodes, far below what exhausts a node.
	DefaultMaxPrefixes = 20000
)

// Settings are a BGPConfiguration's fields with their defaults applied.
type Settings struct {
	// AS of every node that does not override it.
	AS uint32
	// Mesh: nodes peer with each other (until a route reflector exists).
	Mesh bool
	// ListenPort of every node's speaker.
	ListenPort uint16
	// ClusterID of reflectors whose node has no cluster-ID label.
	ClusterID string
	// MeshRestartTime is the graceful-restart time of node-to-node sessions.
	MeshRestartTime time.Duration
	// MeshMaxPrefixes bounds what one node-to-node session may send.
	MeshMaxPrefixes uint32
}

// SettingsOf applies the defaults to a BGPConfiguration spec; the zero spec
// (no BGPConfiguration at all) gives the defaults.
func SettingsOf(spec v1.BGPConfigurationSpec) Settings {
	s := Settings{
		AS:              v1.DefaultASNumber,
		Mesh:            true,
		ListenPort:      DefaultListenPort,
		ClusterID:       DefaultClusterID,
		MeshRestartTime: DefaultMaxRestartTime,
		MeshMaxPrefixes: DefaultMaxPrefixes,
	}
	if spec.NodeMeshMaxPrefixes != nil && *spec.NodeMeshMaxPrefixes > 0 {
		s.MeshMaxPrefixes = *spec.NodeMeshMaxPrefixes
	}
	if spec.ASNumber != nil && *spec.ASNumber != 0 {
		s.AS = *spec.ASNumber
	}
	if spec.NodeToNodeMeshEnabled != nil {
		s.Mesh = *spec.NodeToNodeMeshEnabled
	}
	if spec.ListenPort != nil && *spec.ListenPort != 0 {
		s.ListenPort = *spec.ListenPort
	}
	if id, err := netip.ParseAddr(spec.RouteReflectorClusterID); err == nil && id.Is4() {
		s.ClusterID = id.String()
	}
	if spec.NodeMeshMaxRestartTime != nil && spec.NodeMeshMaxRestartTime.Duration > 0 {
		s.MeshRestartTime = spec.NodeMeshMaxRestartTime.Duration
	}
	return s
}

// NodeAS reads a node's AS-number override from its annotations
// (tabby.io/as-number); 0 means the node uses the cluster's AS.
func NodeAS(annotations map[string]string) (uint32, error) {
	v, ok := annotations[v1.AnnotationASNumber]
	if !ok || v == "" {
		return 0, nil
	}
	as, err := strconv.ParseUint(v, 10, 32)
	if err != nil || as == 0 {
		return 0, fmt.Errorf("annotation %s=%q is not an AS number from 1 to 4294967295: fix or remove it", v1.AnnotationASNumber, v)
	}
	return uint32(as), nil
}

// RouterID is the BGP identifier of a node: its IPv4 address, or for a node
// without one a stable 4-byte value derived from its name (as Calico does
// for IPv6-only nodes).
func RouterID(n Node) netip.Addr {
	if n.IPv4.IsValid() {
		return n.IPv4.Addr()
	}
	sum := sha256.Sum256([]byte("tabby.router-id/" + n.Name))
	return netip.AddrFrom4([4]byte{sum[0], sum[1], sum[2], sum[3]})
}
