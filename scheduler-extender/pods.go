package extender

import (
	"bytes"
	"encoding/json"
	"sync"

	v1 "k8s.io/api/core/v1"
)

// kube-scheduler sends the pod it places in full with every request: in
// its filter, then its prioritize, then again in the next cycle when the
// pod did not fit. Decoding a Pod with encoding/json (reflection over
// dozens of nested structs) was a third of the extender's CPU per request
// in the throughput benchmark. The same pod's JSON is the same bytes, so
// wirePod keeps the last few pods decoded with their JSON and hands out
// the kept Pod when the bytes are equal: a compare instead of a decode.
// Pods handed out are shared by requests and read-only, as every request's
// pod already is (the extender copies a pod before it changes it).

// wirePod is a *v1.Pod as it is decoded.
type wirePod struct{ pod *v1.Pod }

// UnmarshalJSON implements json.Unmarshaler. encoding/json calls it with
// one whole, valid JSON value (not null: a null Pod leaves the field nil).
func (w *wirePod) UnmarshalJSON(data []byte) error {
	if p := recentPods.get(data); p != nil {
		w.pod = p
		return nil
	}
	p := &v1.Pod{}
	if err := json.Unmarshal(data, p); err != nil {
		return err
	}
	recentPods.put(data, p)
	w.pod = p
	return nil
}

// recentPodsKept is how many pods are kept: kube-scheduler places one pod
// at a time, so a few cover a second scheduler and retries.
const recentPodsKept = 4

// maxKeptPodBytes is the largest pod JSON kept; a larger one (a pod with
// huge annotations) is decoded each time rather than pinned.
const maxKeptPodBytes = 64 << 10

// recentPods is the pods last decoded, with their JSON.
var recentPods podMemo

type podMemo struct {
	mu   sync.Mutex
	kept [recentPodsKept]struct {
		data []byte
		pod  *v1.Pod
	}
	next int
}

// get is the kept pod whose JSON is data, nil when none is.
func (m *podMemo) get(data []byte) *v1.Pod {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range m.kept {
		if k := &m.kept[i]; k.pod != nil && bytes.Equal(k.data, data) {
			return k.pod
		}
	}
	return nil
}

// put keeps pod, decoded from data (copied: data is the request's buffer).
func (m *podMemo) put(data []byte, pod *v1.Pod) {
	if len(data) > maxKeptPodBytes {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	k := &m.kept[m.next]
	k.data = append(k.data[:0], data...)
	k.pod = pod
	m.next = (m.next + 1) % recentPodsKept
}
