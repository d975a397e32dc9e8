package main

import "testing"

func TestParseTraceDst(t *testing.T) {
	for _, c := range []struct {
		in, ref, proto string
		port           int
		bad            bool
	}{
		{in: "default/web", ref: "default/web", proto: "icmp"},
		{in: "default/web:80", ref: "default/web", proto: "tcp", port: 80},
		{in: "default/web:53/udp", ref: "default/web", proto: "udp", port: 53},
		{in: "default/web:53/UDP", ref: "default/web", proto: "udp", port: 53},
		{in: "10.0.0.1", ref: "10.0.0.1", proto: "icmp"},
		{in: "10.0.0.1:8080/sctp", ref: "10.0.0.1", proto: "sctp", port: 8080},
		{in: "fd00::5", ref: "fd00::5", proto: "icmp"},
		{in: "[fd00::5]:53/udp", ref: "fd00::5", proto: "udp", port: 53},
		{in: "[fd00::5]:443", ref: "fd00::5", proto: "tcp", port: 443},
		{in: "[fd00::5]", bad: true},
		{in: "default/web:0", bad: true},
		{in: "default/web:65536", bad: true},
		{in: "default/web:http", bad: true},
		{in: "default/web:80/icmp", bad: true},
		{in: ":80", bad: true},
	} {
		ref, proto, port, err := parseTraceDst(c.in)
		if c.bad {
			if err == nil {
				t.Errorf("parseTraceDst(%q) = %q %q %d, want an error", c.in, ref, proto, port)
			}
			continue
		}
		if err != nil || ref != c.ref || proto != c.proto || port != c.port {
			t.Errorf("parseTraceDst(%q) = %q %q %d %v, want %q %q %d", c.in, ref, proto, port, err, c.ref, c.proto, c.port)
		}
	}
}
