package netfilter_test

import (
	"context"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/tabbynet/tabby/internal/netfilter"
	"github.com/tabbynet/tabby/internal/netnstest"
	"github.com/tabbynet/tabby/internal/tier"
)

// TestIPSetNetlink: the same member changes of every set type tabby uses,
// once through netlink and once through `ipset restore` (NoNetlink), in
// two sets each, leave the two sets with the same members as ipset save
// prints them; with exist, adding a member that is there and deleting one
// that is not are not errors; without, they are; a nomatch member goes
// through restore (netlink cannot carry the flag), and so does a batch
// with more than NetlinkMax changes.
func TestIPSetNetlink(t *testing.T) {
	n := newNS(t)
	ctx := context.Background()
	nl, err := netfilter.NewIPSets("")
	if err != nil {
		t.Fatal(err)
	}
	rs := *nl
	rs.NoNetlink = true
	types := map[string]string{"ip": "hash:ip", "net": "hash:net", "ipport": "hash:ip,port", "iface": "hash:net,iface"}
	members := map[string][]string{
		"ip":     {"10.0.0.1", "10.0.0.2"},
		"net":    {"10.1.0.0/16", "10.2.0.5"},
		"ipport": {"10.0.0.1,tcp:80", "10.0.0.2,udp:53", "10.0.0.3,sctp:9000"},
		"iface":  {"10.0.0.1,tab0123456789a", "10.3.0.0/24,tab0123456789b"},
	}
	var create netfilter.SetBatch
	for _, via := range []string{"nl", "rs"} {
		for k, typ := range types {
			create.Create("t-"+via+"-"+k, typ, "inet")
			create.Create("t-"+via+"-"+k+"6", typ, "inet6")
		}
	}
	in(t, n, func() error { return rs.Apply(ctx, &create, false) })
	batch := func(via string, del bool) *netfilter.SetBatch {
		var b netfilter.SetBatch
		for k, ms := range members {
			name := "t-" + via + "-" + k
			b.Typed(name, types[k])
			for _, m := range ms {
				if del {
					b.Del(name, m)
				} else {
					b.Add(name, m, false)
				}
			}
		}
		b.Typed("t-"+via+"-ip6", "hash:ip")
		if del {
			b.Del("t-"+via+"-ip6", "fd00::1")
		} else {
			b.Add("t-"+via+"-ip6", "fd00::1", false)
		}
		return &b
	}
	for _, step := range []struct {
		name  string
		del   bool
		exist bool
	}{{"add", false, false}, {"add again", false, true}, {"del", true, false}, {"del again", true, true}, {"add back", false, false}} {
		in(t, n, func() error {
			if err := nl.Apply(ctx, batch("nl", step.del), step.exist); err != nil {
				return err
			}
			return rs.Apply(ctx, batch("rs", step.del), step.exist)
		})
		save := strings.ReplaceAll(sh(t, n, "ipset", "save"), "t-rs-", "t-nl-")
		lines := strings.Split(save, "\n")
		want := map[string]int{}
		for _, l := range lines {
			if strings.HasPrefix(l, "add ") {
				want[l]++
			}
		}
		for l, c := range want {
			if c != 2 {
				t.Errorf("%s: %q is in one set only: netlink and restore differ", step.name, l)
			}
		}
		if !step.del && len(want) != 10 {
			t.Errorf("%s: %d members, want 10:\n%s", step.name, len(want), save)
		}
	}
	// Without exist, a second add is refused, over netlink as by restore.
	in(t, n, func() error {
		if err := nl.Apply(ctx, batch("nl", false), false); err == nil {
			t.Error("adding members that are there without exist: no error")
		}
		return nil
	})
	// A nomatch member is not lost on the way.
	var b netfilter.SetBatch
	b.Typed("t-nl-net", "hash:net")
	b.Add("t-nl-net", "10.1.2.0/24", true)
	in(t, n, func() error { return nl.Apply(ctx, &b, true) })
	if save := sh(t, n, "ipset", "save", "t-nl-net"); !strings.Contains(save, "add t-nl-net 10.1.2.0/24 nomatch") {
		t.Errorf("the nomatch member did not arrive as one:\n%s", save)
	}
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
