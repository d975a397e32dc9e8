package labtest

// Pod start-up on real nodes, and what a node costs (issue 9):
//
//	go test -run '^$' -bench PodStartup -benchtime 1x -timeout 30m ./test/labtest/

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// BenchmarkPodStartup brings up a lab of 3 nodes, creates 30 pods at once
// (agnhost pause, spread by the scheduler through the extender) and
// measures each pod's creation to Running with its address, as the API
// server's watch reports it: scheduling, the kubelet, containerd, runc and
// tabby's CNI ADD (which waits until the pod's NetworkPolicy is in the
// kernel). It reports p50 and p99, how long lab up took, and the memory
// (RSS) of each node's kubelet, containerd and tabbyd.
func BenchmarkPodStartup(b *testing.B) {
	for range b.N {
		benchPodStartup(b, 3, 30)
	}
}

func benchPodStartup(b *testing.B, nodes, pods int) {
	l := Up(b, "--nodes", strconv.Itoa(nodes))
	ctx := context.Background()
	w, err := l.CS.CoreV1().Pods(metav1.NamespaceDefault).Watch(ctx, metav1.ListOptions{LabelSelector: "bench=startup"})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	created := map[string]time.Time{}
	var mu sync.Mutex
	start := time.Now()
	for i := range pods {
		p := Sleeper(fmt.Sprintf("start-%02d", i), "")
		p.Labels = map[string]string{"bench": "startup"}
		mu.Lock()
		created[p.Name] = time.Now()
		mu.Unlock()
		l.Create(b, p)
	}
	running := map[string]time.Duration{}
	perNode := map[string]int{}
	deadline := time.After(5 * time.Minute)
	for len(running) < pods {
		select {
		case ev := <-w.ResultChan():
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			if _, done := running[p.Name]; done || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
				continue
			}
			mu.Lock()
			running[p.Name] = time.Since(created[p.Name])
			mu.Unlock()
			perNode[p.Spec.NodeName]++
		case <-deadline:
			b.Fatalf("%d of %d pods Running after 5 minutes", len(running), pods)
		}
	}
	all := time.Since(start)
	var ds []time.Duration
	for _, d := range running {
		ds = append(ds, d)
	}
	slices.Sort(ds)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	p50, p99 := startupPercentile(ds, 50), startupPercentile(ds, 99)
	rss := nodeRSS(b, l)
	b.Logf("lab up (%d nodes) in %v; %d pods created at once, all Running in %v (per node %v): create -> Running p50 %.0f ms, p99 %.0f ms, max %.0f ms",
		nodes, l.UpTime.Round(100*time.Millisecond), pods, all.Round(10*time.Millisecond), perNode, ms(p50), ms(p99), ms(ds[len(ds)-1]))
	for _, c := range []string{"kubelet", "containerd", "tabbyd"} {
		b.Logf("RSS per node, %s: %s", c, fmtMiB(rss[c]))
		mean := 0.0
		for _, v := range rss[c] {
			mean += v
		}
		b.ReportMetric(mean/float64(len(rss[c])), c+"-rss-MiB/node")
	}
	b.ReportMetric(l.UpTime.Seconds(), "lab-up-s")
	b.ReportMetric(ms(p50), "start-p50-ms")
	b.ReportMetric(ms(p99), "start-p99-ms")
}

func startupPercentile(sorted []time.Duration, p float64) time.Duration {
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i]
}

// nodeRSS reads the resident memory of each node's kubelet, containerd
// (the daemon, without its shims) and tabbyd, in MiB.
func nodeRSS(b *testing.B, l *Lab) map[string][]float64 {
	b.Helper()
	l.Reload(b)
	out := map[string][]float64{}
	for _, n := range l.State.Nodes {
		for c, pid := range map[string]int{"kubelet": n.Kubelet.Pid, "containerd": n.Containerd.Pid, "tabbyd": l.TabbydProc(b, n.Name).Pid} {
			data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
			if err != nil {
				b.Fatal(err)
			}
			for _, line := range strings.Split(string(data), "\n") {
				if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
					kb, _ := strconv.Atoi(f[1])
					out[c] = append(out[c], float64(kb)/1024)
				}
			}
		}
	}
	return out
}

func fmtMiB(xs []float64) string {
	var parts []string
	for _, x := range xs {
		parts = append(parts, fmt.Sprintf("%.0f MiB", x))
	}
	return strings.Join(parts, ", ")
}
