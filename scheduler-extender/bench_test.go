package extender

import (
	"fmt"
	"net/http"
	"testing"

	v1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// BenchmarkFilterFullNodes is the nodeCacheCapable: false path at 5,000
// nodes: decode, filter by node affinity, encode. Node objects here carry
// labels only; real ones (status, images) are several times larger.
func BenchmarkFilterFullNodes(b *testing.B) {
	for _, verb := range []string{"/filter", "/prioritize"} {
		b.Run(verb[1:], func(b *testing.B) {
			nodes := make([]*v1.Node, 5000)
			for i := range nodes {
				nodes[i] = node(fmt.Sprintf("node-%04d", i), map[string]string{
					"zone": fmt.Sprintf("%c", 'a'+i%3), "kubernetes.io/hostname": fmt.Sprintf("node-%04d", i),
				})
			}
			body := mustJSON(b, extenderv1.ExtenderArgs{Pod: zonePod(), Nodes: nodeList(nodes...)})
			mux, _ := newTestMux(b, 0)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if w := do(mux, "POST", verb, "application/json", body); w.Code != http.StatusOK {
					b.Fatalf("code %d", w.Code)
				}
			}
		})
	}
}
