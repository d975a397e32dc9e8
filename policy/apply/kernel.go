package apply

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"

	"github.com/tabbynet/tabby/policy"
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
		if l := failedLine(msg, stdin); l != "" {
			msg += " (the line: " + l + ")"
		}
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, msg)
	}
	return out.String(), nil
}

var lineRe = regexp.MustCompile(`(?i)line:? (\d+)`)

// failedLine is the input line an error message names.
func failedLine(msg, stdin string) string {
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

// quote makes one argument an iptables-restore token: as it is when it has
// nothing the restore parser splits on, else in double quotes with " and \
// escaped (the parser's own rules).
func quote(a string) string {
	if a != "" && !strings.ContainsAny(a, " \t\"\\'") {
		return a
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(a) + `"`
}

// ruleLine renders a rule for iptables-restore.
func ruleLine(rule []string) string {
	var b strings.Builder
	for i, a := range rule {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(quote(a))
	}
	return b.String()
}

// splitArgs splits a rule as iptables-save prints it into arguments, the way
// iptables-restore does: spaces separate, double quotes group, and inside
// quotes a backslash escapes the next character.
func splitArgs(line string) []string {
	var args []string
	var cur strings.Builder
	inArg, quoted, escaped := false, false, false
	for _, r := range line {
		switch {
		case quoted && escaped:
			cur.WriteRune(r)
			escaped = false
		case quoted && r == '\\':
			escaped = true
		case quoted && r == '"':
			quoted = false
		case quoted:
			cur.WriteRune(r)
		case r == '"':
			quoted, inArg = true, true
		case r == ' ' || r == '\t':
			if inArg {
				args = append(args, cur.String())
				cur.Reset()
				inArg = false
			}
		default:
			cur.WriteRune(r)
			inArg = true
		}
	}
	if inArg {
		args = append(args, cur.String())
	}
	return args
}

// filterTable is what iptables-save -t filter says about the chains the
// applier cares about: every policy chain's rules and the built-in chains'
// rules, as printed (after "-A CHAIN ").
type filterTable struct {
	chains   map[string][]string
	builtins map[string][]string
}

func parseFilter(save string) filterTable {
	ft := filterTable{chains: map[string][]string{}, builtins: map[string][]string{}}
	inFilter := false
	for _, line := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			inFilter = line == "*filter"
		case !inFilter:
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if strings.HasPrefix(name, policy.PolicyChainPrefix) {
				if ft.chains[name] == nil {
					ft.chains[name] = []string{}
				}
			}
		case strings.HasPrefix(line, "-A "):
			chain, rest, _ := strings.Cut(line[3:], " ")
			switch {
			case strings.HasPrefix(chain, policy.PolicyChainPrefix):
				ft.chains[chain] = append(ft.chains[chain], rest)
			case isBuiltin(chain):
				ft.builtins[chain] = append(ft.builtins[chain], rest)
			}
		}
	}
	return ft
}

func isBuiltin(chain string) bool {
	for _, b := range builtins {
		if b == chain {
			return true
		}
	}
	return false
}

// ours reports whether a built-in chain's rule (as printed) is a jump of
// tabby's policy: its target is a policy chain.
func ours(printed string) bool {
	return strings.HasPrefix(target(splitArgs(printed)), policy.PolicyChainPrefix)
}

// kernelSet is one of our sets as the kernel has it.
type kernelSet struct {
	typ    policy.SetType
	family string
	// members maps a member, as printed, to its nomatch flag.
	members map[string]bool
}

// parseIPSetSave reads `ipset save` and returns the sets starting with
// policy.SetPrefix; everyone else's are skipped.
func parseIPSetSave(save string) (map[string]*kernelSet, error) {
	sets := map[string]*kernelSet{}
	for _, line := range strings.Split(save, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.HasPrefix(f[1], policy.SetPrefix) {
			continue
		}
		switch f[0] {
		case "create":
			ks := &kernelSet{typ: policy.SetType(f[2]), members: map[string]bool{}}
			for i := 3; i+1 < len(f); i++ {
				if f[i] == "family" {
					ks.family = f[i+1]
				}
			}
			sets[f[1]] = ks
		case "add":
			ks := sets[f[1]]
			if ks == nil {
				return nil, fmt.Errorf("ipset save lists a member of %s before creating it: %q", f[1], line)
			}
			ks.members[f[2]] = len(f) > 3 && f[3] == "nomatch"
		}
	}
	return sets, nil
}
