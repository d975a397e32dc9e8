// Package installcni installs tabby's CNI plugins on a node, as the
// DaemonSet's init container (`tabbyctl install-cni`) does on every node:
// it copies the plugin binaries into the host's CNI bin dir and writes the
// network config list and a kubeconfig carrying a short-lived token of the
// CNI service account into the host's CNI config dir: it mints that token
// with the TokenRequest API as the pod's own service account (tabby-node),
// and tabbyd replaces it long before it expires (package daemon/cnitoken).
//
// The reference plugins the node needs besides tabby's own (loopback, which
// the container runtime runs for every pod sandbox, and portmap, which the
// conflist chains) come from the image too, but only where the node has
// none or an older one: a node's newer plugin, or one whose version cannot
// be read, stays. The conflist's cniVersion is the newest that tabby, the
// container runtime (told by the Node's containerRuntimeVersion) and every
// chained plugin speak.
//
// Every file is written atomically: a temporary file in the same folder,
// synced, then renamed over the old one. The container runtime and kubelet
// never see a half-written binary or config, and a plugin that is running
// keeps executing its old binary. A file is written only when its content
// or mode changed, so restarting the DaemonSet's pod touches nothing.
//
// The config list is written last: its appearance is what makes the
// runtime consider the pod network ready, so everything it names is in
// place first.
package installcni

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"github.com/tabbynet/tabby/daemon/cnitoken"
	"github.com/tabbynet/tabby/internal/filehash"
	"github.com/tabbynet/tabby/internal/logging"
)

// Defaults of Options.
const (
	DefaultCNIBinDir      = "/opt/cni/bin"
	DefaultCNIConfDir     = "/etc/cni/net.d"
	DefaultConfName       = "10-tabby.conflist"
	DefaultKubeconfigName = "tabby-kubeconfig"
	// DefaultTokenFile and DefaultCAFile are where a pod sees its service
	// account's credentials (tabby-node's, in the DaemonSet).
	DefaultTokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	DefaultCAFile    = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
	// NetworkName is the conflist's "name".
	NetworkName = "k8s-pod-network"
)

// DefaultPlugins are tabby's own binaries, which every install copies
// from the image whatever the node has.
var DefaultPlugins = []string{"tabby", "tabby-ipam"}

// tmpPrefix starts the name of every temporary file install-cni makes; the
// random suffix at the end keeps the runtime from taking one for a config
// (it reads only *.conf, *.conflist and *.json).
const tmpPrefix = ".tabby-install-"

// staleTmpAge is how old a temporary file must be before a later run
// removes it as left over from a run that died (a younger one may belong to
// a run going on at the same time).
const staleTmpAge = 10 * time.Minute

// Options say what to install where. Paths are as this process sees them,
// except HostCNIConfDir.
type Options struct {
	// BinSource holds the binaries to install (the image's folder).
	BinSource string
	// HostRoot is where the host's filesystem is seen from this process;
	// CNIBinDir and CNIConfDir default to HostRoot/opt/cni/bin and
	// HostRoot/etc/cni/net.d. Empty: "/" (tests use a temporary folder).
	HostRoot string
	// CNIBinDir receives the binaries; CNIConfDir the conflist and the
	// kubeconfig. Created when missing.
	CNIBinDir  string
	CNIConfDir string
	// HostCNIConfDir is CNIConfDir as the container runtime that runs the
	// plugins sees it; the conflist names the kubeconfig in it. Default
	// /etc/cni/net.d.
	HostCNIConfDir string
	// ConfName and KubeconfigName are the file names in CNIConfDir
	// (defaults DefaultConfName and DefaultKubeconfigName).
	ConfName       string
	KubeconfigName string

	// Plugins must all be in BinSource and always replace the node's
	// (nil: DefaultPlugins).
	Plugins []string
	// ReferencePlugins are reference CNI plugins the node needs: each goes
	// from BinSource into CNIBinDir when the node has none or an older one
	// (by the version it prints when run without CNI_COMMAND); a node's
	// newer one, or one whose version cannot be read, stays and is checked.
	// portmap is needed only when Portmap is set, the others always; one
	// that is needed and in neither place is an error. nil:
	// DefaultReferencePlugins; empty: none.
	ReferencePlugins []string

	// NodeName is this node's name, as the Node object has it (required).
	NodeName string
	// MTU of pod interfaces; 0 lets the plugin detect it.
	MTU int
	// Portmap chains the reference portmap plugin (hostPort support).
	Portmap bool
	// CNILogLevel is the plugin's "logLevel" (empty: silent).
	CNILogLevel string
	// CNILogFormat is the plugin's "logFormat", text or json (empty: the
	// plugin's default, text).
	CNILogFormat string
	// AgentSocket is the plugin's "agentSocket", where tabbyd serves IPAM
	// (empty: the plugin's default, /var/run/tabby/cni.sock).
	AgentSocket string
	// AssignIPv6 sets the plugin's ipam.assignIPv6: pods get an IPv6
	// address next to their IPv4 one (dual-stack clusters; as Calico's
	// assign_ipv6). False leaves the key out (the plugin's default, IPv4
	// only).
	AssignIPv6 bool

	// RuntimeCNIVersion is the newest CNI version the node's container
	// runtime speaks (such as 1.0.0): the conflist's cniVersion is never
	// newer. Empty: told by ContainerRuntime.
	RuntimeCNIVersion string
	// ContainerRuntime is the node's container runtime and version as its
	// Node object reports them (status.nodeInfo.containerRuntimeVersion,
	// such as containerd://1.6.20). Empty: read from the Node with the CNI
	// credentials below; when that fails, FallbackRuntimeCNIVersion and a
	// warning.
	ContainerRuntime string
	// APITimeout bounds that read, retried while the API server does not
	// answer (default DefaultAPITimeout).
	APITimeout time.Duration

	// APIServer is the API server's https URL as the node reaches it.
	APIServer string
	// TokenFile holds this pod's service-account token and CAFile the
	// cluster's CA bundle (defaults DefaultTokenFile and DefaultCAFile).
	TokenFile string
	CAFile    string
	// CNIServiceAccount, as NAMESPACE/NAME, is the CNI plugin's service
	// account: the kubeconfig carries a token of it minted with TokenRequest
	// (the token of TokenFile must be allowed to create its
	// serviceaccounts/token), of lifetime TokenLifetime (default
	// cnitoken.DefaultLifetime). Empty: the token of TokenFile is the
	// plugin's own and goes into the kubeconfig as it is.
	CNIServiceAccount string
	TokenLifetime     time.Duration
}

// Kind says what a file is.
type Kind string

// Kinds of installed files.
const (
	KindBinary     Kind = "binary"
	KindKubeconfig Kind = "kubeconfig"
	KindConflist   Kind = "conflist"
)

// File is what Install did with one file.
type File struct {
	// Path as this process sees it.
	Path string
	Kind Kind
	// Changed reports that the file was written (created or replaced).
	Changed bool
	// Kept reports a node's own reference plugin that was left in place
	// (see Options.ReferencePlugins); its hashes are the node's file's.
	Kept bool
	// OldSHA256 is the hash of what was there before ("" when nothing was),
	// NewSHA256 of what is there now.
	OldSHA256, NewSHA256 string
}

func (f File) String() string {
	switch {
	case f.Kept && f.NewSHA256 == "":
		return fmt.Sprintf("%s: the node's own, kept (not readable from here)", f.Path)
	case f.Kept:
		return fmt.Sprintf("%s: the node's own, kept (sha256 %s)", f.Path, short(f.NewSHA256))
	case !f.Changed:
		return fmt.Sprintf("%s: unchanged (sha256 %s)", f.Path, short(f.NewSHA256))
	case f.OldSHA256 == "":
		return fmt.Sprintf("%s: installed (sha256 %s)", f.Path, short(f.NewSHA256))
	case f.OldSHA256 == f.NewSHA256:
		return fmt.Sprintf("%s: mode fixed (sha256 %s)", f.Path, short(f.NewSHA256))
	default:
		return fmt.Sprintf("%s: updated (sha256 %s -> %s)", f.Path, short(f.OldSHA256), short(f.NewSHA256))
	}
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

// Result is what Install did.
type Result struct {
	// Files in the order they were handled: binaries, kubeconfig, conflist.
	Files []File
	// CNIVersion is the conflist's cniVersion.
	CNIVersion string
	// Notes say what Install decided and why: which reference plugins it
	// installed or kept, and the conflist's cniVersion.
	Notes []string
	// Warnings are things that will keep pods from using tabby although
	// the install itself succeeded.
	Warnings []string
}

// Changed lists the files that were written.
func (r *Result) Changed() []File {
	var out []File
	for _, f := range r.Files {
		if f.Changed {
			out = append(out, f)
		}
	}
	return out
}

// source is one binary to copy.
type source struct {
	name, path string
	mode       fs.FileMode
	sum        string
}

// Install copies the binaries, then writes the kubeconfig and the conflist.
// Every input is read and checked before anything is written, so bad input
// leaves the host as it was.
func Install(opts Options) (*Result, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	srcs, err := o.sources()
	if err != nil {
		return nil, err
	}
	refs, err := o.planReference()
	if err != nil {
		return nil, err
	}
	kubeconfig, token, ca, err := o.kubeconfig()
	if err != nil {
		return nil, err
	}
	res := &Result{}
	version, err := o.cniVersion(refs, token, ca, res)
	if err != nil {
		return nil, err
	}
	conflist, err := o.conflist(version)
	if err != nil {
		return nil, err
	}
	for _, dir := range []string{o.CNIBinDir, o.CNIConfDir} {
		if err := prepareDir(dir); err != nil {
			return nil, err
		}
	}

	res.CNIVersion = version
	for _, s := range srcs {
		f, err := installBinary(s, filepath.Join(o.CNIBinDir, s.name))
		if err != nil {
			return res, err
		}
		res.Files = append(res.Files, f)
	}
	for _, p := range refs {
		if p.install == nil {
			res.Files = append(res.Files, File{Path: p.hostPath, Kind: KindBinary, Kept: true, OldSHA256: p.keptSum, NewSHA256: p.keptSum})
			continue
		}
		f, err := installBinary(*p.install, p.hostPath)
		if err != nil {
			return res, err
		}
		res.Files = append(res.Files, f)
	}
	for _, c := range []struct {
		name string
		kind Kind
		data []byte
		mode fs.FileMode
	}{
		// The kubeconfig holds a credential: only root reads it. So does
		// the conflist (CIS Kubernetes Benchmark 1.1.9 wants CNI files
		// 0600 or stricter): the container runtime that reads it and runs
		// the plugins is root.
		{o.KubeconfigName, KindKubeconfig, kubeconfig, cnitoken.FileMode},
		{o.ConfName, KindConflist, conflist, 0o600},
	} {
		f, err := installBytes(filepath.Join(o.CNIConfDir, c.name), c.kind, c.data, c.mode)
		if err != nil {
			return res, err
		}
		res.Files = append(res.Files, f)
	}
	res.Warnings = append(res.Warnings, o.warnings(refs)...)
	return res, nil
}

// cniVersion decides the conflist's cniVersion: the newest that tabby, the
// container runtime and every chained plugin speak. It notes the
// reference plugins' fate and the decision in res, and warns there about
// what it had to guess.
func (o Options) cniVersion(refs []refPlan, token, ca []byte, res *Result) (string, error) {
	var chain []chainLimit
	portmapPlanned := false
	for _, p := range refs {
		res.Notes = append(res.Notes, p.note)
		if p.install != nil {
			if p.name == "portmap" {
				// The image's own: it must answer.
				vs, err := cniVersions(p.what)
				if err != nil {
					return "", fmt.Errorf("asking the image's portmap (%s) which CNI versions it speaks: %w", p.what, err)
				}
				chain = append(chain, chainLimit{who: "portmap " + versionOrUnknown(p.version), supported: vs})
				portmapPlanned = true
			}
			continue
		}
		vs, warning := p.checkKept()
		if warning != "" {
			res.Warnings = append(res.Warnings, warning)
		}
		if p.name == "portmap" {
			who := "the node's portmap " + versionOrUnknown(p.version)
			if vs == nil {
				vs, who = upTo(FallbackRuntimeCNIVersion), who+" (assumed)"
			}
			chain = append(chain, chainLimit{who: who, supported: vs})
			portmapPlanned = true
		}
	}
	if o.Portmap && !portmapPlanned {
		// portmap is not among the reference plugins: the node's, if any.
		path := filepath.Join(o.CNIBinDir, "portmap")
		if _, err := os.Stat(path); err == nil {
			vs, err := cniVersions(path)
			if err != nil {
				return "", fmt.Errorf("asking %s which CNI versions it speaks: %w", path, err)
			}
			chain = append(chain, chainLimit{who: "the node's portmap", supported: vs})
		}
	}
	rt := o.runtimeLimit(token, ca)
	if rt.warning != "" {
		res.Warnings = append(res.Warnings, rt.warning)
	}
	version, why, err := chooseCNIVersion(tabbyVersions(), rt, chain)
	if err != nil {
		return "", err
	}
	res.Notes = append(res.Notes, why)
	// A node's plugin that keeps the version below what tabby and the
	// runtime speak deserves a warning: the image's would not.
	if unchained, _, err := chooseCNIVersion(tabbyVersions(), rt, nil); err == nil && unchained != version {
		for _, p := range refs {
			if p.install == nil && p.name == "portmap" {
				res.Warnings = append(res.Warnings, fmt.Sprintf("the node's portmap %s keeps the conflist at cniVersion %s although tabby and the container runtime speak %s: remove %s and restart the tabby-node pod so install-cni installs the image's",
					versionOrUnknown(p.version), version, unchained, p.hostPath))
			}
		}
	}
	return version, nil
}

// upTo lists tabby's CNI versions up to max.
func upTo(max string) []string {
	var out []string
	for _, v := range tabbyVersions() {
		if compareCNI(v, max) <= 0 {
			out = append(out, v)
		}
	}
	return out
}

func (o Options) withDefaults() (Options, error) {
	root := o.HostRoot
	if root == "" {
		root = "/"
	}
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&o.CNIBinDir, filepath.Join(root, DefaultCNIBinDir))
	def(&o.CNIConfDir, filepath.Join(root, DefaultCNIConfDir))
	def(&o.HostCNIConfDir, DefaultCNIConfDir)
	def(&o.ConfName, DefaultConfName)
	def(&o.KubeconfigName, DefaultKubeconfigName)
	def(&o.TokenFile, DefaultTokenFile)
	def(&o.CAFile, DefaultCAFile)
	if o.Plugins == nil {
		o.Plugins = DefaultPlugins
	}
	if o.ReferencePlugins == nil {
		o.ReferencePlugins = DefaultReferencePlugins
	}
	if o.APITimeout <= 0 {
		o.APITimeout = DefaultAPITimeout
	}
	if o.RuntimeCNIVersion != "" {
		if err := ParseCNIVersion(o.RuntimeCNIVersion); err != nil {
			return o, fmt.Errorf("the container runtime's CNI version: %w", err)
		}
	}
	switch {
	case o.BinSource == "":
		return o, errors.New("no source folder for the plugin binaries: pass --bin-source")
	case o.NodeName == "":
		return o, errors.New("no node name: pass --nodename or set NODE_NAME (the DaemonSet sets it from spec.nodeName)")
	case o.MTU < 0 || o.MTU > 65535:
		return o, fmt.Errorf("mtu %d is out of range: use 0 (detect) or a value such as 1450", o.MTU)
	case !filepath.IsAbs(o.HostCNIConfDir):
		return o, fmt.Errorf("the host's CNI config dir %q must be an absolute path", o.HostCNIConfDir)
	case o.TokenLifetime != 0 && o.TokenLifetime < cnitoken.MinLifetime:
		return o, fmt.Errorf("CNI token lifetime %v is below the API server's minimum of %v", o.TokenLifetime, cnitoken.MinLifetime)
	case o.AgentSocket != "" && !filepath.IsAbs(o.AgentSocket):
		return o, fmt.Errorf("agent socket %q must be an absolute path (the plugin runs from the runtime's working directory)", o.AgentSocket)
	}
	for _, n := range []string{o.ConfName, o.KubeconfigName} {
		if n != filepath.Base(n) || strings.HasPrefix(n, ".") {
			return o, fmt.Errorf("file name %q must be a plain name in the CNI config dir", n)
		}
	}
	if ext := filepath.Ext(o.ConfName); ext != ".conflist" {
		return o, fmt.Errorf("config name %q must end in .conflist (the runtime reads a list of plugins only from those)", o.ConfName)
	}
	switch o.CNILogLevel {
	case "", "debug", "info", "warn", "error":
	default:
		return o, fmt.Errorf("CNI log level %q: use debug, info, warn, error or nothing", o.CNILogLevel)
	}
	if o.CNILogFormat != "" {
		if err := logging.CheckFormat(o.CNILogFormat); err != nil {
			return o, fmt.Errorf("CNI %w (or nothing)", err)
		}
	}
	return o, nil
}

// sources finds and hashes the binaries to copy.
func (o Options) sources() ([]source, error) {
	var srcs []source
	add := func(name string) error {
		if name == "" || name != filepath.Base(name) {
			return fmt.Errorf("plugin name %q must be a plain file name", name)
		}
		path := filepath.Join(o.BinSource, name)
		st, err := os.Stat(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("the plugin binary %s is missing from %s: the image must ship it next to tabbyctl, or pass --bin-source with the folder that holds it", name, o.BinSource)
		case err != nil:
			return fmt.Errorf("reading the plugin binary %s: %w", path, err)
		case !st.Mode().IsRegular():
			return fmt.Errorf("the plugin binary %s is not a regular file", path)
		}
		sum, err := filehash.SHA256(path)
		if err != nil {
			return fmt.Errorf("reading the plugin binary %s: %w", path, err)
		}
		srcs = append(srcs, source{name: name, path: path, mode: 0o755, sum: sum})
		return nil
	}
	for _, n := range o.Plugins {
		if err := add(n); err != nil {
			return nil, err
		}
	}
	return srcs, nil
}

// kubeconfig renders the plugin's kubeconfig: this pod's token, or one
// minted from it for CNIServiceAccount, and the CA file. It returns the
// token it wrote and the CA bundle.
func (o Options) kubeconfig() (kubeconfig, token, ca []byte, err error) {
	if o.APIServer == "" {
		return nil, nil, nil, errors.New("no API server address: run in a pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are set there) or pass --apiserver https://HOST:PORT")
	}
	u, err := url.Parse(o.APIServer)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, nil, nil, fmt.Errorf("API server %q is not an https URL such as https://10.96.0.1:443", o.APIServer)
	}
	token, err = os.ReadFile(o.TokenFile)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("reading this pod's service-account token: %w (--token-file; in the DaemonSet kubelet mounts tabby-node's there)", err)
	}
	token = bytes.TrimSpace(token)
	if len(token) == 0 {
		return nil, nil, nil, fmt.Errorf("the token file %s is empty: pass --token-file with a service-account token", o.TokenFile)
	}
	ca, err = os.ReadFile(o.CAFile)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("reading the cluster's CA bundle: %w", err)
	}
	if err := checkCA(ca); err != nil {
		return nil, nil, nil, fmt.Errorf("the CA bundle %s: %w", o.CAFile, err)
	}
	if o.CNIServiceAccount != "" {
		if token, err = o.mintCNIToken(token, ca); err != nil {
			return nil, nil, nil, err
		}
	}
	data, err := cnitoken.Kubeconfig(o.APIServer, ca, string(token))
	if err != nil {
		return nil, nil, nil, err
	}
	return data, token, ca, nil
}

// mintCNIToken mints a token of CNIServiceAccount as the holder of
// podToken, trying again while the API server does not answer (for up to
// APITimeout): the first pod start on a node may come before the API
// server is reachable from it.
func (o Options) mintCNIToken(podToken, ca []byte) ([]byte, error) {
	ns, name, ok := strings.Cut(o.CNIServiceAccount, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return nil, fmt.Errorf("CNI service account %q: give it as NAMESPACE/NAME, such as tabby-system/tabby-cni", o.CNIServiceAccount)
	}
	cs, err := corev1client.NewForConfig(&rest.Config{
		Host:            o.APIServer,
		BearerToken:     string(podToken),
		TLSClientConfig: rest.TLSClientConfig{CAData: ca},
		Timeout:         min(apiTry, o.APITimeout),
		UserAgent:       "tabby-install-cni",
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.APITimeout)
	defer cancel()
	m := cnitoken.Minter{Client: cs.RESTClient(), Namespace: ns, ServiceAccount: name, Lifetime: o.TokenLifetime}
	for {
		t, err := m.Mint(ctx)
		var status apierrors.APIStatus
		switch {
		case err == nil:
			return []byte(t.Value), nil
		case ctx.Err() != nil, errors.As(err, &status) && status.Status().Code < 500:
			// The API server's answer (forbidden, no such account) stands.
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (no answer within %v)", err, o.APITimeout)
		case <-time.After(time.Second):
		}
	}
}

func checkCA(data []byte) error {
	n := 0
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return fmt.Errorf("a certificate does not parse: %w", err)
		}
		n++
	}
	if n == 0 {
		return errors.New("holds no PEM certificate")
	}
	return nil
}

// conflist renders the network config list in CNI version version.
func (o Options) conflist(version string) ([]byte, error) {
	type ipam struct {
		Type       string `json:"type"`
		AssignIPv6 bool   `json:"assignIPv6,omitempty"`
	}
	type tabby struct {
		Type        string `json:"type"`
		Kubeconfig  string `json:"kubeconfig"`
		NodeName    string `json:"nodename"`
		MTU         int    `json:"mtu"`
		LogLevel    string `json:"logLevel,omitempty"`
		LogFormat   string `json:"logFormat,omitempty"`
		AgentSocket string `json:"agentSocket,omitempty"`
		IPAM        ipam   `json:"ipam"`
	}
	plugins := []any{tabby{
		Type:        "tabby",
		Kubeconfig:  filepath.Join(o.HostCNIConfDir, o.KubeconfigName),
		NodeName:    o.NodeName,
		MTU:         o.MTU,
		LogLevel:    o.CNILogLevel,
		LogFormat:   o.CNILogFormat,
		AgentSocket: o.AgentSocket,
		IPAM:        ipam{Type: "tabby-ipam", AssignIPv6: o.AssignIPv6},
	}}
	type portmap struct {
		Type         string          `json:"type"`
		Capabilities map[string]bool `json:"capabilities"`
	}
	if o.Portmap {
		plugins = append(plugins, portmap{Type: "portmap", Capabilities: map[string]bool{"portMappings": true}})
	}
	data, err := json.MarshalIndent(struct {
		CNIVersion string `json:"cniVersion"`
		Name       string `json:"name"`
		Plugins    []any  `json:"plugins"`
	}{version, NetworkName, plugins}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// warnings finds what would keep the runtime from using tabby.
func (o Options) warnings(refs []refPlan) []string {
	var w []string
	// Runtimes (libcni) use the first config of the folder in name order.
	entries, err := os.ReadDir(o.CNIConfDir)
	if err == nil {
		var before []string
		for _, e := range entries {
			n := e.Name()
			switch filepath.Ext(n) {
			case ".conf", ".conflist", ".json":
				if n < o.ConfName && !e.IsDir() {
					before = append(before, n)
				}
			}
		}
		sort.Strings(before)
		if len(before) > 0 {
			w = append(w, fmt.Sprintf("%s holds %s, which the container runtime reads before %s: pods will not use tabby until it is removed (or pass --conf-name with a name that sorts first)",
				o.CNIConfDir, strings.Join(before, ", "), o.ConfName))
		}
	}
	// Reference plugins left out of ReferencePlugins are the node's
	// business, but say when the node lacks them.
	for _, name := range DefaultReferencePlugins {
		if !o.needed(name) {
			continue
		}
		planned := false
		for _, p := range refs {
			planned = planned || p.name == name
		}
		if _, err := os.Lstat(filepath.Join(o.CNIBinDir, name)); err != nil && !planned {
			w = append(w, fmt.Sprintf("%s has no %s binary, and %s: pods will fail to start until it is installed (the containernetworking plugins), or let install-cni install the image's (--reference-plugins)",
				o.CNIBinDir, name, purpose(name)))
		}
	}
	return w
}

// prepareDir creates dir when missing, checks it is a folder, and removes
// temporary files left by runs that died.
func prepareDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w (is the host folder mounted into this container, and writable?)", dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("reading %s: %w", dir, err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), tmpPrefix) {
			continue
		}
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > staleTmpAge {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
	return nil
}

// installBinary copies one binary unless dst already has its content and mode.
func installBinary(s source, dst string) (File, error) {
	f := File{Path: dst, Kind: KindBinary, NewSHA256: s.sum}
	old, same, err := current(dst, s.sum, s.mode)
	if err != nil {
		return f, err
	}
	f.OldSHA256 = old
	if same {
		return f, nil
	}
	in, err := os.Open(s.path)
	if err != nil {
		return f, fmt.Errorf("reading the plugin binary %s: %w", s.path, err)
	}
	defer in.Close()
	sum, err := writeAtomic(dst, s.mode, in)
	if err != nil {
		return f, err
	}
	if sum != s.sum {
		// The source changed while it was copied: what was written is
		// whole (it is what the hash covers), but say so.
		f.NewSHA256 = sum
	}
	f.Changed = true
	return f, nil
}

// installBytes writes data to dst unless dst already holds it with mode.
func installBytes(dst string, kind Kind, data []byte, mode fs.FileMode) (File, error) {
	sum := sha256.Sum256(data)
	f := File{Path: dst, Kind: kind, NewSHA256: hex.EncodeToString(sum[:])}
	old, same, err := current(dst, f.NewSHA256, mode)
	if err != nil {
		return f, err
	}
	f.OldSHA256 = old
	if same {
		return f, nil
	}
	if _, err := writeAtomic(dst, mode, bytes.NewReader(data)); err != nil {
		return f, err
	}
	f.Changed = true
	return f, nil
}

// current hashes what is at path ("" when nothing is) and reports whether
// it is a regular file with the wanted hash and permission bits.
func current(path, want string, mode fs.FileMode) (sum string, same bool, err error) {
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("reading %s: %w", path, err)
	}
	if st.IsDir() {
		return "", false, fmt.Errorf("%s is a folder where a file belongs: remove it", path)
	}
	if !st.Mode().IsRegular() {
		// A symlink or another kind of file is replaced by a regular file.
		return "", false, nil
	}
	sum, err = filehash.SHA256(path)
	if err != nil {
		return "", false, fmt.Errorf("reading %s: %w", path, err)
	}
	return sum, sum == want && st.Mode().Perm() == mode, nil
}

// writeAtomic writes r to a temporary file next to dst, syncs it, gives it
// mode and renames it over dst, then syncs the folder. Readers see the old
// file or the new one, never a part. It returns the hash of what it wrote.
func writeAtomic(dst string, mode fs.FileMode, r io.Reader) (sum string, err error) {
	dir := filepath.Dir(dst)
	tmp, err := os.CreateTemp(dir, tmpPrefix+filepath.Base(dst)+"-*")
	if err != nil {
		return "", fmt.Errorf("writing into %s: %w (is the host folder mounted read-write into this container?)", dir, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	if _, err = io.Copy(io.MultiWriter(tmp, h), r); err != nil {
		return "", fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err = tmp.Chmod(mode); err != nil {
		return "", fmt.Errorf("setting the mode of %s: %w", tmp.Name(), err)
	}
	if err = tmp.Sync(); err != nil {
		return "", fmt.Errorf("syncing %s: %w", tmp.Name(), err)
	}
	if err = tmp.Close(); err != nil {
		return "", fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err = os.Rename(tmp.Name(), dst); err != nil {
		return "", fmt.Errorf("replacing %s: %w", dst, err)
	}
	// The rename is durable once the folder is synced; a failure here does
	// not undo it.
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync()
		d.Close()
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
