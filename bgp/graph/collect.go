package graph

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	v1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/contract"
	"github.com/tabbynet/tabby/daemon/nodestatus"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/podexec"
)

// Load reads what Build needs from the API server: the Nodes, the
// "default" BGPConfiguration (none: the defaults) and the BGPPeers.
func Load(ctx context.Context, ds *datastore.Client) (Inputs, error) {
	var in Inputs
	nodes, err := ds.Nodes.List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("listing Nodes: %w", err)
	}
	in.Nodes = nodes.Items
	cfg, err := ds.BGPConfigurations.Get(ctx, v1.BGPConfigurationName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return in, fmt.Errorf("reading BGPConfiguration %s: %w", v1.BGPConfigurationName, err)
	default:
		in.Config = cfg.Spec
	}
	peers, err := ds.BGPPeers.List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("listing BGPPeers: %w", err)
	}
	in.BGPPeers = peers.Items
	pools, err := ds.IPPools.List(ctx, metav1.ListOptions{})
	if err != nil {
		return in, fmt.Errorf("listing IPPools: %w", err)
	}
	in.NoIPv6Pools = bgp.NoIPv6Pools(pools.Items)
	return in, nil
}

// StatusSource says where the tabby-node pods run and what to exec in them.
type StatusSource struct {
	// Config reaches the API server (exec needs the raw configuration).
	Config *rest.Config
	// Namespace and Selector find the tabby-node pods; Container is
	// tabbyd's container in them.
	Namespace, Selector, Container string
	// Command prints the node's status as JSON (tabbyctl node status
	// -o json); "--endpoint=" and tabbyd's --health-listen are appended
	// when the pod's arguments name one.
	Command []string
	// Parallel bounds the execs under way at once.
	Parallel int
}

// DefaultStatusSource is the tabby-node DaemonSet of deploy/tabby.yaml.
func DefaultStatusSource(cfg *rest.Config) StatusSource {
	return StatusSource{
		Config:    cfg,
		Namespace: contract.DefaultNamespace,
		Selector:  contract.NodePodSelector,
		Container: contract.NodeContainer,
		Command:   []string{"tabbyctl", "node", "status", "-o", "json"},
		Parallel:  8,
	}
}

// Statuses asks each node's tabbyd for its status by exec in the node's
// tabby-node pod through the API server, as `kubectl exec` would; tabbyd
// serves it on the node's loopback only. It fills in.Status and, for
// nodes whose status could not be read (no pod, exec forbidden, tabbyd
// down), in.StatusErrors. The error is for what stops it altogether: the
// pods cannot be listed.
func Statuses(ctx context.Context, ds *datastore.Client, src StatusSource, in *Inputs) error {
	pods, err := ds.Pods(src.Namespace).List(ctx, metav1.ListOptions{LabelSelector: src.Selector})
	if err != nil {
		return fmt.Errorf("listing the tabby-node pods (namespace %s, %s): %w (use --namespace where tabby runs, or --no-status)", src.Namespace, src.Selector, err)
	}
	byNode := map[string]*corev1.Pod{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName != "" && p.Status.Phase == corev1.PodRunning {
			byNode[p.Spec.NodeName] = p
		}
	}
	in.Status = map[string]*nodestatus.Status{}
	in.StatusErrors = map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(src.Parallel, 1))
	for _, n := range in.Nodes {
		pod := byNode[n.Name]
		if pod == nil {
			in.StatusErrors[n.Name] = fmt.Sprintf("no running pod %s in namespace %s on it", src.Selector, src.Namespace)
			continue
		}
		wg.Add(1)
		go func(node string) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			st, err := src.status(ctx, ds, pod)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				in.StatusErrors[node] = err.Error()
				return
			}
			in.Status[node] = st
		}(n.Name)
	}
	wg.Wait()
	return nil
}

// status execs the status command in one pod and reads its JSON. The
// command exits 1 when tabbyd is not ready, with the status printed all
// the same: what it printed counts whatever its exit status.
func (src StatusSource) status(ctx context.Context, ds *datastore.Client, pod *corev1.Pod) (*nodestatus.Status, error) {
	command := append([]string(nil), src.Command...)
	if ep := podexec.HealthListen(pod, src.Container); ep != "" {
		command = append(command, "--endpoint="+ep)
	}
	var stdout, stderr bytes.Buffer
	runErr := podexec.Exec(ctx, src.Config, ds, pod, src.Container, command, &stdout, &stderr)
	st := &nodestatus.Status{}
	if err := json.Unmarshal(stdout.Bytes(), st); err == nil && st.Node != "" {
		return st, nil
	}
	if apierrors.IsForbidden(runErr) {
		return nil, fmt.Errorf("exec in pod %s/%s is forbidden: %w (grant create on pods/exec in %s, or use --no-status)", pod.Namespace, pod.Name, runErr, pod.Namespace)
	}
	why := strings.TrimSpace(stderr.String())
	if runErr != nil {
		why = strings.TrimSpace(runErr.Error() + ": " + why)
	}
	return nil, fmt.Errorf("%s in pod %s/%s: %s", strings.Join(command, " "), pod.Namespace, pod.Name, why)
}
