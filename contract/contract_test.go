package contract

import (
	"crypto/sha1"
	"encoding/hex"
	"regexp"
	"testing"
)

func TestHostVethName(t *testing.T) {
	sum := func(s string) string { h := sha1.Sum([]byte(s)); return "tab" + hex.EncodeToString(h[:])[:11] }
	pod := PodID{Namespace: "default", Name: "web-0"}
	for _, tc := range []struct {
		name       string
		pod        PodID
		cid, ifn   string
		want       string
		sameAsPrev bool
	}{
		{"pod identity", pod, "c1", "eth0", sum("default/web-0"), false},
		{"pod identity ignores container", pod, "c2", "eth0", sum("default/web-0"), false},
		{"second interface", pod, "c1", "net1", sum("default/web-0/net1"), false},
		{"no identity", PodID{}, "c1", "eth0", sum("c1/eth0"), false},
		{"half identity counts as none", PodID{Namespace: "default"}, "c1", "eth0", sum("c1/eth0"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := HostVethName(tc.pod, tc.cid, tc.ifn)
			if got != tc.want {
				t.Errorf("got %q want %q", got, tc.want)
			}
			if len(got) != 14 || !regexp.MustCompile(`^tab[0-9a-f]{11}$`).MatchString(got) {
				t.Errorf("%q is not tab + 11 hex digits (and must fit IFNAMSIZ)", got)
			}
		})
	}
	if HostVethName(PodID{Namespace: "a", Name: "b"}, "c", "eth0") == HostVethName(PodID{Namespace: "a", Name: "c"}, "c", "eth0") {
		t.Error("different pods share a name")
	}
}

func TestNodeOfHeartbeatLease(t *testing.T) {
	for _, node := range []string{"n1", "node-a.example"} {
		if got, ok := NodeOfHeartbeatLease(HeartbeatLeaseName(node)); !ok || got != node {
			t.Errorf("NodeOfHeartbeatLease(HeartbeatLeaseName(%q)) = %q, %v", node, got, ok)
		}
	}
	for _, name := range []string{"", "tabbyd-", "tabby-ipam-gc", "tabby-scheduler-extender", "n1"} {
		if got, ok := NodeOfHeartbeatLease(name); ok {
			t.Errorf("NodeOfHeartbeatLease(%q) = %q, want no node", name, got)
		}
	}
}
