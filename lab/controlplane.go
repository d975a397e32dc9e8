package lab

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/test/cluster"
)

// Identities from deploy/base/rbac.yaml.
const (
	tabbyNamespace = "tabby-system"
	cniAccount     = "tabby-cni"
	cniTokenSecret = "tabby-cni-token"
	nodeAccount    = "tabby-node"
	// nodeTokenSecret is the lab's own token Secret for tabby-node (the
	// DaemonSet gets a projected token instead).
	nodeTokenSecret = "tabby-node-lab-token"
)

// credentials are a service account's token and the cluster's CA bundle.
type credentials struct {
	token, ca []byte
}

// controlPlane is the started control plane, for the rest of Up.
type controlPlane struct {
	c   *cluster.Cluster
	cs  kubernetes.Interface
	cni credentials
	// node is tabby-node's credentials, or the admin's with
	// Options.TabbydAdmin.
	node credentials
}

// startControlPlane makes the control-plane namespace on subnet 0 and starts
// etcd and kube-apiserver in it, installs tabby's CRDs, policies, namespace
// and RBAC, starts tabby-scheduler-extender, kube-scheduler (with
// SchedulerConfigFile, pointed at the extender) and kube-controller-manager
// there, then creates the default IPPool and the service-account tokens the
// nodes need.
func startControlPlane(ctx context.Context, s *State, l Layout, o *Options) (*controlPlane, error) {
	nsName := l.ControlPlaneNS()
	if err := buildHost(s, l, nsName, "cp", 0, ControlPlaneAddr()); err != nil {
		return nil, err
	}
	dir := filepath.Join(s.Dir, "cp")
	c, err := cluster.Start(ctx, cluster.Options{
		Dir:           dir,
		KeepDir:       true,
		BinDir:        o.ControlPlaneDir,
		RepoRoot:      o.RepoRoot,
		BuildOutput:   o.Log,
		NetNS:         NetNSPath(nsName),
		Address:       ControlPlaneAddr().Addr().String(),
		APIServerPort: APIServerPort,
		Detach:        true,
	})
	if err != nil {
		return nil, fmt.Errorf("starting the control plane: %w", err)
	}
	cp := &controlPlane{c: c}
	if err := recordControlPlane(s, c, nsName); err != nil {
		return nil, err
	}
	o.progress("control plane: etcd and kube-apiserver at %s (namespace %s)", c.Server, nsName)
	if err := c.WriteKubeconfig(s.ControlPlane.Kubeconfig, ""); err != nil {
		return nil, err
	}
	if err := c.InstallCRDs(ctx); err != nil {
		return nil, fmt.Errorf("installing tabby's CRDs and policies: %w", err)
	}
	base := filepath.Join(c.RepoRoot, "deploy", "base")
	if err := cluster.ApplyManifests(ctx, c.RESTConfig(), filepath.Join(base, "namespace.yaml"), filepath.Join(base, "rbac.yaml")); err != nil {
		return nil, fmt.Errorf("applying tabby's namespace and RBAC: %w", err)
	}
	// tabbyd renews its heartbeat Lease in tabby's namespace, and the
	// extender filters out nodes without one: it must exist before either.
	if cp.cs, err = kubernetes.NewForConfig(c.RESTConfig()); err != nil {
		return nil, err
	}
	if _, err := cp.cs.CoreV1().Namespaces().Get(ctx, tabbyNamespace, metav1.GetOptions{}); err != nil {
		return nil, fmt.Errorf("tabby's namespace %s after applying deploy/base/namespace.yaml: %w", tabbyNamespace, err)
	}
	o.progress("control plane: tabby's CRDs, admission policies, namespace %s and RBAC installed", tabbyNamespace)
	url, err := startExtender(ctx, s, c, s.Binaries.Extender)
	if err != nil {
		return nil, err
	}
	if err := s.update(func(s *State) { s.ControlPlane.Extender = url }); err != nil {
		return nil, err
	}
	schedConfig, err := schedulerConfig(c.RepoRoot, url)
	if err != nil {
		return nil, err
	}
	if _, err := c.StartScheduler(ctx, cluster.SchedulerOptions{Config: schedConfig}); err != nil {
		return nil, err
	}
	if _, err := c.StartControllerManager(ctx, cluster.ControllerManagerOptions{}); err != nil {
		return nil, err
	}
	if err := recordControlPlane(s, c, nsName); err != nil {
		return nil, err
	}
	o.progress("control plane: %s at %s, kube-scheduler with %s pointed at it, kube-controller-manager (controllers %s) running",
		ExtenderName, url, SchedulerConfigFile, cluster.DefaultControllers)
	if s.PodCIDR != "" {
		if err := createPool(ctx, c.RESTConfig(), s.PodCIDR); err != nil {
			return nil, err
		}
		o.progress("IPPool %s: %s", DefaultPoolName, s.PodCIDR)
	}
	if cp.cni, err = serviceAccountToken(ctx, cp.cs, cniTokenSecret, cniAccount, false); err != nil {
		return nil, err
	}
	if o.TabbydAdmin {
		cp.node = credentials{token: []byte(c.Token), ca: c.CAData()}
	} else if cp.node, err = serviceAccountToken(ctx, cp.cs, nodeTokenSecret, nodeAccount, true); err != nil {
		return nil, err
	}
	return cp, nil
}

// recordControlPlane saves the control plane's address and processes.
func recordControlPlane(s *State, c *cluster.Cluster, nsName string) error {
	var procs []Proc
	for _, p := range c.Processes() {
		if pr, err := procOf(p.Name, p.Pid()); err == nil {
			pr.Log = p.LogPath
			procs = append(procs, pr)
		}
	}
	return s.update(func(s *State) {
		ext := s.ControlPlane.Extender
		s.ControlPlane = ControlPlane{
			NetNS:      nsName,
			Address:    c.Address(),
			Server:     c.Server,
			Dir:        c.Dir,
			CAFile:     c.CAFile,
			Kubeconfig: filepath.Join(c.Dir, "admin.kubeconfig"),
			Extender:   ext,
			Procs:      procs,
		}
	})
}

// createPool creates the default IPPool (as deploy/base/ippool.yaml does,
// with the lab's CIDR); one that exists is kept.
func createPool(ctx context.Context, cfg *rest.Config, cidr string) error {
	ds, err := datastore.New(cfg)
	if err != nil {
		return err
	}
	pool := &tabbyv1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: DefaultPoolName},
		Spec:       tabbyv1.IPPoolSpec{CIDR: cidr, BlockSize: tabbyv1.DefaultBlockSizeV4, NATOutgoing: true},
	}
	if _, err := ds.IPPools.Create(ctx, pool, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating IPPool %s (%s): %w", DefaultPoolName, cidr, err)
	}
	return nil
}

// serviceAccountToken waits until kube-controller-manager has filled in the
// token Secret name of account (creating the Secret first with create) and
// returns its token and CA bundle.
func serviceAccountToken(ctx context.Context, cs kubernetes.Interface, name, account string, create bool) (credentials, error) {
	secrets := cs.CoreV1().Secrets(tabbyNamespace)
	if create {
		_, err := secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name:        name,
				Namespace:   tabbyNamespace,
				Annotations: map[string]string{corev1.ServiceAccountNameKey: account},
			},
			Type: corev1.SecretTypeServiceAccountToken,
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return credentials{}, fmt.Errorf("creating the token Secret %s/%s: %w", tabbyNamespace, name, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last error
	for {
		sec, err := secrets.Get(ctx, name, metav1.GetOptions{})
		if err == nil && len(sec.Data[corev1.ServiceAccountTokenKey]) > 0 && len(sec.Data[corev1.ServiceAccountRootCAKey]) > 0 {
			return credentials{token: sec.Data[corev1.ServiceAccountTokenKey], ca: sec.Data[corev1.ServiceAccountRootCAKey]}, nil
		}
		if err == nil {
			err = fmt.Errorf("no token yet")
		}
		last = err
		select {
		case <-ctx.Done():
			return credentials{}, fmt.Errorf("waiting for kube-controller-manager to fill in the token of %s/%s (service account %s): %v", tabbyNamespace, name, account, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// writeKubeconfig writes a kubeconfig naming server with a bearer token.
func writeKubeconfig(path, server, user string, cred credentials) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["lab"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: cred.ca}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: string(cred.token)}
	cfg.Contexts["lab"] = &clientcmdapi.Context{Cluster: "lab", AuthInfo: user}
	cfg.CurrentContext = "lab"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return nil
}

// RESTConfig is an admin client configuration of the lab's API server for
// a program in the host's namespace: it dials from inside the
// control-plane namespace (no forward needed).
func (s *State) RESTConfig() (*rest.Config, error) {
	if s.ControlPlane.Kubeconfig == "" {
		return nil, fmt.Errorf("the lab in %s has no control plane yet", s.Dir)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", s.ControlPlane.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading the lab's admin kubeconfig: %w", err)
	}
	nsName := s.ControlPlane.NetNS
	cfg.Dial = func(ctx context.Context, network, address string) (net.Conn, error) {
		return dialInNetNS(ctx, nsName, network, address)
	}
	cfg.QPS, cfg.Burst = 100, 200
	cfg.UserAgent = "tabbyctl-lab"
	return cfg, nil
}

// apiTarget is host:port of the API server on the underlay.
func (s *State) apiTarget() string {
	return net.JoinHostPort(s.ControlPlane.Address, strconv.Itoa(APIServerPort))
}
