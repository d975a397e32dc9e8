package lab

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startShim runs the test binary as a shim of argv, in a session of its
// own as the kubelet starts it.
func startShim(t *testing.T, argv ...string) (*exec.Cmd, string) {
	t.Helper()
	exit := filepath.Join(t.TempDir(), "c.exit")
	cmd := exec.Command(os.Args[0], argv...)
	cmd.Env = append(os.Environ(), envShim+"="+exit, "GREETING=hello")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); _ = cmd.Wait() })
	return cmd, exit
}

func readShimExit(t *testing.T, path string) shimExit {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading the exit file: %v", err)
	}
	var ex shimExit
	if err := json.Unmarshal(data, &ex); err != nil {
		t.Fatal(err)
	}
	return ex
}

func exitCode(err error) int {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

func TestShimRecordsExit(t *testing.T) {
	// The child gets the shim's environment.
	cmd, exit := startShim(t, "/bin/sh", "-c", `test "$GREETING" = hello && exit 5`)
	if code := exitCode(cmd.Wait()); code != 5 {
		t.Errorf("the shim exited %d, want the child's 5", code)
	}
	if ex := readShimExit(t, exit); ex.ExitCode != 5 || ex.Signal != 0 || ex.Error != "" || time.Since(ex.FinishedAt) > time.Minute {
		t.Errorf("exit %+v", ex)
	}

	cmd, exit = startShim(t, "/nonexistent/program")
	if code := exitCode(cmd.Wait()); code != 128 {
		t.Errorf("the shim exited %d, want 128", code)
	}
	if ex := readShimExit(t, exit); ex.ExitCode != 128 || !strings.Contains(ex.Error, "/nonexistent/program") {
		t.Errorf("exit %+v", ex)
	}
}

// children lists the children of pid (of every thread).
func children(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	for _, f := range tasks {
		data, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(data)) {
			if c, err := strconv.Atoi(s); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

func waitChild(t *testing.T, pid int) Proc {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if c := children(pid); len(c) == 1 {
			p, err := procOf("child", c[0])
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shim %d has no child", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestShimStoppedThroughItsGroup(t *testing.T) {
	// SIGTERM to the shim's group: the child dies of it, the shim records
	// that and ends.
	cmd, exit := startShim(t, "/bin/sleep", "600")
	child := waitChild(t, cmd.Process.Pid)
	shim, err := procOf("shim", cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- cmd.Wait() }()
	if left := stopProcs([]Proc{shim}, 5*time.Second, true); len(left) > 0 {
		t.Fatalf("the shim did not stop")
	}
	if code := exitCode(<-errc); code != 128+15 {
		t.Errorf("the shim exited %d, want 143", code)
	}
	if ex := readShimExit(t, exit); ex.Signal != 15 || ex.ExitCode != 143 {
		t.Errorf("exit %+v", ex)
	}
	if child.Alive() {
		t.Errorf("the child %d outlived the shim", child.Pid)
	}
}

func TestShimChildDiesWithShim(t *testing.T) {
	// A shim killed alone takes its child with it (and records nothing).
	cmd, exit := startShim(t, "/bin/sleep", "600")
	child := waitChild(t, cmd.Process.Pid)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if left := waitGone([]Proc{child}, 5*time.Second); len(left) > 0 {
		t.Errorf("the child %d outlived its shim", child.Pid)
	}
	if _, err := os.Stat(exit); err == nil {
		t.Errorf("a killed shim wrote an exit file")
	}
}
