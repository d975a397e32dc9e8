package netpol

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	cnpv1 "github.com/tabbynet/tabby/api/cnp/v1beta1"
	"github.com/tabbynet/tabby/policy"
)

// DecodeClusterPolicies decodes ClusterNetworkPolicies read as
// unstructured objects into tabby's mirror of the API, sorted by name. An
// object that does not decode (a field of the wrong type, a number out of
// range: what an API server without the CRD's validation may hold) is a
// problem and is left out; the others are enforced. Decoding goes through
// JSON, which refuses a number that does not fit its field rather than
// truncating it.
func DecodeClusterPolicies(objs []*unstructured.Unstructured) ([]*cnpv1.ClusterNetworkPolicy, []policy.Problem) {
	return (*InputBuilder)(nil).ClusterPolicies(objs)
}

// ClusterPolicies is DecodeClusterPolicies, from memory for the objects
// an earlier call had (informers never modify an object): a sync decodes
// only the policies that changed, and an unchanged policy is the same
// object in every Input. Objects no longer given are forgotten as Build
// forgets Pods. A nil *InputBuilder decodes every object.
func (b *InputBuilder) ClusterPolicies(objs []*unstructured.Unstructured) ([]*cnpv1.ClusterNetworkPolicy, []policy.Problem) {
	var out []*cnpv1.ClusterNetworkPolicy
	var bad []policy.Problem
	if b != nil {
		b.cnpGen++
		if b.cnps == nil {
			b.cnps = map[*unstructured.Unstructured]*cnpEntry{}
		}
	}
	for _, o := range objs {
		if o == nil {
			continue
		}
		var e *cnpEntry
		if b != nil {
			if e = b.cnps[o]; e == nil {
				e = decodeClusterPolicy(o)
				b.cnps[o] = e
			}
			e.gen = b.cnpGen
		} else {
			e = decodeClusterPolicy(o)
		}
		if e.problem != nil {
			bad = append(bad, *e.problem)
			continue
		}
		out = append(out, e.policy)
	}
	if b != nil && len(b.cnps) > len(objs)+len(objs)/8+64 {
		maps.DeleteFunc(b.cnps, func(_ *unstructured.Unstructured, e *cnpEntry) bool { return e.gen != b.cnpGen })
	}
	slices.SortFunc(out, func(a, b *cnpv1.ClusterNetworkPolicy) int { return strings.Compare(a.Name, b.Name) })
	return out, bad
}

// cnpEntry is what one ClusterNetworkPolicy object decodes to: the policy,
// or the problem that keeps it from being enforced.
type cnpEntry struct {
	policy  *cnpv1.ClusterNetworkPolicy
	problem *policy.Problem
	gen     uint64 // the ClusterPolicies call that last had it
}

func decodeClusterPolicy(o *unstructured.Unstructured) *cnpEntry {
	p := &cnpv1.ClusterNetworkPolicy{}
	data, err := json.Marshal(o.Object)
	if err == nil {
		err = json.Unmarshal(data, p)
	}
	if err != nil {
		return &cnpEntry{problem: &policy.Problem{Kind: policy.KindClusterNetworkPolicy, Name: o.GetName(),
			Message: fmt.Sprintf("cannot be read as %s/%s: %v: the policy is not enforced until fixed", cnpv1.GroupName, cnpv1.Version, err)}}
	}
	return &cnpEntry{policy: p}
}

// nodeChanged: only a node's labels and addresses matter to policies
// (nodes peers).
func nodeChanged(old, new any) bool {
	a, ok1 := old.(*corev1.Node)
	b, ok2 := new.(*corev1.Node)
	if !ok1 || !ok2 {
		return true
	}
	return !maps.Equal(a.Labels, b.Labels) || !reflect.DeepEqual(a.Status.Addresses, b.Status.Addresses)
}
