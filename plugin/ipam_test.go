package plugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/tabbynet/tabby/contract"
	"github.com/tabbynet/tabby/contract/agentapi"
)

// fakeAllocator is an in-memory Allocator.
type fakeAllocator struct {
	mu        sync.Mutex
	handles   map[string][]net.IP
	pools     []agentapi.Pool
	pingErr   error
	assignErr error
	requests  []agentapi.AssignRequest
	released  []string
	next      byte
}

func (f *fakeAllocator) Assign(_ context.Context, req agentapi.AssignRequest) ([]agentapi.Address, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, req)
	if f.assignErr != nil {
		// A failure that left something behind, as a timeout might.
		f.handles[req.HandleID] = append(f.handles[req.HandleID], net.IPv4(10, 0, 0, 99))
		return nil, f.assignErr
	}
	f.next++
	ip := net.IPv4(10, 0, 0, f.next).To4()
	f.handles[req.HandleID] = append(f.handles[req.HandleID], ip)
	return []agentapi.Address{{IP: ip, Pool: "p", Block: "10.0.0.0/26"}}, nil
}

func (f *fakeAllocator) ReleaseHandle(_ context.Context, h, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.handles, h)
	f.released = append(f.released, h)
	return nil
}

func (f *fakeAllocator) HandleIPs(_ context.Context, h, _ string) ([]net.IP, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.handles[h], nil
}

func (f *fakeAllocator) NodeHandles(context.Context, string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for h := range f.handles {
		out = append(out, h)
	}
	sort.Strings(out)
	return out, nil
}

func (f *fakeAllocator) UsablePools(context.Context, string) ([]agentapi.Pool, error) {
	return f.pools, nil
}

func (f *fakeAllocator) Ping(context.Context) error { return f.pingErr }

func testConfig(t *testing.T) *Config {
	c, err := LoadConfig([]byte(`{"cniVersion":"1.1.0","name":"net","nodename":"n1","ipam":{"type":"tabby-ipam"}}`))
	if err != nil {
		t.Fatal(err)
	}
	c.LockFile = filepath.Join(t.TempDir(), "ipam.lock")
	return c
}

var discard = slog.New(slog.DiscardHandler)

func TestIPAMAddRequest(t *testing.T) {
	c := testConfig(t)
	c.IPv4Pools = []string{"configured"}
	f := &fakeAllocator{handles: map[string][]net.IP{}}
	ips, err := ipamAdd(context.Background(), c, "cid", contract.PodID{Namespace: "ns", Name: "p", UID: "u1"}, f, discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(ips) != 1 || ips[0].Address.String() != "10.0.0.1/32" || !ips[0].Gateway.Equal(GatewayV4) {
		t.Errorf("ips %v", ips)
	}
	// The allocator gets the pod's identity (it reads the annotations) and
	// the config's choices.
	r := f.requests[0]
	if r.HandleID != "net.cid" || r.Node != "n1" || r.Namespace != "ns" || r.Pod != "p" || r.PodUID != "u1" {
		t.Errorf("request %+v", r)
	}
	if !r.IPv4 || r.IPv6 || len(r.IPv4Pools) != 1 || r.IPv4Pools[0] != "configured" {
		t.Errorf("config choices not passed: %+v", r)
	}
	// Without a pod identity: no pod in the request.
	if _, err := ipamAdd(context.Background(), c, "cid2", contract.PodID{}, f, discard); err != nil {
		t.Fatal(err)
	}
	if r := f.requests[1]; r.Namespace != "" || r.Pod != "" {
		t.Errorf("request without pod %+v", r)
	}
}

func TestDatastoreErrorCodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		code uint
	}{
		{"agent: API server unreachable", &agentapi.Error{Message: "x cannot be reached", Unreachable: true}, types.ErrTryAgainLater},
		{"agent: exhausted passes through", &agentapi.Error{Message: "no address available", Exhausted: true}, 0},
		{"agent went away", fmt.Errorf("wrapped: %w", agentapi.ErrConnectionLost), types.ErrTryAgainLater},
		{"other", errors.New("bad annotation"), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := datastoreError(tc.err)
			var e *types.Error
			if errors.As(err, &e) != (tc.code != 0) || (e != nil && e.Code != tc.code) {
				t.Errorf("got %v (%T), want code %d", err, err, tc.code)
			}
			if err.Error() == "" || !strings.Contains(err.Error(), tc.err.Error()) {
				t.Errorf("message lost: %v", err)
			}
		})
	}
}

func TestIPAMAddFailureReleases(t *testing.T) {
	c := testConfig(t)
	f := &fakeAllocator{handles: map[string][]net.IP{}, assignErr: errors.New("pool exhausted")}
	_, err := ipamAdd(context.Background(), c, "cid", contract.PodID{}, f, discard)
	if err == nil || !strings.Contains(err.Error(), "pool exhausted") || !strings.Contains(err.Error(), "container cid") {
		t.Errorf("error %v", err)
	}
	if len(f.handles) != 0 {
		t.Errorf("left behind: %v", f.handles)
	}
}

func TestIPAMGC(t *testing.T) {
	c := testConfig(t)
	c.ValidAttachments = []types.GCAttachment{{ContainerID: "keep", IfName: "eth0"}}
	f := &fakeAllocator{handles: map[string][]net.IP{
		"net.keep":     {net.IPv4(10, 0, 0, 1)},
		"net.gone":     {net.IPv4(10, 0, 0, 2)},
		"other.gone":   {net.IPv4(10, 0, 0, 3)},
		"vxlan-tunnel": {net.IPv4(10, 0, 0, 4)},
		// tabbyd's spare (ipam.SpareHandle): no network's name begins
		// with '_'.
		"_spare.n1.0a1b": {net.IPv4(10, 0, 0, 5)},
	}}
	if err := ipamGC(context.Background(), c, f, discard); err != nil {
		t.Fatal(err)
	}
	if strings.Join(f.released, ",") != "net.gone" {
		t.Errorf("released %v, want only net.gone", f.released)
	}
}

func TestIPAMCheck(t *testing.T) {
	c := testConfig(t)
	f := &fakeAllocator{handles: map[string][]net.IP{"net.cid": {net.IPv4(10, 0, 0, 1)}}}
	ctx := context.Background()
	if err := ipamCheck(ctx, c, "net.cid", []net.IP{net.IPv4(10, 0, 0, 1)}, f); err != nil {
		t.Error(err)
	}
	err := ipamCheck(ctx, c, "net.cid", []net.IP{net.IPv4(10, 0, 0, 2)}, f)
	if err == nil || !strings.Contains(err.Error(), "IPAM no longer holds 10.0.0.2 for net.cid") {
		t.Errorf("error %v", err)
	}
	if err := ipamCheck(ctx, c, "net.none", nil, f); err == nil {
		t.Error("an empty handle passed CHECK")
	}
}

func TestIPAMStatus(t *testing.T) {
	ctx := context.Background()
	v4 := agentapi.Pool{Name: "v4", CIDR: "10.0.0.0/16"}
	for _, tc := range []struct {
		name string
		f    *fakeAllocator
		v6   bool
		want string
	}{
		{"ok", &fakeAllocator{pools: []agentapi.Pool{v4}}, false, ""},
		{"unreachable", &fakeAllocator{pingErr: errors.New("the Kubernetes API server at x cannot be reached")}, false, "cannot be reached"},
		{"no pool", &fakeAllocator{}, false, "no usable IP pool for node n1"},
		{"no v6 pool", &fakeAllocator{pools: []agentapi.Pool{v4}}, true, "no usable IPv6 pool"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t)
			c.IPv6 = tc.v6
			err := ipamStatus(ctx, c, tc.f)
			if tc.want == "" {
				if err != nil {
					t.Error(err)
				}
				return
			}
			var e *types.Error
			if !errors.As(err, &e) || e.Code != ErrPluginNotAvailable || !strings.Contains(e.Msg, tc.want) {
				t.Errorf("got %v, want code %d saying %q", err, ErrPluginNotAvailable, tc.want)
			}
		})
	}
}

func TestNodeLockSerialises(t *testing.T) {
	path := filepath.Join(t.TempDir(), "l")
	ctx := context.Background()
	l1, err := LockNode(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := LockNode(short, path); err == nil {
		t.Fatal("took a held lock")
	}
	l1.Unlock()
	l2, err := LockNode(ctx, path)
	if err != nil {
		t.Fatalf("lock after unlock (and after an abandoned waiter): %v", err)
	}
	l2.Unlock()
}
