package policy

import (
	"math/rand"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// lpmMatch is how the kernel matches an address against hash:net members:
// the longest prefix holding it decides; a nomatch member means no match.
func lpmMatch(t testing.TB, members []string, a netip.Addr) bool {
	t.Helper()
	best, match := -1, false
	for _, m := range members {
		v, nm := strings.CutSuffix(m, " nomatch")
		p, err := netip.ParsePrefix(v)
		if err != nil || p.Bits() == 0 || p.Masked() != p {
			t.Fatalf("member %q: not a CIDR that hash:net can hold", m)
		}
		if p.Contains(a) && p.Bits() > best {
			best, match = p.Bits(), !nm
		}
	}
	return match
}

// blocksAllow is the reference: some ipBlock has a in its cidr and in none
// of its excepts.
func blocksAllow(blocks []ipBlock, a netip.Addr) bool {
	for _, b := range blocks {
		in := b.cidr.Contains(a)
		for _, e := range b.except {
			in = in && !e.Contains(a)
		}
		if in {
			return true
		}
	}
	return false
}

// checkMembers checks a set's members: sorted, each prefix once (never
// both plain and nomatch), none redundant with the prefix around it.
func checkMembers(t testing.TB, members []string) {
	t.Helper()
	if !slices.IsSorted(members) {
		t.Fatalf("members not sorted: %v", members)
	}
	seen := map[string]bool{}
	for _, m := range members {
		v, _ := strings.CutSuffix(m, " nomatch")
		if seen[v] {
			t.Fatalf("%s listed twice in %v", v, members)
		}
		seen[v] = true
	}
}

// randBlocks makes up to four IPv4 ipBlocks inside 10.1.2.0/24 (or /0 and
// its halves), with up to four excepts each, which often overlap each
// other and the other blocks' cidrs: the cases where cidrs plus nomatch
// excepts, written naively, would be wrong.
func randBlocks(r *rand.Rand) []ipBlock {
	base := netip.MustParseAddr("10.1.2.0")
	pfx := func(minBits int) netip.Prefix {
		a := base.As4()
		a[3] = byte(r.Intn(256))
		return netip.PrefixFrom(netip.AddrFrom4(a), minBits+r.Intn(33-minBits)).Masked()
	}
	var blocks []ipBlock
	for j := r.Intn(4); j >= 0; j-- {
		c := pfx(24)
		switch r.Intn(8) {
		case 0:
			c = netip.MustParsePrefix("0.0.0.0/0")
		case 1:
			c = netip.MustParsePrefix("0.0.0.0/1")
		}
		b := ipBlock{cidr: c}
		for k := r.Intn(5); k > 0 && c.Bits() < 32; k-- {
			e := pfx(24)
			if r.Intn(6) == 0 {
				e = netip.MustParsePrefix(pick(&chooser{r: r}, "0.0.0.0/1", "10.0.0.0/8", "10.1.2.0/24", "128.0.0.0/1"))
			}
			if e.Bits() > c.Bits() && c.Contains(e.Addr()) {
				b.except = append(b.except, e)
			}
		}
		blocks = append(blocks, b)
	}
	r.Shuffle(len(blocks), func(i, j int) { blocks[i], blocks[j] = blocks[j], blocks[i] })
	return blocks
}

// netMembers is exact under the kernel's longest-prefix match: an address
// matches the members exactly when some ipBlock holds it.
func TestNetMembersExact(t *testing.T) {
	r := rand.New(rand.NewSource(7))
	probes := []netip.Addr{netip.MustParseAddr("0.0.0.1"), netip.MustParseAddr("10.1.1.255"), netip.MustParseAddr("10.1.3.0"),
		netip.MustParseAddr("128.0.0.0"), netip.MustParseAddr("255.255.255.255")}
	for x := 0; x < 256; x++ {
		probes = append(probes, netip.AddrFrom4([4]byte{10, 1, 2, byte(x)}))
	}
	for i := 0; i < 3000; i++ {
		blocks := randBlocks(r)
		v4, v6 := netMembers(blocks)
		if len(v6) != 0 {
			t.Fatalf("IPv6 members from IPv4 blocks: %v", v6)
		}
		checkMembers(t, v4)
		named := 0
		for _, b := range blocks {
			named += 1 + len(b.except)
			if b.cidr.Bits() == 0 {
				named++
			}
		}
		if len(v4) > named {
			t.Fatalf("blocks %+v: %d members, more than the %d CIDRs they name", blocks, len(v4), named)
		}
		for _, a := range probes {
			if got, want := lpmMatch(t, v4, a), blocksAllow(blocks, a); got != want {
				t.Fatalf("blocks %+v: %s matches %v: %v, want %v", blocks, a, v4, got, want)
			}
		}
	}
}

func TestNetMembersEdges(t *testing.T) {
	p := netip.MustParsePrefix
	ps := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, x := range s {
			out = append(out, p(x))
		}
		return out
	}
	for _, c := range []struct {
		name   string
		blocks []ipBlock
		v4, v6 []string
	}{
		{"a /0 is two /1s", []ipBlock{{cidr: p("0.0.0.0/0")}}, []string{"0.0.0.0/1", "128.0.0.0/1"}, nil},
		{"::/0", []ipBlock{{cidr: p("::/0")}}, nil, []string{"8000::/1", "::/1"}},
		{"except a /1 of a /0", []ipBlock{{cidr: p("0.0.0.0/0"), except: ps("0.0.0.0/1")}}, []string{"128.0.0.0/1"}, nil},
		{"except as nomatch", []ipBlock{{cidr: p("255.255.255.0/24"), except: ps("255.255.255.255/32")}},
			[]string{"255.255.255.0/24", "255.255.255.255/32 nomatch"}, nil},
		{"nested excepts: the inner one is redundant", []ipBlock{{cidr: p("10.0.0.0/8"), except: ps("10.0.0.0/9", "10.0.0.0/16")}},
			[]string{"10.0.0.0/8", "10.0.0.0/9 nomatch"}, nil},
		{"the same except twice", []ipBlock{{cidr: p("10.0.0.0/8"), except: ps("10.1.0.0/16", "10.1.0.0/16")}},
			[]string{"10.0.0.0/8", "10.1.0.0/16 nomatch"}, nil},
		{"both families", []ipBlock{{cidr: p("10.0.0.0/9")}, {cidr: p("10.128.0.0/9")}, {cidr: p("fd00::/64"), except: ps("fd00::/96")}},
			[]string{"10.0.0.0/9", "10.128.0.0/9"}, []string{"fd00::/64", "fd00::/96 nomatch"}},
		// Another block's cidr inside (or equal to) an except: the except
		// must not hide it.
		{"a block inside another's except", []ipBlock{{cidr: p("10.0.0.0/8"), except: ps("10.1.0.0/16")}, {cidr: p("10.1.2.0/24")}},
			[]string{"10.0.0.0/8", "10.1.0.0/16 nomatch", "10.1.2.0/24"}, nil},
		{"a block equal to another's except", []ipBlock{{cidr: p("10.0.0.0/8"), except: ps("10.1.0.0/16")}, {cidr: p("10.1.0.0/16")}},
			[]string{"10.0.0.0/8"}, nil},
		{"a wider block around another's except", []ipBlock{{cidr: p("10.0.0.0/16"), except: ps("10.0.1.0/24")}, {cidr: p("10.0.0.0/15")}},
			[]string{"10.0.0.0/15"}, nil},
		{"an except inside another block's except", []ipBlock{{cidr: p("10.0.0.0/8"), except: ps("10.1.0.0/16")}, {cidr: p("10.0.0.0/9"), except: ps("10.1.2.0/24")}},
			[]string{"10.0.0.0/8", "10.1.2.0/24 nomatch"}, nil},
	} {
		v4, v6 := netMembers(c.blocks)
		if !slices.Equal(v4, c.v4) || !slices.Equal(v6, c.v6) {
			t.Errorf("%s: %+v: %q %q, want %q %q", c.name, c.blocks, v4, v6, c.v4, c.v6)
		}
	}
}

// The hostile policy of issue 11: ::/0 and 0.0.0.0/0 with 11,000 excepts
// each take one member per CIDR, not the over a million of the
// complement.
func TestNetMembersManyExcepts(t *testing.T) {
	b4, b6 := hostileBlocks(11000)
	v4, v6 := netMembers([]ipBlock{b4, b6})
	if len(v4) != 11002 || len(v6) != 11002 {
		t.Fatalf("%d IPv4 and %d IPv6 members, want 11002 each (two /1s and 11,000 nomatch)", len(v4), len(v6))
	}
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 200; i++ {
		e := b4.except[r.Intn(len(b4.except))]
		a := e.Addr().As4()
		a[3] ^= byte(r.Intn(2))
		addr := netip.AddrFrom4(a)
		if got, want := lpmMatch(t, v4, addr), blocksAllow([]ipBlock{b4}, addr); got != want {
			t.Fatalf("%s: %v, want %v", addr, got, want)
		}
	}
}

// hostileBlocks are 0.0.0.0/0 and ::/0, each with n distinct /31 (/127)
// excepts spread over the whole space, most of them alone in their /24.
func hostileBlocks(n int) (v4, v6 ipBlock) {
	v4 = ipBlock{cidr: netip.MustParsePrefix("0.0.0.0/0")}
	v6 = ipBlock{cidr: netip.MustParsePrefix("::/0")}
	for i := 0; i < n; i++ {
		x := uint32(i) * 390451 // odd: distinct for every i < 2^32
		a := [4]byte{byte(x >> 24), byte(x >> 16), byte(x >> 8), byte(x)}
		v4.except = append(v4.except, netip.PrefixFrom(netip.AddrFrom4(a), 31).Masked())
		var b [16]byte
		copy(b[:4], a[:])
		b[15] = byte(i)
		v6.except = append(v6.except, netip.PrefixFrom(netip.AddrFrom16(b), 127).Masked())
	}
	return v4, v6
}
