package controlplane

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"sigs.k8s.io/yaml"
)

// DefaultControllers is kube-controller-manager's --controllers for tests
// and the lab: everything but the node-lifecycle controller, which would
// mark nodes without a real kubelet NotReady and taint them.
const DefaultControllers = "*,-node-lifecycle-controller"

// Extender registers an HTTP scheduler extender with kube-scheduler (the
// extenders list of a KubeSchedulerConfiguration).
type Extender struct {
	URLPrefix        string `json:"urlPrefix"`
	FilterVerb       string `json:"filterVerb,omitempty"`
	PrioritizeVerb   string `json:"prioritizeVerb,omitempty"`
	BindVerb         string `json:"bindVerb,omitempty"`
	Weight           int64  `json:"weight,omitempty"`
	NodeCacheCapable bool   `json:"nodeCacheCapable,omitempty"`
	EnableHTTPS      bool   `json:"enableHTTPS,omitempty"`
	Ignorable        bool   `json:"ignorable,omitempty"`
}

// SchedulerOptions configure StartScheduler.
type SchedulerOptions struct {
	// Config is a KubeSchedulerConfiguration (YAML) to start from, such as
	// deploy/scheduler/kube-scheduler-config.yaml; its clientConnection and
	// leaderElection are replaced. Empty: the defaults.
	Config []byte
	// Extenders, when set, replace the configuration's extenders.
	Extenders []Extender
	// ExtraArgs are appended to kube-scheduler's flags.
	ExtraArgs []string
	// Name tells a second scheduler's files and log apart (default
	// kube-scheduler).
	Name string
	// QPS and Burst of the scheduler's API client (0: kube-scheduler's
	// defaults, 50 and 100, which bound it to about 50 bindings a second).
	QPS, Burst int
}

// ControllerManagerOptions configure StartControllerManager.
type ControllerManagerOptions struct {
	// Controllers is --controllers (default DefaultControllers).
	Controllers string
	// ExtraArgs are appended to kube-controller-manager's flags.
	ExtraArgs []string
}

// StartScheduler starts kube-scheduler (BinDir/kube-scheduler) against the
// API server as the admin, without leader election, serving on the
// cluster's address, and waits until its /healthz answers. Stop stops it.
func (c *Cluster) StartScheduler(ctx context.Context, opts SchedulerOptions) (*Process, error) {
	name := "kube-scheduler"
	if opts.Name != "" {
		name = opts.Name
	}
	kubeconfig, port, err := c.componentSetup(name)
	if err != nil {
		return nil, err
	}
	config := map[string]any{}
	if len(opts.Config) > 0 {
		if err := yaml.Unmarshal(opts.Config, &config); err != nil {
			return nil, fmt.Errorf("the scheduler configuration given: %w", err)
		}
	}
	config["apiVersion"] = "kubescheduler.config.k8s.io/v1"
	config["kind"] = "KubeSchedulerConfiguration"
	conn := map[string]any{"kubeconfig": kubeconfig}
	if opts.QPS > 0 {
		conn["qps"], conn["burst"] = opts.QPS, max(opts.Burst, opts.QPS)
	}
	config["clientConnection"] = conn
	config["leaderElection"] = map[string]any{"leaderElect": false}
	if len(opts.Extenders) > 0 {
		config["extenders"] = opts.Extenders
	}
	data, err := yaml.Marshal(config)
	if err != nil {
		return nil, err
	}
	configFile := filepath.Join(c.Dir, name+".yaml")
	if err := os.WriteFile(configFile, data, 0o644); err != nil {
		return nil, fmt.Errorf("writing the scheduler's configuration: %w", err)
	}
	// No --authentication-kubeconfig/--authorization-kubeconfig: with them
	// the scheduler logs endless errors about the
	// extension-apiserver-authentication ConfigMap.
	args := append([]string{
		"--config", configFile,
		"--bind-address", c.opts.Address,
		"--secure-port", strconv.Itoa(port),
	}, opts.ExtraArgs...)
	return c.startComponentAs(ctx, name, filepath.Join(c.BinDir, "kube-scheduler"), port, args)
}

// StartControllerManager starts kube-controller-manager against the API
// server as the admin, without leader election, with the service-account
// key (so it fills in service-account token Secrets) and apiserver.crt as
// the root CA of pods, and waits until its /healthz answers. Stop stops it.
func (c *Cluster) StartControllerManager(ctx context.Context, opts ControllerManagerOptions) (*Process, error) {
	const name = "kube-controller-manager"
	kubeconfig, port, err := c.componentSetup(name)
	if err != nil {
		return nil, err
	}
	controllers := opts.Controllers
	if controllers == "" {
		controllers = DefaultControllers
	}
	args := append([]string{
		"--kubeconfig", kubeconfig,
		"--bind-address", c.opts.Address,
		"--secure-port", strconv.Itoa(port),
		"--leader-elect=false",
		"--service-account-private-key-file", c.ServiceAccountKeyFile,
		"--root-ca-file", c.CAFile,
		"--use-service-account-credentials=false",
		"--controllers", controllers,
	}, opts.ExtraArgs...)
	return c.startComponent(ctx, name, port, args)
}

// componentSetup writes Dir/<name>.kubeconfig (the admin, reaching the API
// server at Server) and finds a free port for the component's /healthz.
func (c *Cluster) componentSetup(name string) (kubeconfig string, port int, err error) {
	kubeconfig = filepath.Join(c.Dir, name+".kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, ""); err != nil {
		return "", 0, err
	}
	port, err = c.freePort(c.opts.Address)
	return kubeconfig, port, err
}

// startComponent starts BinDir/name and waits for https://ADDRESS:port/healthz.
func (c *Cluster) startComponent(ctx context.Context, name string, port int, args []string) (*Process, error) {
	return c.startComponentAs(ctx, name, filepath.Join(c.BinDir, name), port, args)
}

// startComponentAs starts the program at path as name (its log is
// Dir/<name>.log) and waits for https://ADDRESS:port/healthz.
func (c *Cluster) startComponentAs(ctx context.Context, name, path string, port int, args []string) (*Process, error) {
	p, err := c.startProcessAs(name, path, args...)
	if err != nil {
		return nil, err
	}
	// The component serves a self-signed certificate it made in memory;
	// this only asks whether it is up.
	hc := c.httpClient(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // a liveness check of a local component
	url := "https://" + net.JoinHostPort(c.opts.Address, strconv.Itoa(port)) + "/healthz"
	err = c.waitFor(ctx, p, name, func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		return checkOK(hc, req)
	})
	if err != nil {
		p.Stop(5 * time.Second)
		return nil, err
	}
	return p, nil
}
