package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
)

// DefaultPoolName names the IPPool tabbyd creates when the cluster has
// none (Config.DefaultIPv4Pool).
const DefaultPoolName = "default-ipv4"

// Encapsulations of the default pool, as Calico's operator names them.
var Encapsulations = []string{"None", "IPIP", "IPIPCrossSubnet", "VXLAN", "VXLANCrossSubnet"}

// DefaultPoolSpec is the spec of the default IPv4 pool: cidr, block size
// (0: the default) and one of Encapsulations; NAT outgoing on, as in
// Calico's default pool.
func DefaultPoolSpec(cidr string, blockSize int, encapsulation string) (*tabbyv1.IPPoolSpec, error) {
	spec := &tabbyv1.IPPoolSpec{CIDR: cidr, BlockSize: blockSize, NATOutgoing: true}
	switch encapsulation {
	case "", "None":
	case "IPIP":
		spec.IPIPMode = tabbyv1.EncapAlways
	case "IPIPCrossSubnet":
		spec.IPIPMode = tabbyv1.EncapCrossSubnet
	case "VXLAN":
		spec.VXLANMode = tabbyv1.EncapAlways
	case "VXLANCrossSubnet":
		spec.VXLANMode = tabbyv1.EncapCrossSubnet
	default:
		return nil, fmt.Errorf("encapsulation %q: use one of %v", encapsulation, Encapsulations)
	}
	p := &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: DefaultPoolName}, Spec: *spec}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return spec, nil
}

// ensureDefaultPool creates the IPPool DefaultPoolName with spec when the
// cluster has no IPPool at all, as calico-node does with
// CALICO_IPV4POOL_CIDR: deploy/tabby.yaml then installs in one kubectl
// apply (a custom resource in the same apply as its CRD is refused, the
// CRD not being served yet), and a cluster whose pools someone made is
// left alone. Every tabbyd tries; the first create wins. It retries while
// the API server does not answer or its admission refuses the pool, until
// ctx ends.
func ensureDefaultPool(ctx context.Context, ds *datastore.Client, spec tabbyv1.IPPoolSpec, log *slog.Logger) {
	backoff := 500 * time.Millisecond
	for {
		done, err := createDefaultPool(ctx, ds, spec, log)
		if done {
			return
		}
		log.Warn("creating the default IPPool: will try again", "pool", DefaultPoolName, "error", err, "in", backoff)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// createDefaultPool makes one attempt; done says nothing is left to try.
func createDefaultPool(ctx context.Context, ds *datastore.Client, spec tabbyv1.IPPoolSpec, log *slog.Logger) (done bool, err error) {
	pools, err := ds.IPPools.List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, err
	}
	if len(pools.Items) > 0 {
		log.Debug("the cluster has IPPools: no default pool made", "pools", len(pools.Items))
		return true, nil
	}
	pool := &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: DefaultPoolName}, Spec: spec}
	_, err = ds.IPPools.Create(ctx, pool, metav1.CreateOptions{FieldManager: "tabbyd"})
	switch {
	case err == nil:
		log.Info("the cluster had no IPPool: created the default one", "pool", DefaultPoolName, "cidr", spec.CIDR, "blockSize", spec.BlockSize,
			"ipipMode", spec.IPIPMode, "vxlanMode", spec.VXLANMode, "natOutgoing", spec.NATOutgoing)
		return true, nil
	case apierrors.IsAlreadyExists(err):
		return true, nil
	case apierrors.IsInvalid(err):
		// Refused by admission. Either a pool was made a moment ago
		// (the overlap policy), which the next List sees, or the API
		// server's ValidatingAdmissionPolicies are not ready yet: right
		// after the CRDs and policies are applied, or after a restart,
		// a policy whose paramKind it has not discovered refuses every
		// write as Invalid ("failed to find resource referenced by
		// paramKind") for a few seconds. The spec passed Validate, so
		// try again.
		return false, fmt.Errorf("refused by the API server (an admission policy that is not ready yet, or a pool made meanwhile): %w", err)
	}
	return false, err
}
