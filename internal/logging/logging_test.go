package logging

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

// TestFlags: the flags build a logger of the asked level and format, klog
// writes through it, and a bad value names the flag and the choices.
func TestFlags(t *testing.T) {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	f := AddFlags(fs)
	if err := fs.Parse([]string{"--log-format=json", "--log-level=WARN"}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	log, err := f.Logger(&buf)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hidden")
	log.Warn("shown", "k", 1)
	klog.ErrorS(nil, "from klog", "reflector", "r")
	klog.Flush()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2 (warn and klog's error):\n%s", len(lines), buf.String())
	}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Errorf("%q is not JSON: %v", l, err)
		}
	}
	for _, tc := range []struct{ level, format, want string }{
		{"loud", "json", `--log-level: log level "loud" is not known: use debug, info, warn or error`},
		{"info", "logfmt", `--log-format: log format "logfmt" is not known: use text or json`},
		{"info", "", `--log-format: log format "" is not known`},
	} {
		_, err := (&Flags{Level: tc.level, Format: tc.format}).Logger(&buf)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("level %q format %q: error %v, want %q", tc.level, tc.format, err, tc.want)
		}
	}
}

// TestClientContext: client-go's lines made with the context land in the
// given logger, not klog's global one; an error that is the context's end
// comes out at debug level (dropped at info), any other stays an error.
func TestClientContext(t *testing.T) {
	var global bytes.Buffer
	klog.SetSlogLogger(slog.New(slog.NewTextHandler(&global, nil)))
	t.Cleanup(klog.ClearLogger)
	for _, lvl := range []slog.Level{slog.LevelDebug, slog.LevelInfo} {
		var buf bytes.Buffer
		ctx := ClientContext(context.Background(), slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: lvl})).With("component", "c"))
		logger := klog.FromContext(ctx)
		logger.Error(fmt.Errorf("reading the body: %w", context.Canceled), "Unexpected error when reading response body")
		logger.Error(errors.New("connection refused"), "Request failed")
		logger.V(2).Info("chatter")
		out := buf.String()
		wantEnded := lvl == slog.LevelDebug
		if got := strings.Contains(out, `level=DEBUG msg="Unexpected error when reading response body"`); got != wantEnded {
			t.Errorf("level %s: the cancelled call's line at debug: %v, want %v:\n%s", lvl, got, wantEnded, out)
		}
		if strings.Contains(out, "level=ERROR msg=\"Unexpected") {
			t.Errorf("level %s: the cancelled call logged an error:\n%s", lvl, out)
		}
		if !strings.Contains(out, `level=ERROR msg="Request failed"`) || !strings.Contains(out, "component=c") {
			t.Errorf("level %s: a real error is not an error line of the given logger:\n%s", lvl, out)
		}
	}
	if global.Len() != 0 {
		t.Errorf("klog's global logger got lines:\n%s", global.String())
	}
}
