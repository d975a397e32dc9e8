package bench

import (
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/daemon/nodestatus"
)

// BenchmarkRouteConvergenceDualStack: 10 dual-stack nodes (tabbyd alone
// in each, --node-ip v4,v6) in a full mesh, an IPv4 and an IPv6 session
// between each pair. Each pod gets an address from an IPv4 pool of /32
// blocks and one from an IPv6 pool of /128 blocks, so it claims a block
// of each family; the time from each block's claim until its route is
// installed on every other node, IPv4 and IPv6 side by side (p50, p99):
//
//	go test -run '^$' -bench RouteConvergenceDualStack -benchtime 1x -timeout 30m ./test/bench/
func BenchmarkRouteConvergenceDualStack(b *testing.B) {
	for i := range b.N {
		benchDualConvergence(b, 10, i)
	}
}

func benchDualConvergence(b *testing.B, count, run int) {
	samples := max(20, count)
	prefix := fmt.Sprintf("rd%d-%d", count, run)
	pools := []*tabbyv1.IPPool{
		{ObjectMeta: metav1.ObjectMeta{Name: prefix + "-v4"}, Spec: tabbyv1.IPPoolSpec{CIDR: fmt.Sprintf("10.%d.0.0/16", 180+run%20), BlockSize: 32}},
		{ObjectMeta: metav1.ObjectMeta{Name: prefix + "-v6"}, Spec: tabbyv1.IPPoolSpec{CIDR: fmt.Sprintf("fd00:bc:%x::/112", run), BlockSize: 128}},
	}
	r := startRun(b, prefix, count, true, map[string]any{"assignIPv4": true, "assignIPv6": true}, pools...)
	nodes, w, confs := r.nodes, r.w, r.confs
	meshStart := time.Now()
	sessions := waitAllBGP(b, nodes, 3*time.Minute, func(_ string, st *nodestatus.Status) error {
		if len(st.Peers) != 2*(count-1) {
			return fmt.Errorf("%d sessions, want %d (one per family with each other node)", len(st.Peers), 2*(count-1))
		}
		return nil
	})
	b.Logf("%d nodes: full mesh of both families established in %v", count, time.Since(meshStart).Round(time.Millisecond))

	var claim4, claim6 []time.Duration
	var first, last *convPod
	var firstV6, lastV6 *convPod
	annotations := map[string]string{tabbyv1.AnnotationIPv4Pools: fmt.Sprintf("[%q]", pools[0].Name), tabbyv1.AnnotationIPv6Pools: fmt.Sprintf("[%q]", pools[1].Name)}
	for i := range samples {
		p, _, ips := addPod(b, nodes[i%len(nodes)], confs, "ds", i, annotations)
		if len(ips) != 2 || !ips[0].Is4() || !ips[1].Is6() {
			b.Fatalf("pod %s: want an IPv4 and an IPv6 address, got %v", p.Name, ips)
		}
		// Both blocks were claimed by the same ADD; each is timed from its
		// own claim.
		c4, r4 := w.converged(b, ips[0], nodes, time.Minute)
		c6, r6 := w.converged(b, ips[1], nodes, time.Minute)
		claim4, claim6 = append(claim4, r4.Sub(c4)), append(claim6, r6.Sub(c6))
		p4, p6 := *p, *p
		p4.ip, p6.ip = ips[0], ips[1]
		if first == nil {
			first, firstV6 = &p4, &p6
		}
		last, lastV6 = &p4, &p6
	}
	slices.Sort(claim4)
	slices.Sort(claim6)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	sm, slo, shi := stats(sessionCounts(sessions))
	rss, _ := tabbydRSS(b, nodes)
	rm, rlo, rhi := stats(rss)
	b.Logf("%d dual-stack nodes, mesh, %d pods: block claim -> routed on every other node: IPv4 p50 %.1f ms, p99 %.1f ms (max %.1f); IPv6 p50 %.1f ms, p99 %.1f ms (max %.1f); "+
		"BGP sessions/node mean %.1f (%g..%g); tabbyd RSS/node mean %.1f MiB (%.1f..%.1f)",
		count, samples, ms(percentile(claim4, 50)), ms(percentile(claim4, 99)), ms(claim4[len(claim4)-1]),
		ms(percentile(claim6, 50)), ms(percentile(claim6, 99)), ms(claim6[len(claim6)-1]), sm, slo, shi, rm, rlo, rhi)
	b.ReportMetric(ms(percentile(claim4, 50)), "v4-claim-p50-ms")
	b.ReportMetric(ms(percentile(claim4, 99)), "v4-claim-p99-ms")
	b.ReportMetric(ms(percentile(claim6, 50)), "v6-claim-p50-ms")
	b.ReportMetric(ms(percentile(claim6, 99)), "v6-claim-p99-ms")
	b.ReportMetric(sm, "sessions/node")
	pingAcross(b, []*convPod{first, last})
	pingAcross(b, []*convPod{firstV6, lastV6})
}
