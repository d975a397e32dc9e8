package tier_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/internal/tier"
)

// TestRoot runs a test that calls Root in a child test binary, as this
// user, and checks what a reader of its log sees: as non-root a skip that
// starts with SkipPrefix and says why, as root a run (and a failure naming
// a missing program).
func TestRoot(t *testing.T) {
	if os.Getenv("TIER_CHILD") != "" {
		t.Skip("the child's own run of TestRoot")
	}
	out, err := child(t, "TestChildRoot")
	if os.Geteuid() != 0 {
		if err != nil || !strings.Contains(out, tier.SkipPrefix+"to look at the kernel") || !strings.Contains(out, "--- SKIP: TestChildRoot") {
			t.Fatalf("as non-root, Root must skip with %q and the reason; got %v:\n%s", tier.SkipPrefix, err, out)
		}
		return
	}
	if err != nil || !strings.Contains(out, "--- PASS: TestChildRoot") {
		t.Fatalf("as root, Root must let the test run; got %v:\n%s", err, out)
	}
	out, err = child(t, "TestChildMissingProgram")
	if err == nil || !strings.Contains(out, "needs the program tabby-no-such-program on PATH") {
		t.Fatalf("as root, a missing program must fail the test naming it; got %v:\n%s", err, out)
	}
}

func child(t *testing.T, name string) (string, error) {
	cmd := exec.Command(os.Args[0], "-test.run", "^"+name+"$", "-test.v")
	cmd.Env = append(os.Environ(), "TIER_CHILD=1")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestChildRoot(t *testing.T) {
	if os.Getenv("TIER_CHILD") == "" {
		t.Skip("run by TestRoot in a child process")
	}
	tier.Root(t, "to look at the kernel")
}

func TestChildMissingProgram(t *testing.T) {
	if os.Getenv("TIER_CHILD") == "" {
		t.Skip("run by TestRoot in a child process")
	}
	tier.Root(t, "to look at the kernel", "tabby-no-such-program")
}
