package bgp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tabbynet/tabby/internal/netnstest"
	"github.com/tabbynet/tabby/internal/testnet"
)

// GoBGP's sockets belong to the namespace of the thread that opens them, so
// each lab speaker runs in a process of its own: this test binary again,
// started by nsenter inside the node's namespace, running
// TestHelperSpeakerProcess. It reads one JSON request a line on stdin and
// answers each with one JSON line on file descriptor 3; its logs go to
// stderr, which the test keeps and prints when it fails.

const helperEnv = "TABBY_BGP_HELPER"

type helperRequest struct {
	Op      string        // start, filters, peers, adverts, learned, states, mute (see startMutePeer)
	Config  Config        `json:",omitempty"`
	Filters *FilterInputs `json:",omitempty"`
	Peers   []Peer        `json:",omitempty"`
	Adverts []Route       `json:",omitempty"`
}

type helperResponse struct {
	Err     string
	Learned []LearnedRoute
	States  []PeerState
}

// TestHelperSpeakerProcess is the speaker process of the lab tests; it does
// nothing in a normal test run.
func TestHelperSpeakerProcess(t *testing.T) {
	if os.Getenv(helperEnv) != "1" {
		t.Skip("the speaker process of the lab tests")
	}
	out := json.NewEncoder(os.NewFile(3, "responses"))
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx := context.Background()
	var s *Speaker
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(nil, 1<<24)
	for in.Scan() {
		var req helperRequest
		var resp helperResponse
		err := json.Unmarshal(in.Bytes(), &req)
		switch {
		case err != nil:
		case req.Op == "mute":
			err = startMutePeer(req.Config.AS, req.Config.RouterID)
		case req.Op == "start":
			req.Config.Log = log
			s, err = Start(ctx, req.Config)
		case s == nil:
			err = fmt.Errorf("%s before start", req.Op)
		case req.Op == "filters":
			f, problems := NewFilters(*req.Filters)
			if err = errors.Join(problems...); err == nil {
				err = s.SetFilters(ctx, f)
			}
		case req.Op == "peers":
			err = s.SetPeers(ctx, req.Peers)
		case req.Op == "adverts":
			err = s.SetAdvertisements(ctx, req.Adverts)
		case req.Op == "learned":
			resp.Learned, err = s.Learned(ctx)
		case req.Op == "states":
			resp.States, err = s.PeerStates(ctx)
		default:
			err = fmt.Errorf("unknown op %q", req.Op)
		}
		if err != nil {
			resp.Err = err.Error()
		}
		if err := out.Encode(resp); err != nil {
			os.Exit(2)
		}
	}
	// stdin closed: exit the way a killed daemon does, without telling peers.
	os.Exit(0)
}

// proc is a speaker process in a lab namespace.
type proc struct {
	t    *testing.T
	name string
	ns   *netnstest.NS

	mu   sync.Mutex
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	logs *testnet.SyncBuffer
}

// startProc starts a speaker process (not yet a speaker: see start) in
// node's namespace; it is killed when the test ends.
func startProc(t *testing.T, name string, node *labNode) *proc {
	t.Helper()
	p := &proc{t: t, name: name, ns: node.ns, logs: &testnet.SyncBuffer{}}
	p.spawn()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("logs of speaker %s:\n%s", name, p.logs.String())
		}
	})
	return p
}

// spawn starts the process (again, after kill).
func (p *proc) spawn() {
	p.t.Helper()
	self, err := os.Executable()
	if err != nil {
		p.t.Fatal(err)
	}
	respR, respW, err := os.Pipe()
	if err != nil {
		p.t.Fatal(err)
	}
	cmd := p.ns.Command(self, "-test.run=^TestHelperSpeakerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	cmd.ExtraFiles = []*os.File{respW}
	cmd.Stderr = p.logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		p.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("starting the speaker process of %s: %v", p.name, err)
	}
	respW.Close()
	out := bufio.NewScanner(respR)
	out.Buffer(nil, 1<<24)
	p.mu.Lock()
	p.cmd, p.in, p.out = cmd, in, out
	p.mu.Unlock()
}

// kill ends the process with SIGKILL: its sessions drop without a
// NOTIFICATION, as when a daemon crashes.
func (p *proc) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
	p.cmd = nil
	fmt.Fprintf(p.logs, "--- killed at %s ---\n", time.Now().Format(time.StampMilli))
}

// call sends one request and waits for its answer.
func (p *proc) call(req helperRequest) (helperResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return helperResponse{}, fmt.Errorf("speaker %s is not running", p.name)
	}
	line, err := json.Marshal(req)
	if err != nil {
		return helperResponse{}, err
	}
	if _, err := p.in.Write(append(line, '\n')); err != nil {
		return helperResponse{}, fmt.Errorf("speaker %s: %w", p.name, err)
	}
	if !p.out.Scan() {
		return helperResponse{}, fmt.Errorf("speaker %s exited: %v", p.name, p.out.Err())
	}
	var resp helperResponse
	if err := json.Unmarshal(p.out.Bytes(), &resp); err != nil {
		return resp, err
	}
	if resp.Err != "" {
		return resp, fmt.Errorf("speaker %s: %s", p.name, resp.Err)
	}
	return resp, nil
}

// must is call for requests that must succeed.
func (p *proc) must(req helperRequest) helperResponse {
	p.t.Helper()
	resp, err := p.call(req)
	if err != nil {
		p.t.Fatal(err)
	}
	return resp
}

func (p *proc) learned() []LearnedRoute { return p.must(helperRequest{Op: "learned"}).Learned }
func (p *proc) states() []PeerState     { return p.must(helperRequest{Op: "states"}).States }
