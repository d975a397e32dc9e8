package plugin

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"k8s.io/klog/v2"
)

func TestLoadConfigDefaults(t *testing.T) {
	defer func(h func() (string, error)) { hostname = h }(hostname)
	hostname = func() (string, error) { return "Worker-7", nil }

	c, err := LoadConfig([]byte(`{"cniVersion":"1.1.0","name":"k8s-pod-network","type":"tabby","kubeconfig":"/etc/cni/net.d/tabby-kubeconfig","mtu":0,"ipam":{"type":"tabby-ipam"}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Name: "k8s-pod-network", CNIVersion: "1.1.0", Kubeconfig: "/etc/cni/net.d/tabby-kubeconfig",
		NodeName: "worker-7", MTU: 0, Timeout: DefaultTimeout, LockFile: "/var/run/tabby/ipam-worker-7.lock",
		IPAMType: "tabby-ipam", IPv4: true, IPv6: false,
	}
	if c.Name != want.Name || c.CNIVersion != want.CNIVersion || c.Kubeconfig != want.Kubeconfig || c.NodeName != want.NodeName ||
		c.MTU != want.MTU || c.Timeout != want.Timeout || c.LockFile != want.LockFile || c.IPAMType != want.IPAMType ||
		c.IPv4 != want.IPv4 || c.IPv6 != want.IPv6 || c.LogLevel != "" ||
		c.PolicyWaitTimeout != DefaultPolicyWaitTimeout || c.PolicyWaitRequired {
		t.Errorf("got %+v\nwant %+v", *c, want)
	}
	if !c.TabbyIPAM() {
		t.Error("tabby-ipam should be served in-process")
	}
	if got := c.HandleID("abc123"); got != "k8s-pod-network.abc123" {
		t.Errorf("HandleID = %q", got)
	}
}

func TestLoadConfigKeys(t *testing.T) {
	for _, tc := range []struct {
		name  string
		conf  string
		check func(t *testing.T, c *Config)
	}{
		{"explicit node and mtu", `{"cniVersion":"1.0.0","name":"n","nodename":"node1","mtu":1400,"ipam":{"type":"tabby-ipam"}}`, func(t *testing.T, c *Config) {
			if c.NodeName != "node1" || c.MTU != 1400 || c.LockFile != "/var/run/tabby/ipam-node1.lock" {
				t.Errorf("%+v", c)
			}
		}},
		{"policy wait", `{"cniVersion":"1.1.0","name":"n","nodename":"a","policyWaitTimeout":"2.5s","policyWaitRequired":true,"ipam":{"type":"tabby-ipam"}}`, func(t *testing.T, c *Config) {
			if c.PolicyWaitTimeout != 2500*time.Millisecond || !c.PolicyWaitRequired {
				t.Errorf("%+v", c)
			}
		}},
		{"no policy wait", `{"cniVersion":"1.1.0","name":"n","nodename":"a","policyWaitTimeout":"0s","ipam":{"type":"tabby-ipam"}}`, func(t *testing.T, c *Config) {
			if c.PolicyWaitTimeout != 0 {
				t.Errorf("%+v", c)
			}
		}},
		{"dual stack", `{"cniVersion":"1.1.0","name":"n","nodename":"a","ipam":{"type":"tabby-ipam","assignIPv4":true,"assignIPv6":true}}`, func(t *testing.T, c *Config) {
			if !c.IPv4 || !c.IPv6 {
				t.Errorf("%+v", c)
			}
		}},
		{"v6 only", `{"cniVersion":"1.1.0","name":"n","nodename":"a","ipam":{"type":"tabby-ipam","assignIPv4":false,"assignIPv6":true}}`, func(t *testing.T, c *Config) {
			if c.IPv4 || !c.IPv6 {
				t.Errorf("%+v", c)
			}
		}},
		{"ipam section overrides", `{"cniVersion":"1.0.0","name":"n","nodename":"top","kubeconfig":"/top","timeout":"5s","ipam":{"type":"tabby-ipam","nodename":"inner","kubeconfig":"/inner","timeout":"2s","lockFile":"/tmp/l","logLevel":"DEBUG","ipv4Pools":["p1"]}}`, func(t *testing.T, c *Config) {
			if c.NodeName != "inner" || c.Kubeconfig != "/inner" || c.Timeout != 2*time.Second || c.LockFile != "/tmp/l" || c.LogLevel != "debug" || len(c.IPv4Pools) != 1 {
				t.Errorf("%+v", c)
			}
		}},
		{"delegated ipam", `{"cniVersion":"0.3.1","name":"n","nodename":"a","ipam":{"type":"host-local","subnet":"10.1.0.0/24"}}`, func(t *testing.T, c *Config) {
			if c.TabbyIPAM() || c.IPAMType != "host-local" {
				t.Errorf("%+v", c)
			}
		}},
		{"gc attachments", `{"cniVersion":"1.1.0","name":"n","nodename":"a","ipam":{"type":"tabby-ipam"},"cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"}]}`, func(t *testing.T, c *Config) {
			if len(c.ValidAttachments) != 1 || c.ValidAttachments[0].ContainerID != "c1" {
				t.Errorf("%+v", c.ValidAttachments)
			}
		}},
		{"agent socket default", `{"cniVersion":"1.1.0","name":"n","nodename":"a","ipam":{"type":"tabby-ipam"}}`, func(t *testing.T, c *Config) {
			if c.AgentSocket != "/var/run/tabby/cni.sock" {
				t.Errorf("agentSocket %q", c.AgentSocket)
			}
		}},
		{"agent socket off", `{"cniVersion":"1.1.0","name":"n","nodename":"a","agentSocket":"","ipam":{"type":"tabby-ipam"}}`, func(t *testing.T, c *Config) {
			if c.AgentSocket != "" {
				t.Errorf("agentSocket %q", c.AgentSocket)
			}
		}},
		{"agent socket in ipam wins", `{"cniVersion":"1.1.0","name":"n","nodename":"a","agentSocket":"/top.sock","ipam":{"type":"tabby-ipam","agentSocket":"/inner.sock"}}`, func(t *testing.T, c *Config) {
			if c.AgentSocket != "/inner.sock" {
				t.Errorf("agentSocket %q", c.AgentSocket)
			}
		}},
		{"prev result", `{"cniVersion":"1.0.0","name":"n","nodename":"a","ipam":{"type":"tabby-ipam"},"prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.1/32"}]}}`, func(t *testing.T, c *Config) {
			if c.PrevResult == nil {
				t.Error("no prevResult")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := LoadConfig([]byte(tc.conf))
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

func TestLoadConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, conf, msg string
		code            uint
	}{
		{"not json", `{"name":`, "not valid JSON", types.ErrDecodingFailure},
		{"mtu not a number", `{"name":"n","nodename":"a","mtu":"big","ipam":{"type":"tabby-ipam"}}`, "NetConf.mtu of type int", types.ErrDecodingFailure},
		{"mtu too big", `{"name":"n","nodename":"a","mtu":70000,"ipam":{"type":"tabby-ipam"}}`, "mtu 70000 is out of range", types.ErrInvalidNetworkConfig},
		{"mtu too small for v6", `{"name":"n","nodename":"a","mtu":1000,"ipam":{"type":"tabby-ipam","assignIPv6":true}}`, "too small for IPv6", types.ErrInvalidNetworkConfig},
		{"no name", `{"nodename":"a","ipam":{"type":"tabby-ipam"}}`, "no \"name\"", types.ErrInvalidNetworkConfig},
		{"name of a spare handle", `{"name":"_spare","nodename":"a","ipam":{"type":"tabby-ipam"}}`, "network name \"_spare\" is not valid", types.ErrInvalidNetworkConfig},
		{"name with a slash", `{"name":"a/b","nodename":"a","ipam":{"type":"tabby-ipam"}}`, "must begin with a letter or a digit", types.ErrInvalidNetworkConfig},
		{"no ipam", `{"name":"n","nodename":"a"}`, "no \"ipam\" section", types.ErrInvalidNetworkConfig},
		{"no family", `{"name":"n","nodename":"a","ipam":{"type":"tabby-ipam","assignIPv4":false}}`, "both false", types.ErrInvalidNetworkConfig},
		{"bad timeout", `{"name":"n","nodename":"a","timeout":"soon","ipam":{"type":"tabby-ipam"}}`, "timeout \"soon\"", types.ErrInvalidNetworkConfig},
		{"negative timeout", `{"name":"n","nodename":"a","timeout":"-1s","ipam":{"type":"tabby-ipam"}}`, "positive duration", types.ErrInvalidNetworkConfig},
		{"bad log level", `{"name":"n","nodename":"a","logLevel":"loud","ipam":{"type":"tabby-ipam"}}`, "logLevel \"loud\"", types.ErrInvalidNetworkConfig},
		{"bad log format", `{"name":"n","nodename":"a","logLevel":"info","logFormat":"logfmt","ipam":{"type":"tabby-ipam"}}`, "logFormat: log format \"logfmt\" is not known: use text or json", types.ErrInvalidNetworkConfig},
		{"bad node name", `{"name":"n","nodename":"Node_1","ipam":{"type":"tabby-ipam"}}`, "not a valid Kubernetes node name", types.ErrInvalidNetworkConfig},
		{"empty pool name", `{"name":"n","nodename":"a","ipam":{"type":"tabby-ipam","ipv4Pools":[""]}}`, "empty pool name", types.ErrInvalidNetworkConfig},
		{"relative agent socket", `{"name":"n","nodename":"a","agentSocket":"cni.sock","ipam":{"type":"tabby-ipam"}}`, "agentSocket \"cni.sock\" is not an absolute path", types.ErrInvalidNetworkConfig},
		{"bad policy wait", `{"name":"n","nodename":"a","policyWaitTimeout":"-1s","ipam":{"type":"tabby-ipam"}}`, "policyWaitTimeout \"-1s\" is not a duration", types.ErrInvalidNetworkConfig},
		{"policy wait required without agent", `{"name":"n","nodename":"a","agentSocket":"","policyWaitRequired":true,"ipam":{"type":"tabby-ipam"}}`, "policyWaitRequired is set but agentSocket", types.ErrInvalidNetworkConfig},
		{"assign not bool", `{"name":"n","nodename":"a","ipam":{"type":"tabby-ipam","assignIPv4":"yes"}}`, "not valid JSON", types.ErrDecodingFailure},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadConfig([]byte(tc.conf))
			var e *types.Error
			if !errors.As(err, &e) {
				t.Fatalf("want a *types.Error, got %T %v", err, err)
			}
			if e.Code != tc.code {
				t.Errorf("code %d, want %d (%s)", e.Code, tc.code, e.Msg)
			}
			if !strings.Contains(e.Msg, tc.msg) {
				t.Errorf("message %q does not say %q", e.Msg, tc.msg)
			}
		})
	}
}

func TestLogger(t *testing.T) {
	c := &Config{Name: "n", NodeName: "a"}
	if c.Logger("tabby").Enabled(t.Context(), 12) {
		t.Error("no logLevel must log nothing")
	}
	c.LogLevel = "warn"
	l := c.Logger("tabby")
	if l.Enabled(t.Context(), -4) || !l.Enabled(t.Context(), 4) {
		t.Error("warn level not honoured")
	}
}

// TestLogFileConfig: logFile defaults under /var/log/tabby with rotation
// limits; the ipam section overrides it; "" means stderr; bad values say
// what to write instead.
func TestLogFileConfig(t *testing.T) {
	for _, tc := range []struct {
		name, conf string
		want       LogFile
		err        string
	}{
		{"default", `{"name":"n","nodename":"a","ipam":{"type":"tabby-ipam"}}`,
			LogFile{Path: "/var/log/tabby/cni.log", MaxSize: 100, MaxBackups: 5, MaxAge: 30}, ""},
		{"set", `{"name":"n","nodename":"a","logFile":"/var/log/cni/tabby.log","logFileMaxSize":10,"logFileMaxBackups":0,"logFileMaxAge":0,"ipam":{"type":"tabby-ipam"}}`,
			LogFile{Path: "/var/log/cni/tabby.log", MaxSize: 10}, ""},
		{"stderr", `{"name":"n","nodename":"a","logFile":"","ipam":{"type":"tabby-ipam"}}`,
			LogFile{MaxSize: 100, MaxBackups: 5, MaxAge: 30}, ""},
		{"ipam section wins", `{"name":"n","nodename":"a","logFile":"/top.log","ipam":{"type":"tabby-ipam","logFile":"/inner.log"}}`,
			LogFile{Path: "/inner.log", MaxSize: 100, MaxBackups: 5, MaxAge: 30}, ""},
		{"relative", `{"name":"n","nodename":"a","logFile":"cni.log","ipam":{"type":"tabby-ipam"}}`, LogFile{}, `logFile "cni.log" is not a clean absolute path of a file`},
		{"a folder", `{"name":"n","nodename":"a","logFile":"/var/log/tabby/","ipam":{"type":"tabby-ipam"}}`, LogFile{}, `logFile "/var/log/tabby/" is not a clean absolute path`},
		{"not clean", `{"name":"n","nodename":"a","logFile":"/var/log/../tmp/x.log","ipam":{"type":"tabby-ipam"}}`, LogFile{}, `is not a clean absolute path`},
		{"size 0", `{"name":"n","nodename":"a","logFileMaxSize":0,"ipam":{"type":"tabby-ipam"}}`, LogFile{}, "logFileMaxSize 0 is out of range: use a whole number of at least 1"},
		{"negative backups", `{"name":"n","nodename":"a","logFileMaxBackups":-1,"ipam":{"type":"tabby-ipam"}}`, LogFile{}, "logFileMaxBackups -1 is out of range"},
		{"not a number", `{"name":"n","nodename":"a","logFileMaxAge":"7d","ipam":{"type":"tabby-ipam"}}`, LogFile{}, "not valid JSON of the expected shape"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := LoadConfig([]byte(tc.conf))
			if tc.err != "" {
				var e *types.Error
				if !errors.As(err, &e) || !strings.Contains(e.Msg, tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Log != tc.want {
				t.Errorf("log file %+v, want %+v", c.Log, tc.want)
			}
		})
	}
}

// TestLogFileRotates: commands (each a Logger of its own, as each plugin
// process is) append to the log file, created 0600 with its folder, and
// it is rotated past its size, keeping MaxBackups older files.
func TestLogFileRotates(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "log", "tabby")
	c := &Config{Name: "n", NodeName: "a", LogLevel: "info", Log: LogFile{Path: filepath.Join(dir, "cni.log"), MaxSize: 1, MaxBackups: 2}}
	line := strings.Repeat("x", 1000)
	for cmd := range 40 { // 40 commands of 100 lines of ~1 kB: 4 MB
		l := c.Logger("tabby")
		for i := range 100 {
			l.Info("added", "cmd", cmd, "i", i, "pad", line)
		}
	}
	fi, err := os.Stat(c.Log.Path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", c.Log.Path, fi.Mode().Perm())
	}
	if fi.Size() > 1<<20 {
		t.Errorf("%s is %d bytes, past its 1 MiB", c.Log.Path, fi.Size())
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	// lumberjack removes backups past MaxBackups after a rotation, in the
	// background: wait for it.
	for deadline := time.Now().Add(5 * time.Second); len(ents) != 3 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		ents, _ = os.ReadDir(dir)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) != 3 {
		t.Errorf("the log folder holds %v, want cni.log and 2 rotated files", names)
	}
	b, _ := os.ReadFile(c.Log.Path)
	if !strings.Contains(string(b), `cmd=39 i=99`) || !strings.Contains(string(b), "plugin=tabby") {
		t.Errorf("the last line is not in %s", c.Log.Path)
	}
}

// TestLogFormatJSON: logFormat json (set in the ipam section, which
// overrides the top level) writes one JSON object a line to the log file,
// with the command's attributes; client-go's klog goes there too.
func TestLogFormatJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cni.log")
	c, err := LoadConfig([]byte(`{"name":"n","nodename":"a","logLevel":"info","logFormat":"text","logFile":"` + path + `","ipam":{"type":"tabby-ipam","logFormat":"json"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.LogFormat != "json" {
		t.Fatalf("logFormat %q, want json from the ipam section", c.LogFormat)
	}
	c.Logger("tabby-ipam").Info("assigned", "ip", "10.0.0.1")
	klog.ErrorS(errors.New("refused"), "reflector failed")
	klog.Flush()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 {
		t.Fatalf("the log holds %d lines, want the plugin's and klog's:\n%s", len(lines), b)
	}
	for _, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Errorf("line %q is not JSON: %v", l, err)
		}
	}
	if !strings.Contains(lines[0], `"plugin":"tabby-ipam"`) || !strings.Contains(lines[1], `"msg":"reflector failed"`) {
		t.Errorf("unexpected lines:\n%s", b)
	}
}

// TestLogFileUnwritable: a log file that cannot be written sends the log
// to stderr; the command goes on.
func TestLogFileUnwritable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	lf := LogFile{Path: filepath.Join(file, "cni.log"), MaxSize: 1}
	if w := lf.writer(); w != os.Stderr {
		t.Errorf("a log file under a regular file: writer %T, want stderr", w)
	}
}
