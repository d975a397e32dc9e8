package daemon

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/internal/testnet"
)

// TestDefaultPoolAfterRefusal: when the API server's admission refuses the
// default pool (as tabby's own IPPool policies do for a few seconds after
// deploy/tabby.yaml is applied, their paramKind not yet discovered),
// tabbyd tries again and creates it once admission lets it through. A
// tabbyd that gave up left a lab with no pool and every node NotReady.
func TestDefaultPoolAfterRefusal(t *testing.T) {
	ds := clustertest.Client(t)
	cs, err := kubernetes.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// A policy that refuses the default pool, as a not-yet-ready one does
	// (a validation failure is Invalid, 422).
	const policy = "test-refuse-default-pool"
	fail := admissionv1.Fail
	vap := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: policy},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Create},
					Rule:       admissionv1.Rule{APIGroups: []string{tabbyv1.GroupName}, APIVersions: []string{"*"}, Resources: []string{"ippools"}},
				},
			}}},
			Validations: []admissionv1.Validation{{Expression: "object.metadata.name != '" + DefaultPoolName + "'", Message: "refused by the test"}},
		},
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, vap, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The control plane is the package's: leave it as it was.
	t.Cleanup(func() {
		bg := context.Background()
		_ = cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(bg, policy, metav1.DeleteOptions{})
		_ = cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(bg, policy, metav1.DeleteOptions{})
		for _, pool := range []string{DefaultPoolName, DefaultIPv6PoolName, "users-pool", "users-v6-pool"} {
			_ = ds.IPPools.Delete(bg, pool, metav1.DeleteOptions{})
		}
	})
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: policy},
		Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        policy,
			ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
		},
	}
	if _, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	spec, err := DefaultPoolSpec("10.244.0.0/16", 0, "VXLANCrossSubnet")
	if err != nil {
		t.Fatal(err)
	}
	probe := &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: DefaultPoolName}, Spec: *spec}
	for {
		_, err := ds.IPPools.Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if apierrors.IsInvalid(err) && strings.Contains(err.Error(), policy) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the test's policy is not enforced: last answer %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	var logs testnet.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	// Refused until its context ends: it says the cluster has no pool
	// (tabbyd's NetworkUnavailable condition waits for true).
	short, cancel := context.WithTimeout(ctx, time.Second)
	if ensureDefaultPool(short, ds, DefaultPoolName, *spec, log) {
		t.Error("ensureDefaultPool reported a pool while admission refused it")
	}
	cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if !ensureDefaultPool(ctx, ds, DefaultPoolName, *spec, log) {
			t.Error("ensureDefaultPool gave up")
		}
	}()
	// Refused twice more (so it did not give up after the first), and no
	// pool.
	for strings.Count(logs.String(), "refused by the test") < 4 {
		select {
		case <-done:
			t.Fatalf("tabbyd gave up on the default pool while admission refused it:\n%s", logs.String())
		case <-ctx.Done():
			t.Fatalf("no refusal logged:\n%s", logs.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
	if _, err := ds.IPPools.Get(ctx, DefaultPoolName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the default pool while admission refuses it: %v, want NotFound", err)
	}
	lifted := time.Now()
	if err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, policy, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("no default pool after admission stopped refusing it:\n%s", logs.String())
	}
	got, err := ds.IPPools.Get(ctx, DefaultPoolName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("ensureDefaultPool returned, but: %v\n%s", err, logs.String())
	}
	if got.Spec.CIDR != spec.CIDR || got.Spec.VXLANMode != tabbyv1.EncapCrossSubnet {
		t.Errorf("the default pool is %+v, want %+v", got.Spec, *spec)
	}
	t.Logf("created %v after the refusing binding was deleted", time.Since(lifted).Round(time.Millisecond))

	// With a pool in the cluster, another tabbyd makes none.
	other := *spec
	other.CIDR = "10.245.0.0/16"
	if err := ds.IPPools.Delete(ctx, DefaultPoolName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	mine := &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "users-pool"}, Spec: tabbyv1.IPPoolSpec{CIDR: "10.246.0.0/16"}}
	if _, err := ds.IPPools.Create(ctx, mine, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !ensureDefaultPool(ctx, ds, DefaultPoolName, other, log) {
		t.Error("ensureDefaultPool did not report the user's pool")
	}
	if _, err := ds.IPPools.Get(ctx, DefaultPoolName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a default pool next to the user's: %v, want NotFound", err)
	}

	// Per family, as calico-node: the user's IPv4 pool does not stop the
	// default IPv6 pool, and a user's IPv6 pool does.
	spec6, err := DefaultIPv6PoolSpec("fd00:10:244::/56", 0)
	if err != nil {
		t.Fatal(err)
	}
	if !ensureDefaultPool(ctx, ds, DefaultIPv6PoolName, *spec6, log) {
		t.Error("ensureDefaultPool did not report the IPv6 pool it made")
	}
	if got, err := ds.IPPools.Get(ctx, DefaultIPv6PoolName, metav1.GetOptions{}); err != nil || got.Spec.CIDR != spec6.CIDR || got.Spec.NATOutgoing {
		t.Errorf("the default IPv6 pool next to the user's IPv4 pool: %+v, %v", got, err)
	}
	if err := ds.IPPools.Delete(ctx, DefaultIPv6PoolName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	mine6 := &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "users-v6-pool"}, Spec: tabbyv1.IPPoolSpec{CIDR: "fd00:99::/56"}}
	if _, err := ds.IPPools.Create(ctx, mine6, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !ensureDefaultPool(ctx, ds, DefaultIPv6PoolName, *spec6, log) {
		t.Error("ensureDefaultPool did not report the user's IPv6 pool")
	}
	if _, err := ds.IPPools.Get(ctx, DefaultIPv6PoolName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a default IPv6 pool next to the user's: %v, want NotFound", err)
	}
}
