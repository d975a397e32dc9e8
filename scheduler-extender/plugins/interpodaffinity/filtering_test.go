package interpodaffinity

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

var (
	affinityFail = &framework.Status{Code: framework.UnschedulableAndUnresolvable, Reason: ErrReasonAffinityRulesNotMatch}
	antiFail     = &framework.Status{Code: framework.Unschedulable, Reason: ErrReasonAntiAffinityRulesNotMatch}
	existingFail = &framework.Status{Code: framework.Unschedulable, Reason: ErrReasonExistingAntiAffinityRulesNotMatch}
)

type filterCase struct {
	name       string
	pod        *v1.Pod
	pods       []*v1.Pod
	nodes      []*v1.Node
	namespaces []*v1.Namespace
	// wantSkip: PreFilter has nothing to say (upstream's Skip status).
	wantSkip bool
	// wantErr: PreFilter fails the pod everywhere with this reason.
	wantErr string
	// want is each node's status, nil when it passes.
	want []*framework.Status
}

func runFilterCases(t *testing.T, cases []filterCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			snap := framework.NewSnapshot(tc.nodes, tc.pods, tc.namespaces)
			check, err := New().PreFilter(context.Background(), snap, tc.pod)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("PreFilter error:\n got %v\nwant %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("PreFilter: %v", err)
			}
			if (check == nil) != tc.wantSkip {
				t.Fatalf("PreFilter skipped = %v, want %v", check == nil, tc.wantSkip)
			}
			for i, n := range tc.nodes {
				var got *framework.Status
				if check != nil {
					got = check(snap.Get(n.Name))
				}
				want := tc.want[i]
				if (got == nil) != (want == nil) || (got != nil && *got != *want) {
					t.Errorf("node %s: got %+v, want %+v", n.Name, got, want)
				}
			}
		})
	}
}

// Upstream's TestRequiredAffinitySingleNode (filtering_test.go, v1.35.4).
func TestRequiredAffinitySingleNode(t *testing.T) {
	podLabel := map[string]string{"service": "securityscan"}
	pod := mkPod().labels(podLabel).node("node1").obj()
	podLabel2 := map[string]string{"security": "S1"}
	node1 := mkNode("node1", map[string]string{"region": "r1", "zone": "z11"})
	nodes := []*v1.Node{node1}
	one := func(s *framework.Status) []*framework.Status { return []*framework.Status{s} }
	serviceIn := func(vals ...string) *metav1.LabelSelector {
		return sel(req("service", metav1.LabelSelectorOpIn, vals...))
	}
	team1 := sel(req("team", metav1.LabelSelectorOpIn, "team1"))
	badValue := `parsing pod: requiredAffinityTerms: values[0][service]: Invalid value: "{{.bad-value.}}": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')`

	runFilterCases(t, []filterCase{
		{
			name:     "A pod that has no required pod affinity scheduling rules can schedule onto a node with no existing pods",
			pod:      new(v1.Pod),
			nodes:    nodes,
			wantSkip: true,
			want:     one(nil),
		},
		{
			name:  "satisfies with requiredDuringSchedulingIgnoredDuringExecution in PodAffinity using In operator that matches the existing pod",
			pod:   mkPod().labels(podLabel2).in(reqAffinity, "service", "region", "securityscan", "value2").obj(),
			pods:  []*v1.Pod{pod},
			nodes: nodes,
			want:  one(nil),
		},
		{
			name:  "satisfies the pod with requiredDuringSchedulingIgnoredDuringExecution in PodAffinity using not in operator in labelSelector that matches the existing pod",
			pod:   mkPod().labels(podLabel2).notIn(reqAffinity, "service", "region", "securityscan3", "value3").obj(),
			pods:  []*v1.Pod{pod},
			nodes: nodes,
			want:  one(nil),
		},
		{
			name: "Does not satisfy the PodAffinity with labelSelector because of diff Namespace",
			pod: podWithRequiredTerms("", "", podLabel2, []v1.PodAffinityTerm{
				{LabelSelector: serviceIn("securityscan", "value2"), Namespaces: []string{"DiffNameSpace"}},
			}, nil),
			pods:  []*v1.Pod{mkPod().ns("ns").label("service", "securityscan").node("node1").obj()},
			nodes: nodes,
			want:  one(affinityFail),
		},
		{
			name:  "Doesn't satisfy the PodAffinity because of unmatching labelSelector with the existing pod",
			pod:   mkPod().labels(podLabel).in(reqAffinity, "service", "", "antivirusscan", "value2").obj(),
			pods:  []*v1.Pod{pod},
			nodes: nodes,
			want:  one(affinityFail),
		},
		{
			name: "satisfies the PodAffinity with different label Operators in multiple RequiredDuringSchedulingIgnoredDuringExecution ",
			pod: podWithRequiredTerms("", "", podLabel2, []v1.PodAffinityTerm{
				{LabelSelector: sel(req("service", metav1.LabelSelectorOpExists), req("wrongkey", metav1.LabelSelectorOpDoesNotExist)), TopologyKey: "region"},
				{LabelSelector: sel(req("service", metav1.LabelSelectorOpIn, "securityscan"), req("service", metav1.LabelSelectorOpNotIn, "WrongValue")), TopologyKey: "region"},
			}, nil),
			pods:  []*v1.Pod{pod},
			nodes: nodes,
			want:  one(nil),
		},
		{
			name: "The labelSelector requirements(items of matchExpressions) are ANDed, the pod cannot schedule onto the node because one of the matchExpression item don't match.",
			pod: podWithRequiredTerms("", "", podLabel2, []v1.PodAffinityTerm{
				{LabelSelector: sel(req("service", metav1.LabelSelectorOpExists), req("wrongkey", metav1.LabelSelectorOpDoesNotExist)), TopologyKey: "region"},
				{LabelSelector: sel(req("service", metav1.LabelSelectorOpIn, "securityscan2"), req("service", metav1.LabelSelectorOpNotIn, "WrongValue")), TopologyKey: "region"},
			}, nil),
			pods:  []*v1.Pod{pod},
			nodes: nodes,
			want:  one(affinityFail),
		},
		{
			name: "satisfies the PodAffinity and PodAntiAffinity with the existing pod",
			pod: mkPod().labels(podLabel2).
				in(reqAffinity, "service", "region", "securityscan", "value2").
				in(reqAnti, "service", "node", "antivirusscan", "value2").obj(),
			pods:  []*v1.Pod{pod},
			nodes: nodes,
			want:  one(nil),
		},
		{
			name: "satisfies the PodAffinity and PodAntiAffinity and PodAntiAffinity symmetry with the existing pod",
			pod: mkPod().labels(podLabel2).
				in(reqAffinity, "service", "region", "securityscan", "value2").
				in(reqAnti, "service", "node", "antivirusscan", "value2").obj(),
			pods: []*v1.Pod{
				mkPod().node("node1").labels(podLabel).in(reqAnti, "service", "node", "antivirusscan", "value2").obj(),
			},
			nodes: nodes,
			want:  one(nil),
		},
		{
			name: "satisfies the PodAffinity but doesn't satisfy the PodAntiAffinity with the existing pod",
			pod: mkPod().labels(podLabel2).
				in(reqAffinity, "service", "region", "securityscan", "value2").
				in(reqAnti, "service", "zone", "securityscan", "value2").obj(),
			pods:  []*v1.Pod{pod},
			nodes: nodes,
			want:  one(antiFail),
		},
		{
			name: "satisfies the PodAffinity and PodAntiAffinity but doesn't satisfy PodAntiAffinity symmetry with the existing pod",
			pod: mkPod().labels(podLabel).
				in(reqAffinity, "service", "region", "securityscan", "value2").
				in(reqAnti, "service", "node", "antivirusscan", "value2").obj(),
			pods: []*v1.Pod{
				mkPod().labels(podLabel).node("node1").in(reqAnti, "service", "zone", "securityscan", "value2").obj(),
			},
			nodes: nodes,
			want:  one(existingFail),
		},
		{
			name:  "pod matches its own Label in PodAffinity and that matches the existing pod Labels",
			pod:   mkPod().labels(podLabel).notIn(reqAffinity, "service", "region", "securityscan", "value2").obj(),
			pods:  []*v1.Pod{mkPod().label("service", "securityscan").node("node2").obj()},
			nodes: nodes,
			want:  one(affinityFail),
		},
		{
			name: "verify that PodAntiAffinity from existing pod is respected when pod has no AntiAffinity constraints. doesn't satisfy PodAntiAffinity symmetry with the existing pod",
			pod:  mkPod().labels(podLabel).obj(),
			pods: []*v1.Pod{
				mkPod().node("node1").labels(podLabel).in(reqAnti, "service", "zone", "securityscan", "value2").obj(),
			},
			nodes: nodes,
			want:  one(existingFail),
		},
		{
			name: "verify that PodAntiAffinity from existing pod is respected when pod has no AntiAffinity constraints. satisfy PodAntiAffinity symmetry with the existing pod",
			pod:  mkPod().labels(podLabel).obj(),
			pods: []*v1.Pod{
				mkPod().node("node1").labels(podLabel).notIn(reqAnti, "service", "zone", "securityscan", "value2").obj(),
			},
			nodes:    nodes,
			wantSkip: true,
			want:     one(nil),
		},
		{
			name: "satisfies the PodAntiAffinity with existing pod but doesn't satisfy PodAntiAffinity symmetry with incoming pod",
			pod: mkPod().labels(podLabel).
				exists(reqAnti, "service", "region").
				exists(reqAnti, "security", "region").obj(),
			pods: []*v1.Pod{
				mkPod().node("node1").labels(podLabel2).exists(reqAnti, "security", "zone").obj(),
			},
			nodes: nodes,
			want:  one(antiFail),
		},
		{
			name: "PodAntiAffinity symmetry check a1: incoming pod and existing pod partially match each other on AffinityTerms",
			pod: mkPod().labels(podLabel).
				exists(reqAnti, "service", "zone").
				exists(reqAnti, "security", "zone").obj(),
			pods: []*v1.Pod{
				mkPod().node("node1").labels(podLabel2).exists(reqAnti, "security", "zone").obj(),
			},
			nodes: nodes,
			want:  one(antiFail),
		},
		{
			name: "PodAntiAffinity symmetry check a2: incoming pod and existing pod partially match each other on AffinityTerms",
			pod:  mkPod().labels(podLabel2).exists(reqAnti, "security", "zone").obj(),
			pods: []*v1.Pod{
				mkPod().node("node1").labels(podLabel).
					exists(reqAnti, "service", "zone").
					exists(reqAnti, "security", "zone").obj(),
			},
			nodes: nodes,
			want:  one(existingFail),
		},
		{
			name: "PodAntiAffinity symmetry check b1: incoming pod and existing pod partially match each other on AffinityTerms",
			pod: mkPod().labels(map[string]string{"abc": "", "xyz": ""}).
				exists(reqAnti, "abc", "zone").
				exists(reqAnti, "def", "zone").obj(),
			pods: []*v1.Pod{
				mkPod().node("node1").labels(map[string]string{"def": "", "xyz": ""}).
					exists(reqAnti, "abc", "zone").
					exists(reqAnti, "def", "zone").obj(),
			},
			nodes: nodes,
			want:  one(antiFail),
		},
		{
			name: "PodAntiAffinity symmetry check b2: incoming pod and existing pod partially match each other on AffinityTerms",
			pod: mkPod().labels(map[string]string{"def": "", "xyz": ""}).
				exists(reqAnti, "abc", "zone").
				exists(reqAnti, "def", "zone").obj(),
			pods: []*v1.Pod{
				mkPod().node("node1").labels(map[string]string{"abc": "", "xyz": ""}).
					exists(reqAnti, "abc", "zone").
					exists(reqAnti, "def", "zone").obj(),
			},
			nodes: nodes,
			want:  one(antiFail),
		},
		{
			name: "PodAffinity fails PreFilter with an invalid affinity label syntax",
			pod: mkPod().labels(podLabel).
				in(reqAffinity, "service", "region", "{{.bad-value.}}").
				in(reqAffinity, "service", "node", "antivirusscan", "value2").obj(),
			nodes:   nodes,
			wantErr: badValue,
		},
		{
			name: "PodAntiAffinity fails PreFilter with an invalid antiaffinity label syntax",
			pod: mkPod().labels(podLabel).
				in(reqAffinity, "service", "region", "foo").
				in(reqAffinity, "service", "node", "{{.bad-value.}}").obj(),
			nodes:   nodes,
			wantErr: badValue,
		},
		{
			name: "affinity with NamespaceSelector",
			pod: podWithRequiredTerms("", "", podLabel2, []v1.PodAffinityTerm{
				{LabelSelector: serviceIn("securityscan", "value2"), NamespaceSelector: team1, TopologyKey: "region"},
			}, nil),
			pods:       []*v1.Pod{mkPod().node("node1").ns("subteam1.team1").labels(podLabel).obj()},
			nodes:      nodes,
			namespaces: teamNamespaces(),
			want:       one(nil),
		},
		{
			name: "affinity with non-matching NamespaceSelector",
			pod: podWithRequiredTerms("", "", podLabel2, []v1.PodAffinityTerm{
				{LabelSelector: serviceIn("securityscan", "value2"), NamespaceSelector: team1, TopologyKey: "region"},
			}, nil),
			pods:       []*v1.Pod{mkPod().node("node1").ns("subteam1.team2").labels(podLabel).obj()},
			nodes:      nodes,
			namespaces: teamNamespaces(),
			want:       one(affinityFail),
		},
		{
			name: "anti-affinity with matching NamespaceSelector",
			pod: podWithRequiredTerms("subteam1.team1", "", podLabel2, nil, []v1.PodAffinityTerm{
				{LabelSelector: serviceIn("securityscan", "value2"), NamespaceSelector: team1, TopologyKey: "zone"},
			}),
			pods:       []*v1.Pod{mkPod().node("node1").ns("subteam2.team1").labels(podLabel).obj()},
			nodes:      nodes,
			namespaces: teamNamespaces(),
			want:       one(antiFail),
		},
		{
			name: "anti-affinity with matching all NamespaceSelector",
			pod: podWithRequiredTerms("subteam1.team1", "", podLabel2, nil, []v1.PodAffinityTerm{
				{LabelSelector: serviceIn("securityscan", "value2"), NamespaceSelector: &metav1.LabelSelector{}, TopologyKey: "zone"},
			}),
			pods:       []*v1.Pod{mkPod().node("node1").ns("subteam2.team1").labels(podLabel).obj()},
			nodes:      nodes,
			namespaces: teamNamespaces(),
			want:       one(antiFail),
		},
		{
			name: "anti-affinity with non-matching NamespaceSelector",
			pod: podWithRequiredTerms("subteam1.team1", "", podLabel2, nil, []v1.PodAffinityTerm{
				{LabelSelector: serviceIn("securityscan", "value2"), NamespaceSelector: team1, TopologyKey: "zone"},
			}),
			pods:       []*v1.Pod{mkPod().node("node1").ns("subteam1.team2").labels(podLabel).obj()},
			nodes:      nodes,
			namespaces: teamNamespaces(),
			want:       one(nil),
		},
	})
}

// Upstream's TestRequiredAffinityMultipleNodes (filtering_test.go, v1.35.4).
func TestRequiredAffinityMultipleNodes(t *testing.T) {
	podLabelA := map[string]string{"foo": "bar"}
	labelRgChina := map[string]string{"region": "China"}
	labelRgChinaAzAz1 := map[string]string{"region": "China", "az": "az1"}
	labelRgIndia := map[string]string{"region": "India"}
	zoneNodes := func(zoneA, zoneB string) []*v1.Node {
		return []*v1.Node{
			mkNode("nodeA", map[string]string{"region": "r1", "zone": zoneA, "hostname": "nodeA"}),
			mkNode("nodeB", map[string]string{"region": "r1", "zone": zoneB, "hostname": "nodeB"}),
		}
	}
	chinaIndia := func(a, b, c string) []*v1.Node {
		return []*v1.Node{mkNode(a, labelRgChina), mkNode(b, labelRgChinaAzAz1), mkNode(c, labelRgIndia)}
	}
	ns1 := []*v1.Namespace{mkNamespace("NS1", nil)}

	runFilterCases(t, []filterCase{
		{
			name:  "A pod can be scheduled onto all the nodes that have the same topology key & label value with one of them has an existing pod that matches the affinity rules",
			pod:   mkPod().in(reqAffinity, "foo", "region", "bar").obj(),
			pods:  []*v1.Pod{mkPod().name("p1").node("node1").labels(podLabelA).obj()},
			nodes: chinaIndia("node1", "node2", "node3"),
			want:  []*framework.Status{nil, nil, affinityFail},
		},
		{
			name: "The affinity rule is to schedule all of the pods of this collection to the same zone. The first pod of the collection " +
				"should not be blocked from being scheduled onto any node, even there's no existing pod that matches the rule anywhere.",
			pod: mkPod().labels(map[string]string{"foo": "bar", "service": "securityscan"}).
				in(reqAffinity, "foo", "zone", "bar").
				in(reqAffinity, "service", "zone", "securityscan").obj(),
			pods: []*v1.Pod{mkPod().name("p1").node("nodeA").labels(map[string]string{"foo": "bar"}).obj()},
			nodes: []*v1.Node{
				mkNode("nodeA", map[string]string{"zone": "az1", "hostname": "h1"}),
				mkNode("nodeB", map[string]string{"zone": "az2", "hostname": "h2"}),
			},
			want: []*framework.Status{nil, nil},
		},
		{
			name: "The first pod of the collection can only be scheduled on nodes labelled with the requested topology keys",
			pod: mkPod().labels(map[string]string{"foo": "bar", "service": "securityscan"}).
				in(reqAffinity, "foo", "zone", "bar").
				in(reqAffinity, "service", "zone", "securityscan").obj(),
			pods: []*v1.Pod{mkPod().name("p1").node("nodeA").labels(map[string]string{"foo": "bar"}).obj()},
			nodes: []*v1.Node{
				mkNode("nodeA", map[string]string{"zoneLabel": "az1", "hostname": "h1"}),
				mkNode("nodeB", map[string]string{"zoneLabel": "az2", "hostname": "h2"}),
			},
			want: []*framework.Status{affinityFail, affinityFail},
		},
		{
			name: "NodeA and nodeB have same topologyKey and label value. NodeA has an existing pod that matches the inter pod affinity rule. The pod can not be scheduled onto nodeA and nodeB.",
			pod:  mkPod().in(reqAnti, "foo", "region", "abc").obj(),
			pods: []*v1.Pod{mkPod().node("nodeA").labels(map[string]string{"foo": "abc"}).obj()},
			nodes: []*v1.Node{
				mkNode("nodeA", map[string]string{"region": "r1", "hostname": "nodeA"}),
				mkNode("nodeB", map[string]string{"region": "r1", "hostname": "nodeB"}),
			},
			want: []*framework.Status{antiFail, antiFail},
		},
		{
			name: "This test ensures that anti-affinity matches a pod when any term of the anti-affinity rule matches a pod.",
			pod: mkPod().in(reqAnti, "foo", "region", "abc").
				in(reqAnti, "service", "zone", "securityscan").obj(),
			pods:  []*v1.Pod{mkPod().node("nodeA").labels(map[string]string{"foo": "abc", "service": "securityscan"}).obj()},
			nodes: zoneNodes("z1", "z2"),
			want:  []*framework.Status{antiFail, antiFail},
		},
		{
			name:  "NodeA and nodeB have same topologyKey and label value. NodeA has an existing pod that matches the inter pod affinity rule. The pod can not be scheduled onto nodeA and nodeB but can be scheduled onto nodeC",
			pod:   mkPod().in(reqAnti, "foo", "region", "abc").obj(),
			pods:  []*v1.Pod{mkPod().node("nodeA").labels(map[string]string{"foo": "abc"}).obj()},
			nodes: chinaIndia("nodeA", "nodeB", "nodeC"),
			want:  []*framework.Status{antiFail, antiFail, nil},
		},
		{
			name: "NodeA and nodeB have same topologyKey and label value. NodeA has an existing pod that matches the inter pod affinity rule. The pod can not be scheduled onto nodeA, nodeB, but can be scheduled onto nodeC (NodeC has an existing pod that match the inter pod affinity rule but in different namespace)",
			pod:  mkPod().ns("NS1").labels(map[string]string{"foo": "123"}).in(reqAnti, "foo", "region", "bar").obj(),
			pods: []*v1.Pod{
				mkPod().node("nodeA").ns("NS1").labels(map[string]string{"foo": "bar"}).obj(),
				mkPod().node("nodeC").ns("NS2").in(reqAnti, "foo", "region", "123").obj(),
			},
			nodes:      chinaIndia("nodeA", "nodeB", "nodeC"),
			namespaces: ns1,
			want:       []*framework.Status{antiFail, antiFail, nil},
		},
		{
			name: "Test existing pod's anti-affinity: if an existing pod has a term with invalid topologyKey, labelSelector of the term is firstly checked, and then topologyKey of the term is also checked",
			pod:  mkPod().label("foo", "").obj(),
			pods: []*v1.Pod{
				mkPod().node("nodeA").exists(reqAnti, "foo", "invalid-node-label").obj(),
			},
			nodes:      zoneNodes("z1", "z1"),
			namespaces: ns1,
			wantSkip:   true,
			want:       []*framework.Status{nil, nil},
		},
		{
			name:       "Test incoming pod's anti-affinity: even if labelSelector matches, we still check if topologyKey matches",
			pod:        mkPod().node("nodeA").exists(reqAnti, "foo", "invalid-node-label").obj(),
			pods:       []*v1.Pod{mkPod().node("nodeA").labels(map[string]string{"foo": ""}).obj()},
			nodes:      zoneNodes("z1", "z1"),
			namespaces: ns1,
			want:       []*framework.Status{nil, nil},
		},
		{
			name: "Test existing pod's anti-affinity: incoming pod wouldn't considered as a fit as it violates each existingPod's terms on all nodes",
			pod:  mkPod().label("foo", "").label("bar", "").obj(),
			pods: []*v1.Pod{
				mkPod().node("nodeA").exists(reqAnti, "foo", "zone").obj(),
				mkPod().node("nodeA").exists(reqAnti, "bar", "region").obj(),
			},
			nodes:      zoneNodes("z1", "z2"),
			namespaces: ns1,
			want:       []*framework.Status{existingFail, existingFail},
		},
		{
			name: "Test incoming pod's anti-affinity: incoming pod wouldn't considered as a fit as it at least violates one anti-affinity rule of existingPod",
			pod:  mkPod().exists(reqAnti, "foo", "zone").exists(reqAnti, "bar", "region").obj(),
			pods: []*v1.Pod{
				mkPod().node("nodeA").labels(map[string]string{"foo": ""}).obj(),
				mkPod().node("nodeB").labels(map[string]string{"bar": ""}).obj(),
			},
			nodes:      zoneNodes("z1", "z2"),
			namespaces: ns1,
			want:       []*framework.Status{antiFail, antiFail},
		},
		{
			name: "Test existing pod's anti-affinity: only when labelSelector and topologyKey both match, it's counted as a single term match - case when one term has invalid topologyKey",
			pod:  mkPod().label("foo", "").label("bar", "").obj(),
			pods: []*v1.Pod{
				mkPod().node("nodeA").exists(reqAnti, "foo", "invalid-node-label").exists(reqAnti, "bar", "zone").obj(),
			},
			nodes:      zoneNodes("z1", "z2"),
			namespaces: ns1,
			want:       []*framework.Status{existingFail, nil},
		},
		{
			name:       "Test incoming pod's anti-affinity: only when labelSelector and topologyKey both match, it's counted as a single term match - case when one term has invalid topologyKey",
			pod:        mkPod().exists(reqAnti, "foo", "invalid-node-label").exists(reqAnti, "bar", "zone").obj(),
			pods:       []*v1.Pod{mkPod().name("podA").node("nodeA").labels(map[string]string{"foo": "", "bar": ""}).obj()},
			nodes:      zoneNodes("z1", "z2"),
			namespaces: ns1,
			want:       []*framework.Status{antiFail, nil},
		},
		{
			name: "Test existing pod's anti-affinity: only when labelSelector and topologyKey both match, it's counted as a single term match - case when all terms have valid topologyKey",
			pod:  mkPod().label("foo", "").label("bar", "").obj(),
			pods: []*v1.Pod{
				mkPod().node("nodeA").exists(reqAnti, "foo", "region").exists(reqAnti, "bar", "zone").obj(),
			},
			nodes:      zoneNodes("z1", "z2"),
			namespaces: ns1,
			want:       []*framework.Status{existingFail, existingFail},
		},
		{
			name:       "Test incoming pod's anti-affinity: only when labelSelector and topologyKey both match, it's counted as a single term match - case when all terms have valid topologyKey",
			pod:        mkPod().exists(reqAnti, "foo", "region").exists(reqAnti, "bar", "zone").obj(),
			pods:       []*v1.Pod{mkPod().node("nodeA").labels(map[string]string{"foo": "", "bar": ""}).obj()},
			nodes:      zoneNodes("z1", "z2"),
			namespaces: ns1,
			want:       []*framework.Status{antiFail, antiFail},
		},
		{
			name: "Test existing pod's anti-affinity: existingPod on nodeA and nodeB has at least one anti-affinity term matches incoming pod, so incoming pod can only be scheduled to nodeC",
			pod:  mkPod().label("foo", "").label("bar", "").obj(),
			pods: []*v1.Pod{
				mkPod().node("nodeA").exists(reqAnti, "foo", "zone").exists(reqAnti, "labelA", "zone").obj(),
				mkPod().node("nodeB").exists(reqAnti, "bar", "zone").exists(reqAnti, "labelB", "zone").obj(),
			},
			nodes: append(zoneNodes("z1", "z2"),
				mkNode("nodeC", map[string]string{"region": "r1", "zone": "z3", "hostname": "nodeC"})),
			namespaces: ns1,
			want:       []*framework.Status{existingFail, existingFail, nil},
		},
		{
			name:       "Test incoming pod's affinity: firstly check if all affinityTerms match, and then check if all topologyKeys match",
			pod:        mkPod().exists(reqAffinity, "foo", "region").exists(reqAffinity, "bar", "zone").obj(),
			pods:       []*v1.Pod{mkPod().name("pod1").labels(map[string]string{"foo": "", "bar": ""}).node("nodeA").obj()},
			nodes:      zoneNodes("z1", "z1"),
			namespaces: ns1,
			want:       []*framework.Status{nil, nil},
		},
		{
			name: "Test incoming pod's affinity: firstly check if all affinityTerms match, and then check if all topologyKeys match, and the match logic should be satisfied on the same pod",
			pod:  mkPod().exists(reqAffinity, "foo", "region").exists(reqAffinity, "bar", "zone").obj(),
			pods: []*v1.Pod{
				mkPod().node("nodeA").name("pod1").labels(map[string]string{"foo": ""}).obj(),
				mkPod().node("nodeB").name("pod2").labels(map[string]string{"bar": ""}).obj(),
			},
			nodes:      zoneNodes("z1", "z2"),
			namespaces: ns1,
			want:       []*framework.Status{affinityFail, affinityFail},
		},
	})
}
