package direct

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestLogRequests: each request to the API server is logged at debug
// level with its method, path, query, status and duration, and the
// response is the server's.
func TestLogRequests(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot)
		w.Write([]byte("short and stout"))
	}))
	defer srv.Close()
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c := &http.Client{Transport: &logRequests{next: http.DefaultTransport, log: log, start: time.Now()}}
	resp, err := c.Get(srv.URL + "/api/v1/pods?limit=1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTeapot {
		t.Errorf("status %d, want the server's %d", resp.StatusCode, http.StatusTeapot)
	}
	got := buf.String()
	for _, want := range []string{`msg="API request"`, "method=GET", "path=/api/v1/pods", `query="limit=1"`, "status=418", "took="} {
		if !strings.Contains(got, want) {
			t.Errorf("the log %q lacks %q", got, want)
		}
	}
}
