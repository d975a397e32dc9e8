package extender

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// filterBody is a request as kube-scheduler sends it with nodeCacheCapable
// false: the pod and the full Nodes.
func filterBody(t testing.TB) []byte {
	return mustJSON(t, extenderv1.ExtenderArgs{Pod: zonePod(), Nodes: nodeList(testNodes()...)})
}

// postFilter sends body to addr's /filter and returns the code and answer.
func postFilter(t testing.TB, client *http.Client, url string, body []byte) (int, string) {
	t.Helper()
	resp, err := client.Post(url+"/filter", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestSlowClients plays slow-loris against the real server: 200 connections
// send a filter request's headers and stall before the body, 50 stall in
// the headers and 50 connect and say nothing. A legitimate request is still
// answered, and the server closes every stalled connection once its timeout
// passes.
func TestSlowClients(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the server's ReadTimeout (10s)")
	}
	base := runtime.NumGoroutine()
	addr := start(t, Config{})
	body := filterBody(t)
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	dial := func(prefix string) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if prefix != "" {
			if _, err := io.WriteString(c, prefix); err != nil {
				t.Fatal(err)
			}
		}
		conns = append(conns, c)
	}
	stalledAt := time.Now()
	for range 200 {
		dial(fmt.Sprintf("POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body)))
	}
	for range 50 {
		dial("POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
	}
	for range 50 {
		dial("")
	}
	time.Sleep(200 * time.Millisecond) // the server has read every stalled header

	client := &http.Client{Timeout: 5 * time.Second}
	for i := range 3 {
		t0 := time.Now()
		code, answer := postFilter(t, client, "http://"+addr, body)
		if code != http.StatusOK {
			t.Fatalf("a legitimate filter request among 300 stalled connections: %d %s", code, answer)
		}
		t.Logf("legitimate filter request %d with 300 stalled connections open: answered in %v", i, time.Since(t0))
	}
	client.CloseIdleConnections()

	// Every stalled connection is closed by the server (EOF, perhaps after
	// a 408 answer), not left open until the client gives up.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open int
	var lastClose time.Duration
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(stalledAt.Add(ReadTimeout + 5*time.Second))
			_, err := io.Copy(io.Discard, c)
			mu.Lock()
			defer mu.Unlock()
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				open++
				return
			}
			lastClose = max(lastClose, time.Since(stalledAt))
		}()
	}
	wg.Wait()
	if open > 0 {
		t.Fatalf("%d of %d stalled connections were still open %v after they stalled", open, len(conns), ReadTimeout+5*time.Second)
	}
	t.Logf("all %d stalled connections closed by the server; the last %v after they stalled", len(conns), lastClose.Round(time.Millisecond))
	// Their goroutines are gone too.
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base+20 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base+20 {
		t.Errorf("%d goroutines after the stalled connections closed, %d before the server started", n, base)
	}
}

// nodeNamesBody streams an ExtenderArgs of exactly size bytes whose
// NodeNames fill it, valid JSON throughout, without holding it in memory.
func nodeNamesBody(size int) io.Reader {
	const head, name, tail = `{"Pod":{"metadata":{"name":"big","namespace":"default"}},"NodeNames":[`, `"node-0000000000000000000000000000",`, `"x"]}`
	n := (size - len(head) - len(tail)) / len(name)
	pad := size - len(head) - len(tail) - n*len(name)
	return io.MultiReader(strings.NewReader(head), &repeatReader{s: name, n: n}, strings.NewReader(strings.Repeat(" ", pad)+tail))
}

type repeatReader struct {
	s   string
	n   int
	off int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	w := 0
	for w < len(p) && r.n > 0 {
		c := copy(p[w:], r.s[r.off:])
		w += c
		r.off += c
		if r.off == len(r.s) {
			r.off, r.n = 0, r.n-1
		}
	}
	if w == 0 {
		return 0, io.EOF
	}
	return w, nil
}

// rawPost sends a POST of body (size bytes; -1: chunked, without a
// Content-Length) to path on addr over its own connection, writing and
// reading at once (the server answers 413 before the body ends), and
// returns the answer.
func rawPost(t *testing.T, addr, path string, body io.Reader, size int) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	go func() {
		w := bufio.NewWriterSize(c, 64<<10)
		defer w.Flush()
		if size < 0 {
			fmt.Fprintf(w, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n", path)
			cw := httputil.NewChunkedWriter(w)
			_, _ = io.Copy(cw, body)
			_ = cw.Close()
			_, _ = io.WriteString(w, "\r\n")
			return
		}
		fmt.Fprintf(w, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, size)
		_, _ = io.Copy(w, body)
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// TestOversizedBody: a 60 MiB POST of valid JSON gets 413 with the limit and
// the flag, with a Content-Length (refused before reading) and chunked (read
// up to the limit), and the server allocates a bounded amount for it, not
// the body.
func TestOversizedBody(t *testing.T) {
	addr := start(t, Config{})
	const size = 60 << 20
	for _, tt := range []struct {
		name     string
		length   int
		maxAlloc uint64
	}{
		// Refused from the header: nothing like the body is allocated.
		{"Content-Length", size, 1 << 20},
		// Read until the limit into a buffer that doubles as it fills
		// (kube-scheduler always sends a Content-Length).
		{"chunked", -1, 5 * DefaultMaxRequestBytes},
	} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		resp, answer := rawPost(t, addr, "/filter", nodeNamesBody(size), tt.length)
		runtime.ReadMemStats(&after)
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(answer, strconv.Itoa(DefaultMaxRequestBytes)) || !strings.Contains(answer, "--max-request-bytes") {
			t.Fatalf("a %d MiB body (%s): %d %q; want 413 naming the limit and --max-request-bytes", size>>20, tt.name, resp.StatusCode, answer)
		}
		// Everything this process allocated meanwhile (the client streams
		// its body without holding it).
		alloc := after.TotalAlloc - before.TotalAlloc
		t.Logf("a %d MiB POST (%s): %d %q; allocated %.2f MiB while serving it, heap in use %.1f -> %.1f MiB",
			size>>20, tt.name, resp.StatusCode, strings.TrimSpace(answer), mib(alloc), mib(before.HeapInuse), mib(after.HeapInuse))
		if alloc > tt.maxAlloc {
			t.Errorf("serving a %d MiB body (%s) allocated %.1f MiB; want at most %.1f MiB", size>>20, tt.name, mib(alloc), mib(tt.maxAlloc))
		}
	}
	// A body just under the limit is read whole and answered.
	under := DefaultMaxRequestBytes - 1024
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	resp, answer := rawPost(t, addr, "/filter", nodeNamesBody(under), under)
	runtime.ReadMemStats(&after)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a body of %d bytes, under the limit: %d %q", under, resp.StatusCode, answer)
	}
	t.Logf("a %.1f MiB request of %d node names, answered %d: allocated %.1f MiB", mib(uint64(under)), under/36, resp.StatusCode, mib(after.TotalAlloc-before.TotalAlloc))
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// TestBrokenJSONOverHTTP: the real server answers a broken body with 400
// and says what is wrong, and the connection serves the next request.
func TestBrokenJSONOverHTTP(t *testing.T) {
	addr := start(t, Config{})
	client := &http.Client{Timeout: 5 * time.Second}
	for _, tt := range []struct{ body, want string }{
		{`{"Pod":{"metadata":{"name":"a"}},"NodeNames":["n1",`, "decoding ExtenderArgs (the JSON of k8s.io/kube-scheduler/extender/v1): unexpected end of JSON input"},
		{`{"Pod":{"spec":{"priority":"high"}},"NodeNames":[]}`, "cannot unmarshal string into Go struct field"},
		{`{"Pod":{},"NodeNames":[]} {}`, "invalid character '{' after top-level value"},
	} {
		code, answer := postFilter(t, client, "http://"+addr, []byte(tt.body))
		if code != http.StatusBadRequest || !strings.Contains(answer, tt.want) {
			t.Errorf("%s: %d %q; want 400 with %q", tt.body, code, answer, tt.want)
		}
	}
	if code, answer := postFilter(t, client, "http://"+addr, filterBody(t)); code != http.StatusOK {
		t.Errorf("a good request after bad ones: %d %s", code, answer)
	}
}

// blockingScheduler holds every Filter until release is closed.
type blockingScheduler struct {
	Scheduler
	entered chan struct{}
	release chan struct{}
}

func (b *blockingScheduler) Filter(ctx context.Context, pod *v1.Pod, nodes []*v1.Node) FilterResult {
	b.entered <- struct{}{}
	<-b.release
	return b.Scheduler.Filter(ctx, pod, nodes)
}

// TestInflightLimit: with every slot taken, a request waits InflightWait
// and gets 503 with Retry-After and a message naming the flag; once a slot
// frees, requests are answered again.
func TestInflightLimit(t *testing.T) {
	sched := &blockingScheduler{Scheduler: testScheduler(), entered: make(chan struct{}, 4), release: make(chan struct{})}
	addr := start(t, Config{Scheduler: sched, MaxRequestsInflight: 2})
	url := "http://" + addr
	body := filterBody(t)
	client := &http.Client{Timeout: 10 * time.Second}
	held := make(chan int, 2)
	for range 2 {
		go func() {
			resp, err := client.Post(url+"/filter", "application/json", bytes.NewReader(body))
			if err != nil {
				held <- 0
				return
			}
			resp.Body.Close()
			held <- resp.StatusCode
		}()
		<-sched.entered
	}
	resp, err := client.Post(url+"/filter", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" || !strings.Contains(string(answer), "--max-requests-inflight") {
		t.Errorf("a third request with 2 slots taken: %d Retry-After %q %q", resp.StatusCode, resp.Header.Get("Retry-After"), answer)
	}
	// /healthz needs no slot.
	if resp, err := client.Get(url + "/healthz"); err != nil || resp.StatusCode != 200 {
		t.Errorf("healthz with every slot taken: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	close(sched.release)
	for range 2 {
		if code := <-held; code != http.StatusOK {
			t.Errorf("a request that held a slot: %d", code)
		}
	}
	if code, answer := postFilter(t, client, url, body); code != http.StatusOK {
		t.Errorf("after the slots freed: %d %s", code, answer)
	}
}
