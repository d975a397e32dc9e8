package logging

import (
	"bytes"
	"encoding/json"
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
