package nflog

import (
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"
)

// TestParseIP reads addresses, protocol and ports from IPv4 and IPv6
// headers, through IPv6 extension headers, and no ports from a later
// fragment or a cut-off packet.
func TestParseIP(t *testing.T) {
	h := func(s string) []byte {
		b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	v4 := "4500 0028 0000 0000 4006 0000 0a000001 0a000002" // TCP 10.0.0.1 -> 10.0.0.2
	v6 := "6000 0000 0008 %s 40 fd000000000000000000000000000001 fd000000000000000000000000000002"
	for _, c := range []struct {
		name, pkt    string
		src, dst     string
		proto        uint8
		sport, dport uint16
	}{
		{"IPv4 TCP", v4 + "c350 0050", "10.0.0.1", "10.0.0.2", ProtoTCP, 50000, 80},
		{"IPv4 later fragment", strings.Replace(v4, "4500 0028 0000 0000", "4500 0028 0000 0010", 1) + "c350 0050", "10.0.0.1", "10.0.0.2", ProtoTCP, 0, 0},
		{"IPv4 cut off", v4 + "c3", "10.0.0.1", "10.0.0.2", ProtoTCP, 0, 0},
		{"IPv6 UDP", strings.Replace(v6, "%s", "11", 1) + "0035 1f90", "fd00::1", "fd00::2", ProtoUDP, 53, 8080},
		{"IPv6 hop-by-hop then SCTP", strings.Replace(v6, "%s", "00", 1) + "84 00 0000 00000000" + "0035 1f90", "fd00::1", "fd00::2", ProtoSCTP, 53, 8080},
		{"IPv6 first fragment", strings.Replace(v6, "%s", "2c", 1) + "06 00 0001 00000001" + "0035 1f90", "fd00::1", "fd00::2", ProtoTCP, 53, 8080},
		{"IPv6 later fragment", strings.Replace(v6, "%s", "2c", 1) + "06 00 0100 00000001" + "0035 1f90", "fd00::1", "fd00::2", ProtoTCP, 0, 0},
	} {
		var p Packet
		parseIP(h(c.pkt), &p)
		want := Packet{Src: netip.MustParseAddr(c.src), Dst: netip.MustParseAddr(c.dst), Proto: c.proto, SrcPort: c.sport, DstPort: c.dport}
		if p != want {
			t.Errorf("%s: %+v, want %+v", c.name, p, want)
		}
	}
	var p Packet
	parseIP(h("4500"), &p)
	if p != (Packet{}) {
		t.Errorf("a 2-byte packet gave %+v", p)
	}
}
