package netfilter

import "strings"

// Table is one table of iptables-save output: every chain it declares,
// with its rules as printed after "-A CHAIN " (a chain without rules maps
// to an empty, non-nil slice).
type Table map[string][]string

// ParseSave reads the table named table from iptables-save output; a
// missing table is empty.
func ParseSave(save, table string) Table {
	t := Table{}
	in := false
	for _, line := range strings.Split(save, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			in = line == "*"+table
		case !in:
		case strings.HasPrefix(line, ":"):
			name, _, _ := strings.Cut(line[1:], " ")
			if t[name] == nil {
				t[name] = []string{}
			}
		case strings.HasPrefix(line, "-A "):
			chain, rest, _ := strings.Cut(line[3:], " ")
			t[chain] = append(t[chain], rest)
		}
	}
	return t
}
