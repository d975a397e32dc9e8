package lab

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tabbynet/tabby/internal/controlplane"
)

// Proc is a process the lab started, known by pid and start time so that a
// recycled pid is never taken for it.
type Proc struct {
	Name string `json:"name"`
	Pid  int    `json:"pid"`
	// Start is the process's start time in clock ticks since boot (field
	// 22 of /proc/PID/stat).
	Start uint64 `json:"start"`
	Log   string `json:"log,omitempty"`
}

// statFields reads /proc/PID/stat from field 3 (the state) on: f[0] is
// the state, f[1] the parent's pid, f[19] the start time.
func statFields(pid int) ([]string, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	// The command name (field 2) is in parentheses and may hold anything.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 {
		return nil, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	return f, nil
}

// procStat reads a process's state letter and start time.
func procStat(pid int) (state byte, start uint64, err error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, 0, err
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return f[0][0], start, err
}

// procOf describes the running process pid.
func procOf(name string, pid int) (Proc, error) {
	_, start, err := procStat(pid)
	if err != nil {
		return Proc{}, err
	}
	return Proc{Name: name, Pid: pid, Start: start}, nil
}

// Alive reports whether the process is still running (a zombie is not).
func (p Proc) Alive() bool {
	if p.Pid <= 0 {
		return false
	}
	state, start, err := procStat(p.Pid)
	return err == nil && start == p.Start && state != 'Z' && state != 'X'
}

// signal sends sig to the process if it is still the one recorded.
func (p Proc) signal(sig syscall.Signal) {
	if p.Alive() {
		_ = syscall.Kill(p.Pid, sig)
	}
}

// signalGroup sends sig to the process group the process leads, if it is
// still the one recorded and leads its group.
func (p Proc) signalGroup(sig syscall.Signal) {
	if !p.Alive() {
		return
	}
	if pg, err := syscall.Getpgid(p.Pid); err == nil && pg == p.Pid {
		_ = syscall.Kill(-p.Pid, sig)
		return
	}
	_ = syscall.Kill(p.Pid, sig)
}

// stopProcs sends SIGTERM to every process (to its group with groups),
// waits up to grace for them to end, then sends SIGKILL to the rest and
// waits a little more. It returns those still alive.
func stopProcs(procs []Proc, grace time.Duration, groups bool) []Proc {
	send := func(p Proc, sig syscall.Signal) {
		if groups {
			p.signalGroup(sig)
		} else {
			p.signal(sig)
		}
	}
	for _, p := range procs {
		send(p, syscall.SIGTERM)
	}
	alive := waitGone(procs, grace)
	for _, p := range alive {
		send(p, syscall.SIGKILL)
	}
	return waitGone(alive, 5*time.Second)
}

// waitGone waits up to d for the processes to end and returns those alive.
func waitGone(procs []Proc, d time.Duration) []Proc {
	deadline := time.Now().Add(d)
	for {
		var alive []Proc
		for _, p := range procs {
			if p.Alive() {
				alive = append(alive, p)
			}
		}
		if len(alive) == 0 || time.Now().After(deadline) {
			return alive
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// procSpec says how to start a detached process.
type procSpec struct {
	name string
	// netns is the path of the network namespace to run in ("" for this
	// program's): the process is started with nsenter --net=PATH, which
	// execs it (same pid) without the remount of /sys that ip netns exec
	// does.
	netns string
	// mountns is the path of the mount namespace to run in ("": this
	// program's), entered with nsenter --mount too.
	mountns string
	path    string
	args    []string
	// env is the environment (nil: this program's).
	env []string
	dir string
	// log receives stdout and stderr (appended).
	log string
	// extraFiles become fds 3, 4, ... of the process.
	extraFiles []*os.File
}

// startDetached starts a process that outlives this program: it leads a
// session of its own and has no death signal. done is closed when it exits
// while this program runs (this program reaps it).
func startDetached(s procSpec) (p Proc, done <-chan struct{}, err error) {
	if err := os.MkdirAll(filepath.Dir(s.log), 0o755); err != nil {
		return Proc{}, nil, err
	}
	cp, err := controlplane.Spawn(s.name, s.path, s.log, controlplane.SpawnOptions{
		NetNS: s.netns, MountNS: s.mountns, Detach: true, Env: s.env, Dir: s.dir, ExtraFiles: s.extraFiles,
	}, s.args...)
	if err != nil {
		return Proc{}, nil, err
	}
	p, err = procOf(s.name, cp.Pid())
	if err != nil {
		// It exited at once; what it said is in its log.
		<-cp.Done()
		return Proc{}, nil, fmt.Errorf("%s exited at once; the end of its log (%s):\n%s", s.name, s.log, controlplane.TailFile(s.log, 15))
	}
	p.Log = s.log
	return p, cp.Done(), nil
}

// netnsInode is the inode of a network namespace file (/run/netns/NAME or
// /proc/PID/ns/net): two files name one namespace when their inodes match.
func netnsInode(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// procsInNetNS lists the processes whose network namespace is one of
// inodes, except this program.
func procsInNetNS(inodes map[uint64]bool) []Proc {
	var out []Proc
	forEachProc(func(pid int) {
		link, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/net")
		if err != nil {
			return
		}
		// net:[4026532290]
		ino, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(link, "net:["), "]"), 10, 64)
		if err != nil || !inodes[ino] {
			return
		}
		if p, err := procOf(comm(pid), pid); err == nil {
			out = append(out, p)
		}
	})
	return out
}

// procsByArgs lists the processes whose arguments (argv without argv[0])
// match, except this program.
func procsByArgs(match func(args []string) bool) []Proc {
	var out []Proc
	forEachProc(func(pid int) {
		data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil || len(data) == 0 {
			return
		}
		argv := strings.Split(strings.TrimSuffix(string(data), "\x00"), "\x00")
		if !match(argv[1:]) {
			return
		}
		if p, err := procOf(comm(pid), pid); err == nil {
			out = append(out, p)
		}
	})
	return out
}

func forEachProc(f func(pid int)) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		f(pid)
	}
}

// describeProc says who process pid is, to tell apart processes of one
// name: its pid, parent, start (clock ticks since boot), cgroup and
// arguments, as far as they can be read.
func describeProc(pid int) string {
	ps := "/proc/" + strconv.Itoa(pid)
	desc := "pid " + strconv.Itoa(pid)
	if f, err := statFields(pid); err == nil {
		ppid, _ := strconv.Atoi(f[1])
		desc += fmt.Sprintf(" (state %s, parent %d %s, start %s)", f[0], ppid, comm(ppid), f[19])
	}
	if data, err := os.ReadFile(ps + "/cgroup"); err == nil {
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		desc += " cgroup " + strings.TrimPrefix(lines[len(lines)-1], "0::")
	}
	if data, err := os.ReadFile(ps + "/cmdline"); err == nil {
		desc += ": " + strings.TrimSpace(strings.ReplaceAll(string(data), "\x00", " "))
	}
	return desc
}

func comm(pid int) string {
	data, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return strings.TrimSpace(string(data))
}

// nsenterPath finds nsenter (util-linux).
func nsenterPath() (string, error) {
	p, err := exec.LookPath("nsenter")
	if err != nil {
		return "", fmt.Errorf("nsenter is missing: %w (install util-linux)", err)
	}
	return p, nil
}
