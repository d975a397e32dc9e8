package daemon

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tabbynet/tabby/daemon/routing"
	"github.com/tabbynet/tabby/internal/netnstest"
)

// TestNATWorker: the NAT worker programs what the routing pass hands it in
// a node's namespace, tells the routing loop when its result changes (the
// first success, a failure, the recovery) and only then, and says so in
// state(), which is what readiness reads.
func TestNATWorker(t *testing.T) {
	n := netnstest.New(t, "natworker")
	changes := 0
	w := newNATWorker(slog.New(slog.NewTextHandler(io.Discard, nil)), newRoutingMetrics(prometheus.NewRegistry()), time.Hour, func() { changes++ })
	pass := func() error {
		var err error
		n.Must(func() error { err = w.pass(context.Background()); return nil })
		return err
	}
	check := func(step string, wantProgrammed bool, wantErr string, wantChanges int) {
		t.Helper()
		programmed, err := w.state()
		if programmed != wantProgrammed || (err == nil) != (wantErr == "") || (err != nil && !strings.Contains(err.Error(), wantErr)) {
			t.Errorf("%s: state() = %v, %v; want %v, %q", step, programmed, err, wantProgrammed, wantErr)
		}
		if changes != wantChanges {
			t.Errorf("%s: the routing loop was told %d times, want %d", step, changes, wantChanges)
		}
	}

	// Nothing handed over yet: nothing done, nothing told.
	if err := pass(); err != nil {
		t.Fatal(err)
	}
	check("before set", false, "", 0)

	// A set of the IPv6 name but another type is in the way: the IPv4
	// half goes in, the worker fails, says what to do, and tells.
	n.Exec("ipset", "create", routing.SetNATPools+routing.SetSuffixV6, "hash:ip", "family", "inet6")
	pools := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")}
	if !w.set(routing.NAT{AllPools: pools, NATPools: pools}) {
		t.Error("handing over a new NAT asked for no pass")
	}
	if err := pass(); err == nil {
		t.Fatal("the pass went through a set of the wrong type")
	}
	check("wrong set", false, "destroy it", 1)
	if out := n.Exec("iptables", "-t", "nat", "-S", routing.NATChain); !strings.Contains(out, "MASQUERADE") {
		t.Errorf("the IPv4 NAT chain is not programmed:\n%s", out)
	}
	// The same failure again: nothing new to tell.
	_ = pass()
	check("the same failure", false, "destroy it", 1)

	// Cleared: the next pass programs both families and tells once.
	n.Exec("ipset", "destroy", routing.SetNATPools+routing.SetSuffixV6)
	if err := pass(); err != nil {
		t.Fatal(err)
	}
	check("recovered", true, "", 2)
	if out := n.Exec("ip6tables", "-t", "nat", "-S", routing.NATChain); !strings.Contains(out, "MASQUERADE") {
		t.Errorf("the IPv6 NAT chain is not programmed:\n%s", out)
	}

	// A heal finds everything in place: nothing to tell. Then the same
	// NAT handed over again asks for no pass.
	if err := pass(); err != nil {
		t.Fatal(err)
	}
	check("heal", true, "", 2)
	if w.set(routing.NAT{AllPools: pools, NATPools: pools}) {
		t.Error("handing over the same NAT asked for a pass")
	}
	// No NAT pool left: the rules go.
	w.set(routing.NAT{AllPools: pools})
	if err := pass(); err != nil {
		t.Fatal(err)
	}
	check("removed", true, "", 2)
	if out := n.Exec("iptables-save", "-t", "nat"); strings.Contains(out, routing.NATChain) {
		t.Errorf("NAT outgoing is still programmed with no natOutgoing pool:\n%s", out)
	}
}
