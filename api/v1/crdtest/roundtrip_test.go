package crdtest

import (
	"context"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
)

func TestMain(m *testing.M) { clustertest.Main(m, nil) }

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// strict makes the API server refuse fields its schema does not know,
// instead of dropping them: a round trip under it shows the schema knows
// every field the Go types send.
var strict = metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}

func meta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:        name,
		Labels:      map[string]string{"app": "tabby-test", tabbyv1.LabelNode: "node-1"},
		Annotations: map[string]string{"note": "round trip"},
	}
}

func selector() *metav1.LabelSelector {
	return &metav1.LabelSelector{
		MatchLabels:      map[string]string{"rack": "r1"},
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "zone", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}}},
	}
}

func ptr[T any](v T) *T { return &v }

// TestRoundTrip creates one object of every kind with every field set,
// reads it back and compares: the CRD schema matches the Go types and
// nothing is pruned.
func TestRoundTrip(t *testing.T) {
	ds := clustertest.Client(t)
	ctx := ctxT(t, time.Minute)
	now := metav1.NewTime(time.Now().Truncate(time.Second)) // the API's precision
	dur := &metav1.Duration{Duration: 90 * time.Second}

	pool := &tabbyv1.IPPool{ObjectMeta: meta("rt-pool"), Spec: tabbyv1.IPPoolSpec{
		CIDR: "10.123.0.0/16", BlockSize: 27, IPIPMode: tabbyv1.EncapCrossSubnet, VXLANMode: tabbyv1.EncapNever,
		NATOutgoing: true, Disabled: true, DisableBGPExport: true, NodeSelector: selector(),
		AllowedUses: []tabbyv1.IPPoolAllowedUse{tabbyv1.UseWorkload, tabbyv1.UseTunnel},
	}}
	block := &tabbyv1.IPAMBlock{ObjectMeta: meta("rt-block"), Spec: tabbyv1.IPAMBlockSpec{
		CIDR: "10.123.0.0/30", Affinity: "host:node-1",
		Allocations: []int{0, -1, 1, -1}, Unallocated: []int{3, 1},
		Attributes: []tabbyv1.AllocationAttribute{
			{HandleID: "k8s-pod-network.abc", Use: tabbyv1.UseWorkload, Namespace: "default", Pod: "p", Node: "node-1", Timestamp: &now},
			{HandleID: "vxlan-tunnel-addr-node-1", Use: tabbyv1.UseTunnel, Node: "node-1", Timestamp: &now},
		},
		SequenceNumber:              1 << 40,
		SequenceNumberForAllocation: map[string]uint64{"0": 7, "2": 1 << 40},
		Deleted:                     true,
	}}
	aff := &tabbyv1.BlockAffinity{ObjectMeta: meta("rt-affinity"), Spec: tabbyv1.BlockAffinitySpec{
		State: tabbyv1.AffinityPendingDeletion, Node: "node-1", CIDR: "10.123.0.0/30", Deleted: true,
	}}
	handle := &tabbyv1.IPAMHandle{ObjectMeta: meta("rt-handle"), Spec: tabbyv1.IPAMHandleSpec{
		HandleID: "k8s-pod-network.abc", Block: map[string]int{"10.123.0.0/30": 2, "fd00::/122": 1}, Deleted: true,
	}}
	ipamCfg := &tabbyv1.IPAMConfiguration{ObjectMeta: meta(tabbyv1.IPAMConfigurationName), Spec: tabbyv1.IPAMConfigurationSpec{
		StrictAffinity: true, MaxBlocksPerHost: 7,
	}}
	bgpCfg := &tabbyv1.BGPConfiguration{ObjectMeta: meta(tabbyv1.BGPConfigurationName), Spec: tabbyv1.BGPConfigurationSpec{
		ASNumber: ptr(uint32(4200000000)), NodeToNodeMeshEnabled: ptr(false), ListenPort: ptr(uint16(1179)),
		ServiceClusterIPs:       []tabbyv1.ServiceIPBlock{{CIDR: "10.96.0.0/16"}, {CIDR: "fd00:96::/112"}},
		ServiceExternalIPs:      []tabbyv1.ServiceIPBlock{{CIDR: "192.0.2.0/24"}},
		ServiceLoadBalancerIPs:  []tabbyv1.ServiceIPBlock{{CIDR: "198.51.100.0/24"}},
		NodeMeshPassword:        &tabbyv1.SecretKeyRef{Namespace: "kube-system", Name: "bgp", Key: "mesh"},
		NodeMeshMaxRestartTime:  dur,
		RouteReflectorClusterID: "244.0.0.9",
		NodeMeshMaxPrefixes:     ptr(uint32(5000)),
	}}
	// node and nodeSelector, peerIP and peerSelector exclude each other:
	// two peers set every field between them.
	peerIP := &tabbyv1.BGPPeer{ObjectMeta: meta("rt-peer-ip"), Spec: tabbyv1.BGPPeerSpec{
		Node: "node-1", PeerIP: "[2001:db8::1]:1179", ASNumber: 4294967295,
		Password:      &tabbyv1.SecretKeyRef{Namespace: "kube-system", Name: "bgp", Key: "peer"},
		SourceAddress: "None", KeepOriginalNextHop: true, MaxRestartTime: dur,
		Filters: []string{"rt-filter"}, MaxPrefixes: ptr(uint32(100)),
	}}
	filter := &tabbyv1.BGPFilter{ObjectMeta: meta("rt-filter"), Spec: tabbyv1.BGPFilterSpec{
		ImportV4: []tabbyv1.BGPFilterRuleV4{{CIDR: "0.0.0.0/0", MatchOperator: tabbyv1.MatchEqual, Action: tabbyv1.FilterAccept}},
		ExportV4: []tabbyv1.BGPFilterRuleV4{{CIDR: "10.0.0.0/8", MatchOperator: tabbyv1.MatchNotIn, Action: tabbyv1.FilterReject}},
		ImportV6: []tabbyv1.BGPFilterRuleV6{{CIDR: "fd00::/8", MatchOperator: tabbyv1.MatchIn, Action: tabbyv1.FilterReject}},
		ExportV6: []tabbyv1.BGPFilterRuleV6{{CIDR: "fd00::/8", MatchOperator: tabbyv1.MatchNotIn, Action: tabbyv1.FilterReject}, {Action: tabbyv1.FilterAccept}},
	}}
	peerSel := &tabbyv1.BGPPeer{ObjectMeta: meta("rt-peer-selector"), Spec: tabbyv1.BGPPeerSpec{
		NodeSelector: selector(), PeerSelector: selector(), SourceAddress: "UseNodeIP",
	}}

	allFieldsSet(t, pool)
	allFieldsSet(t, block)
	allFieldsSet(t, aff)
	allFieldsSet(t, handle)
	allFieldsSet(t, ipamCfg)
	allFieldsSet(t, bgpCfg)
	allFieldsSet(t, peerIP, peerSel)
	allFieldsSet(t, filter)

	check := func(kind string, in, created, got any, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v", kind, err)
			return
		}
		for what, obj := range map[string]any{"create's answer": created, "get": got} {
			a := reflect.ValueOf(in).Elem()
			b := reflect.ValueOf(obj).Elem()
			if !equality.Semantic.DeepEqual(a.FieldByName("Spec").Interface(), b.FieldByName("Spec").Interface()) {
				t.Errorf("%s: %s differs (-sent +stored):\n%s", kind, what, cmp.Diff(a.FieldByName("Spec").Interface(), b.FieldByName("Spec").Interface()))
			}
			am := a.FieldByName("ObjectMeta").Interface().(metav1.ObjectMeta)
			bm := b.FieldByName("ObjectMeta").Interface().(metav1.ObjectMeta)
			if !reflect.DeepEqual(am.Labels, bm.Labels) || !reflect.DeepEqual(am.Annotations, bm.Annotations) || am.Name != bm.Name {
				t.Errorf("%s: %s metadata differs: %+v vs %+v", kind, what, am, bm)
			}
		}
	}
	{
		c, err := ds.IPPools.Create(ctx, pool, strict)
		var g *tabbyv1.IPPool
		if err == nil {
			g, err = ds.IPPools.Get(ctx, pool.Name, metav1.GetOptions{})
			t.Cleanup(func() { _ = ds.IPPools.Delete(context.Background(), pool.Name, metav1.DeleteOptions{}) })
		}
		check("IPPool", pool, c, g, err)
	}
	{
		c, err := ds.IPAMBlocks.Create(ctx, block, strict)
		var g *tabbyv1.IPAMBlock
		if err == nil {
			g, err = ds.IPAMBlocks.Get(ctx, block.Name, metav1.GetOptions{})
			t.Cleanup(func() { _ = ds.IPAMBlocks.Delete(context.Background(), block.Name, metav1.DeleteOptions{}) })
		}
		check("IPAMBlock", block, c, g, err)
	}
	{
		c, err := ds.BlockAffinities.Create(ctx, aff, strict)
		var g *tabbyv1.BlockAffinity
		if err == nil {
			g, err = ds.BlockAffinities.Get(ctx, aff.Name, metav1.GetOptions{})
			t.Cleanup(func() { _ = ds.BlockAffinities.Delete(context.Background(), aff.Name, metav1.DeleteOptions{}) })
		}
		check("BlockAffinity", aff, c, g, err)
	}
	{
		c, err := ds.IPAMHandles.Create(ctx, handle, strict)
		var g *tabbyv1.IPAMHandle
		if err == nil {
			g, err = ds.IPAMHandles.Get(ctx, handle.Name, metav1.GetOptions{})
			t.Cleanup(func() { _ = ds.IPAMHandles.Delete(context.Background(), handle.Name, metav1.DeleteOptions{}) })
		}
		check("IPAMHandle", handle, c, g, err)
	}
	{
		c, err := ds.IPAMConfigurations.Create(ctx, ipamCfg, strict)
		var g *tabbyv1.IPAMConfiguration
		if err == nil {
			g, err = ds.IPAMConfigurations.Get(ctx, ipamCfg.Name, metav1.GetOptions{})
			t.Cleanup(func() { _ = ds.IPAMConfigurations.Delete(context.Background(), ipamCfg.Name, metav1.DeleteOptions{}) })
		}
		check("IPAMConfiguration", ipamCfg, c, g, err)
	}
	{
		c, err := ds.BGPConfigurations.Create(ctx, bgpCfg, strict)
		var g *tabbyv1.BGPConfiguration
		if err == nil {
			g, err = ds.BGPConfigurations.Get(ctx, bgpCfg.Name, metav1.GetOptions{})
			t.Cleanup(func() { _ = ds.BGPConfigurations.Delete(context.Background(), bgpCfg.Name, metav1.DeleteOptions{}) })
		}
		check("BGPConfiguration", bgpCfg, c, g, err)
	}
	for _, p := range []*tabbyv1.BGPPeer{peerIP, peerSel} {
		c, err := ds.BGPPeers.Create(ctx, p, strict)
		var g *tabbyv1.BGPPeer
		if err == nil {
			g, err = ds.BGPPeers.Get(ctx, p.Name, metav1.GetOptions{})
			name := p.Name
			t.Cleanup(func() { _ = ds.BGPPeers.Delete(context.Background(), name, metav1.DeleteOptions{}) })
		}
		check("BGPPeer "+p.Name, p, c, g, err)
	}

	{
		c, err := ds.BGPFilters.Create(ctx, filter, strict)
		var g *tabbyv1.BGPFilter
		if err == nil {
			g, err = ds.BGPFilters.Get(ctx, filter.Name, metav1.GetOptions{})
			t.Cleanup(func() { _ = ds.BGPFilters.Delete(context.Background(), filter.Name, metav1.DeleteOptions{}) })
		}
		check("BGPFilter", filter, c, g, err)
	}

	// Lists come back typed too.
	if l, err := ds.IPAMBlocks.List(ctx, metav1.ListOptions{LabelSelector: tabbyv1.LabelNode + "=node-1"}); err != nil || len(l.Items) != 1 {
		t.Errorf("listing blocks by label: %v, %v", l, err)
	}
}

// TestDefaults: what the API server fills in when a field is left out.
func TestDefaults(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	dyn, err := dynamic.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	// maxBlocksPerHost has a schema default of 20, applied when the field is
	// missing. The Go type always sends it (no omitempty), so a Go client
	// that means "no limit" (0) gets 0; kubectl users who leave it out get 20.
	res := dyn.Resource(tabbyv1.SchemeGroupVersion.WithResource("ipamconfigurations"))
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "tabby.io/v1", "kind": "IPAMConfiguration",
		"metadata": map[string]any{"name": "default"}, "spec": map[string]any{},
	}}
	got, err := res.Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = res.Delete(context.Background(), "default", metav1.DeleteOptions{}) }()
	n, found, err := unstructured.NestedInt64(got.Object, "spec", "maxBlocksPerHost")
	if err != nil || !found || n != tabbyv1.DefaultMaxBlocksPerHost {
		t.Errorf("maxBlocksPerHost defaulted to %d (found %v, %v), want %d", n, found, err, tabbyv1.DefaultMaxBlocksPerHost)
	}
}

// allFieldsSet fails the test when a field of the objects' type (at any
// depth below Spec) is left at its zero value in every one of objs, so that
// a field added to the types later is not silently left out of the round
// trip.
func allFieldsSet(t *testing.T, objs ...any) {
	t.Helper()
	typ := reflect.TypeOf(objs[0]).Elem()
	spec, _ := typ.FieldByName("Spec")
	want := map[string]bool{}
	collectFields(spec.Type, "spec", want)
	set := map[string]bool{}
	for _, o := range objs {
		collectSet(reflect.ValueOf(o).Elem().FieldByName("Spec"), "spec", set)
	}
	var missing []string
	for f := range want {
		if !set[f] {
			missing = append(missing, f)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("%s: the round trip leaves fields unset: %s", typ.Name(), strings.Join(missing, ", "))
	}
}

// leaf types are compared whole.
func isLeaf(t reflect.Type) bool {
	return t.PkgPath() == "k8s.io/apimachinery/pkg/apis/meta/v1" || t.Kind() != reflect.Struct
}

func collectFields(t reflect.Type, path string, out map[string]bool) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if isLeaf(t) {
		out[path] = true
		return
	}
	for i := range t.NumField() {
		f := t.Field(i)
		collectFields(f.Type, path+"."+f.Name, out)
	}
}

func collectSet(v reflect.Value, path string, out map[string]bool) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			if isLeaf(v.Type().Elem()) {
				out[path] = true // a pointer to false or 0 is set
				return
			}
			collectSet(v.Elem(), path, out)
		}
		return
	case reflect.Slice:
		for i := range v.Len() {
			collectSet(v.Index(i), path, out)
		}
		return
	case reflect.Map:
		for _, k := range v.MapKeys() {
			collectSet(v.MapIndex(k), path, out)
		}
		return
	}
	if isLeaf(v.Type()) {
		if !v.IsZero() {
			out[path] = true
		}
		return
	}
	for i := range v.NumField() {
		collectSet(v.Field(i), path+"."+v.Type().Field(i).Name, out)
	}
}
