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
