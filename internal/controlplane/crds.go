package controlplane

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
)

// Names of the admission policies in deploy/policies that InstallCRDs
// waits for (it checks that the API server enforces them before returning).
const (
	PolicyIPPoolOverlap   = "tabby-ippool-no-overlap"
	PolicyIPPoolBlockSize = "tabby-ippool-blocks-fixed"
)

// InstallCRDs applies every deploy/crds/*.yaml of the repository (creating
// or updating each CustomResourceDefinition) and waits until each is
// Established and served, then applies the ValidatingAdmissionPolicies and
// bindings of deploy/policies/*.yaml and waits until the API server
// enforces tabby's IPPool policies.
func (c *Cluster) InstallCRDs(ctx context.Context) error {
	root, err := c.repoRoot()
	if err != nil {
		return fmt.Errorf("finding deploy/crds: %w", err)
	}
	return InstallCRDsFrom(ctx, c.RESTConfig(), root)
}

// InstallCRDsFrom is InstallCRDs for any API server: CRDs from
// root/deploy/crds, policies from root/deploy/policies.
func InstallCRDsFrom(ctx context.Context, cfg *rest.Config, root string) error {
	crdFiles, err := filepath.Glob(filepath.Join(root, "deploy", "crds", "*.yaml"))
	if err != nil {
		return err
	}
	if len(crdFiles) == 0 {
		return fmt.Errorf("no CRDs in %s", filepath.Join(root, "deploy", "crds"))
	}
	sort.Strings(crdFiles)
	ext, err := apiextclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	var crds []*apiextv1.CustomResourceDefinition
	for _, file := range crdFiles {
		docs, err := readYAMLDocs(file)
		if err != nil {
			return err
		}
		for _, doc := range docs {
			crd := &apiextv1.CustomResourceDefinition{}
			if err := yaml.UnmarshalStrict(doc, crd); err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			if crd.Kind != "CustomResourceDefinition" {
				return fmt.Errorf("%s: a %s where a CustomResourceDefinition was expected", file, crd.Kind)
			}
			if err := applyCRD(ctx, ext, crd); err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			crds = append(crds, crd)
		}
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	for _, crd := range crds {
		if err := waitServed(ctx, ext, dyn, crd); err != nil {
			return err
		}
	}

	policyFiles, err := filepath.Glob(filepath.Join(root, "deploy", "policies", "*.yaml"))
	if err != nil {
		return err
	}
	sort.Strings(policyFiles)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	applied := map[string]bool{}
	for _, file := range policyFiles {
		docs, err := readYAMLDocs(file)
		if err != nil {
			return err
		}
		for _, doc := range docs {
			name, err := applyPolicyDoc(ctx, cs, doc)
			if err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			applied[name] = true
		}
	}
	if applied[PolicyIPPoolOverlap] || applied[PolicyIPPoolBlockSize] {
		ds, err := datastore.New(cfg)
		if err != nil {
			return err
		}
		if err := waitPoliciesEnforced(ctx, ds, applied[PolicyIPPoolOverlap], applied[PolicyIPPoolBlockSize]); err != nil {
			return err
		}
	}
	return nil
}

func readYAMLDocs(file string) ([][]byte, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		docs = append(docs, doc)
	}
}

func stripComments(doc []byte) []byte {
	var out bytes.Buffer
	for _, l := range strings.Split(string(doc), "\n") {
		if t := strings.TrimSpace(l); t == "" || strings.HasPrefix(t, "#") || t == "---" {
			continue
		}
		out.WriteString(l + "\n")
	}
	return out.Bytes()
}

func applyCRD(ctx context.Context, ext apiextclient.Interface, crd *apiextv1.CustomResourceDefinition) error {
	cl := ext.ApiextensionsV1().CustomResourceDefinitions()
	for {
		_, err := cl.Create(ctx, crd, metav1.CreateOptions{})
		if !apierrors.IsAlreadyExists(err) {
			return err
		}
		cur, err := cl.Get(ctx, crd.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		upd := crd.DeepCopy()
		upd.ResourceVersion = cur.ResourceVersion
		_, err = cl.Update(ctx, upd, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			return err
		}
	}
}

// waitServed waits until a CRD is Established and a list of its resource
// succeeds.
func waitServed(ctx context.Context, ext apiextclient.Interface, dyn dynamic.Interface, crd *apiextv1.CustomResourceDefinition) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var version string
	for _, v := range crd.Spec.Versions {
		if v.Served {
			version = v.Name
		}
	}
	gvr := schema.GroupVersionResource{Group: crd.Spec.Group, Version: version, Resource: crd.Spec.Names.Plural}
	var last error
	for {
		last = func() error {
			cur, err := ext.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, crd.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, cond := range cur.Status.Conditions {
				if cond.Type == apiextv1.NamesAccepted && cond.Status == apiextv1.ConditionFalse {
					return fmt.Errorf("names not accepted: %s", cond.Message)
				}
				if cond.Type == apiextv1.Established && cond.Status == apiextv1.ConditionTrue {
					_, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1})
					return err
				}
			}
			return errors.New("not Established yet")
		}()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CRD %s is not served: %v", crd.Name, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// applyPolicyDoc creates or updates one ValidatingAdmissionPolicy or
// ValidatingAdmissionPolicyBinding and returns its name.
func applyPolicyDoc(ctx context.Context, cs kubernetes.Interface, doc []byte) (string, error) {
	var meta metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return "", err
	}
	if meta.APIVersion != admissionv1.SchemeGroupVersion.String() {
		return "", fmt.Errorf("apiVersion %q: only %s objects belong in deploy/policies", meta.APIVersion, admissionv1.SchemeGroupVersion)
	}
	switch meta.Kind {
	case "ValidatingAdmissionPolicy":
		p := &admissionv1.ValidatingAdmissionPolicy{}
		if err := yaml.UnmarshalStrict(doc, p); err != nil {
			return "", err
		}
		cl := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies()
		for {
			_, err := cl.Create(ctx, p, metav1.CreateOptions{})
			if !apierrors.IsAlreadyExists(err) {
				return p.Name, err
			}
			cur, err := cl.Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return p.Name, err
			}
			p.ResourceVersion = cur.ResourceVersion
			if _, err = cl.Update(ctx, p, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
				return p.Name, err
			}
		}
	case "ValidatingAdmissionPolicyBinding":
		b := &admissionv1.ValidatingAdmissionPolicyBinding{}
		if err := yaml.UnmarshalStrict(doc, b); err != nil {
			return "", err
		}
		cl := cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
		for {
			_, err := cl.Create(ctx, b, metav1.CreateOptions{})
			if !apierrors.IsAlreadyExists(err) {
				return b.Name, err
			}
			cur, err := cl.Get(ctx, b.Name, metav1.GetOptions{})
			if err != nil {
				return b.Name, err
			}
			b.ResourceVersion = cur.ResourceVersion
			if _, err = cl.Update(ctx, b, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
				return b.Name, err
			}
		}
	default:
		return "", fmt.Errorf("kind %q: only ValidatingAdmissionPolicy and ValidatingAdmissionPolicyBinding belong in deploy/policies", meta.Kind)
	}
}

// Probe objects used to check that the IPPool policies are enforced. The
// pool is disabled and selects no node, and both are deleted before
// InstallCRDs returns.
const (
	probeName = "tabby-admission-probe"
	probeCIDR = "198.18.255.0/24" // benchmarking range (RFC 2544), never a pod range
)

// waitPoliciesEnforced checks, with dry-run requests against a probe pool
// and block, that the API server enforces the IPPool policies. A new policy
// takes effect a second or so after it is created (the admission plugin
// reloads policies every second and starts an informer for its paramKind),
// and until then writes it should refuse go through.
func waitPoliciesEnforced(ctx context.Context, ds *datastore.Client, overlap, blockSize bool) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	pool := &tabbyv1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: probeName},
		Spec: tabbyv1.IPPoolSpec{
			CIDR:         probeCIDR,
			Disabled:     true,
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tabby.io/admission-probe": "no-node-has-this"}},
		},
	}
	poll := func(what string, try func() error, ok func(error) bool) error {
		var last error
		for {
			last = try()
			if ok(last) {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("the API server does not enforce %s yet (last answer: %v); check the policy's status with kubectl get validatingadmissionpolicy -o yaml", what, last)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	denied := func(policy string) func(error) bool {
		return func(err error) bool {
			return apierrors.IsInvalid(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy+"'")
		}
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	// Create the probe pool. Until the policy's informer has synced the API
	// server may refuse it ("not yet synced"); an overlap with a user's pool
	// already proves the overlap policy works.
	poolCreated := false
	if err := poll("the IPPool policies", func() error {
		_, err := ds.IPPools.Create(ctx, pool, metav1.CreateOptions{})
		if err == nil || apierrors.IsAlreadyExists(err) {
			poolCreated = true
			return nil
		}
		return err
	}, func(err error) bool { return err == nil || denied(PolicyIPPoolOverlap)(err) }); err != nil {
		return err
	}
	if !poolCreated {
		// A user's pool covers the probe range; the overlap policy is
		// enforced, and the block policy cannot be probed here: give it the
		// time it normally needs.
		time.Sleep(2 * time.Second)
		return nil
	}
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer dcancel()
		_ = ds.IPAMBlocks.Delete(dctx, probeName, metav1.DeleteOptions{})
		_ = ds.IPPools.Delete(dctx, probeName, metav1.DeleteOptions{})
	}()
	if overlap {
		other := pool.DeepCopy()
		other.Name = probeName + "-overlap"
		if err := poll(PolicyIPPoolOverlap, func() error {
			_, err := ds.IPPools.Create(ctx, other, dry)
			return err
		}, denied(PolicyIPPoolOverlap)); err != nil {
			return err
		}
	}
	if blockSize {
		n := 1 << (32 - tabbyv1.DefaultBlockSizeV4)
		block := &tabbyv1.IPAMBlock{
			ObjectMeta: metav1.ObjectMeta{Name: probeName, Labels: map[string]string{tabbyv1.LabelPool: probeName}},
			Spec: tabbyv1.IPAMBlockSpec{
				CIDR:        strings.TrimSuffix(probeCIDR, "/24") + "/26",
				Allocations: make([]int, n),
				Unallocated: make([]int, n),
				Deleted:     true,
			},
		}
		for i := range n {
			block.Spec.Allocations[i] = -1
			block.Spec.Unallocated[i] = i
		}
		if _, err := ds.IPAMBlocks.Create(ctx, block, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating the probe block: %w", err)
		}
		if err := poll(PolicyIPPoolBlockSize, func() error {
			cur, err := ds.IPPools.Get(ctx, probeName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.Spec.BlockSize = tabbyv1.DefaultBlockSizeV4 + 1
			_, err = ds.IPPools.Update(ctx, cur, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}, denied(PolicyIPPoolBlockSize)); err != nil {
			return err
		}
	}
	return nil
}
