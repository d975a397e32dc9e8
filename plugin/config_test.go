package plugin

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
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
		{"no ipam", `{"name":"n","nodename":"a"}`, "no \"ipam\" section", types.ErrInvalidNetworkConfig},
		{"no family", `{"name":"n","nodename":"a","ipam":{"type":"tabby-ipam","assignIPv4":false}}`, "both false", types.ErrInvalidNetworkConfig},
		{"bad timeout", `{"name":"n","nodename":"a","timeout":"soon","ipam":{"type":"tabby-ipam"}}`, "timeout \"soon\"", types.ErrInvalidNetworkConfig},
		{"negative timeout", `{"name":"n","nodename":"a","timeout":"-1s","ipam":{"type":"tabby-ipam"}}`, "positive duration", types.ErrInvalidNetworkConfig},
		{"bad log level", `{"name":"n","nodename":"a","logLevel":"loud","ipam":{"type":"tabby-ipam"}}`, "logLevel \"loud\"", types.ErrInvalidNetworkConfig},
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
