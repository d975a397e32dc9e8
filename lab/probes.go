package lab

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// prober runs the readiness probe of one run of one container.
type prober struct {
	cancel context.CancelFunc
	ready  atomic.Bool
}

// readyLocked is a running container's readiness: its probe's verdict,
// or true without a probe. k.mu is held.
func (k *kubelet) readyLocked(ps *podState, container string) bool {
	cs := ps.Containers[container]
	if !cs.running() {
		return false
	}
	if p, ok := k.probes[restartCountKey(ps, container, cs.RestartCount)]; ok {
		return p.ready.Load()
	}
	return true
}

// ensureProbe starts the readiness prober of a container's current run if
// it has a readiness probe and none runs. A kubelet that adopts a running
// container starts from the readiness the API server has for it, so that
// a kubelet restart does not make ready pods unready.
func (k *kubelet) ensureProbe(ctx context.Context, pod *corev1.Pod, ps *podState, c corev1.Container, cs *containerState) {
	if c.ReadinessProbe == nil {
		return
	}
	key := restartCountKey(ps, c.Name, cs.RestartCount)
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.probes[key]; ok {
		return
	}
	pctx, cancel := context.WithCancel(ctx)
	p := &prober{cancel: cancel}
	for _, s := range pod.Status.ContainerStatuses {
		if s.Name == c.Name && s.RestartCount == cs.RestartCount && s.Ready && s.State.Running != nil {
			p.ready.Store(true)
		}
	}
	k.probes[key] = p
	podIP := ""
	if len(ps.PodIPs) > 0 {
		podIP = ps.PodIPs[0]
	}
	t := probeTarget{podIP: podIP, netns: ps.NetNSPath, ports: c.Ports, nsenter: k.nsenter}
	podKey := ps.Namespace + "/" + ps.Name
	go k.runProbe(pctx, p, *c.ReadinessProbe, t, podKey, c.Name)
}

// stopProbe stops the probers of a container (every run).
func (k *kubelet) stopProbe(ps *podState, container string) {
	k.stopProbesWithPrefix(string(ps.UID) + "/" + container + "/")
}

// stopProbesOf stops the probers of a pod.
func (k *kubelet) stopProbesOf(ps *podState) { k.stopProbesWithPrefix(string(ps.UID) + "/") }

// stopProbes stops every prober.
func (k *kubelet) stopProbes() { k.stopProbesWithPrefix("") }

func (k *kubelet) stopProbesWithPrefix(prefix string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for key, p := range k.probes {
		if strings.HasPrefix(key, prefix) {
			p.cancel()
			delete(k.probes, key)
		}
	}
}

// probeTarget is where a container's probes go.
type probeTarget struct {
	podIP   string
	netns   string
	ports   []corev1.ContainerPort
	nsenter string
}

// runProbe probes as the probe says (initial delay, period, timeout,
// success and failure thresholds) until ctx ends, and queues the pod when
// the verdict changes.
func (k *kubelet) runProbe(ctx context.Context, p *prober, probe corev1.Probe, t probeTarget, podKey, container string) {
	period := time.Duration(max(probe.PeriodSeconds, 1)) * time.Second
	timeout := time.Duration(max(probe.TimeoutSeconds, 1)) * time.Second
	successes, failures := max(probe.SuccessThreshold, 1), max(probe.FailureThreshold, 1)
	wait := time.Duration(probe.InitialDelaySeconds) * time.Second
	var ok, bad int32
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = period
		err := probeOnce(ctx, probe.ProbeHandler, t, timeout)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			ok, bad = ok+1, 0
		} else {
			ok, bad = 0, bad+1
		}
		switch {
		case ok >= successes && !p.ready.Load():
			p.ready.Store(true)
			k.log.Info("container ready", "pod", podKey, "container", container)
			k.queue.Add(podKey)
		case bad >= failures && p.ready.Load():
			p.ready.Store(false)
			k.log.Info("container not ready", "pod", podKey, "container", container, "error", err)
			k.queue.Add(podKey)
		}
	}
}

// probeOnce runs one probe: exec inside the pod's namespace, tcpSocket and
// httpGet from the node's (where this kubelet runs), as kubelet does.
func probeOnce(ctx context.Context, h corev1.ProbeHandler, t probeTarget, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case h.Exec != nil:
		if len(h.Exec.Command) == 0 {
			return fmt.Errorf("an exec probe without a command")
		}
		cmd := exec.CommandContext(ctx, t.nsenter, append([]string{"--net=" + t.netns, "--"}, h.Exec.Command...)...)
		return cmd.Run()
	case h.TCPSocket != nil:
		port, err := t.port(h.TCPSocket.Port)
		if err != nil {
			return err
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(orDefault(h.TCPSocket.Host, t.podIP), strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return c.Close()
	case h.HTTPGet != nil:
		port, err := t.port(h.HTTPGet.Port)
		if err != nil {
			return err
		}
		scheme := strings.ToLower(string(h.HTTPGet.Scheme))
		if scheme == "" {
			scheme = "http"
		}
		url := scheme + "://" + net.JoinHostPort(orDefault(h.HTTPGet.Host, t.podIP), strconv.Itoa(port)) + h.HTTPGet.Path
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		for _, hd := range h.HTTPGet.HTTPHeaders {
			req.Header.Add(hd.Name, hd.Value)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("HTTP probe: %s", resp.Status)
		}
		return nil
	}
	// gRPC probes are not run in the lab: they pass.
	return nil
}

// port resolves a probe's port, a number or the name of a container port.
func (t probeTarget) port(p intstr.IntOrString) (int, error) {
	if p.Type == intstr.Int {
		return p.IntValue(), nil
	}
	for _, cp := range t.ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("no container port named %q", p.StrVal)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// restartCountKey names a container's run for its prober.
func restartCountKey(ps *podState, container string, restarts int32) string {
	return string(ps.UID) + "/" + container + "/" + strconv.Itoa(int(restarts))
}
