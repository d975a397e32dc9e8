package netfilter

import "strings"

// Quote makes one argument an iptables-restore token: as it is when it has
// nothing the restore parser splits on, else in double quotes with " and \
// escaped (the parser's own rules).
func Quote(a string) string {
	if a != "" && !strings.ContainsAny(a, " \t\"\\'") {
		return a
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(a) + `"`
}

// RuleLine renders a rule's arguments for iptables-restore.
func RuleLine(rule []string) string {
	var b strings.Builder
	for i, a := range rule {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(Quote(a))
	}
	return b.String()
}

// SplitArgs splits a rule as iptables-save prints it into arguments, the
// way iptables-restore does: spaces separate, double quotes group, and
// inside quotes a backslash escapes the next character.
func SplitArgs(line string) []string {
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

// Target is the -j/-g target of a rule's arguments, "" if it has none.
func Target(rule []string) string {
	t := ""
	for i := 0; i+1 < len(rule); i++ {
		switch rule[i] {
		case "-j", "--jump", "-g", "--goto":
			t = rule[i+1]
		}
	}
	return t
}

// JumpsTo returns the rules of a chain (as printed after "-A CHAIN ")
// whose target is a chain owned says is the caller's: the rules the
// caller may delete from a chain it does not own. A comment that merely
// mentions such a chain does not count.
func JumpsTo(printed []string, owned func(chain string) bool) []string {
	var out []string
	for _, l := range printed {
		if owned(Target(SplitArgs(l))) {
			out = append(out, l)
		}
	}
	return out
}

// Prefixed is an ownership test for JumpsTo: the chains starting with
// prefix.
func Prefixed(prefix string) func(string) bool {
	return func(chain string) bool { return chain != "" && strings.HasPrefix(chain, prefix) }
}
