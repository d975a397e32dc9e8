package lab

import (
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Sandbox states of a pod.
const (
	// sandboxCreating: the namespace and CNI ADD are under way (a kubelet
	// that finds this after a restart removes what was made and starts
	// over).
	sandboxCreating = "creating"
	sandboxReady    = "ready"
	// sandboxRemoved: the pod finished; its network is gone (CNI DEL).
	sandboxRemoved = "removed"
)

// podState is what the kubelet knows of one pod; it is saved in the pod's
// folder so that a restarted kubelet adopts the pod instead of wiring it
// again.
type podState struct {
	UID       types.UID `json:"uid"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	// NetNS names the pod's namespace ("" for a hostNetwork pod, which
	// runs in the node's); NetNSPath is where it is bound.
	NetNS       string `json:"netns,omitempty"`
	NetNSPath   string `json:"netnsPath"`
	HostNetwork bool   `json:"hostNetwork,omitempty"`
	// SandboxID is the CNI container ID.
	SandboxID string    `json:"sandboxID,omitempty"`
	Sandbox   string    `json:"sandbox"`
	PodIPs    []string  `json:"podIPs,omitempty"`
	Created   time.Time `json:"created"`
	// Containers by name.
	Containers map[string]*containerState `json:"containers"`

	dir   string // the pod's folder (not saved)
	saved []byte // what was saved last
}

// containerState is one container of a pod: the shim that runs its
// current process, and how its runs ended.
type containerState struct {
	Shim         Proc      `json:"shim"`
	StartedAt    time.Time `json:"startedAt"`
	RestartCount int32     `json:"restartCount"`
	// Exit is how the current run ended (nil while it runs or before it
	// starts); Last is how the run before ended.
	Exit *termination `json:"exit,omitempty"`
	Last *termination `json:"last,omitempty"`
	// Waiting and Message say why it has not started (a bad command).
	Waiting string    `json:"waiting,omitempty"`
	Message string    `json:"message,omitempty"`
	RetryAt time.Time `json:"retryAt,omitzero"`
}

// termination is how a container's run ended.
type termination struct {
	ExitCode   int32     `json:"exitCode"`
	Signal     int32     `json:"signal,omitempty"`
	Reason     string    `json:"reason"`
	Message    string    `json:"message,omitempty"`
	StartedAt  time.Time `json:"startedAt"`
	FinishedAt time.Time `json:"finishedAt"`
}

func (t *termination) state() *corev1.ContainerStateTerminated {
	return &corev1.ContainerStateTerminated{
		ExitCode:   t.ExitCode,
		Signal:     t.Signal,
		Reason:     t.Reason,
		Message:    t.Message,
		StartedAt:  metav1.NewTime(t.StartedAt),
		FinishedAt: metav1.NewTime(t.FinishedAt),
	}
}

// shouldRestart applies a pod's restartPolicy to a run that ended.
func shouldRestart(policy corev1.RestartPolicy, exitCode int32) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return exitCode != 0
	default:
		return true
	}
}

// restartDelay is the back-off before restart number restarts+1: 1s
// doubling up to 10s (kubelet's 10s to 5 minutes is too slow for tests).
func restartDelay(restarts int32) time.Duration {
	if restarts >= 4 {
		return 10 * time.Second
	}
	return min(time.Second<<restarts, 10*time.Second)
}

// finished reports whether a container ran and will not run again.
func (c *containerState) finished(policy corev1.RestartPolicy) bool {
	return c != nil && c.Exit != nil && !shouldRestart(policy, c.Exit.ExitCode)
}

// running reports whether the container's process runs.
func (c *containerState) running() bool { return c != nil && c.Shim.Pid != 0 && c.Exit == nil }

// podPhase is the phase of a pod from its containers.
func podPhase(pod *corev1.Pod, ps *podState) corev1.PodPhase {
	if ps == nil || ps.Sandbox == sandboxCreating {
		return corev1.PodPending
	}
	policy := pod.Spec.RestartPolicy
	allFinished, allSucceeded, anyRan := true, true, false
	for _, c := range pod.Spec.Containers {
		cs := ps.Containers[c.Name]
		if cs != nil && (cs.running() || cs.Exit != nil || cs.RestartCount > 0) {
			anyRan = true
		}
		if !cs.finished(policy) {
			allFinished = false
			continue
		}
		if cs.Exit.ExitCode != 0 {
			allSucceeded = false
		}
	}
	switch {
	case allFinished && allSucceeded:
		return corev1.PodSucceeded
	case allFinished:
		return corev1.PodFailed
	case anyRan:
		return corev1.PodRunning
	}
	return corev1.PodPending
}

// statusInput is what buildStatus needs besides the pod.
type statusInput struct {
	ps *podState
	// sandboxErr is why the sandbox could not be made (CNI ADD failed).
	sandboxErr string
	nodeIP     string
	// ready holds the readiness of running containers by name (a
	// container without a readiness probe is ready when it runs).
	ready map[string]bool
	now   time.Time
}

// buildStatus computes the status the kubelet reports for a pod: the
// fields a kubelet owns are set, the others (qosClass, the scheduler's
// PodScheduled) kept.
func buildStatus(pod *corev1.Pod, in statusInput) corev1.PodStatus {
	st := *pod.Status.DeepCopy()
	now := metav1.NewTime(in.now.Truncate(time.Second))
	ps := in.ps
	st.Phase = podPhase(pod, ps)
	if in.nodeIP != "" {
		st.HostIP = in.nodeIP
		st.HostIPs = []corev1.HostIP{{IP: in.nodeIP}}
	}
	if ps != nil && len(ps.PodIPs) > 0 {
		st.PodIP = ps.PodIPs[0]
		st.PodIPs = nil
		for _, ip := range ps.PodIPs {
			st.PodIPs = append(st.PodIPs, corev1.PodIP{IP: ip})
		}
	}
	if ps != nil && st.StartTime == nil {
		t := metav1.NewTime(ps.Created)
		st.StartTime = &t
	}
	policy := pod.Spec.RestartPolicy
	var notReady []string
	st.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		var cs *containerState
		if ps != nil {
			cs = ps.Containers[c.Name]
		}
		s := corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: "lab://" + c.Image}
		started := false
		switch {
		case cs.running():
			s.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(cs.StartedAt)}
			s.Ready = in.ready[c.Name]
			started = true
			if cs.Last != nil {
				s.LastTerminationState.Terminated = cs.Last.state()
			}
		case cs.finished(policy):
			s.State.Terminated = cs.Exit.state()
			if cs.Last != nil {
				s.LastTerminationState.Terminated = cs.Last.state()
			}
		case cs != nil && cs.Exit != nil:
			s.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
				Message: fmt.Sprintf("back-off restarting failed container %s (exit code %d)", c.Name, cs.Exit.ExitCode)}
			s.LastTerminationState.Terminated = cs.Exit.state()
		default:
			w := &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}
			switch {
			case cs != nil && cs.Waiting != "":
				w.Reason, w.Message = cs.Waiting, cs.Message
			case in.sandboxErr != "":
				w.Message = in.sandboxErr
			}
			s.State.Waiting = w
			if cs != nil && cs.Last != nil {
				s.LastTerminationState.Terminated = cs.Last.state()
			}
		}
		if cs != nil {
			s.RestartCount = cs.RestartCount
			if cs.StartedAt != (time.Time{}) {
				s.ContainerID = fmt.Sprintf("lab://%s/%s/%d", pod.UID, c.Name, cs.RestartCount)
			}
		}
		s.Started = &started
		if !s.Ready {
			notReady = append(notReady, c.Name)
		}
		st.ContainerStatuses = append(st.ContainerStatuses, s)
	}

	terminal := st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed
	sandboxUp := ps != nil && ps.Sandbox == sandboxReady
	ready := len(notReady) == 0 && !terminal
	readyReason, readyMsg := "", ""
	switch {
	case terminal:
		readyReason = "PodCompleted"
	case !ready:
		readyReason = "ContainersNotReady"
		readyMsg = fmt.Sprintf("containers with unready status: [%s]", strings.Join(notReady, " "))
	}
	initialized, initReason, initMsg := true, "", ""
	if len(pod.Spec.InitContainers) > 0 {
		initialized, initReason = false, "LabInitContainersUnsupported"
		initMsg = "the lab kubelet does not run init containers"
	}
	set := func(t corev1.PodConditionType, ok bool, reason, msg string) {
		setCondition(&st, pod.Status.Conditions, corev1.PodCondition{Type: t, Status: boolStatus(ok), Reason: reason, Message: msg}, now)
	}
	set(corev1.PodReadyToStartContainers, sandboxUp, "", "")
	set(corev1.PodInitialized, initialized, initReason, initMsg)
	set(corev1.PodReady, ready, readyReason, readyMsg)
	set(corev1.ContainersReady, ready, readyReason, readyMsg)
	if !hasCondition(pod.Status.Conditions, corev1.PodScheduled) {
		set(corev1.PodScheduled, true, "", "")
	}
	sort.SliceStable(st.Conditions, func(i, j int) bool {
		return conditionOrder(st.Conditions[i].Type) < conditionOrder(st.Conditions[j].Type)
	})
	return st
}

func boolStatus(b bool) corev1.ConditionStatus {
	if b {
		return corev1.ConditionTrue
	}
	return corev1.ConditionFalse
}

func hasCondition(conds []corev1.PodCondition, t corev1.PodConditionType) bool {
	for _, c := range conds {
		if c.Type == t {
			return true
		}
	}
	return false
}

// setCondition puts c into st.Conditions, keeping the transition time of
// the old condition of its type when its status did not change.
func setCondition(st *corev1.PodStatus, old []corev1.PodCondition, c corev1.PodCondition, now metav1.Time) {
	c.LastTransitionTime = now
	for _, o := range old {
		if o.Type == c.Type && o.Status == c.Status {
			c.LastTransitionTime = o.LastTransitionTime
		}
	}
	for i := range st.Conditions {
		if st.Conditions[i].Type == c.Type {
			st.Conditions[i] = c
			return
		}
	}
	st.Conditions = append(st.Conditions, c)
}

// conditionOrder is the order kubelet lists a pod's conditions in.
func conditionOrder(t corev1.PodConditionType) int {
	for i, o := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized,
		corev1.PodReady, corev1.ContainersReady, corev1.PodScheduled} {
		if o == t {
			return i
		}
	}
	return 99
}
