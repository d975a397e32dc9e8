// Package cmd_test checks what the shipped programs link. The programs
// under cmd/ go into the image and onto every node; test machinery (the
// packages under test/) must never go with them, so what the lab and the
// demo need lives under internal/ instead.
package cmd_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
)

// TestShippedProgramsImportNoTestPackage lists every main package under
// cmd/ and everything they link (go list -deps), and fails naming the
// importer of any tabby package under test/.
func TestShippedProgramsImportNoTestPackage(t *testing.T) {
	module := goList(t, "-m")[0]
	mains := goList(t, "-f", `{{if eq .Name "main"}}{{.ImportPath}}{{end}}`, "./...")
	if len(mains) < 5 {
		t.Fatalf("found %d programs under cmd/ (%v); expected tabby, tabby-ipam, tabbyd, tabby-scheduler-extender and tabbyctl", len(mains), mains)
	}
	// One line per linked package: the package, then what it imports.
	deps := goList(t, append([]string{"-deps", "-f", `{{.ImportPath}} {{join .Imports " "}}`}, mains...)...)
	testPrefix := module + "/test/"
	var bad []string
	linked := 0
	for _, line := range deps {
		fields := strings.Fields(line)
		if strings.HasPrefix(fields[0], module+"/") {
			linked++
		}
		for _, imp := range fields[1:] {
			if strings.HasPrefix(imp, testPrefix) {
				bad = append(bad, fields[0]+" imports "+imp)
			}
		}
	}
	if linked < len(mains) {
		t.Fatalf("go list -deps named %d tabby packages for %d programs: the listing is wrong", linked, len(mains))
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		t.Fatalf("shipped programs (%s) link test machinery; move what they need under internal/:\n  %s",
			strings.Join(mains, ", "), strings.Join(bad, "\n  "))
	}
	t.Logf("%d programs link %d tabby packages, none under %s", len(mains), linked, testPrefix)
}

// goList runs go list in cmd/ with args and returns its non-empty lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), append([]string{"list"}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}
