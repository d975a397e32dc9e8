package daemon

import (
	"strings"
	"testing"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
)

func TestDefaultPoolSpec(t *testing.T) {
	for _, c := range []struct {
		cidr, encap string
		block       int
		ipip, vxlan tabbyv1.EncapMode
		err         string
	}{
		{cidr: "10.244.0.0/16", encap: "None"},
		{cidr: "10.244.0.0/16", encap: ""},
		{cidr: "10.244.0.0/16", encap: "IPIP", ipip: tabbyv1.EncapAlways},
		{cidr: "10.244.0.0/16", encap: "IPIPCrossSubnet", ipip: tabbyv1.EncapCrossSubnet},
		{cidr: "10.244.0.0/16", encap: "VXLAN", vxlan: tabbyv1.EncapAlways},
		{cidr: "10.244.0.0/16", block: 24, encap: "VXLANCrossSubnet", vxlan: tabbyv1.EncapCrossSubnet},
		{cidr: "10.244.0.0/16", encap: "GRE", err: `encapsulation "GRE"`},
		{cidr: "10.244.1.0/16", err: "host bits"},
		{cidr: "10.244.0.0/16", block: 12, err: "blockSize"},
		{cidr: "banana", err: "cidr"},
		{cidr: "fd00:10:244::/56", err: "an IPv6 CIDR: give it as --default-ipv6-pool-cidr"},
	} {
		spec, err := DefaultPoolSpec(c.cidr, c.block, c.encap)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s/%d/%s: error %v, want one naming %q", c.cidr, c.block, c.encap, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s/%d/%s: %v", c.cidr, c.block, c.encap, err)
			continue
		}
		if spec.CIDR != c.cidr || spec.BlockSize != c.block || !spec.NATOutgoing || spec.IPIPMode != c.ipip || spec.VXLANMode != c.vxlan {
			t.Errorf("%s/%d/%s: %+v", c.cidr, c.block, c.encap, spec)
		}
	}
}

func TestDefaultIPv6PoolSpec(t *testing.T) {
	for _, c := range []struct {
		cidr  string
		block int
		err   string
	}{
		{cidr: "fd00:10:244::/56"},
		{cidr: "fd00:10:244::/56", block: 120},
		{cidr: "10.244.0.0/16", err: "an IPv4 CIDR: give it as --default-ipv4-pool-cidr"},
		{cidr: "fd00:10:244::/56", block: 26, err: "blockSize"},
		{cidr: "fd00:10:244::1/56", err: "host bits"},
	} {
		spec, err := DefaultIPv6PoolSpec(c.cidr, c.block)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s/%d: error %v, want one naming %q", c.cidr, c.block, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s/%d: %v", c.cidr, c.block, err)
			continue
		}
		// As Calico's default IPv6 pool: routed natively, no NAT outgoing.
		if spec.CIDR != c.cidr || spec.BlockSize != c.block || spec.NATOutgoing || spec.IPIPMode != "" || spec.VXLANMode != "" {
			t.Errorf("%s/%d: %+v", c.cidr, c.block, spec)
		}
	}
}
