package policy

import (
	"math/rand"
	"net/netip"
	"slices"
	"testing"
)

// netMembers is exact: an address is in the union of the prefixes it
// returns exactly when some ipBlock holds it (in cidr, in no except).
func TestNetMembersExact(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	base := netip.MustParseAddr("10.1.2.0")
	randPrefix := func(minBits int) netip.Prefix {
		bits := minBits + r.Intn(33-minBits)
		a := base.As4()
		a[3] = byte(r.Intn(256))
		return netip.PrefixFrom(netip.AddrFrom4(a), bits).Masked()
	}
	for i := 0; i < 2000; i++ {
		var blocks []ipBlock
		for j := r.Intn(4); j >= 0; j-- {
			c := randPrefix(24)
			b := ipBlock{cidr: c}
			for k := r.Intn(4); k > 0 && c.Bits() < 32; k-- {
				bits := c.Bits() + 1 + r.Intn(32-c.Bits())
				a := c.Addr().As4()
				a[3] |= byte(r.Intn(256)) & byte(1<<(32-c.Bits())-1)
				b.except = append(b.except, netip.PrefixFrom(netip.AddrFrom4(a), bits).Masked())
			}
			blocks = append(blocks, b)
		}
		v4, v6 := netMembers(blocks)
		if len(v6) != 0 {
			t.Fatalf("IPv6 members from IPv4 blocks: %v", v6)
		}
		var ps []netip.Prefix
		for _, m := range v4 {
			p := netip.MustParsePrefix(m)
			if p.Bits() == 0 || p.Masked() != p {
				t.Fatalf("member %s", m)
			}
			for _, q := range ps {
				if q.Overlaps(p) {
					t.Fatalf("members %s and %s overlap", q, p)
				}
			}
			ps = append(ps, p)
		}
		for x := 0; x < 256; x++ {
			a := base.As4()
			a[3] = byte(x)
			addr := netip.AddrFrom4(a)
			want := false
			for _, b := range blocks {
				in := b.cidr.Contains(addr)
				for _, e := range b.except {
					in = in && !e.Contains(addr)
				}
				want = want || in
			}
			got := slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(addr) })
			if got != want {
				t.Fatalf("blocks %+v: %s in %v is %v, want %v", blocks, addr, v4, got, want)
			}
		}
	}
}

func TestNetMembersEdges(t *testing.T) {
	p := netip.MustParsePrefix
	for _, c := range []struct {
		blocks []ipBlock
		v4, v6 []string
	}{
		{[]ipBlock{{cidr: p("0.0.0.0/0")}}, []string{"0.0.0.0/1", "128.0.0.0/1"}, nil},
		{[]ipBlock{{cidr: p("::/0")}}, nil, []string{"8000::/1", "::/1"}},
		{[]ipBlock{{cidr: p("0.0.0.0/0"), except: []netip.Prefix{p("0.0.0.0/1")}}}, []string{"128.0.0.0/1"}, nil},
		{[]ipBlock{{cidr: p("255.255.255.0/24"), except: []netip.Prefix{p("255.255.255.255/32")}}},
			[]string{"255.255.255.0/25", "255.255.255.128/26", "255.255.255.192/27", "255.255.255.224/28", "255.255.255.240/29", "255.255.255.248/30", "255.255.255.252/31", "255.255.255.254/32"}, nil},
		{[]ipBlock{{cidr: p("10.0.0.0/8"), except: []netip.Prefix{p("10.0.0.0/9"), p("10.0.0.0/16")}}}, []string{"10.128.0.0/9"}, nil},
		{[]ipBlock{{cidr: p("10.0.0.0/9")}, {cidr: p("10.128.0.0/9")}, {cidr: p("fd00::/64")}}, []string{"10.0.0.0/8"}, []string{"fd00::/64"}},
	} {
		v4, v6 := netMembers(c.blocks)
		if !slices.Equal(v4, c.v4) || !slices.Equal(v6, c.v6) {
			t.Errorf("%+v: %v %v, want %v %v", c.blocks, v4, v6, c.v4, c.v6)
		}
	}
}
