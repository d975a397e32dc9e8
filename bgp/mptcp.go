package bgp

import (
	"errors"
	"net"
)

// Since Go 1.24, Go listeners use Multipath TCP by default where the kernel
// has it, and an MPTCP socket refuses TCP MD5 signatures (ENOPROTOOPT) and
// TTL settings. GoBGP opens its listener with Go's defaults and only logs
// when the MD5 key cannot be set, after which every signed connection
// attempt to this node is dropped by the kernel: the session never comes up.
// Programs that embed the speaker therefore disable MPTCP listeners, in
// their main package:
//
//	//go:debug multipathtcp=0

// ErrMPTCPListeners is returned for a session with a password while the
// program's listeners use MPTCP.
var ErrMPTCPListeners = errors.New("TCP MD5 passwords need plain TCP listeners, but this program's listeners use Multipath TCP (the default since Go 1.24): " +
	"build it with the directive //go:debug multipathtcp=0 in its main package, or run it with GODEBUG=multipathtcp=0")

// listenersUseMPTCP says whether Go listeners of this program use MPTCP; a
// variable so tests can pretend.
var listenersUseMPTCP = func() bool {
	var lc net.ListenConfig
	return lc.MultipathTCP()
}
