package labtest

// Readers of the logs the chaos test counts from: the kubelets' (klog) and
// the tabbyd containers' (slog lines in CRI log files, followed while the
// test runs, since the kubelet deletes a removed container's log).

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// LogLine is one structured log line: slog's text format (tabbyd) or
// klog's (kubelet).
type LogLine struct {
	Time time.Time
	// Level is slog's (INFO, ...) or klog's letter (I, W, E, F).
	Level string
	Msg   string
	Attrs map[string]string
	// Node is the node whose process logged it.
	Node string
	Raw  string
}

var logAttr = regexp.MustCompile(`([A-Za-z0-9_.]+)=("(?:[^"\\]|\\.)*"|\S*)`)

// parseAttrs fills ll from the key=value pairs of s (values quoted as Go
// strings or bare).
func parseAttrs(ll *LogLine, s string) {
	for _, m := range logAttr.FindAllStringSubmatch(s, -1) {
		v := m[2]
		if strings.HasPrefix(v, `"`) {
			if u, err := strconv.Unquote(v); err == nil {
				v = u
			}
		}
		switch m[1] {
		case "time":
			if ll.Time.IsZero() {
				ll.Time, _ = time.Parse(time.RFC3339Nano, v)
			}
		case "level":
			if ll.Level == "" {
				ll.Level = v
			}
		case "msg":
			if ll.Msg == "" {
				ll.Msg = v
			}
		default:
			if _, dup := ll.Attrs[m[1]]; !dup {
				ll.Attrs[m[1]] = v
			}
		}
	}
}

// parseSlog parses one line of slog's text format ("" Msg when it is not
// one).
func parseSlog(line string) LogLine {
	ll := LogLine{Attrs: map[string]string{}, Raw: line}
	if strings.HasPrefix(line, "time=") {
		parseAttrs(&ll, line)
	}
	return ll
}

// klogHeader: Lmmdd hh:mm:ss.uuuuuu threadid file:line] msg
var klogHeader = regexp.MustCompile(`^([IWEF])(\d{4} \d{2}:\d{2}:\d{2}\.\d{6})\s+\d+ [^ \]]+\] (.*)$`)

// parseKlog parses one line of klog's text format, in the year of
// reference (klog writes none) and local time ("" Msg when it is not one;
// continuation lines of multi-line values are not).
func parseKlog(line string, reference time.Time) LogLine {
	ll := LogLine{Attrs: map[string]string{}, Raw: line}
	m := klogHeader.FindStringSubmatch(line)
	if m == nil {
		return ll
	}
	t, err := time.ParseInLocation("2006 0102 15:04:05.000000", strconv.Itoa(reference.Year())+" "+m[2], time.Local)
	if err != nil {
		return ll
	}
	if t.After(reference.Add(24 * time.Hour)) {
		t = t.AddDate(-1, 0, 0) // logged last year
	}
	ll.Time, ll.Level = t, m[1]
	rest := m[3]
	if strings.HasPrefix(rest, `"`) {
		if q, err := strconv.QuotedPrefix(rest); err == nil {
			ll.Msg, _ = strconv.Unquote(q)
			rest = rest[len(q):]
		}
	} else {
		ll.Msg, rest = rest, ""
	}
	parseAttrs(&ll, rest)
	return ll
}

// KubeletLog reads the klog lines of a node's kubelet log (over its
// restarts) for which keep returns true.
func (l *Lab) KubeletLog(t testing.TB, node string, keep func(LogLine) bool) []LogLine {
	t.Helper()
	n := l.Node(t, node)
	f, err := os.Open(filepath.Join(n.Dir, "kubelet.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	now := time.Now()
	var out []LogLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	for sc.Scan() {
		ll := parseKlog(sc.Text(), now)
		ll.Node = node
		if ll.Msg != "" && keep(ll) {
			out = append(out, ll)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// ContainerLogs follows the CRI log files of one container of a pod
// (the tabbyd container of tabby-node, ...) on every node of a lab, as the
// kubelet writes them under /var/log/pods (the node's fs/var-log-pods), in
// the background: the kubelet removes a container's log with the
// container, so that the logs of a tabbyd that was restarted are gone
// unless read while they exist. Files are held open from when they are
// first seen (a removed file can still be read to its end).
type ContainerLogs struct {
	globs []logGlob

	mu    sync.Mutex
	files map[string]*followed // by path and inode
	lines []LogLine

	stop chan struct{}
	done chan struct{}
}

type logGlob struct{ node, pattern string }

type followed struct {
	f       *os.File
	node    string
	path    string
	partial string // a line the runtime split ("P"), waiting for its end
	rest    []byte // bytes after the last newline
	seen    bool   // still in the glob at the last scan
}

// FollowContainerLogs starts following the logs of container in the pods
// of namespace whose names start with podPrefix, on every node.
func (l *Lab) FollowContainerLogs(t testing.TB, namespace, podPrefix, container string) *ContainerLogs {
	t.Helper()
	c := &ContainerLogs{files: map[string]*followed{}, stop: make(chan struct{}), done: make(chan struct{})}
	for _, n := range l.State.Nodes {
		c.globs = append(c.globs, logGlob{node: n.Name,
			pattern: filepath.Join(n.Dir, "fs", "var-log-pods", namespace+"_"+podPrefix+"*", container, "*.log")})
	}
	c.scan()
	go func() {
		defer close(c.done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-c.stop:
				c.scan()
				c.mu.Lock()
				for _, fl := range c.files {
					fl.f.Close()
				}
				c.mu.Unlock()
				return
			case <-tick.C:
				c.scan()
			}
		}
	}()
	t.Cleanup(c.Stop)
	return c
}

// Stop ends the following (after a last read); it may be called again.
func (c *ContainerLogs) Stop() {
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	<-c.done
}

func (c *ContainerLogs) scan() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, fl := range c.files {
		fl.seen = false
	}
	for _, g := range c.globs {
		paths, _ := filepath.Glob(g.pattern)
		for _, p := range paths {
			ino, err := nsInode(p)
			if err != nil {
				continue
			}
			key := p + "#" + strconv.FormatUint(ino, 10)
			fl := c.files[key]
			if fl == nil {
				f, err := os.Open(p)
				if err != nil {
					continue
				}
				fl = &followed{f: f, node: g.node, path: p}
				c.files[key] = fl
			}
			fl.seen = true
		}
	}
	for key, fl := range c.files {
		c.readLocked(fl)
		if !fl.seen {
			// Removed (or rotated): read to its end above, done.
			fl.f.Close()
			delete(c.files, key)
		}
	}
}

// readLocked reads what was appended to a followed file: lines of the CRI
// format "TIMESTAMP STREAM P|F TEXT".
func (c *ContainerLogs) readLocked(fl *followed) {
	data, err := io.ReadAll(fl.f)
	if err != nil || len(data) == 0 {
		return
	}
	data = append(fl.rest, data...)
	i := strings.LastIndexByte(string(data), '\n')
	if i < 0 {
		fl.rest = data
		return
	}
	fl.rest = slices.Clone(data[i+1:])
	for _, line := range strings.Split(string(data[:i]), "\n") {
		parts := strings.SplitN(line, " ", 4)
		if len(parts) < 4 {
			continue
		}
		if parts[2] == "P" {
			fl.partial += parts[3]
			continue
		}
		text := fl.partial + parts[3]
		fl.partial = ""
		ll := parseSlog(text)
		ll.Node = fl.node
		if ll.Msg == "" {
			continue
		}
		c.lines = append(c.lines, ll)
	}
}

// Lines returns the lines read so far for which keep returns true, in
// time order.
func (c *ContainerLogs) Lines(keep func(LogLine) bool) []LogLine {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []LogLine
	for _, ll := range c.lines {
		if keep(ll) {
			out = append(out, ll)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time.Before(out[j].Time) })
	return out
}

// WriteTo writes every line read so far, by node, into dir.
func (c *ContainerLogs) WriteTo(dir, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	by := map[string][]string{}
	for _, ll := range c.lines {
		by[ll.Node] = append(by[ll.Node], ll.Raw)
	}
	for node, lines := range by {
		if err := os.WriteFile(filepath.Join(dir, node+"_"+name+".log"), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// percentile of sorted durations (nearest rank).
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p/100*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
