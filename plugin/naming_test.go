package plugin

import (
	"crypto/sha1"
	"encoding/hex"
	"regexp"
	"testing"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/contract/agentapi"
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

func TestParseArgs(t *testing.T) {
	p, err := ParseArgs("IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-1;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u")
	if err != nil || p.Namespace != "kube-system" || p.Name != "coredns-1" || !p.Known() {
		t.Errorf("%+v %v", p, err)
	}
	if p, err := ParseArgs(""); err != nil || p.Known() {
		t.Errorf("%+v %v", p, err)
	}
	if _, err := ParseArgs("K8S_POD_NAME"); err == nil {
		t.Error("want an error for an entry without =")
	}
}

func TestVethAlias(t *testing.T) {
	a := Attachment{Network: "k8s-pod-network", ContainerID: "0123abcd", IfName: "eth0"}
	s := VethAlias(a)
	if s != "tabby:k8s-pod-network/0123abcd/eth0" {
		t.Errorf("alias %q", s)
	}
	got, ok := ParseVethAlias(s)
	if !ok || got != a {
		t.Errorf("round trip: %+v %v", got, ok)
	}
	for _, bad := range []string{"", "cali", "tabby:", "tabby:a/b", "tabby:a//c", "tabby:a/b/c/d"} {
		if _, ok := ParseVethAlias(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}

// pool is what the allocators report of an IPPool (the modes are the
// API's, so that a renamed constant shows here).
func pool(cidr string, ipip, vxlan tabbyv1.EncapMode, disabled bool) agentapi.Pool {
	return agentapi.Pool{Name: cidr, CIDR: cidr, IPIPMode: string(ipip), VXLANMode: string(vxlan), Disabled: disabled}
}

func TestComputeMTU(t *testing.T) {
	for _, tc := range []struct {
		name             string
		configured, link int
		pools            []agentapi.Pool
		want             int
	}{
		{"configured wins", 1234, 9000, []agentapi.Pool{pool("10.0.0.0/16", "", tabbyv1.EncapAlways, false)}, 1234},
		{"no pools", 0, 1500, nil, 1500},
		{"native pool", 0, 1500, []agentapi.Pool{pool("10.0.0.0/16", tabbyv1.EncapNever, tabbyv1.EncapNever, false)}, 1500},
		{"vxlan always", 0, 1500, []agentapi.Pool{pool("10.0.0.0/16", "", tabbyv1.EncapAlways, false)}, 1450},
		{"vxlan cross subnet", 0, 9000, []agentapi.Pool{pool("10.0.0.0/16", "", tabbyv1.EncapCrossSubnet, false)}, 8950},
		{"ipip", 0, 1500, []agentapi.Pool{pool("10.0.0.0/16", tabbyv1.EncapAlways, "", false)}, 1480},
		{"max over pools", 0, 1500, []agentapi.Pool{pool("10.0.0.0/16", tabbyv1.EncapAlways, "", false), pool("10.1.0.0/16", "", tabbyv1.EncapCrossSubnet, false)}, 1450},
		{"disabled pool ignored", 0, 1500, []agentapi.Pool{pool("10.0.0.0/16", "", tabbyv1.EncapAlways, true), pool("10.1.0.0/16", tabbyv1.EncapAlways, "", false)}, 1480},
		{"no default route", 0, 0, []agentapi.Pool{pool("10.0.0.0/16", "", tabbyv1.EncapAlways, false)}, 1450},
		{"small underlay", 0, 1400, []agentapi.Pool{pool("10.0.0.0/16", "", tabbyv1.EncapAlways, false)}, 1350},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ComputeMTU(tc.configured, tc.link, tc.pools); got != tc.want {
				t.Errorf("got %d want %d", got, tc.want)
			}
		})
	}
}

func TestHostPrefixAndGateway(t *testing.T) {
	p := hostPrefix([]byte{10, 0, 0, 1})
	if p.String() != "10.0.0.1/32" {
		t.Error(p.String())
	}
	p6 := hostPrefix(GatewayV6)
	if p6.String() != "fe80::1/128" {
		t.Error(p6.String())
	}
	if !gatewayFor(p.IP).Equal(GatewayV4) || !gatewayFor(p6.IP).Equal(GatewayV6) {
		t.Error("gateways")
	}
}
