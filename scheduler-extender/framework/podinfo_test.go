package framework

import (
	"maps"
	"testing"
	"unique"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
)

func TestNewPodInfoTerms(t *testing.T) {
	app := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-1"},
		Spec: v1.PodSpec{Affinity: &v1.Affinity{
			PodAffinity: &v1.PodAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{
					{LabelSelector: app, TopologyKey: "zone"},                                             // own namespace
					{LabelSelector: app, TopologyKey: "zone", Namespaces: []string{"a", "b"}},             // the list only
					{LabelSelector: nil, TopologyKey: "zone", NamespaceSelector: &metav1.LabelSelector{}}, // every namespace, no pod
				},
				PreferredDuringSchedulingIgnoredDuringExecution: []v1.WeightedPodAffinityTerm{
					{Weight: 7, PodAffinityTerm: v1.PodAffinityTerm{LabelSelector: app, TopologyKey: "rack",
						NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}}},
				},
			},
			PodAntiAffinity: &v1.PodAntiAffinity{
				PreferredDuringSchedulingIgnoredDuringExecution: []v1.WeightedPodAffinityTerm{
					{Weight: 3, PodAffinityTerm: v1.PodAffinityTerm{LabelSelector: app, TopologyKey: "host"}},
				},
			},
		}},
	}
	pi := NewPodInfo(pod)
	if pi.ParseError != nil {
		t.Fatal(pi.ParseError)
	}
	if pi.Namespace != unique.Make("shop") {
		t.Errorf("Namespace %v", pi.Namespace.Value())
	}
	req := pi.RequiredAffinityTerms
	if len(req) != 3 || len(pi.RequiredAntiAffinityTerms) != 0 || len(pi.PreferredAffinityTerms) != 1 || len(pi.PreferredAntiAffinityTerms) != 1 {
		t.Fatalf("terms %d %d %d %d", len(req), len(pi.RequiredAntiAffinityTerms), len(pi.PreferredAffinityTerms), len(pi.PreferredAntiAffinityTerms))
	}
	set := func(ns ...string) map[string]struct{} {
		m := map[string]struct{}{}
		for _, n := range ns {
			m[n] = struct{}{}
		}
		return m
	}
	for i, want := range []map[string]struct{}{set("shop"), set("a", "b"), set()} {
		if !maps.Equal(req[i].Namespaces, want) {
			t.Errorf("term %d namespaces %v, want %v", i, req[i].Namespaces, want)
		}
	}
	web := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Labels: map[string]string{"app": "web"}}}
	webA := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Labels: map[string]string{"app": "web"}}}
	webX := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Labels: map[string]string{"app": "web"}}}
	prod := labels.Set{"env": "prod"}
	for _, tc := range []struct {
		name     string
		term     *AffinityTerm
		pod      *v1.Pod
		nsLabels labels.Set
		want     bool
	}{
		{"own namespace", &req[0], web, nil, true},
		{"own namespace only", &req[0], webA, nil, false},
		{"listed namespace", &req[1], webA, nil, true},
		{"unlisted namespace", &req[1], web, nil, false},
		{"nil namespaceSelector matches no labels", &req[1], webX, prod, false},
		{"{} namespaceSelector, but a nil labelSelector matches no pod", &req[2], webX, nil, false},
		{"namespaceSelector matches the namespace's labels", &pi.PreferredAffinityTerms[0].AffinityTerm, webX, prod, true},
		{"namespaceSelector, unknown namespace labels", &pi.PreferredAffinityTerms[0].AffinityTerm, webX, nil, false},
	} {
		if got := tc.term.Matches(tc.pod, tc.nsLabels); got != tc.want {
			t.Errorf("%s: Matches = %v", tc.name, got)
		}
	}
	if !req[2].AllNamespaces || req[0].AllNamespaces || pi.PreferredAffinityTerms[0].AllNamespaces {
		t.Errorf("AllNamespaces: %v %v %v", req[2].AllNamespaces, req[0].AllNamespaces, pi.PreferredAffinityTerms[0].AllNamespaces)
	}
	if pi.PreferredAffinityTerms[0].Weight != 7 || pi.PreferredAntiAffinityTerms[0].Weight != 3 || pi.PreferredAntiAffinityTerms[0].TopologyKey != "host" {
		t.Errorf("weighted terms %+v %+v", pi.PreferredAffinityTerms[0], pi.PreferredAntiAffinityTerms[0])
	}
	if !pi.HasAffinity() || pi.HasRequiredAntiAffinity() {
		t.Errorf("HasAffinity %v HasRequiredAntiAffinity %v", pi.HasAffinity(), pi.HasRequiredAntiAffinity())
	}
}

// A term that does not parse empties its list and is reported as upstream
// reports it; the other lists are kept.
func TestNewPodInfoParseError(t *testing.T) {
	bad := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"{{bad}}"}}}}
	good := &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}
	pod := &v1.Pod{Spec: v1.PodSpec{Affinity: &v1.Affinity{
		PodAntiAffinity: &v1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{LabelSelector: good, TopologyKey: "zone"}, {LabelSelector: bad, TopologyKey: "zone"}},
			PreferredDuringSchedulingIgnoredDuringExecution: []v1.WeightedPodAffinityTerm{{Weight: 1, PodAffinityTerm: v1.PodAffinityTerm{
				LabelSelector: good, TopologyKey: "zone", NamespaceSelector: bad,
			}}},
		},
		PodAffinity: &v1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{LabelSelector: good, TopologyKey: "zone"}}},
	}}}
	pi := NewPodInfo(pod)
	want := `[requiredAntiAffinityTerms: values[0][app]: Invalid value: "{{bad}}": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?'), preferredAntiAffinityTerms: values[0][app]: Invalid value: "{{bad}}": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')]`
	if pi.ParseError == nil || pi.ParseError.Error() != want {
		t.Errorf("ParseError:\n got %v\nwant %s", pi.ParseError, want)
	}
	if pi.RequiredAntiAffinityTerms != nil || pi.PreferredAntiAffinityTerms != nil || len(pi.RequiredAffinityTerms) != 1 {
		t.Errorf("lists %d %d %d", len(pi.RequiredAntiAffinityTerms), len(pi.PreferredAntiAffinityTerms), len(pi.RequiredAffinityTerms))
	}
	if !pi.HasRequiredAntiAffinity() {
		t.Error("HasRequiredAntiAffinity is about the spec, not what parsed")
	}
}

func TestPodInfoUpdate(t *testing.T) {
	mk := func(uid, ns string, labels map[string]string) *v1.Pod {
		return &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), Namespace: ns, Labels: labels},
			Spec: v1.PodSpec{Affinity: &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{
					LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, TopologyKey: "zone",
				}},
			}}},
		}
	}
	first := NewPodInfo(mk("u1", "shop", nil))
	relabelled := mk("u1", "shop", map[string]string{"app": "web"})
	got := first.Update(relabelled)
	if got == first || got.Pod != relabelled || first.Pod == relabelled {
		t.Fatal("Update must return a new PodInfo with the new pod and leave the old one alone")
	}
	if &got.RequiredAntiAffinityTerms[0] != &first.RequiredAntiAffinityTerms[0] {
		t.Error("same pod: the parsed terms should be kept")
	}
	if len(got.Labels) != 1 || got.Labels[0] != (Label{unique.Make("app"), unique.Make("web")}) || len(first.Labels) != 0 {
		t.Errorf("labels: updated %v, old %v", got.Labels, first.Labels)
	}
	other := (*PodInfo)(nil).Update(mk("u2", "shop", nil))
	if len(other.RequiredAntiAffinityTerms) != 1 {
		t.Error("nil PodInfo: Update should parse the pod")
	}
	if again := first.Update(mk("u3", "shop", nil)); &again.RequiredAntiAffinityTerms[0] == &first.RequiredAntiAffinityTerms[0] {
		t.Error("another pod (UID): its terms must be parsed anew")
	}
}
