package apply

import (
	"strings"
	"testing"
)

func TestArgClass(t *testing.T) {
	for _, c := range []struct{ arg, want string }{
		{"80", "n"},
		{"1000:2000", "n:"},
		{"53,5353:5360,8080", "n,:,"},
		{"tabby-np-p4-abc", "w"},
		{"TABBY-NP-PI-ABC", "w"},
		{"pol_1", "w"},
		{"x/web", "q"},
		{"cnp-admin:adm", "q"},
		{"a.b", "q"},
		{"", ""},
		{"a b", ""},
		{`a"b`, ""},
		{"a'b", ""},
		{`a\b`, ""},
		{"a\tb", ""},
		{"caf\xc3\xa9", ""},
	} {
		if got := argClass(c.arg); got != c.want {
			t.Errorf("argClass(%q) = %q, want %q", c.arg, got, c.want)
		}
	}
}

func TestLearnTemplate(t *testing.T) {
	for _, c := range []struct {
		name, line string
		vals       []string
		ok         bool
		// other: the arguments a second rule of the shape has, and want
		// its printing by the template.
		other []string
		want  string
	}{
		{"set and chain", "-m set --match-set s1 src -g TABBY-NP-A", []string{"s1", "TABBY-NP-A"}, true,
			[]string{"s2", "TABBY-NP-B"}, "-m set --match-set s2 src -g TABBY-NP-B"},
		{"quoted comment", `-m comment --comment "x/web" -j TABBY-NP-A`, []string{"x/web", "TABBY-NP-A"}, true,
			[]string{"ns/db", "TABBY-NP-B"}, `-m comment --comment "ns/db" -j TABBY-NP-B`},
		{"printed in another order", "-p tcp -m tcp --dport 80 -m set --match-set s1 src -j MARK", []string{"s1", "80"}, true,
			[]string{"s2", "443"}, "-p tcp -m tcp --dport 443 -m set --match-set s2 src -j MARK"},
		{"a value at the line's end", "-j TABBY-NP-A", []string{"TABBY-NP-A"}, true,
			[]string{"TABBY-NP-LONGER"}, "-j TABBY-NP-LONGER"},
		{"inside a longer word only", "-m set --match-set s10 src -j RETURN", []string{"s1"}, false, nil, ""},
		{"printed twice", "-m set --match-set s1 src -m set --match-set s1 dst -j RETURN", []string{"s1"}, false, nil, ""},
		{"a value that is also an option's word", "-p tcp -m comment --comment tcp -j RETURN", []string{"tcp"}, false, nil, ""},
		{"not printed", "-p tcp -m tcp -j RETURN", []string{"80"}, false, nil, ""},
	} {
		tm := learnTemplate(c.line, c.vals)
		if (tm != nil) != c.ok {
			t.Errorf("%s: learnTemplate(%q, %q) = %+v, want a template %v", c.name, c.line, c.vals, tm, c.ok)
			continue
		}
		if tm == nil {
			continue
		}
		if got := tm.fill(c.vals); got != c.line {
			t.Errorf("%s: the template fills its own rule's arguments as %q, want %q", c.name, got, c.line)
		}
		if got := tm.fill(c.other); got != c.want {
			t.Errorf("%s: fill(%q) = %q, want %q", c.name, c.other, got, c.want)
		}
	}
}

// TestPrinting: a learned shape predicts the printing of rules of its
// shape (variable arguments of the same classes) and of no other; forget
// distrusts the shape, so the rules of it are learned one by one from then
// on; prune keeps the printings of the live rules and the distrust.
func TestPrinting(t *testing.T) {
	p := newPrinting()
	rule := func(s string) []string { return strings.Fields(s) }
	a := rule("-p tcp -m tcp --dport 80 -m set --match-set tabby-np-p4-a src -m comment --comment x/web -j TABBY-NP-A")
	p.learn(a, `-p tcp -m tcp --dport 80 -m set --match-set tabby-np-p4-a src -m comment --comment "x/web" -j TABBY-NP-A`)
	for _, c := range []struct {
		rule string
		want string // "": not predicted
	}{
		{"-p tcp -m tcp --dport 443 -m set --match-set tabby-np-p4-b src -m comment --comment ns/db -j TABBY-NP-B",
			`-p tcp -m tcp --dport 443 -m set --match-set tabby-np-p4-b src -m comment --comment "ns/db" -j TABBY-NP-B`},
		// A comment of another class, a port range, a set matched on the
		// destination, a built-in target: other shapes.
		{"-p tcp -m tcp --dport 443 -m set --match-set tabby-np-p4-b src -m comment --comment web -j TABBY-NP-B", ""},
		{"-p tcp -m tcp --dport 1:2 -m set --match-set tabby-np-p4-b src -m comment --comment ns/db -j TABBY-NP-B", ""},
		{"-p tcp -m tcp --dport 443 -m set --match-set tabby-np-p4-b dst -m comment --comment ns/db -j TABBY-NP-B", ""},
		{"-p tcp -m tcp --dport 443 -m set --match-set tabby-np-p4-b src -m comment --comment ns/db -j ACCEPT", ""},
		// An argument iptables would escape: no shape.
		{`-p tcp -m tcp --dport 443 -m set --match-set tabby-np-p4-b src -m comment --comment a"b -j TABBY-NP-B`, ""},
	} {
		got, ok, _ := p.predict(rule(c.rule))
		if ok != (c.want != "") || got != c.want {
			t.Errorf("predict(%q) = %q, %v; want %q", c.rule, got, ok, c.want)
		}
	}

	b := rule("-p tcp -m tcp --dport 443 -m set --match-set tabby-np-p4-b src -m comment --comment ns/db -j TABBY-NP-B")
	p.forget([][]string{a})
	la, ok, ida := p.predict(a)
	if ok {
		t.Errorf("a forgotten rule is predicted: %q", la)
	}
	lb, ok, idb := p.predict(b)
	if ok {
		t.Errorf("a rule of a distrusted shape is predicted: %q", lb)
	}
	if ida == idb {
		t.Error("two rules of a distrusted shape are read back as one")
	}
	p.learn(a, "A")
	p.learn(b, "B")
	if l, _, _ := p.predict(a); l != "A" {
		t.Errorf("a rule learned exactly after its shape was distrusted: %q, want A", l)
	}
	if l, _, _ := p.predict(b); l != "B" {
		t.Errorf("a rule learned exactly after its shape was distrusted: %q, want B", l)
	}

	c := rule("-m set --match-set tabby-np-p4-c src -g TABBY-NP-C")
	p.learn(c, "-m set --match-set tabby-np-p4-c src -g TABBY-NP-C")
	for i := range 2000 {
		r := rule("-j TABBY-NP-X" + strings.Repeat("x", i%7) + string(rune('a'+i%26)))
		p.learn(append(r, "-m", "comment", "--comment", strings.Repeat("y", i)), "whatever")
	}
	p.prune(1, func(yield func([]string)) { yield(c) })
	if l, ok, _ := p.predict(rule("-m set --match-set tabby-np-p4-d src -g TABBY-NP-D")); !ok || l != "-m set --match-set tabby-np-p4-d src -g TABBY-NP-D" {
		t.Errorf("after prune, a live rule's shape predicts %q, %v", l, ok)
	}
	if _, ok, _ := p.predict(b); ok {
		t.Error("after prune, a rule no chain has is still known")
	}
	if len(p.exact) != 1 {
		t.Errorf("after prune, %d exact printings, want 1", len(p.exact))
	}
	if t2, known := p.shapes[mustShape(t, &p, a)]; !known || t2 != nil {
		t.Error("prune dropped a distrusted shape")
	}
}

func mustShape(t *testing.T, p *printing, rule []string) uint64 {
	t.Helper()
	key, _, ok := p.shapeOf(rule)
	if !ok {
		t.Fatalf("%q has no shape", rule)
	}
	return key
}
