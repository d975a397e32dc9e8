package lab

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestShouldRestartAndDelay(t *testing.T) {
	for _, tc := range []struct {
		policy corev1.RestartPolicy
		code   int32
		want   bool
	}{
		{corev1.RestartPolicyAlways, 0, true},
		{corev1.RestartPolicyAlways, 1, true},
		{"", 0, true}, // the API server defaults it to Always
		{corev1.RestartPolicyOnFailure, 0, false},
		{corev1.RestartPolicyOnFailure, 2, true},
		{corev1.RestartPolicyNever, 0, false},
		{corev1.RestartPolicyNever, 137, false},
	} {
		if got := shouldRestart(tc.policy, tc.code); got != tc.want {
			t.Errorf("%s, exit %d: restart %v, want %v", tc.policy, tc.code, got, tc.want)
		}
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	for i, w := range want {
		if got := restartDelay(int32(i)); got != w {
			t.Errorf("delay before restart %d: %v, want %v", i+1, got, w)
		}
	}
	if got := restartDelay(1000); got != 10*time.Second {
		t.Errorf("delay after many restarts: %v", got)
	}
}

func labPod(policy corev1.RestartPolicy, containers ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", UID: "uid-1"},
		Spec:       corev1.PodSpec{RestartPolicy: policy, NodeName: "node1"},
		Status: corev1.PodStatus{Phase: corev1.PodPending, QOSClass: corev1.PodQOSBestEffort, Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(time.Unix(1000, 0))},
		}},
	}
	for _, c := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c, Image: "lab"})
	}
	return p
}

var t0 = time.Unix(2000, 0)

func runningC() *containerState {
	return &containerState{Shim: Proc{Pid: 42, Start: 1}, StartedAt: t0}
}

func exitedC(code int32) *containerState {
	return &containerState{StartedAt: t0, Exit: &termination{ExitCode: code, Reason: "Error", StartedAt: t0, FinishedAt: t0.Add(time.Second)}}
}

func sandbox(cs map[string]*containerState) *podState {
	return &podState{UID: "uid-1", Sandbox: sandboxReady, PodIPs: []string{"10.244.0.5"}, Created: t0, Containers: cs}
}

func TestPodPhase(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy corev1.RestartPolicy
		ps     *podState
		want   corev1.PodPhase
	}{
		{"no sandbox", corev1.RestartPolicyAlways, nil, corev1.PodPending},
		{"sandbox being made", corev1.RestartPolicyAlways, &podState{Sandbox: sandboxCreating}, corev1.PodPending},
		{"not started", corev1.RestartPolicyAlways, sandbox(map[string]*containerState{}), corev1.PodPending},
		{"running", corev1.RestartPolicyAlways, sandbox(map[string]*containerState{"a": runningC(), "b": runningC()}), corev1.PodRunning},
		{"one running one waiting", corev1.RestartPolicyAlways, sandbox(map[string]*containerState{"a": runningC()}), corev1.PodRunning},
		{"always: exited is restarting", corev1.RestartPolicyAlways, sandbox(map[string]*containerState{"a": exitedC(0), "b": exitedC(1)}), corev1.PodRunning},
		{"never: all succeeded", corev1.RestartPolicyNever, sandbox(map[string]*containerState{"a": exitedC(0), "b": exitedC(0)}), corev1.PodSucceeded},
		{"never: one failed", corev1.RestartPolicyNever, sandbox(map[string]*containerState{"a": exitedC(0), "b": exitedC(2)}), corev1.PodFailed},
		{"never: one still runs", corev1.RestartPolicyNever, sandbox(map[string]*containerState{"a": exitedC(2), "b": runningC()}), corev1.PodRunning},
		{"onfailure: failed restarts", corev1.RestartPolicyOnFailure, sandbox(map[string]*containerState{"a": exitedC(0), "b": exitedC(1)}), corev1.PodRunning},
		{"onfailure: all succeeded", corev1.RestartPolicyOnFailure, sandbox(map[string]*containerState{"a": exitedC(0), "b": exitedC(0)}), corev1.PodSucceeded},
		{"network removed after the end", corev1.RestartPolicyNever, func() *podState {
			ps := sandbox(map[string]*containerState{"a": exitedC(0), "b": exitedC(0)})
			ps.Sandbox = sandboxRemoved
			return ps
		}(), corev1.PodSucceeded},
	} {
		if got := podPhase(labPod(tc.policy, "a", "b"), tc.ps); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}

func condition(st corev1.PodStatus, typ corev1.PodConditionType) corev1.PodCondition {
	for _, c := range st.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return corev1.PodCondition{}
}

func TestBuildStatusRunningAndReady(t *testing.T) {
	pod := labPod(corev1.RestartPolicyAlways, "srv", "side")
	ps := sandbox(map[string]*containerState{"srv": runningC(), "side": runningC()})
	ps.Containers["side"].RestartCount = 2
	ps.Containers["side"].Last = &termination{ExitCode: 1, Reason: "Error", StartedAt: t0, FinishedAt: t0}
	now := t0.Add(time.Minute)
	in := statusInput{ps: ps, nodeIP: "10.77.0.11", ready: map[string]bool{"srv": true, "side": false}, now: now}
	st := buildStatus(pod, in)
	if st.Phase != corev1.PodRunning || st.PodIP != "10.244.0.5" || len(st.PodIPs) != 1 || st.HostIP != "10.77.0.11" || st.HostIPs[0].IP != "10.77.0.11" {
		t.Errorf("status %+v", st)
	}
	if st.QOSClass != corev1.PodQOSBestEffort || st.StartTime == nil || !st.StartTime.Time.Equal(t0) {
		t.Errorf("kept fields: qos %s start %v", st.QOSClass, st.StartTime)
	}
	if c := condition(st, corev1.PodReady); c.Status != corev1.ConditionFalse || c.Reason != "ContainersNotReady" || c.Message != "containers with unready status: [side]" {
		t.Errorf("Ready %+v", c)
	}
	if c := condition(st, corev1.PodScheduled); !c.LastTransitionTime.Time.Equal(time.Unix(1000, 0)) {
		t.Errorf("the scheduler's PodScheduled was not kept: %+v", c)
	}
	if c := condition(st, corev1.PodReadyToStartContainers); c.Status != corev1.ConditionTrue {
		t.Errorf("PodReadyToStartContainers %+v", c)
	}
	side := st.ContainerStatuses[1]
	if side.Name != "side" || side.State.Running == nil || side.RestartCount != 2 || side.LastTerminationState.Terminated == nil || side.Ready {
		t.Errorf("side %+v", side)
	}
	if side.ContainerID != "lab://uid-1/side/2" || side.Started == nil || !*side.Started {
		t.Errorf("side id %s started %v", side.ContainerID, side.Started)
	}
	// The order kubelet uses.
	var order []corev1.PodConditionType
	for _, c := range st.Conditions {
		order = append(order, c.Type)
	}
	want := []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.PodReady, corev1.ContainersReady, corev1.PodScheduled}
	if len(order) != len(want) {
		t.Fatalf("conditions %v", order)
	}
	for i := range want {
		if order[i] != want[i] {
			t.Errorf("conditions %v, want %v", order, want)
		}
	}

	// Once side is ready, Ready turns True with a new transition time; a
	// status built again from the result is the same (nothing to post).
	in.ready["side"] = true
	pod.Status = st
	st2 := buildStatus(pod, statusInput{ps: ps, nodeIP: in.nodeIP, ready: in.ready, now: now.Add(time.Minute)})
	if c := condition(st2, corev1.PodReady); c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Time.Equal(now.Add(time.Minute)) {
		t.Errorf("Ready after the probe %+v", c)
	}
	if c := condition(st2, corev1.PodInitialized); !c.LastTransitionTime.Time.Equal(now) {
		t.Errorf("Initialized moved: %+v", c)
	}
	pod.Status = st2
	st3 := buildStatus(pod, statusInput{ps: ps, nodeIP: in.nodeIP, ready: in.ready, now: now.Add(time.Hour)})
	if !equalStatus(st2, st3) {
		t.Errorf("an unchanged pod's status changed:\n%+v\n%+v", st2, st3)
	}
}

func equalStatus(a, b corev1.PodStatus) bool {
	if len(a.Conditions) != len(b.Conditions) {
		return false
	}
	for i := range a.Conditions {
		if a.Conditions[i] != b.Conditions[i] {
			return false
		}
	}
	return a.Phase == b.Phase && a.PodIP == b.PodIP && len(a.ContainerStatuses) == len(b.ContainerStatuses)
}

func TestBuildStatusWaiting(t *testing.T) {
	pod := labPod(corev1.RestartPolicyAlways, "c")
	// No sandbox: CNI ADD failed.
	st := buildStatus(pod, statusInput{sandboxErr: "CNI ADD failed: no pool", nodeIP: "10.77.0.11", now: t0})
	w := st.ContainerStatuses[0].State.Waiting
	if st.Phase != corev1.PodPending || w == nil || w.Reason != "ContainerCreating" || w.Message != "CNI ADD failed: no pool" || st.PodIP != "" {
		t.Errorf("status %+v", st)
	}
	if c := condition(st, corev1.PodReadyToStartContainers); c.Status != corev1.ConditionFalse {
		t.Errorf("PodReadyToStartContainers %+v", c)
	}
	// A command that cannot run.
	ps := sandbox(map[string]*containerState{"c": {Waiting: "CreateContainerError", Message: "no command"}})
	st = buildStatus(pod, statusInput{ps: ps, now: t0})
	if w := st.ContainerStatuses[0].State.Waiting; w == nil || w.Reason != "CreateContainerError" || st.Phase != corev1.PodPending {
		t.Errorf("status %+v", st)
	}
	// Back-off between restarts.
	ps = sandbox(map[string]*containerState{"c": exitedC(1)})
	st = buildStatus(pod, statusInput{ps: ps, now: t0})
	cs := st.ContainerStatuses[0]
	if cs.State.Waiting == nil || cs.State.Waiting.Reason != "CrashLoopBackOff" || cs.LastTerminationState.Terminated.ExitCode != 1 || st.Phase != corev1.PodRunning {
		t.Errorf("status %+v", st)
	}
	// Init containers are not run.
	pod.Spec.InitContainers = []corev1.Container{{Name: "init"}}
	st = buildStatus(pod, statusInput{ps: sandbox(map[string]*containerState{}), now: t0})
	if c := condition(st, corev1.PodInitialized); c.Status != corev1.ConditionFalse || c.Reason != "LabInitContainersUnsupported" {
		t.Errorf("Initialized %+v", c)
	}
}

func TestBuildStatusTerminal(t *testing.T) {
	pod := labPod(corev1.RestartPolicyNever, "c")
	ps := sandbox(map[string]*containerState{"c": exitedC(3)})
	ps.Sandbox = sandboxRemoved
	st := buildStatus(pod, statusInput{ps: ps, now: t0})
	term := st.ContainerStatuses[0].State.Terminated
	if st.Phase != corev1.PodFailed || term == nil || term.ExitCode != 3 || st.PodIP != "10.244.0.5" {
		t.Errorf("status %+v", st)
	}
	if c := condition(st, corev1.PodReady); c.Status != corev1.ConditionFalse || c.Reason != "PodCompleted" {
		t.Errorf("Ready %+v", c)
	}
}
