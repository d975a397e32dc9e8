package extender

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	v1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// TestKeepAlive: kube-scheduler's HTTPExtender.send (v1.35) decodes the
// answer with json.NewDecoder(resp.Body).Decode and closes the body without
// reading on, so its connection is kept only when the body is at EOF once
// the JSON value is read. A chunked answer (any over the server's 4 KiB
// buffer, without a Content-Length) never is: each such request cost a new
// TCP connection. Filter and prioritize over 500 nodes, as the throughput
// benchmark sends them, must all use one connection.
func TestKeepAlive(t *testing.T) {
	var nodes []*v1.Node
	names := []string{}
	for i := range 500 {
		n := node(fmt.Sprintf("node-%03d", i), map[string]string{"zone": []string{"a", "b", "c"}[i%3]})
		nodes = append(nodes, n)
		names = append(names, n.Name)
	}
	cache := mapCache{}
	for _, n := range nodes {
		cache[n.Name] = n
	}
	mux := http.NewServeMux()
	(&Handler{Scheduler: testScheduler(), Nodes: cache}).Register(mux)
	srv := httptest.NewUnstartedServer(mux)
	var conns atomic.Int32
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	// send is HTTPExtender.send, line for line.
	send := func(action string, args, result any) {
		t.Helper()
		out, err := json.Marshal(args)
		if err != nil {
			t.Fatal(err)
		}
		req, err := http.NewRequest("POST", srv.URL+"/"+action, bytes.NewReader(out))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: code %d", action, resp.StatusCode)
		}
		if err := json.NewDecoder(resp.Body).Decode(result); err != nil {
			t.Fatal(err)
		}
	}
	for range 20 {
		var fr extenderv1.ExtenderFilterResult
		send("filter", extenderv1.ExtenderArgs{Pod: zonePod(), NodeNames: &names}, &fr)
		if fr.NodeNames == nil || len(*fr.NodeNames) != 334 {
			t.Fatalf("filter passed %v nodes, want the 334 in zones a and b", fr.NodeNames)
		}
		var hp extenderv1.HostPriorityList
		send("prioritize", extenderv1.ExtenderArgs{Pod: zonePod(), NodeNames: fr.NodeNames}, &hp)
		if len(hp) != 334 {
			t.Fatalf("prioritize scored %d nodes, want 334", len(hp))
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("40 requests used %d connections, want 1", n)
	}
}
