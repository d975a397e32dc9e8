package plugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/tabbynet/tabby/contract/agentapi"
	"github.com/tabbynet/tabby/internal/netnstest"
)

// stuckAllocator answers nothing until the command's context ends: then
// Assign says the API server is out of reach, as tabbyd's agent does, and
// every other call fails with the context's error, as the agent's client
// does when the answer never came.
type stuckAllocator struct{ fakeAllocator }

func (s *stuckAllocator) Assign(ctx context.Context, _ agentapi.AssignRequest) ([]agentapi.Address, error) {
	<-ctx.Done()
	return nil, &agentapi.Error{Unreachable: true, Message: "the Kubernetes API server at https://10.96.0.1:443 cannot be reached: connection refused"}
}

func (s *stuckAllocator) UsablePools(ctx context.Context, _ string) ([]agentapi.Pool, error) {
	<-ctx.Done()
	return nil, fmt.Errorf("asking tabbyd's CNI agent at /var/run/tabby/cni.sock (usable-pools): %w", ctx.Err())
}

// An ADD whose IPAM and MTU detection both fail as its time runs out
// reports IPAM's error, which names the cause (the API server out of
// reach), rather than the MTU detection's, which only names the deadline.
func TestAddOutOfTimeReportsIPAMsCause(t *testing.T) {
	node := netnstest.New(t, "node")
	pod := netnstest.New(t, "pod")
	// MTU detection reads the default route's device.
	node.IP("link add d0 type veth peer name d1")
	node.IP("addr add 10.9.0.1/24 dev d0")
	node.IP("link set d0 up")
	node.IP("link set d1 up")
	node.IP("route add default via 10.9.0.2")
	c := testConfig(t)
	d := Deps{Logger: discard, NewAllocator: func(context.Context, *Config, *slog.Logger) (Allocator, error) {
		return &stuckAllocator{}, nil
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	args := &skel.CmdArgs{ContainerID: "cid", Netns: pod.Path(), IfName: "eth0",
		Args: "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID=u1"}
	var err error
	node.Must(func() error {
		_, err = CmdAdd(ctx, args, c, d, discard)
		return nil
	})
	var te *types.Error
	if !errors.As(err, &te) || te.Code != types.ErrTryAgainLater || !strings.Contains(te.Msg, "API server") {
		t.Fatalf("ADD's error: %v; want IPAM's, naming the API server out of reach (CNI code %d)", err, types.ErrTryAgainLater)
	}
}

// A command cut short by its timeout says so, and where to change it,
// keeping the CNI code of the step's error.
func TestOutOfTime(t *testing.T) {
	c := testConfig(t)
	c.Timeout = 30 * time.Second
	step := fmt.Errorf("asking tabbyd's CNI agent at /var/run/tabby/cni.sock (usable-pools): %w", context.DeadlineExceeded)
	err := outOfTime(step, "tabby", c)
	want := `tabby: the command did not finish within its timeout of 30s ("timeout" in the CNI config of network "net"): asking`
	if !strings.HasPrefix(err.Error(), want) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %q, want it to start %q and wrap the deadline", err, want)
	}
	coded := outOfTime(types.NewError(types.ErrTryAgainLater, "tabby: the API server cannot be reached", "retry"), "tabby", c)
	var te *types.Error
	if !errors.As(coded, &te) || te.Code != types.ErrTryAgainLater || !strings.HasPrefix(te.Msg, "tabby: the command did not finish") || te.Details != "retry" {
		t.Errorf("a CNI error: got %#v", coded)
	}
}
