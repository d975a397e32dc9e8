package lab

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestProcIdentity(t *testing.T) {
	self, err := procOf("self", os.Getpid())
	if err != nil || !self.Alive() {
		t.Fatalf("this process: %+v %v", self, err)
	}
	// Another start time is another process, whatever its pid.
	if (Proc{Pid: self.Pid, Start: self.Start + 1}).Alive() {
		t.Error("a recycled pid counts as alive")
	}
	if (Proc{}).Alive() {
		t.Error("pid 0 counts as alive")
	}
}

// TestDescribeProc: the description names the process's real parent,
// its start and its arguments.
func TestDescribeProc(t *testing.T) {
	self, err := procOf("self", os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	d := describeProc(os.Getpid())
	for _, want := range []string{
		fmt.Sprintf("pid %d (state ", os.Getpid()),
		fmt.Sprintf(", parent %d %s, start %d)", os.Getppid(), comm(os.Getppid()), self.Start),
		" cgroup /",
		": " + os.Args[0],
	} {
		if !strings.Contains(d, want) {
			t.Errorf("describeProc(self) = %q, lacks %q", d, want)
		}
	}
}

func TestStartDetachedAndStop(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "sub", "sleep.log")
	p, done, err := startDetached(procSpec{name: "sleep", path: "/bin/sleep", args: []string{"600"}, log: log, env: []string{"X=1"}})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Alive() || p.Log != log {
		t.Fatalf("%+v", p)
	}
	// It leads a session of its own.
	if sid, err := unix.Getsid(p.Pid); err != nil || sid != p.Pid {
		t.Errorf("session %d (%v), want %d", sid, err, p.Pid)
	}
	if left := stopProcs([]Proc{p}, 5*time.Second, false); len(left) > 0 {
		t.Fatalf("sleep did not stop")
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Error("done was not closed")
	}
	if p.Alive() {
		t.Error("a stopped process is alive")
	}
	if data, _ := os.ReadFile(log); len(data) == 0 {
		t.Error("nothing in the log")
	}

}

func TestProcsByArgs(t *testing.T) {
	// A shell that waits in its builtin read: it never forks, so no child
	// shows the same arguments for a moment (as `sh -c "sleep 600"` does
	// between its fork and the exec of sleep, seen under load).
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	cmd := exec.Command("/bin/sh", "-c", "read x", "tabby-lab-test-marker")
	cmd.Stdin = r
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	found := procsByArgs(func(args []string) bool { return len(args) == 3 && args[2] == "tabby-lab-test-marker" })
	if len(found) != 1 || found[0].Pid != cmd.Process.Pid {
		t.Errorf("found %+v, want pid %d", found, cmd.Process.Pid)
	}
}
