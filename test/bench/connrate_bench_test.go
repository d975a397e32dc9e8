package bench

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/tabbynet/tabby/daemon/netpol"
	"github.com/tabbynet/tabby/internal/benchstat"
	"github.com/tabbynet/tabby/internal/netnstest"
	"github.com/tabbynet/tabby/internal/testnet"
	"github.com/tabbynet/tabby/internal/tier"
	"github.com/tabbynet/tabby/policy"
)

// BenchmarkNetpolConnRate: new TCP connections a second from one pod to
// another of the same node (each connects, reads the server's two bytes
// to the end and closes; one at a time), through the node's FORWARD path:
// without tabby's rules, with conntrack on (as on every node that runs
// kube-proxy), and with the 1,000-policy ruleset of
// BenchmarkNetpolThroughput for a node of 100 pods, in three layouts of
// its dispatch:
//
//   - buckets: as compiled (policy.DispatchBuckets);
//   - flat: the signatures' rules in one list, as before buckets, in
//     their order (the server's and client's rules where their names
//     put them);
//   - flat-last: the same with the server's and the client's rules last,
//     as a pod whose combination of policies sorts last meets them.
//
// Only a connection's first packet walks the dispatch (the rest are
// ESTABLISHED), so it shows here and not in iperf3's throughput. The
// headlines are each layout's rate over the conntrack-only rate, and the
// set lookups its first packet makes in FROM-POD and TO-POD together.
func BenchmarkNetpolConnRate(b *testing.B) {
	needPolicyTools(b)
	w := newNPWorld(5000, 1000, 100)
	server, client := iperfPods(w)
	rs := policy.Compile(w.input())
	if len(rs.Problems) > 0 {
		b.Fatalf("the compiler refused %d policies, the first: %+v", len(rs.Problems), rs.Problems[0])
	}
	serverM := server.Status.PodIP + "," + netpol.HostIface(server)
	clientM := client.Status.PodIP + "," + netpol.HostIface(client)
	flat := flattenDispatch(rs)
	layouts := []struct {
		name string
		rs   *policy.Ruleset
	}{
		{"buckets", rs},
		{"flat", flat},
		{"flat-last", dispatchLast(flat, clientM, serverM)},
	}
	lookups := map[string]int{}
	for _, l := range layouts {
		eg, err := dispatchLookups(l.rs, policy.ChainFromPod, clientM)
		if err != nil {
			b.Fatalf("%s: %v", l.name, err)
		}
		in, err := dispatchLookups(l.rs, policy.ChainToPod, serverM)
		if err != nil {
			b.Fatalf("%s: %v", l.name, err)
		}
		lookups[l.name] = eg + in
	}

	node, serverNS, clientNS := pairNode(b, server, client)
	addr := net.JoinHostPort(server.Status.PodIP, "8080")
	stop, err := testnet.ServeTCP(serverNS, addr, []byte("ok"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(stop)
	a := newApplier(b, node, nil)
	b.Cleanup(func() {
		_ = cleanupIn(node, a)
	})
	be := a.Backend()
	// Tens of thousands of connections a round: their conntrack entries
	// leave TIME_WAIT after a second instead of two minutes.
	if err := netnstest.Thread(node, func() error {
		return os.WriteFile("/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_time_wait", []byte("1"), 0o644)
	}); err != nil {
		b.Fatalf("shortening conntrack's TIME_WAIT in the node: %v", err)
	}
	const d = 2 * time.Second
	rate := map[string][]float64{}
	measure := func(name string) {
		r, err := connRate(clientNS, addr, d)
		if err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		rate[name] = append(rate[name], r)
	}
	for i := 0; b.Loop(); i++ {
		if err := cleanupIn(node, a); err != nil {
			b.Fatal(err)
		}
		measure("none")
		if err := conntrackOn(node, be, "-A"); err != nil {
			b.Fatal(err)
		}
		measure("conntrack")
		if err := conntrackOn(node, be, "-D"); err != nil {
			b.Fatal(err)
		}
		// The layouts in a different order each round.
		for j := range layouts {
			l := layouts[(i+j)%len(layouts)]
			if _, err := applyIn(node, a, l.rs); err != nil {
				b.Fatalf("%s: %v", l.name, err)
			}
			measure(l.name)
		}
	}
	tracked := benchstat.Median(rate["conntrack"])
	b.ReportMetric(benchstat.Median(rate["none"]), "none-conn/s")
	b.ReportMetric(tracked, "conntrack-conn/s")
	for _, l := range layouts {
		b.ReportMetric(benchstat.Median(rate[l.name]), l.name+"-conn/s")
		b.ReportMetric(benchstat.Median(rate[l.name])/tracked, l.name+"-ratio-conntrack")
		b.ReportMetric(float64(lookups[l.name]), l.name+"-lookups")
	}
	b.Logf("connections a second: %v (%s backend)", rate, be.Mode)
}

// TestDispatchBucketsTraffic: the node of BenchmarkNetpolConnRate, its
// dispatch in buckets, with both iptables backends: the connection its
// policies allow goes through a bucket chain of each direction, and a port
// they do not open is refused.
func TestDispatchBucketsTraffic(t *testing.T) {
	tier.Root(t, "the test makes network namespaces, iptables rules and ipsets", "ipset", "iptables-restore")
	w := newNPWorld(5000, 1000, 100)
	server, client := iperfPods(w)
	rs := policy.Compile(w.input())
	if len(rs.Problems) > 0 {
		t.Fatalf("the compiler refused %d policies, the first: %+v", len(rs.Problems), rs.Problems[0])
	}
	for _, c := range rs.Chains {
		if c.Name == policy.ChainToPod && c.Family == policy.FamilyIPv4 && !isBucket(c.Name, ruleTarget(c.Rules[0])) {
			t.Fatalf("%s starts %q; want a bucket's rule (the world has %d signatures)", c.Name, c.Rules[0], len(rs.Signatures))
		}
	}
	for _, be := range npBackends(t) {
		t.Run(string(be.Mode), func(t *testing.T) {
			node, serverNS, clientNS := pairNode(t, server, client)
			for _, port := range []string{"8080", "5201"} {
				stop, err := testnet.ServeTCP(serverNS, net.JoinHostPort(server.Status.PodIP, port), []byte("ok"))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(stop)
			}
			a := newApplier(t, node, &be)
			t.Cleanup(func() {
				_ = cleanupIn(node, a)
			})
			if _, err := applyIn(node, a, rs); err != nil {
				t.Fatal(err)
			}
			if got, err := testnet.ReadTCP(clientNS, net.JoinHostPort(server.Status.PodIP, "8080"), 2*time.Second); err != nil || string(got) != "ok" {
				t.Errorf("client to server port 8080, which the policies allow: %q, %v", got, err)
			}
			if got, err := testnet.ReadTCP(clientNS, net.JoinHostPort(server.Status.PodIP, "5201"), 500*time.Millisecond); err == nil {
				t.Errorf("client to server port 5201, which no policy opens: read %q", got)
			}
			pk, err := chainPackets(node, be.IPTablesSave)
			if err != nil {
				t.Fatal(err)
			}
			for _, parent := range []string{policy.ChainFromPod, policy.ChainToPod} {
				var through uint64
				for chain, p := range pk {
					if isBucket(parent, chain) {
						through += p
					}
				}
				if through == 0 {
					t.Errorf("no packet went through a bucket chain of %s: %v", parent, pk)
				}
			}
		})
	}
}

// connRate opens connections from netns to addr one after another for d,
// reads each to its end, and returns how many it made a second.
func connRate(netns ns.NetNS, addr string, d time.Duration) (float64, error) {
	var n int
	err := netns.Do(func(ns.NetNS) error {
		buf := make([]byte, 64)
		start := time.Now()
		for time.Since(start) < d {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				return err
			}
			for err == nil {
				_, err = c.Read(buf)
			}
			c.Close()
			if !errors.Is(err, io.EOF) {
				return fmt.Errorf("connection %d: %w", n+1, err)
			}
			n++
		}
		return nil
	})
	return float64(n) / d.Seconds(), err
}

// isBucket says whether chain is a bucket chain of dispatch chain parent.
func isBucket(parent, chain string) bool {
	return strings.HasPrefix(chain, parent+"-")
}

// flattenDispatch is rs with each dispatch chain's buckets undone: the
// signatures' rules in one list in the order of their chains' names, as
// the compiler made them before buckets, then the chain's own tail; no
// bucket chains or sets.
func flattenDispatch(rs *policy.Ruleset) *policy.Ruleset {
	out := *rs
	out.Chains = nil
	bucketSets := map[string]bool{}
	byName := map[string]policy.Chain{}
	for _, c := range rs.Chains {
		byName[c.Family+" "+c.Name] = c
	}
	for _, c := range rs.Chains {
		if isBucket(policy.ChainFromPod, c.Name) || isBucket(policy.ChainToPod, c.Name) {
			continue
		}
		if c.Name != policy.ChainFromPod && c.Name != policy.ChainToPod {
			out.Chains = append(out.Chains, c)
			continue
		}
		var sigs, tail [][]string
		for _, r := range c.Rules {
			target := ruleTarget(r)
			if !isBucket(c.Name, target) {
				tail = append(tail, r)
				continue
			}
			bucketSets[matchSet(r)] = true
			bc := byName[c.Family+" "+target]
			for _, br := range bc.Rules {
				if strings.HasPrefix(ruleTarget(br), policy.PolicyChainPrefix) {
					sigs = append(sigs, br)
				}
			}
		}
		slices.SortFunc(sigs, func(x, y []string) int { return strings.Compare(ruleTarget(x), ruleTarget(y)) })
		out.Chains = append(out.Chains, policy.Chain{Name: c.Name, Family: c.Family, Rules: append(sigs, tail...)})
	}
	out.Sets = slices.DeleteFunc(slices.Clone(rs.Sets), func(s policy.Set) bool { return bucketSets[s.Name] })
	return &out
}

// dispatchLast is the flat rs with the dispatch rules of the sets holding
// the members moved after the other signatures' rules of their chain.
func dispatchLast(rs *policy.Ruleset, members ...string) *policy.Ruleset {
	holds := map[string]bool{}
	for _, s := range rs.Sets {
		for _, m := range members {
			if slices.Contains(s.Members, m) {
				holds[s.Name] = true
			}
		}
	}
	out := *rs
	out.Chains = slices.Clone(rs.Chains)
	for i, c := range out.Chains {
		if c.Name != policy.ChainFromPod && c.Name != policy.ChainToPod {
			continue
		}
		var sigs, moved, tail [][]string
		for _, r := range c.Rules {
			switch {
			case !strings.HasPrefix(ruleTarget(r), policy.PolicyChainPrefix):
				tail = append(tail, r)
			case holds[matchSet(r)]:
				moved = append(moved, r)
			default:
				sigs = append(sigs, r)
			}
		}
		out.Chains[i].Rules = slices.Concat(sigs, moved, tail)
	}
	return &out
}

// dispatchLookups counts the set lookups the first packet of member's pod
// ("address,veth") meets in dispatch chain chain (IPv4), following it
// into a bucket, up to the rule that sends it to its signature's chain.
func dispatchLookups(rs *policy.Ruleset, chain, member string) (int, error) {
	chains := map[string][][]string{}
	for _, c := range rs.Chains {
		if c.Family == policy.FamilyIPv4 {
			chains[c.Name] = c.Rules
		}
	}
	sets := map[string][]string{}
	for _, s := range rs.Sets {
		sets[s.Name] = s.Members
	}
	n := 0
	for rules := chains[chain]; ; {
		next := false
		for _, r := range rules {
			set := matchSet(r)
			if set == "" {
				continue
			}
			n++
			if !slices.Contains(sets[set], member) {
				continue
			}
			target := ruleTarget(r)
			if !isBucket(chain, target) {
				return n, nil
			}
			rules, next = chains[target], true
			break
		}
		if !next {
			return n, fmt.Errorf("%s does not dispatch %s", chain, member)
		}
	}
}

// ruleTarget is a rule's -j or -g target.
func ruleTarget(r []string) string {
	for i := 0; i+1 < len(r); i++ {
		if r[i] == "-j" || r[i] == "-g" {
			return r[i+1]
		}
	}
	return ""
}

// matchSet is the set a rule's -m set matches, "" without one.
func matchSet(r []string) string {
	if i := slices.Index(r, "--match-set"); i >= 0 && i+1 < len(r) {
		return r[i+1]
	}
	return ""
}
