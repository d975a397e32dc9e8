package schedtest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// TestHostileClients plays the slow and oversized callers against the real
// tabby-scheduler-extender binary that kube-scheduler uses here: 200
// connections that send a request's headers and stall, and a 60 MiB POST
// of valid JSON. The binary's resident memory stays bounded (its peak,
// VmHWM, from /proc), the POST gets 413, and kube-scheduler keeps placing
// pods meanwhile.
func TestHostileClients(t *testing.T) {
	cs := fixture(t)
	ns := namespace(t, cs, nil)
	addr := strings.TrimPrefix(extenderURL, "http://")
	hwm0, rss0 := memKiB(t, extender.Pid())

	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 200 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
		conns = append(conns, c)
	}

	const size = 60 << 20
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	go func() {
		w := bufio.NewWriterSize(c, 64<<10)
		fmt.Fprintf(w, "POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", size)
		io.WriteString(w, `{"Pod":{},"NodeNames":[`)
		name := []byte(`"node-0000000000000000000000000000",`)
		for n := 0; n < size/len(name); n++ {
			if _, err := w.Write(name); err != nil {
				return
			}
		}
		w.Flush()
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a 60 MiB POST: %d %s", resp.StatusCode, answer)
	}

	// kube-scheduler's own requests are answered meanwhile: a pod is placed
	// by its rules.
	t0 := time.Now()
	pod(t, cs, ns, "amid-attack", nil, nodeSelector(corev1.LabelTopologyZone, "b"))
	oneOf(t, "a pod with 200 stalled connections open", bound(t, cs, ns, "amid-attack"), "n3", "n4")
	placed := time.Since(t0)

	hwm1, rss1 := memKiB(t, extender.Pid())
	t.Logf("extender (pid %d): RSS %d -> %d KiB, peak RSS %d -> %d KiB; 60 MiB POST: %d %q; a pod placed in %v with 200 stalled connections open",
		extender.Pid(), rss0, rss1, hwm0, hwm1, resp.StatusCode, strings.TrimSpace(string(answer)), placed.Round(time.Millisecond))
	if grow := hwm1 - hwm0; grow > 32<<10 {
		t.Errorf("the extender's peak resident memory grew by %d KiB", grow)
	}
}

// memKiB reads a process's peak and current resident set from /proc.
func memKiB(t *testing.T, pid int) (hwm, rss int) {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "VmHWM:":
			hwm = v
		case "VmRSS:":
			rss = v
		}
	}
	return hwm, rss
}
