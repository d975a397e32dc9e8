package labtest

// Helpers of the IPAM chaos test (chaos_test.go) on the lab's real nodes:
//
//   - CNIKiller kills CNI plugins in the middle of ADD: containerd execs
//     them (libcni, as a child of the node's containerd), and the kernel's
//     process connector reports every exec at once;
//   - AddressMonitor checks continuously, from the API server and from the
//     kernel (the eth0 of every pod sandbox, found through the pod cgroups
//     under each node's cgroup root), that no address is held by two
//     running pods;
//   - readers of what the kubelets (klog) and the tabbyd containers (CRI
//     log files, followed while the test runs: the kubelet removes them with
//     their container) logged.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tabbynet/tabby/lab"
)

// procStat is a process's parent and start time (fields 4 and 22 of
// /proc/PID/stat); start is 0 when it is gone (or a zombie).
func procStat(pid int) (ppid int, start uint64) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0
	}
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, 0
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return 0, 0
	}
	ppid, _ = strconv.Atoi(f[1])
	start, _ = strconv.ParseUint(f[19], 10, 64)
	return ppid, start
}

func procStart(pid int) uint64 {
	_, start := procStat(pid)
	return start
}

// KillProc sends SIGKILL to a process the lab found (if it is still that
// process) and waits until it is gone.
func KillProc(p lab.Proc) error {
	if !p.Alive() {
		return nil
	}
	if err := syscall.Kill(p.Pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing %s (pid %d): %w", p.Name, p.Pid, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.Alive() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s (pid %d) survives SIGKILL", p.Name, p.Pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

func children(pid int) []int {
	files, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	var out []int
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, s := range strings.Fields(string(data)) {
			if c, err := strconv.Atoi(s); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

func comm(pid int) string {
	data, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return strings.TrimSpace(string(data))
}

// environ is a process's environment as a map.
func environ(pid int) map[string]string {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return nil
	}
	env := map[string]string{}
	for _, kv := range strings.Split(string(data), "\x00") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return env
}

// procEvents reports the machine's exec and exit events through the
// kernel's process connector (netlink, NETLINK_CONNECTOR, CN_IDX_PROC),
// which needs CAP_NET_ADMIN.
type procEvents struct{ fd int }

// Process connector constants (linux/connector.h, linux/cn_proc.h).
const (
	cnIdxProc         = 1
	cnValProc         = 1
	procCNMcastListen = 1
	procEventExec     = 0x00000002
	procEventExit     = 0x80000000
)

func openProcEvents() (*procEvents, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_CONNECTOR)
	if err != nil {
		return nil, err
	}
	pe := &procEvents{fd: fd}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: cnIdxProc}); err != nil {
		pe.close()
		return nil, err
	}
	// A busy machine execs a lot: room for bursts, and a timeout so that
	// the reader sees Stop.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100000})
	// nlmsghdr (16) + cn_msg (20) + the operation (4).
	msg := make([]byte, 40)
	binary.NativeEndian.PutUint32(msg[0:], 40)
	binary.NativeEndian.PutUint16(msg[4:], unix.NLMSG_DONE)
	binary.NativeEndian.PutUint32(msg[12:], uint32(os.Getpid()))
	binary.NativeEndian.PutUint32(msg[16:], cnIdxProc)
	binary.NativeEndian.PutUint32(msg[20:], cnValProc)
	binary.NativeEndian.PutUint16(msg[32:], 4)
	binary.NativeEndian.PutUint32(msg[36:], procCNMcastListen)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		pe.close()
		return nil, err
	}
	return pe, nil
}

func (pe *procEvents) close() { _ = unix.Close(pe.fd) }

// procEvent is an exec (the pid runs a new program) or the exit of a
// process (its main thread).
type procEvent struct {
	exec bool
	pid  int
}

// read returns the events of one datagram (none on timeout); lost counts
// datagrams the kernel dropped (ENOBUFS).
func (pe *procEvents) read(buf []byte) (evs []procEvent, lost bool, err error) {
	n, _, err := unix.Recvfrom(pe.fd, buf, 0)
	switch {
	case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR):
		return nil, false, nil
	case errors.Is(err, unix.ENOBUFS):
		return nil, true, nil
	case err != nil:
		return nil, false, err
	}
	for off := 0; off+16 <= n; {
		l := int(binary.NativeEndian.Uint32(buf[off:]))
		if l < 16 || off+l > n {
			break
		}
		d := buf[off+16 : off+l]
		off += (l + 3) &^ 3
		// cn_msg (20), then proc_event: what (4), cpu (4), timestamp (8),
		// then the event: process_pid, process_tgid, ...
		if len(d) < 20+16+8 {
			continue
		}
		what := binary.NativeEndian.Uint32(d[20:])
		pid := int(binary.NativeEndian.Uint32(d[36:]))
		tgid := int(binary.NativeEndian.Uint32(d[40:]))
		switch {
		case what == procEventExec:
			evs = append(evs, procEvent{exec: true, pid: tgid})
		case what == procEventExit && pid == tgid:
			evs = append(evs, procEvent{pid: pid})
		}
	}
	return evs, false, nil
}

// CNIAdd is one CNI ADD the killer saw: a tabby plugin that containerd
// ran with CNI_COMMAND=ADD.
type CNIAdd struct {
	Pid       int
	Node, Pod string
	// Start: exec'd; End: exited (zero when the killer stopped first).
	Start, End time.Time
	Killed     bool
}

// CNIKill is one CNI plugin process killed in the middle of ADD.
type CNIKill struct {
	At  time.Time
	Pid int
	// Binary is tabby, or tabby-ipam when tabby had handed the command
	// over (re-exec'd itself: tabbyd's agent was not there).
	Binary    string
	Node, Pod string
	// Age is how long the ADD had run.
	Age time.Duration
}

// CNIKiller SIGKILLs CNI plugin processes that run ADD for the pods of
// one namespace, a random time after they start, as a node that loses a
// runtime's child in the middle of its work would. The plugins are the
// children of the nodes' containerd (libcni execs /opt/cni/bin/tabby, in
// the node's namespaces); their environment (CNI_COMMAND, CNI_ARGS) says
// what they do and for which pod.
type CNIKiller struct {
	l         *Lab
	namespace string
	prob      float64
	maxDelay  time.Duration
	// Mode is how it finds the plugins: "process connector" (exec events
	// from the kernel) or "polling" (containerd's children every 5 ms,
	// where the connector is not available).
	Mode string

	mu         sync.Mutex
	rng        *rand.Rand
	runtimes   map[int]string // containerd pid -> node
	procs      map[[2]uint64]*cniProc
	byPid      map[int]*cniProc
	kills      []CNIKill
	adds       []*cniProc
	paused     bool
	lostEvents int

	pe   *procEvents
	stop chan struct{}
	wg   sync.WaitGroup
}

type cniProc struct {
	CNIAdd
	start  uint64
	binary string
	gone   bool
}

// StartCNIKiller starts killing the ADDs of the lab's CNI plugins for the
// pods of namespace: each one with probability prob, after a delay drawn
// uniformly from [0, maxDelay). Stop ends it.
func (l *Lab) StartCNIKiller(namespace string, prob float64, maxDelay time.Duration, seed uint64) *CNIKiller {
	k := &CNIKiller{l: l, namespace: namespace, prob: prob, maxDelay: maxDelay, rng: rand.New(rand.NewPCG(seed, 7)),
		runtimes: map[int]string{}, procs: map[[2]uint64]*cniProc{}, byPid: map[int]*cniProc{}, stop: make(chan struct{})}
	k.refreshRuntimes()
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		t := time.NewTicker(300 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-k.stop:
				return
			case <-t.C:
				k.refreshRuntimes()
			}
		}
	}()
	var err error
	if k.pe, err = openProcEvents(); err == nil {
		k.Mode = "process connector"
		k.wg.Add(1)
		go k.listen()
	} else {
		k.Mode = "polling (the process connector: " + err.Error() + ")"
		k.wg.Add(1)
		go k.poll()
	}
	return k
}

// refreshRuntimes re-reads the nodes' containerd processes (a restart
// changes them).
func (k *CNIKiller) refreshRuntimes() {
	st, err := lab.Load(k.l.Dir)
	if err != nil {
		return
	}
	rt := map[int]string{}
	for _, n := range st.Nodes {
		if n.Containerd.Alive() {
			rt[n.Containerd.Pid] = n.Name
		}
	}
	k.mu.Lock()
	k.runtimes = rt
	k.mu.Unlock()
}

// Pause stops (or resumes) the killing; ADDs are still counted.
func (k *CNIKiller) Pause(p bool) {
	k.mu.Lock()
	k.paused = p
	k.mu.Unlock()
}

// CNIKillerReport is what a CNIKiller saw and did.
type CNIKillerReport struct {
	Mode  string
	Adds  []CNIAdd
	Kills []CNIKill
	// LostEvents counts datagrams of exec/exit events the kernel dropped.
	LostEvents int
}

// Stop ends the killer and returns what it saw and killed.
func (k *CNIKiller) Stop() CNIKillerReport {
	select {
	case <-k.stop:
	default:
		close(k.stop)
	}
	k.wg.Wait()
	if k.pe != nil {
		k.pe.close()
		k.pe = nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	r := CNIKillerReport{Mode: k.Mode, Kills: slices.Clone(k.kills), LostEvents: k.lostEvents}
	for _, a := range k.adds {
		r.Adds = append(r.Adds, a.CNIAdd)
	}
	return r
}

// listen follows exec and exit events.
func (k *CNIKiller) listen() {
	defer k.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		select {
		case <-k.stop:
			return
		default:
		}
		evs, lost, err := k.pe.read(buf)
		if err != nil {
			return
		}
		if lost {
			k.mu.Lock()
			k.lostEvents++
			k.mu.Unlock()
		}
		for _, ev := range evs {
			if ev.exec {
				k.seen(ev.pid, time.Now())
			} else {
				k.exited(ev.pid, time.Now())
			}
		}
	}
}

// poll looks at containerd's children every 5 ms.
func (k *CNIKiller) poll() {
	defer k.wg.Done()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-k.stop:
			return
		case <-tick.C:
		}
		now := time.Now()
		k.mu.Lock()
		rts := slices.Collect(maps.Keys(k.runtimes))
		k.mu.Unlock()
		live := map[int]bool{}
		for _, rt := range rts {
			for _, c := range children(rt) {
				live[c] = true
				k.seen(c, now)
			}
		}
		k.mu.Lock()
		var ended []int
		for pid, p := range k.byPid {
			if !p.gone && (!live[pid] || procStart(pid) != p.start) {
				ended = append(ended, pid)
			}
		}
		k.mu.Unlock()
		for _, pid := range ended {
			k.exited(pid, now)
		}
	}
}

// seen looks at a process that exec'd (or that polling found): a tabby
// plugin that a node's containerd runs for ADD is counted, and maybe
// killed.
func (k *CNIKiller) seen(pid int, now time.Time) {
	bin := comm(pid)
	if bin != "tabby" && bin != "tabby-ipam" {
		return
	}
	ppid, start := procStat(pid)
	if start == 0 {
		return
	}
	key := [2]uint64{uint64(pid), start}
	k.mu.Lock()
	node, ours := k.runtimes[ppid]
	_, known := k.procs[key]
	k.mu.Unlock()
	if !ours || known {
		return // not the lab's, or tabby that re-exec'd itself as tabby-ipam
	}
	env := environ(pid)
	if env["CNI_COMMAND"] != "ADD" {
		return
	}
	p := &cniProc{CNIAdd: CNIAdd{Pid: pid, Node: node, Start: now}, start: start, binary: bin}
	namespace := ""
	for _, a := range strings.Split(env["CNI_ARGS"], ";") {
		if v, ok := strings.CutPrefix(a, "K8S_POD_NAME="); ok {
			p.Pod = v
		}
		if v, ok := strings.CutPrefix(a, "K8S_POD_NAMESPACE="); ok {
			namespace = v
		}
	}
	if namespace != k.namespace {
		return
	}
	k.mu.Lock()
	k.procs[key] = p
	k.byPid[pid] = p
	k.adds = append(k.adds, p)
	kill := !k.paused && k.rng.Float64() < k.prob
	delay := time.Duration(k.rng.Int64N(int64(k.maxDelay)))
	k.mu.Unlock()
	if kill {
		k.wg.Add(1)
		go func() {
			defer k.wg.Done()
			k.killLater(p, delay)
		}()
	}
}

func (k *CNIKiller) exited(pid int, now time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.byPid[pid]
	if p == nil || p.gone {
		return
	}
	p.gone, p.End = true, now
	delete(k.byPid, pid)
}

func (k *CNIKiller) killLater(p *cniProc, delay time.Duration) {
	select {
	case <-k.stop:
		return
	case <-time.After(delay):
	}
	// Still the same process, still the plugin (tabby may have exec'd
	// tabby-ipam: same pid, same start time).
	if procStart(p.Pid) != p.start {
		return
	}
	bin := comm(p.Pid)
	if bin != "tabby" && bin != "tabby-ipam" {
		return
	}
	if syscall.Kill(p.Pid, syscall.SIGKILL) != nil {
		return
	}
	k.mu.Lock()
	p.Killed = true
	k.kills = append(k.kills, CNIKill{At: time.Now(), Pid: p.Pid, Binary: bin, Node: p.Node, Pod: p.Pod, Age: time.Since(p.Start)})
	k.mu.Unlock()
}
