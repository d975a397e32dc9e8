package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/tabbynet/tabby/contract"
	"github.com/tabbynet/tabby/contract/agentapi"
)

// fakeAgent serves agentapi on a unix socket: assign answers with
// assignErr when set, else one address.
type fakeAgent struct {
	socket    string
	mu        sync.Mutex
	assignErr *agentapi.Error
	calls     []string
}

func (a *fakeAgent) setAssignErr(e *agentapi.Error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.assignErr = e
}

func (a *fakeAgent) lastCall() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls[len(a.calls)-1]
}

func startFakeAgent(t *testing.T) *fakeAgent {
	t.Helper()
	a := &fakeAgent{socket: filepath.Join(t.TempDir(), "cni.sock")}
	ln, err := net.Listen("unix", a.socket)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/{endpoint}", func(w http.ResponseWriter, r *http.Request) {
		ep := r.PathValue("endpoint")
		a.mu.Lock()
		defer a.mu.Unlock()
		a.calls = append(a.calls, ep)
		switch {
		case ep == agentapi.EndpointAssign && a.assignErr != nil:
			w.WriteHeader(http.StatusConflict)
			_ = json.NewEncoder(w).Encode(a.assignErr)
		case ep == agentapi.EndpointAssign:
			_ = json.NewEncoder(w).Encode(agentapi.AssignResponse{Addresses: []agentapi.Address{{IP: net.IPv4(10, 9, 0, 1), Pool: "p", Block: "10.9.0.0/26"}}})
		default:
			_, _ = w.Write([]byte("{}"))
		}
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return a
}

func TestResolveAllocator(t *testing.T) {
	ctx := context.Background()
	direct := &fakeAllocator{handles: map[string][]net.IP{}}
	withDirect := Deps{Direct: func(context.Context, *Config, *slog.Logger) (Allocator, error) { return direct, nil }}
	agent := startFakeAgent(t)

	for _, tc := range []struct {
		name   string
		deps   Deps
		socket string
		want   string // "agent", "direct" or "reexec"
	}{
		{"agent listening", withDirect, agent.socket, "agent"},
		{"nothing listening", withDirect, filepath.Join(t.TempDir(), "none.sock"), "direct"},
		{"agent off", withDirect, "", "direct"},
		{"handed over already", Deps{Direct: withDirect.Direct, NoAgent: true}, agent.socket, "direct"},
		{"no agent, no datastore client", Deps{}, filepath.Join(t.TempDir(), "none.sock"), "reexec"},
		{"agent, no datastore client", Deps{}, agent.socket, "agent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t)
			c.AgentSocket = tc.socket
			got, err := tc.deps.resolve(ctx, c, discard)
			switch tc.want {
			case "agent":
				if _, ok := got.(*agentapi.Client); !ok || err != nil {
					t.Errorf("got %T, %v; want the agent", got, err)
				}
			case "direct":
				if got != Allocator(direct) || err != nil {
					t.Errorf("got %T, %v; want the direct allocator", got, err)
				}
			case "reexec":
				if !errors.Is(err, errDirectNeeded) {
					t.Errorf("got %T, %v; want errDirectNeeded", got, err)
				}
			}
		})
	}
}

// TestAgentAnswers: the agent's addresses reach the result, and its IPAM
// errors come back as they are (no fallback, no retry code), while an
// unreachable API server is "try again later".
func TestAgentAnswers(t *testing.T) {
	ctx := context.Background()
	agent := startFakeAgent(t)
	c := testConfig(t)
	c.AgentSocket = agent.socket
	alloc, err := Deps{}.resolve(ctx, c, discard)
	if err != nil {
		t.Fatal(err)
	}
	ips, err := ipamAdd(ctx, c, "cid", contract.PodID{Namespace: "ns", Name: "p"}, alloc, discard)
	if err != nil || len(ips) != 1 || ips[0].Address.String() != "10.9.0.1/32" {
		t.Fatalf("ADD through the agent: %v, %v", ips, err)
	}

	agent.setAssignErr(&agentapi.Error{Message: `no address available: no IPv4 address for pod ns/p on node n1: tried pool p (10.9.0.0/26): ...`, Exhausted: true})
	_, err = ipamAdd(ctx, c, "cid2", contract.PodID{Namespace: "ns", Name: "p"}, alloc, discard)
	var te *types.Error
	if err == nil || errors.As(err, &te) || !strings.Contains(err.Error(), "tabby: assigning addresses to pod ns/p (container cid2) on node n1: no address available") {
		t.Errorf("exhausted through the agent: %v", err)
	}
	if last := agent.lastCall(); last != agentapi.EndpointRelease {
		t.Errorf("a failed assignment is not released after: last call %s", last)
	}

	agent.setAssignErr(&agentapi.Error{Message: "the Kubernetes API server at https://x cannot be reached", Unreachable: true})
	_, err = ipamAdd(ctx, c, "cid3", contract.PodID{}, alloc, discard)
	if !errors.As(err, &te) || te.Code != types.ErrTryAgainLater {
		t.Errorf("unreachable through the agent: %v, want code %d", err, types.ErrTryAgainLater)
	}
}
