package contract_test

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
)

// The layout rules of issue 14, checked on what `go list` says the packages
// import. The plugin binary and tabbyd are upgraded on different schedules,
// so neither may build on the other's insides: what they share lives in
// contract/ (and ipam/). Shipped programs must not link test machinery.

const module = "github.com/tabbynet/tabby"

// shipped are the programs the image and the release carry.
var shipped = []string{
	module + "/cmd/tabby",
	module + "/cmd/tabby-ipam",
	module + "/cmd/tabbyd",
	module + "/cmd/tabby-scheduler-extender",
	module + "/cmd/tabbyctl",
}

// testImportsAllowed are test files that cross the plugin/daemon line on
// purpose, and why; the rule holds for every other test file.
var testImportsAllowed = map[string]string{
	module + "/daemon/routing -> " + module + "/plugin": "netns_test.go wires real pods with the plugin's SetupPod/SetupHost to route between them",
}

// pkg is what the checks read of `go list -json`.
type pkg struct {
	ImportPath   string
	Deps         []string // every package it links, transitively
	TestImports  []string
	XTestImports []string
}

// goList runs `go list -json` on patterns: one entry per package named,
// with its transitive dependencies in Deps (test files not included).
func goList(t *testing.T, patterns ...string) []pkg {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is not on PATH (%v): run this test with `go test`, which puts it there", err)
	}
	args := append([]string{"list", "-json=ImportPath,Deps,TestImports,XTestImports"}, patterns...)
	cmd := exec.Command(goBin, args...)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	var pkgs []pkg
	for dec := json.NewDecoder(strings.NewReader(string(out))); ; {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("reading go list's output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		t.Fatalf("go list %s found no packages", strings.Join(patterns, " "))
	}
	return pkgs
}

// under tells whether path is the package dir or one below it.
func under(path, dir string) bool {
	return path == module+"/"+dir || strings.HasPrefix(path, module+"/"+dir+"/")
}

// crossings lists "pkg -> dep" for every package of from that links a
// package under to, and (direct imports only) every test file that does.
func crossings(t *testing.T, from, to string) []string {
	var bad []string
	for _, p := range goList(t, module+"/"+from+"/...") {
		for _, d := range p.Deps {
			if under(d, to) {
				bad = append(bad, p.ImportPath+" -> "+d)
			}
		}
		for _, d := range append(p.TestImports, p.XTestImports...) {
			edge := p.ImportPath + " -> " + d
			if under(d, to) && testImportsAllowed[edge] == "" && !slices.Contains(bad, edge+" (test)") {
				bad = append(bad, edge+" (test)")
			}
		}
	}
	return bad
}

func TestPluginDoesNotImportDaemon(t *testing.T) {
	if bad := crossings(t, "plugin", "daemon"); len(bad) > 0 {
		t.Errorf("the CNI plugin (or a test of it) links tabbyd's packages; move what they share to contract/ (or ipam/):\n  %s", strings.Join(bad, "\n  "))
	}
}

func TestDaemonDoesNotImportPlugin(t *testing.T) {
	if bad := crossings(t, "daemon", "plugin"); len(bad) > 0 {
		t.Errorf("tabbyd (or a test of it) links the CNI plugin's packages; move what they share to contract/:\n  %s", strings.Join(bad, "\n  "))
	}
}

// testMachinery maps each test/ package a shipped program links to the
// programs that link it.
func testMachinery(t *testing.T) map[string][]string {
	linked := map[string][]string{}
	for _, p := range goList(t, shipped...) {
		for _, d := range p.Deps {
			if under(d, "test") {
				linked[d] = append(linked[d], strings.TrimPrefix(p.ImportPath, module+"/"))
			}
		}
	}
	return linked
}

func TestShippedProgramsLinkNoTestPackage(t *testing.T) {
	linked := testMachinery(t)
	var lines []string
	for d, by := range linked {
		lines = append(lines, d+" (linked by "+strings.Join(by, ", ")+")")
	}
	sort.Strings(lines)
	if len(lines) > 0 {
		t.Errorf("shipped programs link test machinery; move what they need under internal/:\n  %s", strings.Join(lines, "\n  "))
	}
}

func TestLayoutChecksCanFail(t *testing.T) {
	// The checks above pass vacuously if go list reports no dependencies
	// or the rules name the wrong module: each must see a crossing that
	// exists on purpose.
	if !slices.ContainsFunc(goList(t, module+"/daemon/netpol")[0].Deps, func(d string) bool { return d == module+"/contract" }) {
		t.Error("go list does not show daemon/netpol linking contract/: the layout checks read the wrong data")
	}
	if bad := crossings(t, "plugin", "contract"); len(bad) == 0 {
		t.Error("no plugin package links contract/ by go list's account: the layout checks read the wrong data")
	}
}
