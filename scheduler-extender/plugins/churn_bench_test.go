package plugins_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	extender "github.com/tabbynet/tabby/scheduler-extender"
	"github.com/tabbynet/tabby/scheduler-extender/cache"
	"github.com/tabbynet/tabby/scheduler-extender/plugins"
	"github.com/tabbynet/tabby/scheduler-extender/plugins/network"
)

// BenchmarkExtenderChurn is the throughput benchmark's shape (test/
// schedtest): 500 nodes in 10 zones, pods of two apps, half spreading
// over zones; before each pod's filter and prioritize the previous pod is
// bound, as kube-scheduler does, so every request sees a changed cluster.
func BenchmarkExtenderChurn(b *testing.B) {
	c := cache.New()
	in := benchInputs()
	// As the throughput benchmark's fixture: a second pool, for other
	// nodes (its nodeSelector matches none of these).
	in.Pools = append(in.Pools, &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "rack1"}, Spec: tabbyv1.IPPoolSpec{CIDR: "11.0.0.0/16",
		NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "1"}}}})
	c.SetNamespace(&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default"}})
	names := make([]string, 500)
	for i := range names {
		names[i] = fmt.Sprintf("bench-%03d", i)
		c.SetNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: names[i], Labels: map[string]string{
			v1.LabelHostname: names[i], v1.LabelTopologyZone: fmt.Sprintf("z%d", i%10), "bench": "true"}}})
		in.Blocks = append(in.Blocks, network.Block{CIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 26), Node: names[i], Free: 50})
	}
	fw := plugins.Default(c.Snapshot, &network.Plugin{Inputs: func() *network.Inputs { return in }})
	mux := http.NewServeMux()
	(&extender.Handler{Scheduler: fw, Nodes: c}).Register(mux)
	post := poster(b, mux)
	mkPod := func(i int) *v1.Pod {
		app := map[string]string{"app": fmt.Sprintf("a%d", i%2)}
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: "default", UID: types.UID(fmt.Sprint(i)), Labels: app},
			Spec: v1.PodSpec{NodeSelector: map[string]string{"bench": "true"}}}
		if i%2 == 0 {
			p.Spec.TopologySpreadConstraints = []v1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: v1.LabelTopologyZone,
				WhenUnsatisfiable: v1.ScheduleAnyway, LabelSelector: &metav1.LabelSelector{MatchLabels: app}}}
		}
		return p
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i > 0 {
			prev := mkPod(i - 1)
			prev.Spec.NodeName = names[(i*7)%len(names)]
			prev.Status.Phase = v1.PodRunning
			c.SetPod(prev)
		}
		body, _ := json.Marshal(extenderv1.ExtenderArgs{Pod: mkPod(i), NodeNames: &names})
		post("/filter", body)
		post("/prioritize", body)
		i++
	}
}
