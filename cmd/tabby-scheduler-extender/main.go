// Command tabby-scheduler-extender is tabby's kube-scheduler extender.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tabbynet/tabby/contract"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/buildinfo"
	"github.com/tabbynet/tabby/internal/logging"
	extender "github.com/tabbynet/tabby/scheduler-extender"
	"github.com/tabbynet/tabby/scheduler-extender/cache"
	"github.com/tabbynet/tabby/scheduler-extender/plugins"
	"github.com/tabbynet/tabby/scheduler-extender/plugins/network"
)

func main() {
	var (
		cfg         extender.Config
		namespace   string
		checkTabbyd bool
		ipv4, ipv6  bool
		logFlags    *logging.Flags
		qps         float32
		burst       int
	)
	cmd := &cobra.Command{
		Use:          "tabby-scheduler-extender",
		Short:        "kube-scheduler extender: places pods by scheduling rules and by what the network knows",
		Version:      buildinfo.Version,
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		// exitError prints the error: in the log's format once there is a log.
		SilenceErrors: true,
		RunE: func(*cobra.Command, []string) error {
			var err error
			if cfg.Log, err = logFlags.Logger(os.Stderr); err != nil {
				return err
			}
			var families []int
			if ipv4 {
				families = append(families, 4)
			}
			if ipv6 {
				families = append(families, 6)
			}
			if len(families) == 0 {
				return fmt.Errorf("--ipv4=false and --ipv6=false: pods get addresses of at least one family; say which, as the CNI config does")
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			rc, err := datastore.LoadConfig(cfg.Kubeconfig)
			if err != nil {
				return err
			}
			ds, err := datastore.New(rc)
			if err != nil {
				return err
			}
			kc := rest.CopyConfig(rc)
			kc.QPS, kc.Burst = qps, max(burst, int(qps))
			// Protobuf, as kube-scheduler's own client: the extender
			// watches every Pod and Node, and decoding JSON events is
			// most of its CPU between requests. (Tabby's CRDs, read
			// through ds, stay JSON.)
			kc.ContentType = "application/vnd.kubernetes.protobuf"
			kc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
			kube, err := kubernetes.NewForConfig(kc)
			if err != nil {
				return err
			}
			c := cache.New()
			if err := c.Start(ctx, kube); err != nil {
				return fmt.Errorf("watching Nodes, Pods and Namespaces at %s: %w", rc.Host, err)
			}
			w := network.NewWatcher()
			w.CheckHeartbeats = checkTabbyd
			if err := w.Start(ctx, ds, kube, namespace); err != nil {
				return err
			}
			cfg.Nodes = c
			cfg.Placements = c
			cfg.Bind = func(ctx context.Context, b *v1.Binding) error {
				return kube.CoreV1().Pods(b.Namespace).Bind(ctx, b, metav1.CreateOptions{})
			}
			cfg.Scheduler = plugins.Default(c.Snapshot, &network.Plugin{Inputs: w.Inputs, Families: families})
			cfg.Log.Info("tabby-scheduler-extender caches synced", "apiserver", rc.Host, "listen", cfg.Listen)
			return extender.Run(ctx, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", ":8888", "address to serve POST /filter, POST /prioritize, POST /bind, GET /healthz and GET /metrics on")
	f.StringVar(&cfg.Kubeconfig, "kubeconfig", "", "kubeconfig of the API server (default: in-cluster, then $KUBECONFIG)")
	f.StringVar(&cfg.TLSCertFile, "tls-cert-file", "", "PEM certificate (with any intermediates) to serve HTTPS with, for kube-scheduler's enableHTTPS; needs --tls-key-file")
	f.StringVar(&cfg.TLSKeyFile, "tls-key-file", "", "PEM private key of --tls-cert-file")
	f.StringVar(&cfg.ClientCAFile, "client-ca-file", "", "PEM CA certificates; when set (with --tls-cert-file), every request but GET /healthz needs a client certificate they signed (kube-scheduler's extender tlsConfig certFile and keyFile)")
	f.Int64Var(&cfg.MaxRequestBytes, "max-request-bytes", extender.DefaultMaxRequestBytes, "largest request body accepted; larger ones get 413 (4 MiB fits nodeCacheCapable requests of 5,000 nodes; full Nodes, nodeCacheCapable: false, need about 10 KB a node)")
	f.IntVar(&cfg.MaxRequestsInflight, "max-requests-inflight", extender.DefaultMaxRequestsInflight, "requests decoded and answered at once; more wait up to 1s for a slot, then get 503")
	f.StringVar(&namespace, "tabbyd-namespace", contract.DefaultNamespace, "namespace where each tabbyd renews its heartbeat Lease (tabbyd's --namespace)")
	f.BoolVar(&checkTabbyd, "require-tabbyd", true, "filter out nodes whose tabbyd heartbeat Lease is missing or lapsed")
	f.BoolVar(&ipv4, "ipv4", true, "pods get an IPv4 address (as the CNI config's ipam.assignIPv4)")
	f.BoolVar(&ipv6, "ipv6", false, "pods get an IPv6 address (as the CNI config's ipam.assignIPv6)")
	f.BoolVar(&cfg.Profiling, "profiling", false, "also serve Go's CPU, heap and goroutine profiles at /debug/pprof/ on --listen (go tool pprof http://127.0.0.1:8888/debug/pprof/profile)")
	f.Float32Var(&qps, "kube-api-qps", 50, "API requests a second of the Kubernetes client that watches and creates Bindings (kube-scheduler's bindVerb: one a pod; kube-scheduler's own default)")
	f.IntVar(&burst, "kube-api-burst", 100, "burst of --kube-api-qps")
	logFlags = logging.AddFlags(f)
	if err := cmd.Execute(); err != nil {
		exitError(cfg.Log, err)
	}
}

// exitError reports the error that ends the program, as a log line when
// the log is set up (so a JSON log ends with JSON), and exits 1.
func exitError(log *slog.Logger, err error) {
	if log != nil {
		log.Error("tabby-scheduler-extender stopped", "error", err)
	} else {
		fmt.Fprintln(os.Stderr, "Error:", err)
	}
	os.Exit(1)
}
