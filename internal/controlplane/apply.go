package controlplane

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// FieldManager is the field manager of ApplyManifests' server-side applies.
const FieldManager = "tabby-test"

// ApplyManifests applies every object of the YAML files (documents
// separated by ---), in order, with a server-side apply that takes over
// conflicting fields, as `kubectl apply --server-side --force-conflicts`
// does. Kinds are found through discovery, which is refreshed when a kind is
// missing (a CRD applied a moment before).
func ApplyManifests(ctx context.Context, cfg *rest.Config, files ...string) error {
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	cached := memory.NewMemCacheClient(disc)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(cached)
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	for _, file := range files {
		docs, err := readYAMLDocs(file)
		if err != nil {
			return err
		}
		for _, doc := range docs {
			obj := &unstructured.Unstructured{}
			if err := yaml.Unmarshal(doc, &obj.Object); err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			if err := applyObject(ctx, dyn, mapper, obj); err != nil {
				return fmt.Errorf("%s: applying %s %s: %w", file, obj.GetKind(), obj.GetName(), err)
			}
		}
	}
	return nil
}

func applyObject(ctx context.Context, dyn dynamic.Interface, mapper *restmapper.DeferredDiscoveryRESTMapper, obj *unstructured.Unstructured) error {
	gvk := obj.GroupVersionKind()
	var mapping *meta.RESTMapping
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err == nil {
			break
		}
		if !meta.IsNoMatchError(err) || time.Now().After(deadline) {
			return err
		}
		mapper.Reset()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	data, err := obj.MarshalJSON()
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := obj.GetNamespace()
		if ns == "" {
			ns = metav1.NamespaceDefault
		}
		ri = dyn.Resource(mapping.Resource).Namespace(ns)
	}
	force := true
	_, err = ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: FieldManager, Force: &force})
	return err
}
