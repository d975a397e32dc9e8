// Package cluster runs a real Kubernetes control plane (etcd and
// kube-apiserver, built from the Go module proxy by test/controlplane) on
// loopback, for tests and for `tabbyctl lab`.
//
// A Cluster is started with Start and stopped with Stop. Everything it
// starts runs in its own process group and is killed by the kernel if the
// starting program dies (unless Options.Detach); files live in Cluster.Dir.
// With Options.NetNS everything runs inside that network namespace (the lab
// runs its control plane so, on an address of its underlay).
//
// The API server's serving certificate is the self-signed one kube-apiserver
// writes into its --cert-dir: apiserver.crt holds the serving certificate
// followed by the CA that signed it. The serving certificate names the IP
// addresses Options.Address (advertise and bind address, 127.0.0.1 by
// default) and 10.96.0.1 (the kubernetes Service) and the DNS names
// kubernetes, kubernetes.default and kubernetes.default.svc. Clients trust
// apiserver.crt as their CA; a client that reaches the server under another
// address (through a forwarder) sets the TLS server name to "kubernetes"
// (WriteKubeconfig does this).
package controlplane

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// EnvControlPlaneDir names a folder holding the control-plane binaries
// (etcd, kube-apiserver, ...); when set, Start uses it instead of running
// test/controlplane/build.sh.
const EnvControlPlaneDir = "TABBY_CONTROLPLANE_DIR"

// ServiceClusterIPRange is the API server's --service-cluster-ip-range.
const ServiceClusterIPRange = "10.96.0.0/16"

// ServerName is a DNS name the API server's serving certificate carries; a
// client reaching the server under an address the certificate does not name
// verifies it under this name.
const ServerName = "kubernetes"

// Options configure Start.
type Options struct {
	// Dir is the working folder (etcd data, certificates, keys, logs). Empty:
	// a new temporary folder. Stop removes the folder when Start created it
	// (a temporary one, or Dir when it did not exist), unless KeepDir.
	Dir string
	// KeepDir keeps the working folder after Stop (to read the logs).
	KeepDir bool
	// BinDir holds etcd and kube-apiserver. Empty: $TABBY_CONTROLPLANE_DIR,
	// else the folder test/controlplane/build.sh prints (it builds the
	// binaries when they are missing, which takes minutes the first time).
	BinDir string
	// RepoRoot is the tabby repository (for build.sh and deploy/). Empty: the
	// nearest folder above the working directory holding
	// test/controlplane/build.sh.
	RepoRoot string
	// BuildOutput receives build.sh's progress; nil means os.Stderr.
	BuildOutput io.Writer
	// ReadyTimeout bounds the wait for each component to become ready
	// (default 60s; the API server normally takes 2-3 seconds).
	ReadyTimeout time.Duration
	// ExtraAPIServerArgs are appended to kube-apiserver's flags.
	ExtraAPIServerArgs []string

	// NetNS is the path of a network namespace (such as /run/netns/NAME)
	// that every process of the cluster runs in, started through nsenter
	// --net; the cluster's own clients (readiness checks, RESTConfig) dial
	// from inside it. Empty: this program's namespace.
	NetNS string
	// Address is the API server's bind and advertise address (default
	// 127.0.0.1); kube-scheduler and kube-controller-manager serve on it
	// too. etcd always listens on 127.0.0.1 (of NetNS).
	Address string
	// APIServerPort is the API server's port (0: a free one).
	APIServerPort int
	// Detach lets the processes outlive the program that started them (no
	// death signal; each leads a session of its own). Stop still stops them
	// while this program runs; afterwards they are the caller's to stop, by
	// the pids Processes reports.
	Detach bool
}

// Cluster is a running control plane.
type Cluster struct {
	// Dir is the working folder: etcd/ (data), pki/ (apiserver.crt/.key),
	// tokens.csv, sa.key, sa.pub and one <component>.log per process.
	Dir string
	// BinDir holds the control-plane binaries.
	BinDir string
	// RepoRoot is the tabby repository the cluster was started from ("" when
	// it is not known, e.g. BinDir was given and no repository was found).
	RepoRoot string
	// Server is the API server's URL, https://127.0.0.1:PORT.
	Server string
	// EtcdURL is etcd's client URL.
	EtcdURL string
	// Token is the admin's bearer token (user admin, group system:masters).
	Token string
	// CAFile is the API server's self-signed certificate (serving cert and
	// its CA), what clients trust.
	CAFile string
	// ServiceAccountKeyFile and ServiceAccountPublicKeyFile are the RSA pair
	// that signs service-account tokens (kube-controller-manager's
	// --service-account-private-key-file takes the first).
	ServiceAccountKeyFile       string
	ServiceAccountPublicKeyFile string

	opts       Options
	removeDir  bool
	apiPort    int
	apiArgs    []string
	caData     []byte
	mu         sync.Mutex
	etcd       *Process
	apiserver  *Process
	extra      []*Process
	stopped    bool
	stopOnce   sync.Once
	readyLimit time.Duration
}

// Start starts etcd and kube-apiserver on 127.0.0.1 with free ports, waits
// until the API server is ready and creates the default ServiceAccount of
// the default namespace (there is no controller-manager to do it).
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	c := &Cluster{opts: opts, RepoRoot: opts.RepoRoot, readyLimit: opts.ReadyTimeout}
	if c.readyLimit == 0 {
		c.readyLimit = 60 * time.Second
	}
	if c.opts.Address == "" {
		c.opts.Address = "127.0.0.1"
	}
	if ip := net.ParseIP(c.opts.Address); ip == nil {
		return nil, fmt.Errorf("the API server address %q is not an IP address", c.opts.Address)
	}
	if err := c.findBinaries(ctx); err != nil {
		return nil, err
	}
	if err := c.makeDir(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	if err := c.writeCredentials(); err != nil {
		return nil, err
	}
	// A port found free may be taken by someone else before etcd or the
	// API server binds it (other test packages start clusters at the same
	// time): try again with new ports when that happens.
	for attempt := 1; ; attempt++ {
		err = c.startEtcd(ctx)
		if err == nil {
			err = c.firstAPIServerStart(ctx)
		}
		if err == nil || attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			break
		}
		c.stopProcesses()
		_ = os.RemoveAll(filepath.Join(c.Dir, "etcd"))
	}
	if err != nil {
		return nil, err
	}
	if err := c.createDefaultServiceAccount(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Cluster) findBinaries(ctx context.Context) error {
	dir := c.opts.BinDir
	if dir == "" {
		dir = os.Getenv(EnvControlPlaneDir)
	}
	if dir == "" {
		root, err := c.repoRoot()
		if err != nil {
			return fmt.Errorf("finding the control-plane binaries: %w (or set $%s to a folder holding etcd and kube-apiserver)", err, EnvControlPlaneDir)
		}
		// Test packages start at the same time: build.sh lets one build
		// while the others wait, then they find the binaries.
		script := filepath.Join(root, "test", "controlplane", "build.sh")
		cmd := exec.CommandContext(ctx, "bash", script)
		var out bytes.Buffer
		cmd.Stdout = &out
		cmd.Stderr = c.opts.BuildOutput
		if cmd.Stderr == nil {
			cmd.Stderr = os.Stderr
		}
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("building the control plane with %s: %w (run it by hand to see why; it needs the Go module proxy the first time)", script, err)
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		dir = strings.TrimSpace(lines[len(lines)-1])
	}
	for _, b := range []string{"etcd", "kube-apiserver"} {
		st, err := os.Stat(filepath.Join(dir, b))
		if err != nil || st.Mode()&0o111 == 0 {
			return fmt.Errorf("control-plane binary %s is missing from %s: run test/controlplane/build.sh (or fix $%s)", b, dir, EnvControlPlaneDir)
		}
	}
	c.BinDir = dir
	return nil
}

// repoRoot returns the repository root, finding it on first use.
func (c *Cluster) repoRoot() (string, error) {
	if c.RepoRoot != "" {
		return c.RepoRoot, nil
	}
	root, err := FindRepoRoot()
	if err != nil {
		return "", err
	}
	c.RepoRoot = root
	return root, nil
}

// FindRepoRoot walks up from the working directory to the tabby repository
// root, the first folder holding test/controlplane/build.sh.
func FindRepoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "test", "controlplane", "build.sh")); err == nil {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("no tabby repository (a folder with test/controlplane/build.sh) above %s", wd)
		}
	}
}

func (c *Cluster) makeDir() error {
	if c.opts.Dir == "" {
		d, err := os.MkdirTemp("", "tabby-cluster-")
		if err != nil {
			return fmt.Errorf("making the cluster folder: %w", err)
		}
		c.Dir, c.removeDir = d, true
		return nil
	}
	d, err := filepath.Abs(c.opts.Dir)
	if err != nil {
		return err
	}
	if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
		c.removeDir = true
	}
	if err := os.MkdirAll(d, 0o700); err != nil {
		return fmt.Errorf("making the cluster folder: %w", err)
	}
	c.Dir = d
	return nil
}

func (c *Cluster) writeCredentials() error {
	tok := make([]byte, 24)
	if _, err := rand.Read(tok); err != nil {
		return err
	}
	c.Token = hex.EncodeToString(tok)
	if err := os.WriteFile(filepath.Join(c.Dir, "tokens.csv"), []byte(c.Token+",admin,admin-uid,system:masters\n"), 0o600); err != nil {
		return fmt.Errorf("writing the token file: %w", err)
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("generating the service-account key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	c.ServiceAccountKeyFile = filepath.Join(c.Dir, "sa.key")
	c.ServiceAccountPublicKeyFile = filepath.Join(c.Dir, "sa.pub")
	if err := os.WriteFile(c.ServiceAccountKeyFile, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(c.ServiceAccountPublicKeyFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644); err != nil {
		return err
	}
	c.CAFile = filepath.Join(c.Dir, "pki", "apiserver.crt")
	return os.MkdirAll(filepath.Join(c.Dir, "pki"), 0o700)
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	return freePortOn("127.0.0.1")
}

func freePortOn(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// freePort returns a TCP port on host that was free a moment ago in the
// cluster's network namespace.
func (c *Cluster) freePort(host string) (port int, err error) {
	if c.opts.NetNS == "" {
		return freePortOn(host)
	}
	err = InNetNS(c.opts.NetNS, func() error {
		port, err = freePortOn(host)
		return err
	})
	return port, err
}

// dialContext dials from the cluster's network namespace.
func (c *Cluster) dialContext(ctx context.Context, network, address string) (net.Conn, error) {
	if c.opts.NetNS == "" {
		var d net.Dialer
		return d.DialContext(ctx, network, address)
	}
	return DialInNetNS(ctx, c.opts.NetNS, network, address)
}

// httpClient is an HTTP client dialling from the cluster's network namespace.
func (c *Cluster) httpClient(tlsConfig *tls.Config) *http.Client {
	return &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext:     c.dialContext,
		TLSClientConfig: tlsConfig,
	}}
}

// spawn starts a process of the cluster as Options say (namespace, detach).
func (c *Cluster) spawn(name, path string, args ...string) (*Process, error) {
	return Spawn(name, path, filepath.Join(c.Dir, name+".log"), SpawnOptions{NetNS: c.opts.NetNS, Detach: c.opts.Detach}, args...)
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	cport, err := c.freePort("127.0.0.1")
	if err != nil {
		return err
	}
	pport, err := c.freePort("127.0.0.1")
	if err != nil {
		return err
	}
	c.EtcdURL = "http://127.0.0.1:" + strconv.Itoa(cport)
	peer := "http://127.0.0.1:" + strconv.Itoa(pport)
	p, err := c.spawn("etcd", filepath.Join(c.BinDir, "etcd"),
		"--name", "default",
		"--data-dir", filepath.Join(c.Dir, "etcd"),
		"--listen-client-urls", c.EtcdURL,
		"--advertise-client-urls", c.EtcdURL,
		"--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer,
		"--initial-cluster", "default="+peer,
		"--listen-metrics-urls", "",
		"--unsafe-no-fsync",
		"--log-level", "warn",
	)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.etcd = p
	c.mu.Unlock()
	hc := c.httpClient(nil)
	return c.waitFor(ctx, p, "etcd", func() error {
		resp, err := hc.Get(c.EtcdURL + "/health")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"health":"true"`)) {
			return fmt.Errorf("/health: %s %s", resp.Status, body)
		}
		return nil
	})
}

// waitFor polls check until it succeeds, the process exits, or the wait
// times out; errors carry the tail of the process's log.
func (c *Cluster) waitFor(ctx context.Context, p *Process, what string, check func() error) error {
	ctx, cancel := context.WithTimeout(ctx, c.readyLimit)
	defer cancel()
	var last error
	for {
		if last = check(); last == nil {
			return nil
		}
		select {
		case <-p.Done():
			return fmt.Errorf("waiting for %s to become ready: %w", what, p.exitError(c.keepsDir()))
		case <-ctx.Done():
			return fmt.Errorf("%s did not become ready (%v; last check: %v); the end of its log%s:\n%s", what, ctx.Err(), last, p.where(c.keepsDir()), tailFile(p.LogPath, 25))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *Cluster) firstAPIServerStart(ctx context.Context) error {
	port := c.opts.APIServerPort
	if port == 0 {
		var err error
		if port, err = c.freePort(c.opts.Address); err != nil {
			return err
		}
	}
	c.apiPort = port
	c.Server = "https://" + net.JoinHostPort(c.opts.Address, strconv.Itoa(port))
	c.apiArgs = append([]string{
		"--etcd-servers", c.EtcdURL,
		"--bind-address", c.opts.Address,
		"--advertise-address", c.opts.Address,
		"--secure-port", strconv.Itoa(port),
		"--cert-dir", filepath.Join(c.Dir, "pki"),
		"--token-auth-file", filepath.Join(c.Dir, "tokens.csv"),
		"--authorization-mode", "Node,RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", c.ServiceAccountPublicKeyFile,
		"--service-account-signing-key-file", c.ServiceAccountKeyFile,
		"--service-cluster-ip-range", ServiceClusterIPRange,
		"--allow-privileged=true",
		"--endpoint-reconciler-type", "none",
		"--profiling=false",
	}, c.opts.ExtraAPIServerArgs...)
	return c.StartAPIServer(ctx)
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, on the
// same port with the same certificate, token and etcd data, and waits until
// it is ready. It does nothing when the API server is running.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return errors.New("the cluster was stopped")
	}
	if c.apiserver != nil {
		if done, _ := c.apiserver.Exited(); !done {
			c.mu.Unlock()
			return nil
		}
	}
	p, err := c.spawn("kube-apiserver", filepath.Join(c.BinDir, "kube-apiserver"), c.apiArgs...)
	if err != nil {
		c.mu.Unlock()
		return err
	}
	c.apiserver = p
	c.mu.Unlock()

	var hc *http.Client
	return c.waitFor(ctx, p, "kube-apiserver", func() error {
		if hc == nil {
			// The API server writes its certificate a moment after it starts
			// (and reuses it when it restarts).
			pemData, err := os.ReadFile(c.CAFile)
			if err != nil {
				return err
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pemData) {
				return fmt.Errorf("%s holds no certificate yet", c.CAFile)
			}
			c.mu.Lock()
			c.caData = pemData
			c.mu.Unlock()
			hc = c.httpClient(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.Server+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+c.Token)
		return checkOK(hc, req)
	})
}

// checkOK sends req and returns nil when the answer is 200 OK, else the
// status and the end of the body.
func checkOK(hc *http.Client, req *http.Request) error {
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", req.URL.Path, resp.Status, lastLines(string(body), 3))
	}
	return nil
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, " | ")
}

// StopAPIServer stops kube-apiserver only (etcd keeps running with its
// data), as when the datastore goes down. StartAPIServer brings it back.
func (c *Cluster) StopAPIServer() {
	c.mu.Lock()
	p := c.apiserver
	c.mu.Unlock()
	if p != nil {
		p.Stop(10 * time.Second)
	}
}

// APIServerRunning reports whether kube-apiserver's process is alive.
func (c *Cluster) APIServerRunning() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.apiserver == nil {
		return false
	}
	done, _ := c.apiserver.Exited()
	return !done
}

func (c *Cluster) createDefaultServiceAccount(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(c.RESTConfig())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.readyLimit)
	defer cancel()
	for {
		_, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{
			ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "default"},
		}, metav1.CreateOptions{})
		if err == nil || apierrors.IsAlreadyExists(err) {
			return nil
		}
		// The default namespace is made by the API server shortly after it
		// reports ready.
		select {
		case <-ctx.Done():
			return fmt.Errorf("creating the default ServiceAccount: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Connect is a Cluster started elsewhere and reached at server (an https
// URL), trusting caPEM (its apiserver.crt) and acting with the admin's
// token: a qemu guest uses the host's control plane so. RESTConfig and
// WriteKubeconfig work on it; Stop stops nothing.
func Connect(server string, caPEM []byte, token string) (*Cluster, error) {
	u, err := url.Parse(server)
	if err != nil || u.Scheme != "https" || u.Hostname() == "" {
		return nil, fmt.Errorf("server %q is not an https URL such as https://10.0.2.2:6443", server)
	}
	if _, err := tlsServerName(caPEM, u.Hostname()); err != nil {
		return nil, err
	}
	if token == "" {
		return nil, errors.New("connecting to the API server needs the admin's token")
	}
	return &Cluster{Server: server, Token: token, caData: caPEM, opts: Options{Address: u.Hostname()}}, nil
}

// CAData is the PEM the API server's clients trust (apiserver.crt).
func (c *Cluster) CAData() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.caData...)
}

// RESTConfig is an admin client configuration (bearer token, verifying the
// serving certificate against apiserver.crt, under ServerName when the
// certificate does not name Server's host). With Options.NetNS it dials
// from inside that namespace.
func (c *Cluster) RESTConfig() *rest.Config {
	ca := c.CAData()
	var serverName string
	if u, err := url.Parse(c.Server); err == nil {
		serverName, _ = tlsServerName(ca, u.Hostname())
	}
	cfg := &rest.Config{
		Host:        c.Server,
		BearerToken: c.Token,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:     ca,
			ServerName: serverName,
		},
		QPS:   100,
		Burst: 200,
	}
	if c.opts.NetNS != "" {
		cfg.Dial = c.dialContext
	}
	return cfg
}

// WriteKubeconfig writes an admin kubeconfig to path. server is the URL
// clients use ("" means Cluster.Server); when its host is not a name the
// serving certificate carries (a forwarder elsewhere), the kubeconfig sets
// tls-server-name so that the certificate is still verified.
func (c *Cluster) WriteKubeconfig(path, server string) error {
	if server == "" {
		server = c.Server
	}
	u, err := url.Parse(server)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("server %q is not an https URL such as https://127.0.0.1:6443", server)
	}
	ca := c.CAData()
	serverName, err := tlsServerName(ca, u.Hostname())
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["tabby"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca, TLSServerName: serverName}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: c.Token}
	cfg.Contexts["tabby"] = &clientcmdapi.Context{Cluster: "tabby", AuthInfo: "admin", Namespace: "default"}
	cfg.CurrentContext = "tabby"
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return nil
}

// tlsServerName returns "" when the serving certificate names host, else
// ServerName.
func tlsServerName(caPEM []byte, host string) (string, error) {
	block, _ := pem.Decode(caPEM)
	if block == nil {
		return "", errors.New("the API server's certificate is not known yet")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "", fmt.Errorf("parsing the API server's certificate: %w", err)
	}
	if cert.VerifyHostname(host) == nil {
		return "", nil
	}
	if err := cert.VerifyHostname(ServerName); err != nil {
		return "", fmt.Errorf("the API server's certificate names neither %s nor %s", host, ServerName)
	}
	return ServerName, nil
}

// StartProcess starts another program next to the control plane (for
// example kube-scheduler or kube-controller-manager; a bare name is looked up
// in BinDir) with the same care: its own process group, killed if this
// program dies (unless Options.Detach), in Options.NetNS, output appended
// to Dir/<name>.log, stopped by Stop.
func (c *Cluster) StartProcess(name string, args ...string) (*Process, error) {
	path := name
	if !strings.Contains(name, "/") {
		path = filepath.Join(c.BinDir, name)
	}
	return c.startProcessAs(filepath.Base(name), path, args...)
}

// startProcessAs is StartProcess of the program at path, logging to
// Dir/<name>.log.
func (c *Cluster) startProcessAs(name, path string, args ...string) (*Process, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil, errors.New("the cluster was stopped")
	}
	p, err := c.spawn(name, path, args...)
	if err != nil {
		return nil, err
	}
	c.extra = append(c.extra, p)
	return p, nil
}

// Processes are the running processes of the cluster: etcd, kube-apiserver
// and those StartProcess started, in that order.
func (c *Cluster) Processes() []*Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ps []*Process
	for _, p := range append([]*Process{c.etcd, c.apiserver}, c.extra...) {
		if p == nil {
			continue
		}
		if done, _ := p.Exited(); !done {
			ps = append(ps, p)
		}
	}
	return ps
}

// Address is the API server's bind and advertise address.
func (c *Cluster) Address() string { return c.opts.Address }

func (c *Cluster) stopProcesses() {
	c.mu.Lock()
	extra, api, etcd := c.extra, c.apiserver, c.etcd
	c.extra, c.apiserver, c.etcd = nil, nil, nil
	c.mu.Unlock()
	for i := len(extra) - 1; i >= 0; i-- {
		extra[i].Stop(5 * time.Second)
	}
	if api != nil {
		api.Stop(10 * time.Second)
	}
	if etcd != nil {
		etcd.Stop(5 * time.Second)
	}
}

// keepsDir reports whether Dir outlives Stop.
func (c *Cluster) keepsDir() bool { return c.opts.KeepDir || !c.removeDir }

// Stop stops every process the cluster started (and only those) and
// removes the working folder when Start created it, unless Options.KeepDir.
// It may be called more than once.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		c.mu.Lock()
		c.stopped = true
		c.mu.Unlock()
		c.stopProcesses()
		if c.removeDir && !c.opts.KeepDir && c.Dir != "" {
			_ = os.RemoveAll(c.Dir)
		}
	})
}
