package buildinfo

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDeadcode builds tabby's programs as make build does (with the
// Makefile's BUILD_TAGS) and fails when something they link turns off the
// linker's removal of unused methods. A function that calls reflect's
// Method or MethodByName with a name not known at compile time (the
// linker marks it <ReflectMethod>) makes every exported method of every
// type that reaches an interface stay in the binary: for tabbyd that was
// 6 MB of its 33, and about 4 MiB of each node's resident memory (the
// binary's pages are shared, but each process counts those it maps). The
// failure names the chain of calls that makes such a function reachable,
// so that whoever bumps a dependency can see which one did it.
func TestDeadcode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds five programs")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	tags := makeVar(t, filepath.Join(root, "Makefile"), "BUILD_TAGS")
	for _, cmd := range []string{"tabbyd", "tabby-scheduler-extender", "tabbyctl", "tabby", "tabby-ipam"} {
		t.Run(cmd, func(t *testing.T) {
			c := exec.Command("go", "build", "-tags", tags, "-ldflags=-dumpdep", "-o", os.DevNull, "./cmd/"+cmd)
			c.Dir = root
			c.Env = append(os.Environ(), "CGO_ENABLED=0")
			var out bytes.Buffer
			c.Stderr = &out
			if err := c.Run(); err != nil {
				t.Fatalf("go build -tags %q -ldflags=-dumpdep ./cmd/%s: %v\n%s", tags, cmd, err, tail(out.String(), 2000))
			}
			if chains := reflectMethodChains(out.Bytes()); len(chains) > 0 {
				t.Errorf("./cmd/%s links a function that keeps every exported method (<ReflectMethod>); reached through:\n%s",
					cmd, strings.Join(chains, "\n\n"))
			}
		})
	}
}

// makeVar is the value of a "NAME := value" line of a Makefile.
func makeVar(t *testing.T, path, name string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\s*:=\s*(.*)$`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("%s has no line %s := ...", path, name)
	}
	return strings.TrimSpace(string(m[1]))
}

// reflectMethodChains reads the linker's -dumpdep output (one "from -> to"
// edge a line, a symbol marked " <ReflectMethod>" when it is such a
// function) and returns, for each marked symbol, the chain of symbols
// from the program's root ("_") to it.
func reflectMethodChains(dump []byte) []string {
	edges := map[string][]string{}
	var marked []string
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(dump))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		from, to, ok := strings.Cut(sc.Text(), " -> ")
		if !ok {
			continue
		}
		from, to = symbol(from, &marked, seen), symbol(to, &marked, seen)
		edges[from] = append(edges[from], to)
	}
	parent := map[string]string{"_": ""}
	queue := []string{"_"}
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		for _, n := range edges[s] {
			if _, ok := parent[n]; !ok {
				parent[n] = s
				queue = append(queue, n)
			}
		}
	}
	var chains []string
	for _, m := range marked {
		if _, ok := parent[m]; !ok {
			chains = append(chains, m+" (no chain from the root found)")
			continue
		}
		var path []string
		for s := m; s != ""; s = parent[s] {
			path = append(path, s)
		}
		for i, j := 0, len(path)-1; i < j; i, j = i+1, j-1 {
			path[i], path[j] = path[j], path[i]
		}
		chains = append(chains, strings.Join(path, "\n  -> "))
	}
	return chains
}

// symbol strips a -dumpdep symbol's attributes, noting it in marked (once)
// when one is <ReflectMethod>.
func symbol(s string, marked *[]string, seen map[string]bool) string {
	name, attrs, _ := strings.Cut(s, " <")
	if strings.Contains(attrs, "ReflectMethod") && !seen[name] {
		seen[name] = true
		*marked = append(*marked, name)
	}
	return name
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
