package lab

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"
	"time"
)

// shimExit is what a container's shim records when the container's
// process ends.
type shimExit struct {
	ExitCode int32 `json:"exitCode"`
	// Signal is the signal that killed the process (0: it exited).
	Signal int32 `json:"signal,omitempty"`
	// Error says why the process could not start.
	Error      string    `json:"error,omitempty"`
	FinishedAt time.Time `json:"finishedAt"`
}

// RunShim is `tabbyctl lab shim`: it runs argv (the container's command)
// as its child, with its own environment, folder, stdio and network
// namespace, waits for it and writes how it ended into exitFile, then
// returns the child's exit code. It is a container runtime's shim in
// miniature: the kubelet starts it detached, so that the container's
// process outlives a kubelet restart, and any kubelet reads its end from
// exitFile. The kubelet stops a container by signalling the shim's
// process group (the shim and its child): the shim ignores the signals
// itself and ends when the child does; the child dies with the shim.
func RunShim(exitFile string, argv []string) int {
	if len(argv) == 0 {
		return record(exitFile, shimExit{ExitCode: 128, Error: "no command"})
	}
	// The child's death signal fires when the thread that forked it ends:
	// keep this goroutine on one thread for the life of the shim.
	runtime.LockOSThread()
	// Handled, not ignored: an ignored signal would stay ignored in the
	// child across exec.
	signal.Notify(make(chan os.Signal, 4), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return record(exitFile, shimExit{ExitCode: 128, Error: err.Error()})
	}
	err := cmd.Wait()
	ex := shimExit{}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		ws := ee.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			ex.Signal = int32(ws.Signal())
			ex.ExitCode = 128 + ex.Signal
		} else {
			ex.ExitCode = int32(ws.ExitStatus())
		}
	default:
		ex.ExitCode, ex.Error = 128, err.Error()
	}
	return record(exitFile, ex)
}

// record writes the exit file and returns the exit code.
func record(exitFile string, ex shimExit) int {
	ex.FinishedAt = time.Now().UTC()
	data, _ := json.Marshal(ex)
	if err := writeFileAtomic(exitFile, data, 0o644); err != nil {
		os.Stderr.WriteString("tabbyctl lab shim: recording the exit: " + err.Error() + "\n")
	}
	return int(ex.ExitCode)
}
