package lab

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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
// NAMESPACE/NAME or NAME): /proc/PID/ns/net of a process of the pod, found
// in the pod's cgroup below its node's cgroup root (the pod's UID names
// it). When the API server does not answer, the pod's UID comes from the
// kubelets' pod log folders (/var/log/pods/NAMESPACE_NAME_UID).
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
		for i := range s.Nodes {
			n := &s.Nodes[i]
			matches, _ := filepath.Glob(filepath.Join(n.fsDir(), "var-log-pods", namespace+"_"+name+"_*"))
			for _, m := range matches {
				uid := strings.TrimPrefix(filepath.Base(m), namespace+"_"+name+"_")
				if path, perr := podNetNSPath(n, uid); perr == nil {
					return path, nil
				}
			}
		}
		return "", fmt.Errorf("asking the API server for pod %s/%s: %w (and no node runs it)", namespace, name, err)
	}
	n, err := s.Node(pod.Spec.NodeName)
	if err != nil {
		return "", fmt.Errorf("pod %s/%s is not on a node of the lab yet (phase %s, node %q): wait until it is Running", namespace, name, pod.Status.Phase, pod.Spec.NodeName)
	}
	path, err := podNetNSPath(n, string(pod.UID))
	if err != nil {
		return "", fmt.Errorf("pod %s/%s (phase %s) on %s: %w", namespace, name, pod.Status.Phase, n.Name, err)
	}
	return path, nil
}

// podNetNSPath is /proc/PID/ns/net of a process in the cgroup of the pod
// with uid on node n (kubelet's cgroupfs layout: ROOT/kubepods[/QOS]/podUID/CONTAINER).
func podNetNSPath(n *Node, uid string) (string, error) {
	hs, err := cgroupHierarchies()
	if err != nil {
		return "", err
	}
	want := "pod" + uid
	for _, h := range hs {
		var podDir string
		_ = filepath.WalkDir(filepath.Join(h, n.CgroupRoot), func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			if d.Name() == want {
				podDir = path
				return filepath.SkipAll
			}
			return nil
		})
		if podDir == "" {
			continue
		}
		pids := CgroupPids(podDir)
		// The sandbox's pause lives as long as the pod: its namespace
		// file stays valid while containers restart.
		slices.SortStableFunc(pids, func(a, b int) int {
			pa, pb := comm(a) == "pause", comm(b) == "pause"
			switch {
			case pa && !pb:
				return -1
			case pb && !pa:
				return 1
			}
			return 0
		})
		for _, pid := range pids {
			path := "/proc/" + strconv.Itoa(pid) + "/ns/net"
			if _, err := os.Stat(path); err == nil {
				return path, nil
			}
		}
		return "", errors.New("its cgroup holds no process: it has no network namespace now (not started, or ended)")
	}
	return "", errors.New("its node runs no cgroup for it (not started yet, or gone)")
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

// ErrSeveralProcesses is NodeProcess's error when more than one process
// of the name runs on the node (a container's old process still ending
// beside its new one, or a stray).
var ErrSeveralProcesses = errors.New("more than one process of the name")

// NodeProcess finds the process named comm (its /proc/PID/comm) running in
// node n's network namespace: a hostNetwork container's program, such as
// the tabbyd of the node's tabby-node pod.
func NodeProcess(n *Node, comm string) (Proc, error) {
	ino, err := netnsInode(NetNSPath(n.NetNS))
	if err != nil {
		return Proc{}, err
	}
	var found []Proc
	for _, p := range procsInNetNS(map[uint64]bool{ino: true}) {
		if p.Name == comm {
			found = append(found, p)
		}
	}
	switch len(found) {
	case 0:
		return Proc{}, fmt.Errorf("no %s runs on %s", comm, n.Name)
	case 1:
		return found[0], nil
	}
	descs := make([]string, len(found))
	for i, p := range found {
		descs[i] = describeProc(p.Pid)
	}
	return Proc{}, fmt.Errorf("%w: %d processes named %s run on %s: %s", ErrSeveralProcesses, len(found), comm, n.Name, strings.Join(descs, "; "))
}

// Clientset is an admin clientset of the lab's API server (RESTConfig's).
func (s *State) Clientset() (kubernetes.Interface, error) {
	cfg, err := s.RESTConfig()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}
