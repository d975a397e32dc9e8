package netfilter_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/tabbynet/tabby/internal/netfilter"
	"github.com/tabbynet/tabby/internal/netnstest"
	"github.com/tabbynet/tabby/internal/tier"
)

// TestIPSetNetlink: the same creates, and then the same member changes,
// of every set type tabby uses, in both families, once over netlink and
// once through `ipset restore` (NoNetlink), leave the same sets with the
// same members as ipset save prints them; adding a member that is there
// and deleting one that is not are not errors; a nomatch member arrives as
// one; a batch larger than one request and one write arrives whole.
func TestIPSetNetlink(t *testing.T) {
	n := newNS(t)
	ctx := context.Background()
	nl, err := netfilter.NewIPSets("")
	if err != nil {
		t.Fatal(err)
	}
	rs := *nl
	rs.NoNetlink = true
	// The netlink side goes over netlink alone: Apply would fall back to
	// restore on an error and hide it.
	via := map[string]func(*netfilter.SetBatch) error{
		"nl": func(b *netfilter.SetBatch) error { return nl.ApplyNetlink(ctx, b) },
		"rs": func(b *netfilter.SetBatch) error { return rs.Apply(ctx, b, true) },
	}
	types := map[string]string{"ip": "hash:ip", "net": "hash:net", "ipport": "hash:ip,port", "iface": "hash:net,iface"}
	members := map[string][]string{
		"ip":     {"10.0.0.1", "10.0.0.2"},
		"net":    {"10.1.0.0/16", "10.2.0.5"},
		"ipport": {"10.0.0.1,tcp:80", "10.0.0.2,udp:53", "10.0.0.3,sctp:9000"},
		"iface":  {"10.0.0.1,tab0123456789a", "10.3.0.0/24,tab0123456789b"},
	}
	// Both sides' sets, named t-nl-… and t-rs-…, as ipset save prints
	// them with the restore side's names, and the netlink side's names
	// (sets are created with a random hash seed, initval, left out).
	saved := func() (nlSide, rsSide []string) {
		for _, l := range strings.Split(sh(t, n, "ipset", "save"), "\n") {
			l, _, _ = strings.Cut(l, " initval ")
			if r, ok := strings.CutPrefix(l, "add t-rs-"); ok {
				rsSide = append(rsSide, "add t-nl-"+r)
			} else if r, ok := strings.CutPrefix(l, "create t-rs-"); ok {
				rsSide = append(rsSide, "create t-nl-"+r)
			} else if strings.HasPrefix(l, "add t-nl-") || strings.HasPrefix(l, "create t-nl-") {
				nlSide = append(nlSide, l)
			}
		}
		slices.Sort(nlSide)
		slices.Sort(rsSide)
		return nlSide, rsSide
	}
	same := func(step string) []string {
		a, b := saved()
		if !slices.Equal(a, b) {
			t.Errorf("%s: netlink and restore differ:\nnetlink:\n%s\nrestore:\n%s", step, strings.Join(a, "\n"), strings.Join(b, "\n"))
		}
		return a
	}
	for side, apply := range via {
		var create netfilter.SetBatch
		for k, typ := range types {
			create.Create("t-"+side+"-"+k, typ, "inet", "hashsize", "64", "maxelem", "1048576")
			create.Create("t-"+side+"-"+k+"6", typ, "inet6")
		}
		in(t, n, func() error { return apply(&create) })
		in(t, n, func() error { return apply(&create) }) // again: not an error with exist
	}
	if got := same("create"); len(got) != 8 {
		t.Errorf("create: %d sets, want 8: %q", len(got), got)
	}
	batch := func(side string, del bool) *netfilter.SetBatch {
		var b netfilter.SetBatch
		for k, ms := range members {
			name := "t-" + side + "-" + k
			b.Typed(name, types[k])
			for _, m := range ms {
				if del {
					b.Del(name, m)
				} else {
					b.Add(name, m, false)
				}
			}
		}
		for k, m := range map[string]string{"ip6": "fd00::1", "net6": "fd00:1::/64", "ipport6": "fd00::1,tcp:443", "iface6": "fd00::2,tab0123456789a"} {
			name := "t-" + side + "-" + k
			b.Typed(name, types[strings.TrimSuffix(k, "6")])
			if del {
				b.Del(name, m)
			} else {
				b.Add(name, m, false)
			}
		}
		return &b
	}
	for _, step := range []struct {
		name string
		del  bool
	}{{"add", false}, {"add again", false}, {"del", true}, {"del again", true}, {"add back", false}} {
		for side, apply := range via {
			in(t, n, func() error { return apply(batch(side, step.del)) })
		}
		if got := same(step.name); !step.del && len(got) != 8+13 {
			t.Errorf("%s: %d lines, want 8 sets and 13 members:\n%s", step.name, len(got), strings.Join(got, "\n"))
		}
	}
	// A nomatch member, and a member going from match to nomatch in place.
	for side, apply := range via {
		var b netfilter.SetBatch
		b.Typed("t-"+side+"-net", "hash:net")
		b.Add("t-"+side+"-net", "10.1.2.0/24", true)
		b.Add("t-"+side+"-net", "10.1.0.0/16", true)
		in(t, n, func() error { return apply(&b) })
	}
	if got := same("nomatch"); !slices.Contains(got, "add t-nl-net 10.1.2.0/24 nomatch") || !slices.Contains(got, "add t-nl-net 10.1.0.0/16 nomatch") {
		t.Errorf("the nomatch members did not arrive as such:\n%s", strings.Join(got, "\n"))
	}
	// Larger than a request (adtMaxBytes) and than a write: new sets
	// filled, then half their members moved from one set to the next.
	for side, apply := range via {
		var b netfilter.SetBatch
		for k := range 3 {
			name := fmt.Sprintf("t-%s-big%d", side, k)
			b.Create(name, "hash:net,iface", "inet", "hashsize", "4096", "maxelem", "1048576")
			for i := range 6000 {
				b.Add(name, fmt.Sprintf("10.%d.%d.%d,tab%011d", k, i>>8, i&255, i), false)
			}
		}
		for k := range 3 {
			from, to := fmt.Sprintf("t-%s-big%d", side, k), fmt.Sprintf("t-%s-big%d", side, (k+1)%3)
			for i := 0; i < 6000; i += 2 {
				m := fmt.Sprintf("10.%d.%d.%d,tab%011d", k, i>>8, i&255, i)
				b.Add(to, m, false)
				b.Del(from, m)
			}
		}
		in(t, n, func() error { return apply(&b) })
	}
	if got := same("big"); len(got) != 8+13+1+3+18000 {
		t.Errorf("big: %d lines, want %d", len(got), 8+13+1+3+18000)
	}
}

// TestIPSetNetlinkRefused: a request the kernel refuses fails the netlink
// path with an error naming it, and the deletions after it are not sent,
// so a member moving between sets stays in the one it had; Apply then
// runs the batch through restore, whose error quotes the line.
func TestIPSetNetlinkRefused(t *testing.T) {
	n := newNS(t)
	ctx := context.Background()
	s, err := netfilter.NewIPSets("")
	if err != nil {
		t.Fatal(err)
	}
	sh(t, n, "ipset", "create", "t-from", "hash:ip")
	sh(t, n, "ipset", "add", "t-from", "10.0.0.1")
	var b netfilter.SetBatch
	b.Typed("t-missing", "hash:ip")
	b.Typed("t-from", "hash:ip")
	b.Add("t-missing", "10.0.0.1", false)
	b.Del("t-from", "10.0.0.1")
	in(t, n, func() error {
		err := s.ApplyNetlink(ctx, &b)
		if !errors.Is(err, syscall.ENOENT) || !strings.Contains(err.Error(), "t-missing") {
			return fmt.Errorf("adding to a missing set over netlink: %v; want ENOENT, naming the set", err)
		}
		t.Logf("refused over netlink, as it should be: %v", err)
		return nil
	})
	if got := sh(t, n, "ipset", "save", "t-from"); !strings.Contains(got, "add t-from 10.0.0.1") {
		t.Errorf("the deletion after the refused add was sent:\n%s", got)
	}
	in(t, n, func() error {
		err := s.Apply(ctx, &b, true)
		if err == nil || !strings.Contains(err.Error(), "(the line: add t-missing 10.0.0.1)") {
			return fmt.Errorf("Apply of the same batch: %v; want restore's error quoting the line", err)
		}
		return nil
	})
}

// BenchmarkIPSetMove: a pod's address leaving one set for another (one
// add, one del), as a label change makes it, over netlink and with
// `ipset restore`.
func BenchmarkIPSetMove(b *testing.B) {
	tier.Root(b, "a real-kernel benchmark: it creates network namespaces", "ipset")
	n := netnstest.New(b, "netfilter")
	ctx := context.Background()
	sets, err := netfilter.NewIPSets("")
	if err != nil {
		b.Fatal(err)
	}
	var create netfilter.SetBatch
	create.Create("t-a", "hash:net,iface", "inet")
	create.Create("t-b", "hash:net,iface", "inet")
	if err := n.Do(func(ns.NetNS) error { return sets.Apply(ctx, &create, false) }); err != nil {
		b.Fatal(err)
	}
	for _, via := range []string{"netlink", "restore"} {
		b.Run(via, func(b *testing.B) {
			s := *sets
			s.NoNetlink = via == "restore"
			i := 0
			err := n.Do(func(ns.NetNS) error {
				for b.Loop() {
					from, to := []string{"t-a", "t-b"}[i%2], []string{"t-b", "t-a"}[i%2]
					i++
					var m netfilter.SetBatch
					m.Typed(from, "hash:net,iface")
					m.Typed(to, "hash:net,iface")
					m.Add(to, "10.244.1.5,tab0123456789a", false)
					m.Del(from, "10.244.1.5,tab0123456789a")
					if err := s.Apply(ctx, &m, true); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}
