package plugin

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	"gopkg.in/natefinch/lumberjack.v2"
	"k8s.io/klog/v2"

	"github.com/tabbynet/tabby/contract/agentapi"
	"github.com/tabbynet/tabby/internal/logging"
)

// IPAMTypeTabby is the ipam.type that the tabby plugin serves in-process
// instead of exec'ing the tabby-ipam binary.
const IPAMTypeTabby = "tabby-ipam"

// Defaults of the CNI config.
const (
	// DefaultTimeout bounds the datastore work of one CNI command.
	DefaultTimeout = 30 * time.Second
	// DefaultLockDir holds the per-node IPAM lock files.
	DefaultLockDir = "/var/run/tabby"
	// DefaultPolicyWaitTimeout bounds how long ADD waits for tabbyd to
	// program the pod's NetworkPolicy.
	DefaultPolicyWaitTimeout = 10 * time.Second
	// DefaultLogFile is where the plugins log (when logLevel is set),
	// rotated at DefaultLogFileMaxSize MiB, keeping
	// DefaultLogFileMaxBackups older files for at most
	// DefaultLogFileMaxAge days.
	DefaultLogFile           = "/var/log/tabby/cni.log"
	DefaultLogFileMaxSize    = 100
	DefaultLogFileMaxBackups = 5
	DefaultLogFileMaxAge     = 30
)

// NetConf is the CNI network config of the tabby plugin as it appears in the
// conflist, e.g.
//
//	{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"tabby",
//	 "kubeconfig":"/etc/cni/net.d/tabby-kubeconfig","nodename":"node1","mtu":0,
//	 "ipam":{"type":"tabby-ipam"}}]}
//
// (install-cni writes the newest cniVersion of SupportedVersions that the
// container runtime and every chained plugin speak too: 1.0.0 under
// containerd 1.6 and 1.7, 1.1.0 under containerd 2.)
//
// The tabby-ipam plugin reads the same keys: when it runs under another plugin
// (ptp, bridge) the ipam section may carry kubeconfig, nodename, timeout,
// lockFile, agentSocket, logLevel and logFile itself; they override the
// top-level ones.
type NetConf struct {
	types.NetConf

	// Kubeconfig names the kubeconfig file of the datastore (the Kubernetes
	// API). Empty: in-cluster service account, then $KUBECONFIG.
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// NodeName is this node's name; default the host name.
	NodeName string `json:"nodename,omitempty"`
	// MTU of the pod interface; 0 detects it from the node's default-route
	// interface minus the encapsulation overhead of the usable pools.
	MTU int `json:"mtu,omitempty"`
	// LogLevel (debug, info, warn, error) turns logging on; empty means no
	// logging.
	LogLevel string `json:"logLevel,omitempty"`
	// LogFormat is text (default: key=value lines) or json (one JSON
	// object a line), as tabbyd's --log-format.
	LogFormat string `json:"logFormat,omitempty"`
	// LogFile is where the log goes (default DefaultLogFile), rotated by
	// size; "" logs to stderr. LogFileMaxSize (MiB), LogFileMaxBackups and
	// LogFileMaxAge (days; 0 keeps them whatever their age) tune the
	// rotation.
	LogFile           *string `json:"logFile,omitempty"`
	LogFileMaxSize    *int    `json:"logFileMaxSize,omitempty"`
	LogFileMaxBackups *int    `json:"logFileMaxBackups,omitempty"`
	LogFileMaxAge     *int    `json:"logFileMaxAge,omitempty"`
	// Timeout bounds the datastore work of one command ("30s" by default).
	Timeout string `json:"timeout,omitempty"`
	// LockFile serialises IPAM between concurrent commands on one node;
	// default /var/run/tabby/ipam-<nodename>.lock.
	LockFile string `json:"lockFile,omitempty"`
	// AgentSocket is tabbyd's CNI agent (tabbyd --cni-socket); default
	// /var/run/tabby/cni.sock, "" never asks tabbyd.
	AgentSocket *string `json:"agentSocket,omitempty"`
	// PolicyWaitTimeout bounds how long ADD waits for tabbyd to program
	// the pod's NetworkPolicy ("10s" by default; "0s" does not wait).
	PolicyWaitTimeout string `json:"policyWaitTimeout,omitempty"`
	// PolicyWaitRequired fails ADD when tabbyd's agent cannot be reached
	// to wait for the pod's NetworkPolicy (default false: the pod starts).
	PolicyWaitRequired bool `json:"policyWaitRequired,omitempty"`

	// IPAM is the "ipam" section; it shadows types.NetConf.IPAM.
	IPAM IPAMConf `json:"ipam"`
}

// IPAMConf is the "ipam" section.
type IPAMConf struct {
	Type string `json:"type"`
	// AssignIPv4 (default true) and AssignIPv6 (default false) say which
	// families a pod gets.
	AssignIPv4 *bool `json:"assignIPv4,omitempty"`
	AssignIPv6 *bool `json:"assignIPv6,omitempty"`
	// IPv4Pools and IPv6Pools restrict the pools by name; pod and namespace
	// annotations override them.
	IPv4Pools []string `json:"ipv4Pools,omitempty"`
	IPv6Pools []string `json:"ipv6Pools,omitempty"`

	// These override the top-level keys of the same names (for tabby-ipam
	// under another plugin).
	Kubeconfig  string  `json:"kubeconfig,omitempty"`
	NodeName    string  `json:"nodename,omitempty"`
	LogLevel    string  `json:"logLevel,omitempty"`
	LogFormat   string  `json:"logFormat,omitempty"`
	LogFile     *string `json:"logFile,omitempty"`
	Timeout     string  `json:"timeout,omitempty"`
	LockFile    string  `json:"lockFile,omitempty"`
	AgentSocket *string `json:"agentSocket,omitempty"`
}

// Config is a parsed, validated config with every default applied.
type Config struct {
	// Raw is the config as received on stdin (passed on to delegated IPAM).
	Raw        []byte
	Name       string
	CNIVersion string
	Kubeconfig string
	NodeName   string
	// MTU as configured (0 = detect).
	MTU      int
	LogLevel string
	// LogFormat is logging.FormatText or logging.FormatJSON.
	LogFormat string
	// Log is where the log goes when LogLevel is set.
	Log      LogFile
	Timeout  time.Duration
	LockFile string
	// AgentSocket is tabbyd's CNI agent; "" means do not use it.
	AgentSocket string
	// PolicyWaitTimeout bounds the wait for the pod's NetworkPolicy (0:
	// no wait); PolicyWaitRequired fails ADD when tabbyd cannot be asked.
	PolicyWaitTimeout  time.Duration
	PolicyWaitRequired bool

	IPAMType  string
	IPv4      bool
	IPv6      bool
	IPv4Pools []string
	IPv6Pools []string

	// PrevResult is the previous plugin's result (CHECK, DEL, chained ADD).
	PrevResult types.Result
	// ValidAttachments are the attachments GC must keep.
	ValidAttachments []types.GCAttachment
	// DNS as configured, returned in the result when set.
	DNS types.DNS
}

// TabbyIPAM tells whether IPAM is served in-process.
func (c *Config) TabbyIPAM() bool { return c.IPAMType == IPAMTypeTabby }

// HandleID is the IPAM handle of one attachment: "<network>.<containerID>".
func (c *Config) HandleID(containerID string) string { return c.Name + "." + containerID }

// ConfigError is a CNI error for a config the user must fix.
func ConfigError(format string, a ...any) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf(format, a...), "fix the CNI network config (the conflist in /etc/cni/net.d)")
}

// networkNameRE is libcni's rule for a network's name.
var networkNameRE = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`)

var nodeNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// hostname is replaced by tests.
var hostname = os.Hostname

// LoadConfig parses and validates a tabby (or tabby-ipam) network config and
// applies the defaults. Errors are *types.Error values (code 7, invalid
// network config; 6, decoding failure) that say what to fix.
func LoadConfig(data []byte) (*Config, error) {
	var nc NetConf
	if err := json.Unmarshal(data, &nc); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure,
			fmt.Sprintf("tabby: the network config is not valid JSON of the expected shape: %v", err),
			"keys and types: kubeconfig (string), nodename (string), mtu (number), logLevel (string), logFormat (string), logFile (string), logFileMaxSize, logFileMaxBackups and logFileMaxAge (numbers), timeout (duration string), ipam (object with type, assignIPv4, assignIPv6)")
	}
	c := configOf(&nc, data)
	// Each step checks and completes its part of c, in an order the keys
	// depend on (the MTU check needs the families, the lock file the node
	// name); the first error wins.
	for _, step := range []func(*NetConf) error{
		c.loadNetwork, c.loadMTU, c.loadLogging, c.loadTimeouts,
		c.loadNode, c.loadAgent, c.loadPools, c.loadPrevResult,
	} {
		if err := step(&nc); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// configOf takes the keys of nc as they are, the ipam section's winning
// over the top level's (for tabby-ipam under another plugin).
func configOf(nc *NetConf, data []byte) *Config {
	return &Config{
		Raw:        data,
		Name:       nc.Name,
		CNIVersion: nc.CNIVersion,
		Kubeconfig: firstNonEmpty(nc.IPAM.Kubeconfig, nc.Kubeconfig),
		NodeName:   firstNonEmpty(nc.IPAM.NodeName, nc.NodeName),
		MTU:        nc.MTU,
		LogLevel:   strings.ToLower(firstNonEmpty(nc.IPAM.LogLevel, nc.LogLevel)),
		LogFormat:  firstNonEmpty(nc.IPAM.LogFormat, nc.LogFormat, logging.FormatText),
		LockFile:   firstNonEmpty(nc.IPAM.LockFile, nc.LockFile),
		IPAMType:   nc.IPAM.Type,
		IPv4:       true,
		IPv6:       false,
		IPv4Pools:  nc.IPAM.IPv4Pools,
		IPv6Pools:  nc.IPAM.IPv6Pools,
		DNS:        nc.DNS,

		PolicyWaitTimeout:  DefaultPolicyWaitTimeout,
		PolicyWaitRequired: nc.PolicyWaitRequired,

		ValidAttachments: nc.ValidAttachments,
	}
}

// loadNetwork checks the network's name and IPAM and which families a pod
// gets.
func (c *Config) loadNetwork(nc *NetConf) error {
	if c.Name == "" {
		return ConfigError("tabby: the network config has no \"name\": give the network a name such as \"k8s-pod-network\"")
	}
	if !networkNameRE.MatchString(c.Name) {
		// Handles are "<name>.<containerID>": a name of other characters
		// could take handles that are not pods' (ipam.SpareHandlePrefix)
		// for its own in CNI GC.
		return ConfigError("tabby: the network name %q is not valid: it must begin with a letter or a digit, followed by letters, digits, '_', '.' or '-' (as libcni requires)", c.Name)
	}
	if c.CNIVersion == "" {
		c.CNIVersion = "0.1.0"
	}
	if c.IPAMType == "" {
		return ConfigError("tabby: the network config has no \"ipam\" section with a \"type\": use \"ipam\": {\"type\": \"tabby-ipam\"}")
	}
	if nc.IPAM.AssignIPv4 != nil {
		c.IPv4 = *nc.IPAM.AssignIPv4
	}
	if nc.IPAM.AssignIPv6 != nil {
		c.IPv6 = *nc.IPAM.AssignIPv6
	}
	if c.TabbyIPAM() && !c.IPv4 && !c.IPv6 {
		return ConfigError("tabby: ipam.assignIPv4 and ipam.assignIPv6 are both false, so a pod would get no address: set at least one of them to true")
	}
	return nil
}

// loadMTU checks a configured MTU against the families in use.
func (c *Config) loadMTU(*NetConf) error {
	if c.MTU != 0 && (c.MTU < 68 || c.MTU > 65535) {
		return ConfigError("tabby: mtu %d is out of range: use 0 to detect it, or a value from 68 to 65535 (1280 or more with IPv6)", c.MTU)
	}
	if c.MTU != 0 && c.IPv6 && c.MTU < 1280 {
		return ConfigError("tabby: mtu %d is too small for IPv6 (ipam.assignIPv6 is true): use at least 1280, or 0 to detect it", c.MTU)
	}
	return nil
}

// loadLogging checks the log level and format and takes the log file.
func (c *Config) loadLogging(nc *NetConf) error {
	switch c.LogLevel {
	case "", "debug", "info", "warn", "warning", "error":
	default:
		return ConfigError("tabby: logLevel %q is not known: use debug, info, warn or error (or leave it out for no logging)", c.LogLevel)
	}
	if err := logging.CheckFormat(c.LogFormat); err != nil {
		return ConfigError("tabby: logFormat: %v (or leave it out for text)", err)
	}
	lf, err := logFileOf(*nc)
	if err != nil {
		return err
	}
	c.Log = lf
	return nil
}

// loadTimeouts parses the command timeout and the policy wait.
func (c *Config) loadTimeouts(nc *NetConf) error {
	c.Timeout = DefaultTimeout
	if t := firstNonEmpty(nc.IPAM.Timeout, nc.Timeout); t != "" {
		d, err := time.ParseDuration(t)
		if err != nil || d <= 0 {
			return ConfigError("tabby: timeout %q is not a positive duration: write it like \"30s\" or \"2m\"", t)
		}
		c.Timeout = d
	}
	if t := nc.PolicyWaitTimeout; t != "" {
		d, err := time.ParseDuration(t)
		if err != nil || d < 0 {
			return ConfigError("tabby: policyWaitTimeout %q is not a duration: write it like \"10s\", or \"0s\" not to wait for tabbyd to program the pod's NetworkPolicy", t)
		}
		c.PolicyWaitTimeout = d
	}
	return nil
}

// loadNode takes the node's name (the host name by default) and the IPAM
// lock named after it.
func (c *Config) loadNode(*NetConf) error {
	if c.NodeName == "" {
		h, err := hostname()
		if err != nil {
			return ConfigError("tabby: no \"nodename\" in the config and the host name is unknown (%v): set \"nodename\" to this node's Kubernetes name", err)
		}
		c.NodeName = strings.ToLower(h)
	}
	if len(c.NodeName) > 253 || !nodeNameRE.MatchString(c.NodeName) {
		return ConfigError("tabby: nodename %q is not a valid Kubernetes node name (lower-case letters, digits, '-' and '.'): set \"nodename\" to the node's name as kubectl get nodes shows it", c.NodeName)
	}
	if c.LockFile == "" {
		c.LockFile = DefaultLockDir + "/ipam-" + c.NodeName + ".lock"
	}
	return nil
}

// loadAgent takes tabbyd's socket: "" set on purpose means never ask
// tabbyd, so the keys are pointers and only a missing one takes the
// default.
func (c *Config) loadAgent(nc *NetConf) error {
	c.AgentSocket = agentapi.DefaultSocket
	for _, s := range []*string{nc.IPAM.AgentSocket, nc.AgentSocket} {
		if s != nil {
			c.AgentSocket = *s
			break
		}
	}
	if c.AgentSocket != "" && !filepath.IsAbs(c.AgentSocket) {
		return ConfigError("tabby: agentSocket %q is not an absolute path: use tabbyd's --cni-socket (default %s), or \"\" to never ask tabbyd", c.AgentSocket, agentapi.DefaultSocket)
	}
	if c.PolicyWaitRequired && c.AgentSocket == "" {
		return ConfigError("tabby: policyWaitRequired is set but agentSocket is \"\", so tabbyd can never be asked: name tabbyd's --cni-socket in agentSocket, or drop policyWaitRequired")
	}
	return nil
}

// loadPools checks the pool names.
func (c *Config) loadPools(*NetConf) error {
	for _, p := range append(append([]string(nil), c.IPv4Pools...), c.IPv6Pools...) {
		if p == "" {
			return ConfigError("tabby: ipam.ipv4Pools/ipv6Pools contains an empty pool name: list IPPool names such as \"default-ipv4\"")
		}
	}
	return nil
}

// loadPrevResult parses the previous plugin's result (CHECK, DEL, chained
// ADD) in the config's version.
func (c *Config) loadPrevResult(nc *NetConf) error {
	if nc.RawPrevResult == nil {
		return nil
	}
	if err := version.ParsePrevResult(&nc.NetConf); err != nil {
		return types.NewError(types.ErrDecodingFailure, fmt.Sprintf("tabby: cannot parse prevResult: %v", err), "")
	}
	c.PrevResult = nc.PrevResult
	return nil
}

// LogFile is where a plugin logs, and how the file is rotated.
type LogFile struct {
	// Path of the file; "" logs to stderr.
	Path string
	// MaxSize (MiB) rotates the file; MaxBackups older files are kept,
	// for at most MaxAge days (0: whatever their age).
	MaxSize, MaxBackups, MaxAge int
}

// logFileOf validates the logFile keys of a config and applies their
// defaults.
func logFileOf(nc NetConf) (LogFile, error) {
	lf := LogFile{Path: DefaultLogFile, MaxSize: DefaultLogFileMaxSize, MaxBackups: DefaultLogFileMaxBackups, MaxAge: DefaultLogFileMaxAge}
	for _, p := range []*string{nc.IPAM.LogFile, nc.LogFile} {
		if p != nil {
			lf.Path = *p
			break
		}
	}
	if lf.Path != "" && (!filepath.IsAbs(lf.Path) || strings.HasSuffix(lf.Path, "/") || filepath.Clean(lf.Path) != lf.Path) {
		return lf, ConfigError("tabby: logFile %q is not a clean absolute path of a file: use one such as %q, or \"\" to log to stderr", lf.Path, DefaultLogFile)
	}
	for _, k := range []struct {
		key string
		v   *int
		min int
		dst *int
	}{
		{"logFileMaxSize", nc.LogFileMaxSize, 1, &lf.MaxSize},
		{"logFileMaxBackups", nc.LogFileMaxBackups, 0, &lf.MaxBackups},
		{"logFileMaxAge", nc.LogFileMaxAge, 0, &lf.MaxAge},
	} {
		if k.v == nil {
			continue
		}
		if *k.v < k.min {
			return lf, ConfigError("tabby: %s %d is out of range: use a whole number of at least %d (logFileMaxSize in MiB, logFileMaxAge in days)", k.key, *k.v, k.min)
		}
		*k.dst = *k.v
	}
	return lf, nil
}

// writer opens the log: the file, rotated by lumberjack (created with
// its folder, mode 0600), or stderr when the config says "" or the file
// cannot be written (a CNI command never fails for its log; stderr says
// why).
func (lf LogFile) writer() io.Writer {
	if lf.Path == "" {
		return os.Stderr
	}
	err := os.MkdirAll(filepath.Dir(lf.Path), 0o755)
	if err == nil {
		var f *os.File
		if f, err = os.OpenFile(lf.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err == nil {
			err = f.Close()
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "tabby: cannot write the logFile %s (%v): logging to stderr; fix its folder's permissions or set logFile\n", lf.Path, err)
		return os.Stderr
	}
	// Each command is a process of its own writing whole lines with
	// O_APPEND; lumberjack rotates when its size passes MaxSize. Old files
	// are not compressed: a plugin process may exit before that finishes.
	return &lumberjack.Logger{Filename: lf.Path, MaxSize: lf.MaxSize, MaxBackups: lf.MaxBackups, MaxAge: lf.MaxAge, LocalTime: true}
}

// Logger returns the logger the config asks for: the log file (or stderr)
// at the level set by logLevel, or a logger that discards everything.
func (c *Config) Logger(plugin string) *slog.Logger {
	var lvl slog.Level
	switch c.LogLevel {
	case "":
		return slog.New(slog.DiscardHandler)
	case "debug":
		lvl = slog.LevelDebug
	case "info":
		lvl = slog.LevelInfo
	case "warn", "warning":
		lvl = slog.LevelWarn
	default:
		lvl = slog.LevelError
	}
	h, err := logging.Handler(c.Log.writer(), lvl, c.LogFormat)
	if err != nil {
		// LoadConfig checked the format; a Config built by hand may not be.
		h = slog.NewTextHandler(c.Log.writer(), &slog.HandlerOptions{Level: lvl})
	}
	log := slog.New(h)
	// The direct path's client-go logs through klog: into the same file
	// and format, not onto the runtime's stderr.
	klog.SetSlogLogger(log)
	return log.With("plugin", plugin, "network", c.Name, "node", c.NodeName, "pid", os.Getpid())
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}
