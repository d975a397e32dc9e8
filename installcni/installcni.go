// Package installcni installs tabby's CNI plugins on a node, as the
// DaemonSet's init container (`tabbyctl install-cni`) does on every node:
// it copies the plugin binaries into the host's CNI bin dir and writes the
// network config list and a kubeconfig carrying the CNI service account's
// token into the host's CNI config dir.
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

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/version"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/tabbynet/tabby/plugin"
)

// Defaults of Options.
const (
	DefaultCNIBinDir      = "/opt/cni/bin"
	DefaultCNIConfDir     = "/etc/cni/net.d"
	DefaultConfName       = "10-tabby.conflist"
	DefaultKubeconfigName = "tabby-kubeconfig"
	// DefaultTokenFile and DefaultCAFile are where a pod sees its service
	// account's credentials; the DaemonSet mounts the tabby-cni token
	// Secret there in the install-cni container.
	DefaultTokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	DefaultCAFile    = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
	// NetworkName is the conflist's "name".
	NetworkName = "k8s-pod-network"
	// CNIVersion is the conflist's "cniVersion".
	CNIVersion = "1.1.0"
)

// DefaultPlugins are the binaries every install needs.
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

	// Plugins must all be in BinSource (nil: DefaultPlugins).
	Plugins []string
	// OptionalPlugins are copied when BinSource has them (such as portmap,
	// which a host may already have).
	OptionalPlugins []string

	// NodeName is this node's name, as the Node object has it (required).
	NodeName string
	// MTU of pod interfaces; 0 lets the plugin detect it.
	MTU int
	// Portmap chains the reference portmap plugin (hostPort support).
	Portmap bool
	// CNILogLevel is the plugin's "logLevel" (empty: silent).
	CNILogLevel string
	// AgentSocket is the plugin's "agentSocket", where tabbyd serves IPAM
	// (empty: the plugin's default, /var/run/tabby/cni.sock).
	AgentSocket string

	// APIServer is the API server's https URL as the node reaches it.
	APIServer string
	// TokenFile holds the CNI service account's token and CAFile the
	// cluster's CA bundle (defaults DefaultTokenFile and DefaultCAFile).
	TokenFile string
	CAFile    string
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
	// OldSHA256 is the hash of what was there before ("" when nothing was),
	// NewSHA256 of what is there now.
	OldSHA256, NewSHA256 string
}

func (f File) String() string {
	switch {
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
	kubeconfig, err := o.kubeconfig()
	if err != nil {
		return nil, err
	}
	conflist, err := o.conflist(srcs)
	if err != nil {
		return nil, err
	}
	for _, dir := range []string{o.CNIBinDir, o.CNIConfDir} {
		if err := prepareDir(dir); err != nil {
			return nil, err
		}
	}

	res := &Result{}
	for _, s := range srcs {
		f, err := installBinary(s, filepath.Join(o.CNIBinDir, s.name))
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
		// The kubeconfig holds a credential: only root reads it.
		{o.KubeconfigName, KindKubeconfig, kubeconfig, 0o600},
		{o.ConfName, KindConflist, conflist, 0o644},
	} {
		f, err := installBytes(filepath.Join(o.CNIConfDir, c.name), c.kind, c.data, c.mode)
		if err != nil {
			return res, err
		}
		res.Files = append(res.Files, f)
	}
	res.Warnings = o.warnings()
	return res, nil
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
	switch {
	case o.BinSource == "":
		return o, errors.New("no source folder for the plugin binaries: pass --bin-source")
	case o.NodeName == "":
		return o, errors.New("no node name: pass --nodename or set NODE_NAME (the DaemonSet sets it from spec.nodeName)")
	case o.MTU < 0 || o.MTU > 65535:
		return o, fmt.Errorf("mtu %d is out of range: use 0 (detect) or a value such as 1450", o.MTU)
	case !filepath.IsAbs(o.HostCNIConfDir):
		return o, fmt.Errorf("the host's CNI config dir %q must be an absolute path", o.HostCNIConfDir)
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
	return o, nil
}

// sources finds and hashes the binaries to copy.
func (o Options) sources() ([]source, error) {
	var srcs []source
	add := func(name string, required bool) error {
		if name == "" || name != filepath.Base(name) {
			return fmt.Errorf("plugin name %q must be a plain file name", name)
		}
		path := filepath.Join(o.BinSource, name)
		st, err := os.Stat(path)
		switch {
		case errors.Is(err, fs.ErrNotExist) && !required:
			return nil
		case errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("the plugin binary %s is missing from %s: the image must ship it next to tabbyctl, or pass --bin-source with the folder that holds it", name, o.BinSource)
		case err != nil:
			return fmt.Errorf("reading the plugin binary %s: %w", path, err)
		case !st.Mode().IsRegular():
			return fmt.Errorf("the plugin binary %s is not a regular file", path)
		}
		sum, err := hashFile(path)
		if err != nil {
			return fmt.Errorf("reading the plugin binary %s: %w", path, err)
		}
		srcs = append(srcs, source{name: name, path: path, mode: 0o755, sum: sum})
		return nil
	}
	for _, n := range o.Plugins {
		if err := add(n, true); err != nil {
			return nil, err
		}
	}
	for _, n := range o.OptionalPlugins {
		if err := add(n, false); err != nil {
			return nil, err
		}
	}
	return srcs, nil
}

// kubeconfig renders the plugin's kubeconfig from the token and CA files.
func (o Options) kubeconfig() ([]byte, error) {
	if o.APIServer == "" {
		return nil, errors.New("no API server address: run in a pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are set there) or pass --apiserver https://HOST:PORT")
	}
	u, err := url.Parse(o.APIServer)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("API server %q is not an https URL such as https://10.96.0.1:443", o.APIServer)
	}
	token, err := os.ReadFile(o.TokenFile)
	if err != nil {
		return nil, fmt.Errorf("reading the CNI service account's token: %w (the DaemonSet mounts the Secret tabby-cni-token there; kube-controller-manager fills it in, and the init container is retried until it has)", err)
	}
	token = bytes.TrimSpace(token)
	if len(token) == 0 {
		return nil, fmt.Errorf("the token file %s is empty: kube-controller-manager has not filled in the Secret tabby-cni-token yet (the init container is retried)", o.TokenFile)
	}
	ca, err := os.ReadFile(o.CAFile)
	if err != nil {
		return nil, fmt.Errorf("reading the cluster's CA bundle: %w", err)
	}
	if err := checkCA(ca); err != nil {
		return nil, fmt.Errorf("the CA bundle %s: %w", o.CAFile, err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubernetes"] = &clientcmdapi.Cluster{Server: o.APIServer, CertificateAuthorityData: ca}
	cfg.AuthInfos["tabby-cni"] = &clientcmdapi.AuthInfo{Token: string(token)}
	cfg.Contexts["tabby-cni"] = &clientcmdapi.Context{Cluster: "kubernetes", AuthInfo: "tabby-cni"}
	cfg.CurrentContext = "tabby-cni"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, fmt.Errorf("rendering the kubeconfig: %w", err)
	}
	header := "# Written by tabbyctl install-cni for the tabby CNI plugin (service account\n" +
		"# tabby-system/tabby-cni); rewritten when tabby-node's pod starts.\n"
	return append([]byte(header), data...), nil
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

// conflist renders the network config list, in the newest CNI version that
// every chained plugin speaks: Debian's portmap, for one, stops at 1.0.0,
// and a runtime refuses the whole list when one plugin cannot speak its
// version.
func (o Options) conflist(srcs []source) ([]byte, error) {
	version := CNIVersion
	if o.Portmap {
		path := filepath.Join(o.CNIBinDir, "portmap")
		for _, s := range srcs {
			if s.name == "portmap" {
				path = s.path
			}
		}
		v, err := newestCommonVersion(path, plugin.SupportedVersions.SupportedVersions())
		if err != nil {
			return nil, err
		}
		if v != "" {
			version = v
		}
	}
	type ipam struct {
		Type string `json:"type"`
	}
	type tabby struct {
		Type        string `json:"type"`
		Kubeconfig  string `json:"kubeconfig"`
		NodeName    string `json:"nodename"`
		MTU         int    `json:"mtu"`
		LogLevel    string `json:"logLevel,omitempty"`
		AgentSocket string `json:"agentSocket,omitempty"`
		IPAM        ipam   `json:"ipam"`
	}
	plugins := []any{tabby{
		Type:        "tabby",
		Kubeconfig:  filepath.Join(o.HostCNIConfDir, o.KubeconfigName),
		NodeName:    o.NodeName,
		MTU:         o.MTU,
		LogLevel:    o.CNILogLevel,
		AgentSocket: o.AgentSocket,
		IPAM:        ipam{Type: "tabby-ipam"},
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

// newestCommonVersion asks a plugin binary which CNI versions it speaks
// (CNI_COMMAND=VERSION) and returns the newest one that is also in ours; ""
// when the binary is not there (the warnings say so).
func newestCommonVersion(path string, ours []string) (string, error) {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := invoke.GetVersionInfo(ctx, path, nil)
	if err != nil {
		return "", fmt.Errorf("asking %s which CNI versions it speaks: %w", path, err)
	}
	theirs := map[string]bool{}
	for _, v := range info.SupportedVersions() {
		theirs[v] = true
	}
	best := ""
	for _, v := range ours {
		if !theirs[v] {
			continue
		}
		if newer, err := version.GreaterThan(v, best); best == "" || (err == nil && newer) {
			best = v
		}
	}
	if best == "" {
		return "", fmt.Errorf("%s speaks CNI %v, none of which tabby speaks (%v): install a newer one", path, info.SupportedVersions(), ours)
	}
	return best, nil
}

// warnings finds what would keep the runtime from using tabby.
func (o Options) warnings() []string {
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
	if o.Portmap {
		if _, err := os.Stat(filepath.Join(o.CNIBinDir, "portmap")); err != nil {
			w = append(w, fmt.Sprintf("the conflist chains portmap, but %s has no portmap binary: pods will fail to start until it is installed (the containernetworking plugins), or pass --portmap=false", o.CNIBinDir))
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
	sum, err = hashFile(path)
	if err != nil {
		return "", false, fmt.Errorf("reading %s: %w", path, err)
	}
	return sum, sum == want && st.Mode().Perm() == mode, nil
}

func hashFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
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
