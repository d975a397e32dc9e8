package nflog

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"time"

	"github.com/mdlayher/netlink"
)

// decode reads a packet message's attributes (after struct nfgenmsg).
func decode(b []byte, now time.Time) (Packet, bool) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return Packet{}, false
	}
	ad.ByteOrder = binary.BigEndian
	p := Packet{Time: now}
	var payload []byte
	for ad.Next() {
		switch ad.Type() {
		case attrPrefix:
			p.Prefix = strings.TrimRight(string(ad.Bytes()), "\x00")
		case attrTime:
			if t := ad.Bytes(); len(t) == 16 {
				sec, usec := binary.BigEndian.Uint64(t), binary.BigEndian.Uint64(t[8:])
				p.Time = time.Unix(int64(sec), int64(usec)*1000)
			}
		case attrInDev:
			p.InDev = ad.Uint32()
		case attrOutDev:
			p.OutDev = ad.Uint32()
		case attrPayload:
			payload = ad.Bytes()
		}
	}
	if ad.Err() != nil {
		return Packet{}, false
	}
	parseIP(payload, &p)
	return p, true
}

// IP protocol numbers with ports.
const (
	ProtoICMP   = 1
	ProtoTCP    = 6
	ProtoUDP    = 17
	ProtoICMPv6 = 58
	ProtoSCTP   = 132
)

// parseIP fills the addresses, protocol and ports from an IPv4 or IPv6
// packet; what is missing or cut off stays zero.
func parseIP(b []byte, p *Packet) {
	if len(b) < 1 {
		return
	}
	var l4 []byte
	switch b[0] >> 4 {
	case 4:
		ihl := int(b[0]&0x0f) * 4
		if len(b) < 20 || ihl < 20 {
			return
		}
		p.Src = netip.AddrFrom4([4]byte(b[12:16]))
		p.Dst = netip.AddrFrom4([4]byte(b[16:20]))
		p.Proto = b[9]
		// Only the first fragment carries the ports.
		if binary.BigEndian.Uint16(b[6:8])&0x1fff == 0 && len(b) >= ihl {
			l4 = b[ihl:]
		}
	case 6:
		if len(b) < 40 {
			return
		}
		p.Src = netip.AddrFrom16([16]byte(b[8:24]))
		p.Dst = netip.AddrFrom16([16]byte(b[24:40]))
		p.Proto, l4 = skipExtensions(b[6], b[40:])
	default:
		return
	}
	switch p.Proto {
	case ProtoTCP, ProtoUDP, ProtoSCTP:
		if len(l4) >= 4 {
			p.SrcPort = binary.BigEndian.Uint16(l4)
			p.DstPort = binary.BigEndian.Uint16(l4[2:])
		}
	}
}

// skipExtensions follows IPv6 extension headers (hop-by-hop, routing,
// destination options; a non-first fragment has no ports) to the
// transport header.
func skipExtensions(next uint8, b []byte) (uint8, []byte) {
	for {
		switch next {
		case 0, 43, 60: // hop-by-hop, routing, destination options
			if len(b) < 8 {
				return next, nil
			}
			n := (int(b[1]) + 1) * 8
			if len(b) < n {
				return b[0], nil
			}
			next, b = b[0], b[n:]
		case 44: // fragment
			if len(b) < 8 {
				return next, nil
			}
			if binary.BigEndian.Uint16(b[2:4])&0xfff8 != 0 {
				return b[0], nil
			}
			next, b = b[0], b[8:]
		default:
			return next, b
		}
	}
}
