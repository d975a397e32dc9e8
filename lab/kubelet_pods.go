package lab

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// sync makes one pod as its object says: it wires a new pod, runs and
// restarts its containers, reports its status, and on deletion stops it,
// unwires it and deletes the object. It returns when to look again.
func (k *kubelet) sync(ctx context.Context, key string) (time.Duration, error) {
	ns, name, _ := strings.Cut(key, "/")
	pod, err := k.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		pod, err = nil, nil
	}
	if err != nil {
		return 0, err
	}
	k.mu.Lock()
	ps := k.state[key]
	k.mu.Unlock()

	// A pod that is gone, or replaced by another of the same name, or
	// whose wiring an earlier kubelet left half-done: undo it.
	if ps != nil && (pod == nil || pod.UID != ps.UID || ps.Sandbox == sandboxCreating) {
		if err := k.removePod(ctx, key, ps, 2*time.Second); err != nil {
			return 0, err
		}
		ps = nil
	}
	if pod == nil {
		return 0, nil
	}
	if pod.DeletionTimestamp != nil {
		return 0, k.deletePod(ctx, key, pod, ps)
	}
	if ps == nil {
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			return 0, nil // it ended before this kubelet's time
		}
		if ps, err = k.createSandbox(ctx, key, pod); err != nil {
			k.mu.Lock()
			k.sandboxErr[key] = err.Error()
			k.mu.Unlock()
			k.event(ctx, pod, corev1.EventTypeWarning, "FailedCreatePodSandBox", err.Error())
			if serr := k.postStatus(ctx, pod, nil); serr != nil {
				k.log.Warn("posting pod status", "pod", key, "error", serr)
			}
			return 0, err
		}
	}
	next := k.syncContainers(ctx, pod, ps)
	phase := podPhase(pod, ps)
	if (phase == corev1.PodSucceeded || phase == corev1.PodFailed) && ps.Sandbox == sandboxReady {
		// kubelet removes a finished pod's sandbox: its address goes back.
		k.stopProbesOf(ps)
		if err := k.removeNetwork(ctx, ps); err != nil {
			return 0, err
		}
		ps.Sandbox = sandboxRemoved
	}
	if err := ps.save(); err != nil {
		return 0, err
	}
	if err := k.postStatus(ctx, pod, ps); err != nil {
		return 0, err
	}
	return next, nil
}

// deletePod stops a pod being deleted (SIGTERM, SIGKILL after its grace
// period), unwires it and deletes its object, as kubelet does once the
// pod's containers are gone.
func (k *kubelet) deletePod(ctx context.Context, key string, pod *corev1.Pod, ps *podState) error {
	if ps != nil {
		grace := 30 * time.Second
		if pod.DeletionGracePeriodSeconds != nil {
			grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
		}
		if err := k.removePod(ctx, key, ps, grace); err != nil {
			return err
		}
	}
	uid := pod.UID
	err := k.cs.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64),
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting Pod %s: %w", key, err)
	}
	return nil
}

// removePod stops the pod's containers, unwires it, removes its namespace
// and forgets it.
func (k *kubelet) removePod(ctx context.Context, key string, ps *podState, grace time.Duration) error {
	k.stopProbesOf(ps)
	var shims []Proc
	for _, cs := range ps.Containers {
		if cs.running() {
			shims = append(shims, cs.Shim)
		}
	}
	if left := stopProcs(shims, grace, true); len(left) > 0 {
		return fmt.Errorf("containers of %s (shims %v) do not stop", key, pids(left))
	}
	if ps.Sandbox != sandboxRemoved {
		if err := k.removeNetwork(ctx, ps); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(ps.dir); err != nil {
		return err
	}
	k.mu.Lock()
	if k.state[key] == ps {
		delete(k.state, key)
	}
	delete(k.sandboxErr, key)
	k.mu.Unlock()
	k.log.Info("pod removed", "pod", key, "uid", ps.UID)
	return nil
}

// sandboxID is the pod's CNI container ID: stable for the pod, so that a
// DEL after a kubelet restart names the ADD's attachment.
func sandboxID(uid types.UID) string {
	sum := sha256.Sum256([]byte("tabby-lab/" + string(uid)))
	return hex.EncodeToString(sum[:])
}

// createSandbox makes a pod's network namespace and wires it with CNI ADD
// through libcni (this process runs in the node's namespace, so the
// plugins do too), then writes the namespace's path into the pod's
// AnnotationNetNS. A hostNetwork pod runs in the node's namespace.
func (k *kubelet) createSandbox(ctx context.Context, key string, pod *corev1.Pod) (*podState, error) {
	ps := &podState{
		UID:        pod.UID,
		Namespace:  pod.Namespace,
		Name:       pod.Name,
		Sandbox:    sandboxCreating,
		Created:    time.Now().Truncate(time.Second),
		Containers: map[string]*containerState{},
		dir:        filepath.Join(k.podsDir(), podDirName(pod.Namespace, pod.Name, pod.UID)),
	}
	if pod.Spec.HostNetwork {
		ps.HostNetwork, ps.NetNSPath, ps.PodIPs = true, k.cfg.NetNS, []string{k.cfg.NodeIP}
	} else {
		ps.NetNS = k.cfg.PodNSPrefix + strings.ReplaceAll(string(pod.UID), "-", "")[:12]
		ps.NetNSPath = NetNSPath(ps.NetNS)
		ps.SandboxID = sandboxID(pod.UID)
	}
	// Saved before anything is made, so a kubelet that dies half-way
	// leaves a record of what to undo.
	if err := ps.save(); err != nil {
		return nil, err
	}
	k.mu.Lock()
	k.state[key] = ps
	k.mu.Unlock()
	if !ps.HostNetwork {
		if err := k.addNetwork(ctx, pod, ps); err != nil {
			if rerr := k.removePod(ctx, key, ps, 0); rerr != nil {
				k.log.Warn("undoing a failed sandbox", "pod", key, "error", rerr)
			}
			return nil, err
		}
	}
	ps.Sandbox = sandboxReady
	if err := ps.save(); err != nil {
		return nil, err
	}
	k.mu.Lock()
	delete(k.sandboxErr, key)
	k.mu.Unlock()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         pod.UID, // a precondition: never annotate a namesake
		"annotations": map[string]string{AnnotationNetNS: ps.NetNSPath, AnnotationSandboxID: ps.SandboxID},
	}})
	if _, err := k.cs.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		k.log.Warn("annotating the pod with its namespace", "pod", key, "error", err)
	}
	k.log.Info("pod wired", "pod", key, "netns", ps.NetNSPath, "ips", ps.PodIPs)
	return ps, nil
}

// runtimeConf is what a container runtime passes the plugins for a pod.
func (k *kubelet) runtimeConf(ps *podState, pod *corev1.Pod) *libcni.RuntimeConf {
	rt := &libcni.RuntimeConf{
		ContainerID: ps.SandboxID,
		NetNS:       ps.NetNSPath,
		IfName:      "eth0",
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", ps.Namespace},
			{"K8S_POD_NAME", ps.Name},
			{"K8S_POD_INFRA_CONTAINER_ID", ps.SandboxID},
			{"K8S_POD_UID", string(ps.UID)},
		},
	}
	if pod != nil {
		var mappings []map[string]any
		for _, c := range pod.Spec.Containers {
			for _, p := range c.Ports {
				if p.HostPort == 0 {
					continue
				}
				m := map[string]any{"hostPort": p.HostPort, "containerPort": p.ContainerPort, "protocol": strings.ToLower(string(p.Protocol))}
				if p.HostIP != "" {
					m["hostIP"] = p.HostIP
				}
				mappings = append(mappings, m)
			}
		}
		if len(mappings) > 0 {
			rt.CapabilityArgs = map[string]any{"portMappings": mappings}
		}
	}
	return rt
}

func (k *kubelet) addNetwork(ctx context.Context, pod *corev1.Pod, ps *podState) error {
	if err := addNetNS(ps.NetNS); err != nil {
		return err
	}
	list, err := k.loadConflist()
	if err != nil {
		return err
	}
	r, err := k.cni.AddNetworkList(ctx, list, k.runtimeConf(ps, pod))
	if err != nil {
		return fmt.Errorf("CNI ADD (%s) of pod %s/%s: %w", list.Name, pod.Namespace, pod.Name, err)
	}
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return fmt.Errorf("reading the CNI ADD result: %w", err)
	}
	for _, ip := range res.IPs {
		ps.PodIPs = append(ps.PodIPs, ip.Address.IP.String())
	}
	if len(ps.PodIPs) == 0 {
		return fmt.Errorf("CNI ADD of pod %s/%s gave no address", pod.Namespace, pod.Name)
	}
	return nil
}

// removeNetwork runs CNI DEL for the pod and removes its namespace.
func (k *kubelet) removeNetwork(ctx context.Context, ps *podState) error {
	if ps.HostNetwork {
		return nil
	}
	if ps.SandboxID != "" {
		list, err := k.loadConflist()
		if err != nil {
			return err
		}
		if err := k.cni.DelNetworkList(ctx, list, k.runtimeConf(ps, nil)); err != nil {
			return fmt.Errorf("CNI DEL (%s) of pod %s/%s: %w", list.Name, ps.Namespace, ps.Name, err)
		}
	}
	return delNetNS(ps.NetNS)
}

// syncContainers starts containers that have not run, notices those that
// ended and restarts them as the restartPolicy says (with back-off). It
// returns when to look again (0: on the next event or resync).
func (k *kubelet) syncContainers(ctx context.Context, pod *corev1.Pod, ps *podState) time.Duration {
	if ps.Sandbox != sandboxReady || len(pod.Spec.InitContainers) > 0 {
		return 0
	}
	now := time.Now()
	var next time.Duration
	wake := func(d time.Duration) {
		if d > 0 && (next == 0 || d < next) {
			next = d
		}
	}
	for _, c := range pod.Spec.Containers {
		cs := ps.Containers[c.Name]
		if cs == nil {
			cs = &containerState{}
			ps.Containers[c.Name] = cs
		}
		if cs.running() {
			if cs.Shim.Alive() {
				k.ensureProbe(ctx, pod, ps, c, cs)
				continue
			}
			cs.Exit = k.readExit(ps, c.Name, cs)
			k.stopProbe(ps, c.Name)
			k.log.Info("container exited", "pod", ps.Namespace+"/"+ps.Name, "container", c.Name, "exitCode", cs.Exit.ExitCode, "reason", cs.Exit.Reason)
		}
		if cs.Exit != nil {
			if !shouldRestart(pod.Spec.RestartPolicy, cs.Exit.ExitCode) {
				continue
			}
			if at := cs.Exit.FinishedAt.Add(restartDelay(cs.RestartCount)); now.Before(at) {
				wake(at.Sub(now))
				continue
			}
			cs.Last, cs.Exit = cs.Exit, nil
			cs.RestartCount++
		}
		if cs.Waiting != "" && now.Before(cs.RetryAt) {
			wake(cs.RetryAt.Sub(now))
			continue
		}
		if err := k.startContainer(pod, ps, c, cs); err != nil {
			cs.Waiting, cs.Message, cs.RetryAt = "CreateContainerError", err.Error(), now.Add(5*time.Second)
			k.event(ctx, pod, corev1.EventTypeWarning, "Failed", err.Error())
			wake(5 * time.Second)
			continue
		}
		k.event(ctx, pod, corev1.EventTypeNormal, "Started", "Started container "+c.Name)
		k.ensureProbe(ctx, pod, ps, c, cs)
	}
	return next
}

// exitFile is where a container's shim writes how its process ended.
func exitFile(ps *podState, container string) string {
	return filepath.Join(ps.dir, container+".exit")
}

// startContainer runs the container's command+args as a process in the
// pod's namespace, under a shim (tabbyctl lab shim) that records its exit.
func (k *kubelet) startContainer(pod *corev1.Pod, ps *podState, c corev1.Container, cs *containerState) error {
	argv := append(append([]string{}, c.Command...), c.Args...)
	if len(argv) == 0 {
		return fmt.Errorf("container %s has no command: the lab runs host programs, give it command: [/absolute/path, ...]", c.Name)
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return fmt.Errorf("container %s: command %s: %w", c.Name, argv[0], err)
	}
	argv[0] = path
	env, err := k.containerEnv(pod, ps, c)
	if err != nil {
		return err
	}
	_ = os.Remove(exitFile(ps, c.Name))
	args := append([]string{"lab", "shim", "--exit-file", exitFile(ps, c.Name), "--"}, argv...)
	p, done, err := startDetached(procSpec{
		name:  c.Name,
		netns: ps.NetNSPath,
		path:  k.cfg.Tabbyctl,
		args:  args,
		env:   env,
		dir:   c.WorkingDir,
		log:   filepath.Join(ps.dir, c.Name+".log"),
	})
	if err != nil {
		return err
	}
	cs.Shim, cs.StartedAt, cs.Waiting, cs.Message = p, time.Now().Truncate(time.Second), "", ""
	key := ps.Namespace + "/" + ps.Name
	go func() {
		<-done
		k.queue.Add(key)
	}()
	return nil
}

// containerEnv is the container's environment: PATH, HOSTNAME (the pod's
// name: containers share the host's UTS namespace here), and the
// container's env with literal values and the common fieldRefs.
func (k *kubelet) containerEnv(pod *corev1.Pod, ps *podState, c corev1.Container) ([]string, error) {
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME=" + pod.Name}
	podIP := ""
	if len(ps.PodIPs) > 0 {
		podIP = ps.PodIPs[0]
	}
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil {
			if e.ValueFrom.FieldRef == nil {
				return nil, fmt.Errorf("container %s: env %s: only literal values and fieldRef work in the lab", c.Name, e.Name)
			}
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.name":
				v = pod.Name
			case "metadata.namespace":
				v = pod.Namespace
			case "metadata.uid":
				v = string(pod.UID)
			case "spec.nodeName":
				v = pod.Spec.NodeName
			case "spec.serviceAccountName":
				v = pod.Spec.ServiceAccountName
			case "status.podIP":
				v = podIP
			case "status.podIPs":
				v = strings.Join(ps.PodIPs, ",")
			case "status.hostIP", "status.hostIPs":
				v = k.cfg.NodeIP
			default:
				return nil, fmt.Errorf("container %s: env %s: fieldRef %s is not supported in the lab", c.Name, e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
		}
		env = append(env, e.Name+"="+v)
	}
	return env, nil
}

// readExit reads how a container's process ended from its shim's exit
// file; a shim killed before it could write one leaves an unknown end.
func (k *kubelet) readExit(ps *podState, container string, cs *containerState) *termination {
	t := &termination{StartedAt: cs.StartedAt, FinishedAt: time.Now().Truncate(time.Second)}
	data, err := os.ReadFile(exitFile(ps, container))
	var ex shimExit
	if err == nil {
		err = json.Unmarshal(data, &ex)
	}
	if err != nil {
		t.ExitCode, t.Reason = 137, "Error"
		t.Message = "the container's shim died without recording an exit status"
		return t
	}
	t.ExitCode, t.Signal, t.Message = ex.ExitCode, ex.Signal, ex.Error
	t.FinishedAt = ex.FinishedAt.Truncate(time.Second)
	switch {
	case ex.Error != "":
		t.Reason = "StartError"
	case ex.ExitCode == 0:
		t.Reason = "Completed"
	default:
		t.Reason = "Error"
	}
	return t
}

// postStatus sends the pod's status when it differs from what the API
// server has, with a merge patch carrying the pod's uid as precondition.
func (k *kubelet) postStatus(ctx context.Context, pod *corev1.Pod, ps *podState) error {
	key := pod.Namespace + "/" + pod.Name
	k.mu.Lock()
	in := statusInput{ps: ps, sandboxErr: k.sandboxErr[key], nodeIP: k.cfg.NodeIP, ready: map[string]bool{}, now: time.Now()}
	if ps != nil {
		for name := range ps.Containers {
			in.ready[name] = k.readyLocked(ps, name)
		}
	}
	k.mu.Unlock()
	st := buildStatus(pod, in)
	if equality.Semantic.DeepEqual(st, pod.Status) {
		return nil
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": pod.UID},
		"status": map[string]any{
			"phase":             st.Phase,
			"conditions":        st.Conditions,
			"hostIP":            st.HostIP,
			"hostIPs":           st.HostIPs,
			"podIP":             st.PodIP,
			"podIPs":            st.PodIPs,
			"startTime":         st.StartTime,
			"containerStatuses": st.ContainerStatuses,
		},
	})
	if err != nil {
		return err
	}
	_, err = k.cs.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("posting the status of %s: %w", key, err)
	}
	return nil
}
