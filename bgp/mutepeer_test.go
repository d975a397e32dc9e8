package bgp

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	gbgp "github.com/osrg/gobgp/v3/pkg/packet/bgp"
)

// A mute peer: a BGP speaker that accepts sessions, announces graceful
// restart, keeps the session up, and never sends a route or End-of-RIB,
// like the switches of kube-router #1323. A speaker in GoBGP's restarting
// mode waits for every established graceful-restart peer's End-of-RIB
// before it sends its own routes, so a mute peer holds them back for the
// whole deferral time.

// startMutePeer listens on port 179 of every address of the namespace.
func startMutePeer(as uint32, id netip.Addr) error {
	ln, err := net.Listen("tcp4", ":179")
	if err != nil {
		return err
	}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go muteSession(conn, as, id)
		}
	}()
	return nil
}

func muteSession(conn net.Conn, as uint32, id netip.Addr) {
	defer conn.Close()
	caps := []gbgp.ParameterCapabilityInterface{
		gbgp.NewCapMultiProtocol(gbgp.RF_IPv4_UC),
		gbgp.NewCapGracefulRestart(false, false, 120, []*gbgp.CapGracefulRestartTuple{gbgp.NewCapGracefulRestartTuple(gbgp.RF_IPv4_UC, false)}),
		gbgp.NewCapFourOctetASNumber(as),
	}
	open := gbgp.NewBGPOpenMessage(uint16(as), 30, id.String(), []gbgp.OptionParameterInterface{gbgp.NewOptionParameterCapability(caps)})
	if err := sendBGP(conn, open); err != nil {
		return
	}
	go func() {
		for sendBGP(conn, gbgp.NewBGPKeepAliveMessage()) == nil {
			time.Sleep(5 * time.Second)
		}
	}()
	for {
		if _, err := readBGP(conn); err != nil {
			return
		}
	}
}

func sendBGP(w io.Writer, m *gbgp.BGPMessage) error {
	b, err := m.Serialize()
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// readBGP reads one message and returns its type.
func readBGP(r io.Reader) (uint8, error) {
	hdr := make([]byte, gbgp.BGP_HEADER_LENGTH)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return 0, err
	}
	n := int(binary.BigEndian.Uint16(hdr[16:18]))
	if n < gbgp.BGP_HEADER_LENGTH {
		return 0, fmt.Errorf("bad BGP message length %d", n)
	}
	if _, err := io.CopyN(io.Discard, r, int64(n-gbgp.BGP_HEADER_LENGTH)); err != nil {
		return 0, err
	}
	return hdr[18], nil
}
