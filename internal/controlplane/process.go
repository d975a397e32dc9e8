package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// Process is one program the cluster started: its own process group, killed
// by the kernel (SIGKILL) when the process that started it dies (unless
// Options.Detach), output appended to a log file.
type Process struct {
	// Name is what the process is called in errors and its log file name.
	Name string
	// Path and Args are the program and its arguments (without argv[0]).
	Path string
	Args []string
	// NetNS is the network namespace it runs in ("" for this program's).
	NetNS string
	// LogPath is where stdout and stderr go (appended).
	LogPath string

	cmd  *exec.Cmd
	done chan struct{}
	err  error // set before done is closed
}

// spawner runs every fork on one OS thread that is locked for the life of
// the program and never runs anything else. Pdeathsig fires when the
// *thread* that forked the child exits, not the process: a child forked from
// an ordinary goroutine would be killed as soon as the Go runtime retires
// that thread (which it does whenever a goroutine that locked it, for
// example to enter a network namespace, ends without unlocking).
var spawner struct {
	once sync.Once
	ch   chan func()
}

func onSpawnerThread(f func()) {
	spawner.once.Do(func() {
		spawner.ch = make(chan func())
		go func() {
			runtime.LockOSThread() // never unlocked: this thread lives as long as the program
			for f := range spawner.ch {
				f()
			}
		}()
	})
	done := make(chan struct{})
	spawner.ch <- func() { f(); close(done) }
	<-done
}

// startProcess starts path with args, output appended to logPath.
func startProcess(name, path, logPath string, args ...string) (*Process, error) {
	return Spawn(name, path, logPath, SpawnOptions{}, args...)
}

// SpawnOptions say where and how Spawn runs a process.
type SpawnOptions struct {
	// NetNS, when set, is the path of the network namespace the process
	// runs in: it is started through nsenter --net=PATH, which enters the
	// namespace and execs the program (same pid, the host's mount
	// namespace and /sys, unlike ip netns exec).
	NetNS string
	// MountNS, when set, is the path of a mount namespace (such as
	// /proc/PID/ns/mnt) the process runs in, entered by nsenter --mount
	// like NetNS; the program's path is looked up inside it.
	MountNS string
	// Detach lets the process outlive the program that started it: it
	// leads a session of its own and gets no death signal.
	Detach bool
	// Env is the environment (nil: this program's); Dir the working
	// folder ("": this program's).
	Env []string
	Dir string
	// ExtraFiles become the process's fds 3, 4, ...
	ExtraFiles []*os.File
}

// Spawn starts path with args as SpawnOptions say, stdout and stderr
// appended to logPath. Without Detach the process leads its own process
// group and is killed when this program dies; either way this program
// reaps it if it ends first (Process.Done).
func Spawn(name, path, logPath string, so SpawnOptions, args ...string) (*Process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the log of %s: %w", name, err)
	}
	defer logf.Close()
	fmt.Fprintf(logf, "=== %s: starting %s %q\n", time.Now().Format(time.RFC3339Nano), path, args)
	cmd := exec.Command(path, args...)
	if so.NetNS != "" || so.MountNS != "" {
		nsenter, err := exec.LookPath("nsenter")
		if err != nil {
			return nil, fmt.Errorf("starting %s in namespaces %s %s: %w (install util-linux)", name, so.NetNS, so.MountNS, err)
		}
		var nsArgs []string
		if so.NetNS != "" {
			nsArgs = append(nsArgs, "--net="+so.NetNS)
		}
		if so.MountNS != "" {
			nsArgs = append(nsArgs, "--mount="+so.MountNS)
		}
		cmd = exec.Command(nsenter, append(append(nsArgs, "--", path), args...)...)
	}
	cmd.Env = so.Env
	cmd.Dir = so.Dir
	cmd.ExtraFiles = so.ExtraFiles
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if so.Detach {
		// A session leader also leads its process group, so Stop still
		// signals exactly this process and what it forks.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	}
	p := &Process{Name: name, Path: path, Args: args, NetNS: so.NetNS, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	onSpawnerThread(func() { err = cmd.Start() })
	if err != nil {
		return nil, fmt.Errorf("starting %s (%s): %w", name, path, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id (also its process group id).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM to the process group, waits up to grace for the process
// to exit, then sends SIGKILL to the group. It only ever signals the group of
// this process, which the process leads.
func (p *Process) Stop(grace time.Duration) {
	pgid := p.cmd.Process.Pid
	select {
	case <-p.done:
		// The leader is gone; make sure nothing it forked into its group survives.
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		return
	default:
	}
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

// exitError describes how the process ended, with the tail of its log.
// keptLog says where the whole log stays ("" when the folder is removed).
func (p *Process) exitError(keptLog bool) error {
	what := "exited"
	if p.err != nil {
		what = p.err.Error()
	}
	return fmt.Errorf("%s %s; the end of its log%s:\n%s", p.Name, what, p.where(keptLog), tailFile(p.LogPath, 25))
}

func (p *Process) where(keptLog bool) string {
	if keptLog {
		return " (" + p.LogPath + ")"
	}
	return ""
}

// TailFile returns the last n lines of a file (at most 8 KiB), indented by
// four spaces, for error messages that show the end of a log.
func TailFile(path string, n int) string { return tailFile(path, n) }

// tailFile returns the last n lines of a file (at most 8 KiB).
func tailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	defer f.Close()
	const limit = 8 << 10
	st, err := f.Stat()
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	off := max(0, st.Size()-limit)
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return "(unreadable log: " + err.Error() + ")"
	}
	buf = bytes.TrimRight(buf, "\n")
	lines := bytes.Split(buf, []byte("\n"))
	if off > 0 && len(lines) > 1 {
		lines = lines[1:] // the first line is probably cut
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + string(bytes.Join(lines, []byte("\n    ")))
}
