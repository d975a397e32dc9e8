package demo

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tabbynet/tabby/internal/testnet"
	"github.com/tabbynet/tabby/internal/tier"
)

// TestDemo runs the whole demo (control plane, node, three pods, pings,
// teardown) and checks what it prints: three addresses of the pool and an
// all-OK matrix. It needs root.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("the demo needs root, network namespaces and a control plane")
	}
	tier.Root(t, "the demo makes network namespaces and runs a control plane")
	plugins, err := testnet.PluginDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err = Run(ctx, Options{PluginDir: plugins, Out: &out})
	t.Logf("demo output:\n%s", out.String())
	if err != nil {
		t.Fatalf("demo: %v", err)
	}
	text := out.String()
	addrs := regexp.MustCompile(`\b10\.244\.\d+\.\d+/32\b`).FindAllString(text, -1)
	if len(addrs) != 3 || addrs[0] == addrs[1] || addrs[1] == addrs[2] || addrs[0] == addrs[2] {
		t.Errorf("want 3 distinct pod addresses of %s, got %v", PoolCIDR, addrs)
	}
	if n := len(regexp.MustCompile(`\bOK\b`).FindAllString(text, -1)); n != 12 || strings.Contains(text, "FAIL") {
		t.Errorf("want an all-OK 4x4 ping matrix (12 OK), got %d OK", n)
	}
	if !strings.Contains(text, "All 12 probes answered.") || !strings.Contains(text, "control plane stopped") {
		t.Error("the demo did not report its probes or its teardown")
	}
	if m := regexp.MustCompile(`network namespace (\S+),`).FindStringSubmatch(text); m == nil {
		t.Error("the demo did not name its node's namespace")
	} else if _, err := os.Stat(m[1]); !os.IsNotExist(err) {
		t.Errorf("the node's namespace %s is still there after the demo (%v)", m[1], err)
	}
}
