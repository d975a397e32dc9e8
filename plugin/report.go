package plugin

import (
	"context"
	"time"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/tabbynet/tabby/contract/agentapi"
)

// reportTimeout bounds telling tabbyd how long a command took: a local
// unix socket answers in well under a millisecond, and a tabbyd that does
// not answer in time goes without the figure rather than the pod waiting.
const reportTimeout = 100 * time.Millisecond

// reported runs a command, then tells tabbyd's agent (the config's
// agentSocket) how long it took and whether it failed, for the histogram
// tabby_cni_command_duration_seconds: the plugin exits after every command,
// so only tabbyd can keep one. The report is best effort: the command's
// result and its error never depend on it. A command whose config cannot
// be read, or that runs without the agent (Deps.NoAgent: handed over
// because tabbyd did not answer), is not reported.
func reported(d Deps, command string, f func(*skel.CmdArgs) error) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) error {
		start := time.Now()
		err := f(args)
		if d.NoAgent || d.NewAllocator != nil {
			return err
		}
		c, cerr := LoadConfig(args.StdinData)
		if cerr != nil || c.AgentSocket == "" {
			return err
		}
		r := agentapi.CommandReport{Command: command, Result: agentapi.ResultOK, Seconds: time.Since(start).Seconds()}
		if err != nil {
			r.Result = agentapi.ResultError
		}
		report(c.AgentSocket, r)
		return err
	}
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
