package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ParsePodRef splits NAMESPACE/NAME (or NAME, in namespace default).
func ParsePodRef(ref string) (namespace, name string, err error) {
	namespace, name, found := strings.Cut(ref, "/")
	if !found {
		namespace, name = metav1.NamespaceDefault, ref
	}
	if namespace == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("pod %q: write NAMESPACE/NAME (or NAME for namespace default)", ref)
	}
	return namespace, name, nil
}

// PodNetNS finds the network namespace of a pod of the lab (ref is
// NAMESPACE/NAME or NAME): the path the lab kubelet wrote into the pod's
// AnnotationNetNS, or, when the API server does not answer, the one in
// the kubelets' state.
func PodNetNS(ctx context.Context, s *State, ref string) (string, error) {
	namespace, name, err := ParsePodRef(ref)
	if err != nil {
		return "", err
	}
	cfg, err := s.RESTConfig()
	if err != nil {
		return "", err
	}
	cfg.Timeout = 5 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	pod, err := cs.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", fmt.Errorf("pod %s/%s: %w", namespace, name, errNoSuchPod)
	case err != nil:
		ps, derr := podStateOnDisk(s, namespace, name)
		if derr != nil {
			return "", fmt.Errorf("asking the API server for pod %s/%s: %w (and the kubelets do not know it either)", namespace, name, err)
		}
		return ps.NetNSPath, nil
	}
	path := pod.Annotations[AnnotationNetNS]
	if path == "" {
		return "", fmt.Errorf("pod %s/%s has no network namespace yet (phase %s, node %q): wait until it is Running", namespace, name, pod.Status.Phase, pod.Spec.NodeName)
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("pod %s/%s: its network namespace %s is gone (phase %s)", namespace, name, path, pod.Status.Phase)
	}
	return path, nil
}

// Exec replaces this program with argv run inside the pod's network
// namespace (nsenter --net=PATH -- argv...): stdin, stdout, stderr and the
// exit status are argv's own. It returns only on error.
func Exec(ctx context.Context, s *State, ref string, argv []string) error {
	if len(argv) == 0 {
		return errors.New("no command: lab exec NAMESPACE/POD -- COMMAND [ARGS...]")
	}
	path, err := PodNetNS(ctx, s, ref)
	if err != nil {
		return err
	}
	nsenter, err := nsenterPath()
	if err != nil {
		return err
	}
	return syscall.Exec(nsenter, append([]string{"nsenter", "--net=" + path, "--"}, argv...), os.Environ())
}

// errNoSuchPod is returned by PodNetNS for a pod the lab does not run.
var errNoSuchPod = errors.New("no such pod")

// podStateOnDisk finds a pod's state in the kubelets' folders of the lab
// (for lab exec when the API server does not answer).
func podStateOnDisk(s *State, namespace, name string) (*podState, error) {
	for _, n := range s.Nodes {
		matches, _ := filepath.Glob(filepath.Join(n.Dir, "pods", namespace+"_"+name+"_*"))
		for _, m := range matches {
			if ps, err := readPodState(m); err == nil && ps.Namespace == namespace && ps.Name == name {
				return ps, nil
			}
		}
	}
	return nil, fmt.Errorf("pod %s/%s: %w", namespace, name, errNoSuchPod)
}
