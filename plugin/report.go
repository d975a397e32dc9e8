package plugin

import (
	"context"
	"time"

	"github.com/tabbynet/tabby/contract/agentapi"
)

// reportTimeout bounds telling tabbyd how long a command took: a local
// unix socket answers in well under a millisecond, and a tabbyd that does
// not answer in time goes without the figure rather than the pod waiting.
const reportTimeout = 100 * time.Millisecond

// reports says whether a command run with config c tells tabbyd's agent
// (the config's agentSocket) how long it took and whether it failed, for
// the histogram tabby_cni_command_duration_seconds: the plugin exits after
// every command, so only tabbyd can keep one. A command that runs without
// the agent (Deps.NoAgent: handed over because tabbyd did not answer, or
// an allocator a test gave) is not reported.
func (d Deps) reports(c *Config) bool {
	return !d.NoAgent && d.NewAllocator == nil && c.AgentSocket != ""
}

// reportCommand sends the report of a command that started at start and
// ended with err, through cl (the command's client of the agent, whose
// connection is open) or else a new connection to socket. It is best
// effort: the command's result and its error never depend on it.
func reportCommand(cl *agentapi.Client, socket, command string, start time.Time, err error) {
	r := agentapi.CommandReport{Command: command, Result: agentapi.ResultOK, Seconds: time.Since(start).Seconds()}
	if err != nil {
		r.Result = agentapi.ResultError
	}
	if cl == nil {
		report(socket, r)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), reportTimeout)
	defer cancel()
	_ = cl.Report(ctx, r)
}

// report sends r to the agent at socket, ignoring every error.
func report(socket string, r agentapi.CommandReport) {
	ctx, cancel := context.WithTimeout(context.Background(), reportTimeout)
	defer cancel()
	cl, err := agentapi.Dial(ctx, socket)
	if err != nil {
		return
	}
	defer cl.Close()
	_ = cl.Report(ctx, r)
}
