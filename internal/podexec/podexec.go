// Package podexec runs a program in a pod's container through the API
// server, as `kubectl exec` does: how tabbyctl reaches a node's tabbyd,
// which serves its status and logs on the node's loopback only.
package podexec

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/tabbynet/tabby/datastore"
)

// Exec runs command in the container of pod, its output streamed to
// stdout and stderr, until it exits or ctx ends.
func Exec(ctx context.Context, cfg *rest.Config, ds *datastore.Client, pod *corev1.Pod, container string, command []string, stdout, stderr io.Writer) error {
	req := ds.CoreREST().Post().Namespace(pod.Namespace).Resource("pods").Name(pod.Name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: command, Stdout: true, Stderr: true}, datastore.ParameterCodec)
	exec, err := newExecutor(cfg, req.URL())
	if err != nil {
		return err
	}
	return exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: stdout, Stderr: stderr})
}

// newExecutor speaks WebSocket to the API server, falling back to SPDY
// where the WebSocket upgrade fails (servers older than v1.30), as
// kubectl exec does.
func newExecutor(cfg *rest.Config, u *url.URL) (remotecommand.Executor, error) {
	ws, err := remotecommand.NewWebSocketExecutor(cfg, "GET", u.String())
	if err != nil {
		return nil, fmt.Errorf("exec over WebSocket: %w", err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(cfg, "POST", u)
	if err != nil {
		return nil, fmt.Errorf("exec over SPDY: %w", err)
	}
	return remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
}

// HealthListen is the --health-listen argument of the pod's container,
// "" when it has none (tabbyctl's default then matches tabbyd's).
func HealthListen(pod *corev1.Pod, container string) string {
	for _, c := range pod.Spec.Containers {
		if c.Name != container {
			continue
		}
		args := append(append([]string(nil), c.Command...), c.Args...)
		for i, a := range args {
			if v, ok := strings.CutPrefix(a, "--health-listen="); ok {
				return v
			}
			if a == "--health-listen" && i+1 < len(args) {
				return args[i+1]
			}
		}
	}
	return ""
}
