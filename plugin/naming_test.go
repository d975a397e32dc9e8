package plugin

import (
	"testing"

	"github.com/containernetworking/cni/pkg/skel"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/contract"
	"github.com/tabbynet/tabby/contract/agentapi"
)

func TestAttachmentNameIsTabbyds(t *testing.T) {
	// The plugin names the host veth from CNI_ARGS and the container ID;
	// tabbyd's policy rules name it from the Pod alone: both must agree
	// for the rules to meet the pod's traffic.
	args := &skel.CmdArgs{ContainerID: "c1", IfName: "eth0",
		Args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-abc;K8S_POD_INFRA_CONTAINER_ID=c1"}
	_, got, _, err := attachment(&Config{Name: "k8s-pod-network"}, args)
	if err != nil {
		t.Fatal(err)
	}
	want := contract.HostVethName(contract.PodID{Namespace: "kube-system", Name: "coredns-abc"}, "", contract.DefaultIfName)
	if got != want {
		t.Errorf("the plugin names the veth %q, tabbyd %q", got, want)
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
