package labtest

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/internal/tier"
	"github.com/tabbynet/tabby/lab"
)

// TestSweepOrphans: a lab whose owner process is gone is removed with the
// real tabbyctl lab down (its network namespace goes) and so is its
// record; a lab of a running process stays, with its record; a record
// that is not one is reported and left.
func TestSweepOrphans(t *testing.T) {
	tier.Root(t, "the test makes network namespaces and runs tabbyctl lab down", "ip")
	saved := OwnersDir
	OwnersDir = t.TempDir()
	t.Cleanup(func() { OwnersDir = saved })

	dead, alive := "ltsw"+randHex(3), "ltsw"+randHex(3)
	for _, name := range []string{dead, alive} {
		ns := lab.Prefix(name) + "node1"
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
		}
		t.Cleanup(func() {
			if _, err := os.Lstat(lab.NetNSPath(ns)); err == nil {
				_ = exec.Command("ip", "netns", "del", ns).Run()
			}
		})
	}
	// The dead owner: a process that ran and ended.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	write := func(name string, o owner) {
		b, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(OwnersDir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(dead, owner{PID: cmd.Process.Pid, Start: 1, Dir: filepath.Join(t.TempDir(), "lab")})
	if _, err := registerOwner(alive, filepath.Join(t.TempDir(), "lab")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(OwnersDir, "ltjunk"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}

	var log strings.Builder
	err := sweepOrphans(io.MultiWriter(&log, os.Stderr), downLab)
	if err == nil || !strings.Contains(err.Error(), "ltjunk: not an owner record") {
		t.Errorf("sweepOrphans: %v; want the record that is not one reported", err)
	}
	if !strings.Contains(log.String(), "removed lab "+dead) {
		t.Errorf("sweepOrphans said %q; want the dead owner's lab %s removed", log.String(), dead)
	}
	for _, c := range []struct {
		name string
		want bool
	}{{dead, false}, {alive, true}} {
		_, nsErr := os.Lstat(lab.NetNSPath(lab.Prefix(c.name) + "node1"))
		_, recErr := os.Stat(filepath.Join(OwnersDir, c.name))
		if (nsErr == nil) != c.want || (recErr == nil) != c.want {
			t.Errorf("lab %s: namespace there %v, record there %v; want both %v", c.name, nsErr == nil, recErr == nil, c.want)
		}
	}
	if _, err := os.Stat(filepath.Join(OwnersDir, "ltjunk")); err != nil {
		t.Errorf("the record that is not one: %v; want it left", err)
	}
}
