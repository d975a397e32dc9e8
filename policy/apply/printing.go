package apply

import (
	"hash/maphash"
	"slices"
	"strings"

	"github.com/tabbynet/tabby/policy"
)

// printing is how the kernel prints rules (iptables-save's text after
// "-A CHAIN "), learned from chains read back just after the applier
// wrote them: a chain whose every rule's printing it predicts is not read
// back. The next kernel read checks every prediction (remember).
//
// It learns two ways. exact maps a rule (its ruleKey) to the line read
// back for it. shapes maps a rule's shape, the rule with its variable
// arguments (set names, tabby's chain names, comments, ports: shapeOf)
// taken out, to a template: the line read back for one rule of that shape,
// cut where that rule's variable arguments were printed. iptables prints a
// variable argument as a function of its option and its class (argClass):
// set and chain names as they are, ports as numbers, a comment quoted
// unless it is all letters, digits, '-' and '_'. So one rule read back
// tells how every rule of its shape prints: the 21,086 rules the compiler
// writes for 1,000 policies over 5,000 local pods have a few dozen shapes,
// and a full sync with the nft backend reads back 16 of the 2,858 chains
// (readBackCover) instead of the whole table.
//
// A wrong prediction costs one rewrite, never a loop of them: the next
// kernel read finds the chain printed otherwise, and forget drops its
// rules' exact printings and distrusts their shapes for good, so the chain
// is written again, read back, and its rules learned exactly.
type printing struct {
	seed  maphash.Seed
	exact map[uint64]string
	// shapes: a nil template is a distrusted shape (forget).
	shapes map[uint64]*template
}

// template is a printed line with the variable arguments of the rule it
// was learned from cut out: lit[0], the argument vars[0], lit[1], … The
// rule's variable arguments, in shapeOf's order, fill the gaps.
type template struct {
	lit  []string
	vars []int
}

func newPrinting() printing {
	return printing{seed: maphash.MakeSeed(), exact: map[uint64]string{}, shapes: map[uint64]*template{}}
}

// ruleKey identifies a rule's arguments in p.exact: a hash (seeded per
// applier) rather than the rule's text, which would double the memory of
// the chains. Two rules with one key (odds of 2^-64 per pair) would make
// a chain's printing predicted wrong: the next kernel read finds it
// changed, rewrites it and forgets the key.
func (p *printing) ruleKey(rule []string) uint64 {
	var h maphash.Hash
	h.SetSeed(p.seed)
	for _, a := range rule {
		h.WriteString(a)
		h.WriteByte(0)
	}
	return h.Sum64()
}

// variable reports whether the argument after option opt is one of a
// rule's variable arguments (see shapeOf).
func variable(opt, arg string) bool {
	switch opt {
	case "--match-set", "--comment", "--dport", "--dports", "--sport", "--sports":
		return true
	case "-j", "-g":
		return strings.HasPrefix(arg, policy.ChainPrefix)
	}
	return false
}

// argClass is the class of a variable argument: arguments of one option
// and one class are printed alike. "n" and the argument's punctuation
// for numbers and lists and ranges of them ("80:90,443" is "n:,"); "w"
// for words iptables prints bare (letters, digits, '-', '_'); "q" for
// the other printable arguments, which it quotes. "" for an argument
// with a space, a quote, a backslash or a control character, which
// iptables escapes: a rule with one has no shape.
func argClass(arg string) string {
	if arg == "" {
		return ""
	}
	num, word := true, true
	for i := 0; i < len(arg); i++ {
		c := arg[i]
		switch {
		case c <= ' ' || c >= 0x7f || c == '"' || c == '\'' || c == '\\':
			return ""
		case c >= '0' && c <= '9':
		case c == ':' || c == ',':
			word = false
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '-', c == '_':
			num = false
		default:
			num, word = false, false
		}
	}
	switch {
	case num:
		var b strings.Builder
		b.WriteByte('n')
		for i := 0; i < len(arg); i++ {
			if arg[i] == ':' || arg[i] == ',' {
				b.WriteByte(arg[i])
			}
		}
		return b.String()
	case word:
		return "w"
	}
	return "q"
}

// shapeOf is the key of rule's shape, with its variable arguments in
// order; ok is false when the rule has none (its exact printing is all
// there is to learn) or one iptables would escape.
func (p *printing) shapeOf(rule []string) (key uint64, vals []string, ok bool) {
	var h maphash.Hash
	h.SetSeed(p.seed)
	h.WriteByte(1) // no shape key is a ruleKey
	for i, a := range rule {
		if i > 0 && variable(rule[i-1], a) {
			c := argClass(a)
			if c == "" {
				return 0, nil, false
			}
			vals = append(vals, a)
			h.WriteByte(1)
			h.WriteString(c)
		} else {
			h.WriteString(a)
		}
		h.WriteByte(0)
	}
	return h.Sum64(), vals, len(vals) > 0
}

// learnTemplate cuts line, the printing of a rule whose variable
// arguments are vals, where each is printed: as a whole word (bounded by
// the line's ends, spaces or quotes), exactly once, with no two in one
// place. nil when some argument is not so printed.
func learnTemplate(line string, vals []string) *template {
	type cut struct{ at, v int }
	cuts := make([]cut, 0, len(vals))
	for v, val := range vals {
		at := -1
		for from := 0; ; {
			i := strings.Index(line[from:], val)
			if i < 0 {
				break
			}
			i += from
			from = i + 1
			end := i + len(val)
			if (i == 0 || line[i-1] == ' ' || line[i-1] == '"') && (end == len(line) || line[end] == ' ' || line[end] == '"') {
				if at >= 0 {
					return nil // printed twice, or as a word elsewhere in the line
				}
				at = i
			}
		}
		if at < 0 {
			return nil
		}
		cuts = append(cuts, cut{at, v})
	}
	slices.SortFunc(cuts, func(a, b cut) int { return a.at - b.at })
	t := &template{}
	prev := 0
	for _, c := range cuts {
		if c.at < prev {
			return nil // overlapping
		}
		t.lit = append(t.lit, line[prev:c.at])
		t.vars = append(t.vars, c.v)
		prev = c.at + len(vals[c.v])
	}
	t.lit = append(t.lit, line[prev:])
	return t
}

// fill is the printing of the rule of t's shape whose variable arguments
// are vals.
func (t *template) fill(vals []string) string {
	var b strings.Builder
	for i, v := range t.vars {
		b.WriteString(t.lit[i])
		b.WriteString(vals[v])
	}
	b.WriteString(t.lit[len(t.lit)-1])
	return b.String()
}

// learn records line as the printing of rule, and of its shape unless
// that is known or distrusted.
func (p *printing) learn(rule []string, line string) {
	p.exact[p.ruleKey(rule)] = line
	key, vals, ok := p.shapeOf(rule)
	if !ok {
		return
	}
	if _, known := p.shapes[key]; known {
		return
	}
	if t := learnTemplate(line, vals); t != nil && t.fill(vals) == line {
		p.shapes[key] = t
	}
}

// predict is how the kernel prints rule, if known. When it is not,
// unknown is what the rule has in common with the rules that one read
// back teaches too: its shape when that can be learned, the rule itself
// otherwise (readBackCover).
func (p *printing) predict(rule []string) (line string, ok bool, unknown uint64) {
	k := p.ruleKey(rule)
	if l, ok := p.exact[k]; ok {
		return l, true, 0
	}
	key, vals, shaped := p.shapeOf(rule)
	if !shaped {
		return "", false, k
	}
	t, known := p.shapes[key]
	switch {
	case t != nil:
		return t.fill(vals), true, 0
	case known:
		return "", false, k // distrusted: learned rule by rule
	}
	return "", false, key
}

// forget drops the printing of rules, found wrong, and distrusts their
// shapes.
func (p *printing) forget(rules [][]string) {
	for _, r := range rules {
		delete(p.exact, p.ruleKey(r))
		if key, _, ok := p.shapeOf(r); ok {
			p.shapes[key] = nil
		}
	}
}

// prune drops, when p has grown well past n (the rules of the chains
// written, which live lists), the exact printings of rules no chain has
// any more (chains come and go with pods' combinations of policies) and
// the templates of shapes none has. Distrust stays: it is one entry per
// shape ever found wrong.
func (p *printing) prune(n int, live func(yield func([]string))) {
	if len(p.exact)+len(p.shapes) <= 2*n+1024 {
		return
	}
	exact := make(map[uint64]string, n)
	shapes := map[uint64]*template{}
	for key, t := range p.shapes {
		if t == nil {
			shapes[key] = nil
		}
	}
	live(func(r []string) {
		k := p.ruleKey(r)
		if l, ok := p.exact[k]; ok {
			exact[k] = l
		}
		if key, _, ok := p.shapeOf(r); ok {
			if t, ok := p.shapes[key]; ok {
				shapes[key] = t
			}
		}
	})
	p.exact, p.shapes = exact, shapes
}
