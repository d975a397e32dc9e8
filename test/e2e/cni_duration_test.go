package e2e

import (
	"fmt"
	"testing"
	"time"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/internal/testnet"
)

// commandDurations reads tabbyd's CNI command histogram: count and sum by
// "COMMAND/result".
func commandDurations(t *testing.T, d *testnet.Tabbyd) (count, sum map[string]float64) {
	t.Helper()
	m, err := d.Metrics(ctxT(t), "tabby_cni_command_duration_seconds")
	if err != nil {
		t.Fatal(err)
	}
	count, sum = map[string]float64{}, map[string]float64{}
	for _, cmd := range []string{"ADD", "DEL"} {
		for _, res := range []string{"ok", "error"} {
			labels := fmt.Sprintf(`{command=%q,result=%q}`, cmd, res)
			count[cmd+"/"+res] = m["tabby_cni_command_duration_seconds_count"+labels]
			sum[cmd+"/"+res] = m["tabby_cni_command_duration_seconds_sum"+labels]
		}
	}
	return count, sum
}

// TestCNICommandDuration: the real tabby plugin, run by libcni, reports
// each ADD and DEL to the node's real tabbyd, which counts it in
// tabby_cni_command_duration_seconds by command and result; the time it
// reports lies within what the runtime waited for the plugin. A failed ADD
// counts as an error; without tabbyd the commands work as before.
func TestCNICommandDuration(t *testing.T) {
	n := newNode(t)
	n.addPool(t, 4, nil)
	d := n.startTabbyd(t)
	list := conflist(t, "1.1.0", n.TabbyConf(nil))

	timed := func(f func() error) (time.Duration, error) {
		start := time.Now()
		err := f()
		return time.Since(start), err
	}
	c0, s0 := commandDurations(t, d)
	pod := newPod(t, n, "timed", nil)
	addWall, err := timed(func() error { _, err := n.Add(ctxT(t), list, pod, nil); return err })
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	delWall, err := timed(func() error { return n.Del(ctxT(t), list, pod, nil) })
	if err != nil {
		t.Fatalf("DEL: %v", err)
	}
	bad := newPod(t, n, "timed-bad", map[string]string{tabbyv1.AnnotationIPv4Pools: `["no-such-pool"]`})
	if _, err := n.Add(ctxT(t), list, bad, nil); err == nil {
		t.Fatal("ADD into a pool that does not exist succeeded")
	}
	c1, s1 := commandDurations(t, d)
	for k, want := range map[string]float64{"ADD/ok": 1, "DEL/ok": 1, "ADD/error": 1, "DEL/error": 0} {
		if got := c1[k] - c0[k]; got != want {
			t.Errorf("tabby_cni_command_duration_seconds_count{%s} grew by %v, want %v", k, got, want)
		}
	}
	for k, wall := range map[string]time.Duration{"ADD/ok": addWall, "DEL/ok": delWall} {
		got := time.Duration((s1[k] - s0[k]) * float64(time.Second))
		if got <= 0 || got > wall {
			t.Errorf("%s: the plugin reported %v, the runtime waited %v for it", k, got, wall)
		}
		t.Logf("%s: the plugin reported %v, the runtime waited %v", k, got, wall)
	}

	// Without tabbyd: no report, and the commands do not fail for it.
	if err := d.Kill(); err != nil {
		t.Fatal(err)
	}
	alone := newPod(t, n, "timed-alone", nil)
	n.mustAdd(t, list, alone)
	if err := n.Del(ctxT(t), list, alone, nil); err != nil {
		t.Fatalf("DEL without tabbyd: %v", err)
	}
}
