package netfilter

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// run runs a command with stdin and returns its standard output. A failure
// says which command failed and what it printed; when the command names
// the line of its input it choked on (iptables-restore, ipset restore),
// that line is quoted too.
func run(ctx context.Context, stdin string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(errb.String())
		if l := FailedLine(msg, stdin); l != "" {
			msg += " (the line: " + l + ")"
		}
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, msg)
	}
	return out.String(), nil
}

// lineRe finds the line number in the errors of iptables-restore ("Error
// occurred at line: 3"), iptables-nft-restore ("line 3 failed") and ipset
// ("Error in line 3").
var lineRe = regexp.MustCompile(`(?i)line:? (\d+)`)

// FailedLine is the line of stdin that an error message names, "" when it
// names none.
func FailedLine(msg, stdin string) string {
	m := lineRe.FindStringSubmatch(msg)
	if m == nil || stdin == "" {
		return ""
	}
	n, _ := strconv.Atoi(m[1])
	lines := strings.Split(stdin, "\n")
	if n < 1 || n > len(lines) {
		return ""
	}
	return lines[n-1]
}
