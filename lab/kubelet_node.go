package lab

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

var everything = labels.Everything()

// Heartbeats.
const (
	leaseDuration   = 40 * time.Second
	leaseRenew      = 10 * time.Second
	nodeStatusEvery = time.Minute
	// KubeletVersion is what the lab kubelet reports as its version.
	KubeletVersion = "v1.35.4-tabby-lab"
)

// cniConfigFile is the network config a runtime would use: the first
// *.conflist, *.conf or *.json of the folder in name order.
func cniConfigFile(dir string) (string, error) {
	files, err := libcni.ConfFiles(dir, []string{".conflist", ".conf", ".json"})
	if err != nil {
		return "", err
	}
	if len(files) == 0 {
		return "", fmt.Errorf("no network config in %s (install-cni writes it)", dir)
	}
	return files[0], nil
}

// loadConflist loads the node's network config, as a runtime does for
// every sandbox (so a config install-cni rewrote is used at once).
func (k *kubelet) loadConflist() (*libcni.NetworkConfigList, error) {
	file, err := cniConfigFile(k.cfg.CNIConfDir)
	if err != nil {
		return nil, err
	}
	return libcni.NetworkConfFromFile(file)
}

// nodeConditions is the node's Ready condition: True once a network config
// is in place, as kubelet reports NetworkReady from its runtime.
func (k *kubelet) readyCondition(now metav1.Time) corev1.NodeCondition {
	c := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		Message: "lab kubelet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now}
	if _, err := cniConfigFile(k.cfg.CNIConfDir); err != nil {
		c.Status, c.Reason = corev1.ConditionFalse, "NetworkPluginNotReady"
		c.Message = "container runtime network not ready: cni config uninitialized: " + err.Error()
	}
	return c
}

// nodeStatus sets what the kubelet owns in a node's status: capacity,
// addresses, node info and the Ready condition. Other conditions (tabbyd's
// NetworkUnavailable) are kept.
func (k *kubelet) nodeStatus(st *corev1.NodeStatus, now metav1.Time) {
	capacity := corev1.ResourceList{
		corev1.ResourcePods:   resource.MustParse("110"),
		corev1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(memTotal(), resource.BinarySI),
	}
	st.Capacity, st.Allocatable = capacity, capacity
	st.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: k.cfg.NodeIP},
		{Type: corev1.NodeHostName, Address: k.cfg.NodeName},
	}
	st.NodeInfo = corev1.NodeSystemInfo{
		KubeletVersion:          KubeletVersion,
		OperatingSystem:         "linux",
		Architecture:            runtime.GOARCH,
		ContainerRuntimeVersion: "tabby-lab://1",
	}
	ready := k.readyCondition(now)
	for i, c := range st.Conditions {
		if c.Type != corev1.NodeReady {
			continue
		}
		if c.Status == ready.Status {
			ready.LastTransitionTime = c.LastTransitionTime
		}
		st.Conditions[i] = ready
		return
	}
	st.Conditions = append(st.Conditions, ready)
}

// memTotal is the machine's memory in bytes (every node reports it).
func memTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 1 << 30
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			if kb, err := strconv.ParseInt(fields[1], 10, 64); err == nil {
				return kb << 10
			}
		}
	}
	return 1 << 30
}

// registerNode creates the Node with its status, or posts the status of
// one that exists (a restarted kubelet), then removes the not-ready taint
// the TaintNodesByCondition admission plugin put on it (the node-lifecycle
// controller, which would, is off in the lab). It retries until the API
// server answers.
func (k *kubelet) registerNode(ctx context.Context) error {
	return poll(ctx, 500*time.Millisecond, func() error {
		err := k.postNode(ctx)
		if err != nil {
			k.log.Warn("registering the node", "node", k.cfg.NodeName, "error", err)
		}
		return err
	})
}

func (k *kubelet) postNode(ctx context.Context) error {
	nodes := k.cs.CoreV1().Nodes()
	for attempt := 0; ; attempt++ {
		now := metav1.NewTime(time.Now().Truncate(time.Second))
		node, err := nodes.Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			node = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: k.cfg.NodeName, Labels: map[string]string{
				corev1.LabelHostname:   k.cfg.NodeName,
				corev1.LabelOSStable:   "linux",
				corev1.LabelArchStable: runtime.GOARCH,
			}}}
			k.nodeStatus(&node.Status, now)
			node, err = nodes.Create(ctx, node, metav1.CreateOptions{})
		case err != nil:
			return err
		default:
			k.nodeStatus(&node.Status, now)
			node, err = nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{})
		}
		if (apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err)) && attempt < 10 {
			continue
		}
		if err != nil {
			return fmt.Errorf("posting Node %s: %w", k.cfg.NodeName, err)
		}
		return k.untaint(ctx, node)
	}
}

// untaint removes the not-ready taint once the node is Ready. The patch
// carries the node's resourceVersion, so it never drops a taint someone
// added meanwhile; on a conflict it starts again from the node as it is.
func (k *kubelet) untaint(ctx context.Context, node *corev1.Node) error {
	for attempt := 0; ; attempt++ {
		if nodeReady(&corev1.Node{Status: node.Status}) != nil {
			return nil
		}
		var keep []corev1.Taint
		found := false
		for _, t := range node.Spec.Taints {
			if t.Key == corev1.TaintNodeNotReady {
				found = true
				continue
			}
			keep = append(keep, t)
		}
		if !found {
			return nil
		}
		if keep == nil {
			keep = []corev1.Taint{}
		}
		patch, err := json.Marshal(map[string]any{
			"metadata": map[string]any{"resourceVersion": node.ResourceVersion},
			"spec":     map[string]any{"taints": keep},
		})
		if err != nil {
			return err
		}
		_, err = k.cs.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if apierrors.IsConflict(err) && attempt < 10 {
			if node, err = k.cs.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{}); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("removing the taint %s of Node %s: %w", corev1.TaintNodeNotReady, node.Name, err)
		}
		return nil
	}
}

// heartbeat renews the node's Lease every 10 seconds and posts its status
// every minute (and when its readiness changes), as kubelet does.
func (k *kubelet) heartbeat(ctx context.Context) {
	lastStatus := time.Now()
	lastReady := corev1.ConditionTrue
	for {
		if err := k.renewLease(ctx); err != nil && ctx.Err() == nil {
			k.log.Warn("renewing the node lease", "error", err)
		}
		ready := k.readyCondition(metav1.Now()).Status
		if time.Since(lastStatus) >= nodeStatusEvery || ready != lastReady {
			if err := k.postNode(ctx); err != nil && ctx.Err() == nil {
				k.log.Warn("posting the node status", "error", err)
			} else {
				lastStatus, lastReady = time.Now(), ready
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(leaseRenew):
		}
	}
}

func (k *kubelet) renewLease(ctx context.Context) error {
	leases := k.cs.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	lease, err := leases.Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: k.cfg.NodeName, Namespace: corev1.NamespaceNodeLease},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity:       ptr.To(k.cfg.NodeName),
				LeaseDurationSeconds: ptr.To(int32(leaseDuration / time.Second)),
				RenewTime:            &now,
			},
		}
		if node, err := k.cs.CoreV1().Nodes().Get(ctx, k.cfg.NodeName, metav1.GetOptions{}); err == nil {
			lease.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}
		}
		_, err = leases.Create(ctx, lease, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	lease.Spec.RenewTime = &now
	lease.Spec.HolderIdentity = ptr.To(k.cfg.NodeName)
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
}
