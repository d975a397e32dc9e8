package main

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/tabbynet/tabby/internal/logging"
)

// Exit codes, as scripts see them (documented in the root command's help
// and the README). They follow grep and diff: 1 is an answer, 2 is trouble.
const (
	exitOK      = 0
	exitProblem = 1 // the command worked and found a problem
	exitError   = 2 // usage, connection or any other error: no answer
)

// problemError is the failure of a command that did its work and found
// something wrong (ipam check's problems, a node that is not ready): exit 1.
type problemError struct{ err error }

func (e problemError) Error() string { return e.err.Error() }
func (e problemError) Unwrap() error { return e.err }

// problem makes a problemError of a message.
func problem(format string, args ...any) error {
	return problemError{fmt.Errorf(format, args...)}
}

// loggedError is an error a command has already written to its log: main
// does not print it again, and exits as for the error it wraps.
type loggedError struct{ err error }

func (e loggedError) Error() string { return e.err.Error() }
func (e loggedError) Unwrap() error { return e.err }

// logFinal writes the error that ends a command to its log when the log
// is JSON (--log-format json), so that a log shipper reading the
// command's stderr gets JSON down to the last line; a text log keeps
// main's plain "tabbyctl: ..." line.
func logFinal(log *slog.Logger, format string, err error) error {
	if err == nil || format != logging.FormatJSON {
		return err
	}
	log.Error("install-cni failed", "error", err, "exitCode", exitCode(err))
	return loggedError{err}
}

// exitCode maps what a command returned to tabbyctl's exit status.
func exitCode(err error) int {
	var p problemError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &p):
		return exitProblem
	}
	return exitError
}

// exitCodesHelp is the root command's description of the exit codes.
const exitCodesHelp = `Exit codes (for scripts):
  0  success
  1  the command worked and found a problem: ipam check found problems,
     ipam release refused or could not release an address, node status
     found tabbyd not ready, lab demo found a probe or placement wrong
  2  the command could not do its work: a usage error (unknown command or
     flag, wrong arguments, a bad -o value), the API server or tabbyd
     unreachable, an unusable kubeconfig or context, or another error it
     names`
