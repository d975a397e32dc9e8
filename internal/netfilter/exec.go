package netfilter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// run runs a command with stdin and returns its standard output. A failure
// says which command failed and what it printed; when the command names
// the line of its input it choked on (iptables-restore, ipset restore),
// that line is quoted too.
func run(ctx context.Context, stdin string, name string, args ...string) (string, error) {
	return start(ctx, stdin, name, args...)()
}

// start starts a command as run does, from the calling thread (so in its
// network namespace), and returns at once: wait waits for it and returns
// what run would.
func start(ctx context.Context, stdin string, name string, args ...string) (wait func() (string, error)) {
	return startFed(ctx, stdin, nil, name, args...)
}

// startFed is start with the input written by feed, as it goes, rather
// than all at once; stdin is that input whole, for quoting the line an
// error names. When feed fails, the program's input ends there, and wait
// names feed's error beside the program's.
func startFed(ctx context.Context, stdin string, feed func(io.Writer) error, name string, args ...string) (wait func() (string, error)) {
	cmd := exec.CommandContext(ctx, name, args...)
	var in io.WriteCloser
	var fed chan error
	if feed != nil {
		var err error
		if in, err = cmd.StdinPipe(); err != nil {
			return func() (string, error) { return "", fmt.Errorf("%s: %w", name, err) }
		}
	} else if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	fail := func(err error) (string, error) {
		msg := strings.TrimSpace(errb.String())
		if l := FailedLine(msg, stdin); l != "" {
			msg += " (the line: " + l + ")"
		}
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, msg)
	}
	if err := cmd.Start(); err != nil {
		return func() (string, error) { return fail(err) }
	}
	if feed != nil {
		fed = make(chan error, 1)
		go func() {
			err := feed(in)
			in.Close()
			fed <- err
		}()
	}
	return func() (string, error) {
		werr := cmd.Wait()
		var ferr error
		if fed != nil {
			ferr = <-fed
		}
		switch {
		case werr != nil && ferr != nil && !errors.Is(ferr, syscall.EPIPE) && !errors.Is(ferr, os.ErrClosed):
			return fail(fmt.Errorf("%w (its input: %w)", werr, ferr))
		case werr != nil:
			return fail(werr)
		case ferr != nil:
			return fail(ferr)
		}
		return out.String(), nil
	}
}

// lineRe finds the line number in the errors of iptables-restore ("Error
// occurred at line: 3"), iptables-nft-restore ("line 3 failed") and ipset
// ("Error in line 3").
var lineRe = regexp.MustCompile(`(?i)line:? (\d+)`)

// nameRe finds a name an error message quotes, as iptables-nft-restore
// does without a line number ("Chain 'TABBY-X' does not exist") and
// iptables-legacy-restore ("Couldn't load target `TABBY-X'").
var nameRe = regexp.MustCompile("['`]([^'` ]+)'")

// FailedLine is the line of stdin that an error message names: by number,
// unless that is the COMMIT (iptables-nft-restore checks jumps only when
// committing) and the message quotes a name, in which case the first line
// with that name as one of its words; "" when it names none.
func FailedLine(msg, stdin string) string {
	if stdin == "" {
		return ""
	}
	lines := strings.Split(stdin, "\n")
	numbered := ""
	if m := lineRe.FindStringSubmatch(msg); m != nil {
		if n, _ := strconv.Atoi(m[1]); n >= 1 && n <= len(lines) {
			numbered = lines[n-1]
		}
	}
	if m := nameRe.FindStringSubmatch(msg); m != nil && (numbered == "" || numbered == "COMMIT") {
		for _, l := range lines {
			if slices.Contains(strings.Fields(l), m[1]) {
				return l
			}
		}
	}
	return numbered
}
