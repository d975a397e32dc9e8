package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/version"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
)

// KubeletConfig configures RunKubelet.
type KubeletConfig struct {
	NodeName string
	// NodeIP is the node's address (its InternalIP, pods' hostIP).
	NodeIP string
	// Kubeconfig reaches the API server from inside the node.
	Kubeconfig string
	// Dir holds the kubelet's state: pods/<namespace>_<name>_<uid>/ with
	// each pod's state, containers' logs and exit files.
	Dir string
	// CNIConfDir is read as a container runtime reads it: the first
	// *.conflist, *.conf or *.json in name order. CNIBinDirs are the
	// plugins' search path; CNICacheDir libcni's cache.
	CNIConfDir  string
	CNIBinDirs  []string
	CNICacheDir string
	// NetNS is the node's own namespace (hostNetwork pods run there).
	NetNS string
	// PodNSPrefix starts the names of the pods' namespaces.
	PodNSPrefix string
	// Tabbyctl runs the container shims (tabbyctl lab shim).
	Tabbyctl string
	// Workers is how many pods are worked on at once (default 4).
	Workers int
	Log     *slog.Logger
}

// KubeletConfigFor is the configuration of node's kubelet in the lab s.
func KubeletConfigFor(s *State, node string) (KubeletConfig, error) {
	n, err := s.Node(node)
	if err != nil {
		return KubeletConfig{}, err
	}
	return KubeletConfig{
		NodeName:    n.Name,
		NodeIP:      n.IP(),
		Kubeconfig:  s.ControlPlane.Kubeconfig,
		Dir:         n.Dir,
		CNIConfDir:  n.CNIConfDir,
		CNIBinDirs:  []string{n.CNIBinDir},
		CNICacheDir: filepath.Join(n.Dir, "cni-cache"),
		NetNS:       NetNSPath(n.NetNS),
		PodNSPrefix: Prefix(s.Name) + "pod-",
		Tabbyctl:    s.Binaries.Tabbyctl,
	}, nil
}

// kubelet is the lab's kubelet for one node.
type kubelet struct {
	cfg     KubeletConfig
	log     *slog.Logger
	cs      kubernetes.Interface
	pods    corelisters.PodLister
	queue   workqueue.TypedRateLimitingInterface[string]
	cni     *libcni.CNIConfig
	nsenter string

	mu sync.Mutex
	// state of the pods this node runs, by namespace/name.
	state map[string]*podState
	// sandboxErr says why a pod's sandbox could not be made.
	sandboxErr map[string]string
	probes     map[string]*prober
}

// RunKubelet runs the lab kubelet until ctx ends: it registers the Node
// (Ready, untainted) and renews its Lease, and runs every Pod bound to the
// node. It leaves the pods running when it stops; the next RunKubelet with
// the same Dir adopts them.
func RunKubelet(ctx context.Context, cfg KubeletConfig) error {
	if cfg.Workers == 0 {
		cfg.Workers = 4
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return fmt.Errorf("loading kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	rc.UserAgent = "tabby-lab-kubelet/" + cfg.NodeName
	rc.QPS, rc.Burst = 50, 100
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	k := &kubelet{
		cfg: cfg,
		log: log,
		cs:  cs,
		// An exec of its own: libcni makes its default one lazily, which
		// races when workers run plugins at once. Plugins' stderr goes to
		// the kubelet's log.
		cni: libcni.NewCNIConfigWithCacheDir(cfg.CNIBinDirs, cfg.CNICacheDir, &invoke.DefaultExec{
			RawExec:       &invoke.RawExec{Stderr: os.Stderr},
			PluginDecoder: version.PluginDecoder{},
		}),
		state:      map[string]*podState{},
		sandboxErr: map[string]string{},
		probes:     map[string]*prober{},
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedMaxOfRateLimiter(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](200*time.Millisecond, 10*time.Second),
		)),
	}
	if k.nsenter, err = nsenterPath(); err != nil {
		return err
	}
	if err := k.loadState(); err != nil {
		return err
	}
	if err := k.registerNode(ctx); err != nil {
		return err
	}
	go k.heartbeat(ctx)

	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = "spec.nodeName=" + cfg.NodeName
	}))
	inf := factory.Core().V1().Pods()
	k.pods = inf.Lister()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			k.queue.Add(key)
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return fmt.Errorf("the pod informer did not sync: %w", context.Cause(ctx))
	}
	log.Info("lab kubelet running", "node", cfg.NodeName, "ip", cfg.NodeIP, "adopted", len(k.state))

	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Go(func() {
			for k.work(ctx) {
			}
		})
	}
	// Process exits of adopted pods and probe results are noticed by
	// looking again every second.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	k.resync()
	pods, _ := k.pods.List(everything)
	for _, p := range pods {
		k.queue.Add(p.Namespace + "/" + p.Name)
	}
	for {
		select {
		case <-ctx.Done():
			k.queue.ShutDown()
			k.stopProbes()
			wg.Wait()
			log.Info("lab kubelet stopped; its pods keep running", "node", cfg.NodeName)
			return nil
		case <-tick.C:
			k.resync()
		}
	}
}

// resync queues every pod the kubelet runs (pods it failed to wire are
// retried with back-off by the queue).
func (k *kubelet) resync() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for key := range k.state {
		k.queue.Add(key)
	}
}

func (k *kubelet) work(ctx context.Context) bool {
	key, quit := k.queue.Get()
	if quit {
		return false
	}
	defer k.queue.Done(key)
	after, err := k.sync(ctx, key)
	switch {
	case err != nil && ctx.Err() == nil:
		k.log.Warn("syncing pod", "pod", key, "error", err)
		k.queue.AddRateLimited(key)
	case after > 0:
		k.queue.Forget(key)
		k.queue.AddAfter(key, after)
	default:
		k.queue.Forget(key)
	}
	return true
}

// podsDir holds one folder per pod.
func (k *kubelet) podsDir() string { return filepath.Join(k.cfg.Dir, "pods") }

func podDirName(namespace, name string, uid types.UID) string {
	return namespace + "_" + name + "_" + string(uid)
}

// loadState reads the pods' state left by an earlier kubelet of this node.
func (k *kubelet) loadState() error {
	entries, err := os.ReadDir(k.podsDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		dir := filepath.Join(k.podsDir(), e.Name())
		ps, err := readPodState(dir)
		if err != nil {
			k.log.Warn("ignoring a pod folder", "dir", dir, "error", err)
			continue
		}
		k.state[ps.Namespace+"/"+ps.Name] = ps
	}
	return nil
}

func readPodState(dir string) (*podState, error) {
	data, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		return nil, err
	}
	ps := &podState{}
	if err := json.Unmarshal(data, ps); err != nil {
		return nil, err
	}
	if ps.Containers == nil {
		ps.Containers = map[string]*containerState{}
	}
	ps.dir = dir
	return ps, nil
}

// save writes the pod's state when it changed since the last save.
func (ps *podState) save() error {
	data, err := json.MarshalIndent(ps, "", "  ")
	if err != nil {
		return err
	}
	if bytes.Equal(data, ps.saved) {
		return nil
	}
	if err := os.MkdirAll(ps.dir, 0o755); err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(ps.dir, StateFile), append(data, '\n'), 0o644); err != nil {
		return err
	}
	ps.saved = data
	return nil
}

// event records a Kubernetes Event about a pod, as kubelet does (best
// effort).
func (k *kubelet) event(ctx context.Context, pod *corev1.Pod, typ, reason, msg string) {
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: pod.Name + ".", Namespace: pod.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name,
			UID: pod.UID, APIVersion: "v1", ResourceVersion: pod.ResourceVersion},
		Reason: reason, Message: msg, Type: typ,
		Source:         corev1.EventSource{Component: "lab-kubelet", Host: k.cfg.NodeName},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
		ReportingController: "tabby.io/lab-kubelet", ReportingInstance: k.cfg.NodeName,
	}
	if _, err := k.cs.CoreV1().Events(pod.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		k.log.Debug("recording an event", "pod", pod.Namespace+"/"+pod.Name, "reason", reason, "error", err)
	}
}
